"""Bandit toy (VPO, arXiv 2605.22817): arm rewards, the in-graph twin, and the VPO unit numbers
on its answer sets."""

import json

import jax
import jax.numpy as jnp
import numpy as np

from vpo import objectives
from vpo.tasks import bandit


def test_records_statement_and_words():
    task = bandit.make_bandit_task()
    records = task.make_problems(3, 4)
    assert json.loads(json.dumps(records)) == records == task.make_problems(3, 4)
    assert records == [{"index": i} for i in range(4)]
    text = task.statement(records[0])
    assert text == text.strip() and "A 1 0" in text and "C 0.6 0.6" in text
    assert set(text.split()) | set(task.symbols) <= set(task.words)
    assert task.symbols == ("A", "B", "C") and task.answer_len == 1 and not task.is_host
    np.testing.assert_array_equal(task.arrays(records).index, [0, 1, 2, 3])
    assert task.arrays(records).index.dtype == np.int32


def test_arm_rewards_duplicates_and_junk():
    task = bandit.make_bandit_task()
    answers = ["A", "C", "A", "bandit", None, "A B", "B", "c"]
    rewards, valid = task.score([{"index": 0}], [answers])
    np.testing.assert_allclose(rewards[0], [[1, 0], [0.6, 0.6], [0, 0], [0, 0], [0, 0], [0, 0],
                                            [0, 1], [0, 0]])
    np.testing.assert_array_equal(valid[0], [True, True, False, False, False, False, True, False])
    assert [bool(task.solved(r)) for r in rewards[0, :2]] == [False, True]
    assert bool(jax.jit(task.solved)(jnp.asarray([0.6, 0.6])))


def test_symbol_reward_equals_score():
    task = bandit.make_bandit_task()
    records = task.make_problems(0, 3)
    fn = jax.jit(jax.vmap(task.symbol_reward))
    got = fn(task.arrays(records), jnp.arange(3, dtype=jnp.int32)[:, None],
             jnp.ones((3, 1), bool))
    rewards, valid = task.score(records, [[arm] for arm in bandit.ARMS])
    assert valid.all()
    np.testing.assert_allclose(np.asarray(got), rewards[:, 0])
    np.testing.assert_allclose(np.asarray(got), bandit.ARM_REWARDS_3R)


def test_demonstrations_cover_the_arms():
    task = bandit.make_bandit_task()
    demos = task.demonstrations({"index": 0}, np.random.default_rng(0), 3)
    assert sorted(demos) == ["A", "B", "C"]
    rewards, valid = task.score([{"index": 0}], [demos])
    assert valid.all()


def test_expected_max_of_answer_sets_matches_the_vpo_toy():
    task = bandit.make_bandit_task()
    weights_1KR = objectives.dirichlet_weights(jax.random.key(0), 1, 20000, 2)
    for answers, want in [(["A", "B"], 0.75), (["C", "C"], 0.60), (["A", "B", "C"], 0.76),
                          (["A", "A"], 0.50)]:
        rewards, valid = task.score([{"index": 0}], [answers])
        got = objectives.expected_max(rewards[None], valid[None], weights_1KR)
        np.testing.assert_allclose(float(got[0, 0]), want, atol=0.01)
