"""Codeword task: records, the in-graph reward equals the host score (per-position matches),
demonstrations read the clues and never show the code, mutation demonstrations keep what the
parents' scores show right and beat every parent."""

import json

import jax
import numpy as np
import pytest

from vpo.tasks import codeword, make_task


@pytest.fixture(scope="module")
def task():
    return codeword.make_codeword_task()


@pytest.fixture(scope="module")
def records(task):
    return task.make_problems(3, 16)


def test_records_are_json_deterministic_and_the_code_is_in_its_clues(task, records):
    assert json.loads(json.dumps(records)) == records
    assert task.make_problems(3, 16) == records and task.make_problems(4, 16) != records
    for r in records:
        clues = [c.split() for c in r["clues"]]
        assert len(clues) == 6 and all(len(set(c)) == 3 for c in clues)
        assert all(x in c for x, c in zip(r["code"].split(), clues, strict=True))
    assert make_task("codeword", length=4).name == "codeword4"


def test_symbol_reward_equals_score(task, records):
    rng = np.random.default_rng(0)
    answers = [[str(w) for w in rng.choice(task.symbols, size=rng.integers(1, 7))]
               for _ in range(80)] + [r["code"].split() for r in records]
    recs = [records[i % len(records)] for i in range(80)] + list(records)
    ids = np.zeros((len(answers), task.answer_len), np.int32)
    mask = np.zeros(ids.shape, bool)
    for i, a in enumerate(answers):
        ids[i, :len(a)] = [task.symbols.index(w) for w in a]
        mask[i, :len(a)] = True
    got = np.asarray(jax.jit(jax.vmap(task.symbol_reward))(task.arrays(recs), ids, mask))
    rewards, valid = task.score(recs, [[" ".join(a)] for a in answers])
    assert valid.all()
    np.testing.assert_array_equal(got, rewards[:, 0])
    assert got[-len(records):].all()  # the code matches at every position
    assert np.asarray(task.solved(got[-1])) and not np.asarray(task.solved(got[-1] * 0))


def test_score_reads_positions_and_refuses_foreign_or_long_answers(task):
    code = "1a 2b 3c 4a 5b 6c"
    record = {"clues": [f"{k}a {k}b {k}c" for k in range(1, 7)], "code": code}
    rewards, valid = task.score([record], [[code, "1a 1a 1a", code + " 6c", "1a 2z", None,
                                            code]])
    np.testing.assert_array_equal(rewards[0, 0], np.ones(6))
    np.testing.assert_array_equal(rewards[0, 1], [1, 0, 0, 0, 0, 0])  # shorter: its positions
    assert valid[0].tolist() == [True, True, False, False, False, False]  # long, foreign,
    # missing, a repeat of an earlier answer


def test_demonstrations_draw_from_the_clues(task, records):
    rng = np.random.default_rng(1)
    hits = []
    for r in records:
        clues = [c.split() for c in r["clues"]]
        demos = task.demonstrations(r, rng, 3)
        assert len(set(demos)) == 3
        for d in demos:
            assert all(x in c for x, c in zip(d.split(), clues, strict=True))
            hits.append(np.mean([a == b for a, b in zip(d.split(), r["code"].split(),
                                                        strict=True)]))
    assert 0.15 < np.mean(hits) < 0.55  # about 1/3: the clues, not the code


def test_mutation_children_keep_the_right_positions_and_beat_every_parent(task, records):
    rng = np.random.default_rng(2)
    for r in records:
        parents, children = task.mutation_demonstrations(r, rng, 2, 2)
        code = r["code"].split()
        score = [np.array([a == b for a, b in zip(p.split(), code, strict=True)])
                 for p in parents]
        assert 1 <= len(parents) <= 2 and len(children) == 2
        for c in children:
            c = c.split()
            for s, p in zip(score, parents, strict=True):
                right = np.flatnonzero(s)
                assert all(c[i] == p.split()[i] for i in right)
            assert sum(a == b for a, b in zip(c, code, strict=True)) > max(map(sum, score))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="clue_size"):
        codeword.make_codeword_task(clue_size=1)
    with pytest.raises(ValueError, match="letters"):
        codeword.make_codeword_task(letters=40)
