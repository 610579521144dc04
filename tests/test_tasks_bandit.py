"""Bandit toy (digest §1.10): arm rewards and the VPO unit numbers on its answer sets."""

import jax
import numpy as np

from vpo import objectives
from vpo.tasks import bandit, base


def _reward(task, text, M):
    tokens, mask = base.encode_completion(task.vocab, text, task.completion_len(M))
    return jax.jit(task.reward, static_argnums=3)(None, tokens, mask, M)


def test_arm_rewards_duplicates_and_junk():
    task = bandit.make_bandit_task()
    rewards, valid = _reward(task, "A <sep> C <sep> A <sep> bandit <eos>", 4)
    np.testing.assert_allclose(rewards, [[1, 0], [0.6, 0.6], [0, 0], [0, 0]])
    np.testing.assert_array_equal(valid, [True, True, False, False])
    assert [bool(task.solved(r)) for r in rewards[:2]] == [False, True]


def test_expected_max_of_answer_sets_matches_the_digest():
    task = bandit.make_bandit_task()
    weights_1KR = objectives.dirichlet_weights(jax.random.key(0), 1, 20000, 2)
    for text, want in [("A <sep> B <eos>", 0.75), ("C <sep> C <eos>", 0.60),
                       ("A <sep> B <sep> C <eos>", 0.76), ("A <sep> A <eos>", 0.50)]:
        M = text.count("<sep>") + 1
        rewards, valid = _reward(task, text, M)
        got = objectives.expected_max(rewards[None, None], valid[None, None], weights_1KR)
        np.testing.assert_allclose(float(got[0, 0]), want, atol=0.01)
