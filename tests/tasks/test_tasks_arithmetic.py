"""Arithmetic host task: the expression parser, records and statements, and the host score on
hand-written answers."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vpo.tasks import arithmetic


@pytest.fixture(scope="module")
def task():
    return arithmetic.make_arithmetic_task()


@pytest.mark.parametrize("text, want", [
    ("3 + 4 * 5", (23, [3, 4, 5])),
    ("( 3 + 4 ) * 5", (35, [3, 4, 5])),
    ("9 - 2 - 3", (4, [9, 2, 3])),  # left associative
    ("( ( 2 ) )", (2, [2])),
    ("3 +", None), ("( 3 + 4", None), ("3 4", None), ("", None), ("* 3", None),
    ("\u00b2 + 3", None), ("-3", None), ("1" * 101, None),  # only ASCII digit words, bounded
])
def test_parse(text, want):
    assert arithmetic.parse(text.split()) == want


def test_records_statement_and_words(task):
    records = task.make_problems(5, 8)
    assert json.loads(json.dumps(records)) == records == task.make_problems(5, 8)
    assert task.make_problems(6, 8) != records
    assert task.is_host and task.symbols is None and task.answer_len == 11
    for r in records:
        assert len(r["numbers"]) == 3 and all(1 <= n <= 9 for n in r["numbers"])
        assert 1 <= r["target"] <= 99
        text = task.statement(r)
        assert text == text.strip() and set(text.split()) <= set(task.words)
    r = {"numbers": [3, 4, 5], "target": 35}
    assert task.statement(r) == "Use the numbers 3 4 5 and + - * ( ) to reach 35"
    assert {"0", "99", "+", "-", "*", "(", ")"} <= set(task.words)


def test_score_on_hand_written_answers(task):
    record = {"numbers": [3, 4, 5], "target": 35}
    answers = ["( 3 + 4 ) * 5", "35", "3 +", "4 * 5 + 5", "(3 + 4) * 5", "( 3  + 4 )\n* 5",
               "3 * 4 * 5", None, "( 3 + 4 ) * 5 + 0 - 0 + 0", "3 + <answer 2>", "3 +",
               "9" * 60 + " * 3"]
    rewards, valid = task.score([record], [answers])
    np.testing.assert_allclose(rewards[0], [
        [1, 1, 1],  # exact with the given numbers: solved
        [1, 0, 1],  # exact, but 35 is not a given number
        [0, 0, 0],  # unparseable: a valid slot with a zero row
        [1, 2 / 3, 1 - 10 / 35],  # reuses 5 (2 of 3 numbers given); value 25
        [0, 0, 0],  # "(3" is one word: unparseable, still valid (other words than slot 0)
        [0, 0, 0],  # the same words as the first answer: a duplicate
        [1, 1, 1 - 25 / 35],  # 60
        [0, 0, 0],  # missing
        [0, 0, 0],  # 13 words > A = 11
        [0, 0, 0],  # a stray tag: unparseable, valid
        [0, 0, 0],  # duplicate of the unparseable third answer
        [1, 0.5, 0],  # a huge value is just far from the target
    ], atol=1e-6)
    np.testing.assert_array_equal(valid[0], [True, True, True, True, True, False, True, False,
                                             False, True, False, True])
    assert [bool(task.solved(r)) for r in rewards[0]] == [True] + [False] * 11
    assert bool(jax.jit(task.solved)(jnp.ones(3)))


def test_score_batches_problems_of_different_slot_counts(task):
    records = [{"numbers": [3, 4, 5], "target": 12}, {"numbers": [1, 2, 3], "target": 6}]
    rewards, valid = task.score(records, [["3 * 4"], ["1 + 2 + 3", "1 * 2 * 3"]])
    assert rewards.shape == (2, 2, 3) and valid.tolist() == [[True, False], [True, True]]
    np.testing.assert_allclose(rewards[:, 0], [[1, 1, 1], [1, 1, 1]])
    assert not rewards[0, 1].any()


def test_demonstrations_are_well_formed_and_use_given_numbers(task):
    records = task.make_problems(5, 8)
    rng = np.random.default_rng(0)
    for r in records:
        demos = task.demonstrations(r, rng, 3)
        assert len(demos) == 3 and all(isinstance(d, str) for d in demos)
        rewards, valid = task.score([r], [demos])
        assert valid.all() and np.all(rewards[0, :, :2] == 1)


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="num_numbers"):
        arithmetic.make_arithmetic_task(num_numbers=1)
    with pytest.raises(ValueError, match="max_target"):
        arithmetic.make_arithmetic_task(max_target=5)
