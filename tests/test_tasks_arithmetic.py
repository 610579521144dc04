"""Arithmetic host task: the expression parser and the host reward on hand-written strings."""

import numpy as np
import pytest

from vpo.tasks import arithmetic, base


@pytest.fixture(scope="module")
def task():
    return arithmetic.make_arithmetic_task()


@pytest.mark.parametrize("text, want", [
    ("3 + 4 * 5", (23, [3, 4, 5])),
    ("( 3 + 4 ) * 5", (35, [3, 4, 5])),
    ("9 - 2 - 3", (4, [9, 2, 3])),  # left associative
    ("( ( 2 ) )", (2, [2])),
    ("3 +", None), ("( 3 + 4", None), ("3 4", None), ("", None), ("* 3", None),
])
def test_parse(text, want):
    assert arithmetic.parse(text.split()) == want


def test_host_reward_on_hand_written_strings(task):
    problem = arithmetic.ArithmeticProblems(np.array([3, 4, 5], np.int32), np.int32(35))
    text = ("( 3 + 4 ) * 5 <sep> 35 <sep> 3 + <sep> 4 * 5 + 5 <sep> ( 3 + 4 ) * 5 <sep> "
            "3 * 4 * 5 <eos>")
    rewards, valid = task.host_reward(problem, text, 6)
    np.testing.assert_allclose(rewards, [
        [1, 1, 1],  # exact with the given numbers: solved
        [1, 0, 1],  # exact, but 35 is not a given number
        [0, 0, 0],  # malformed
        [1, 2 / 3, 1 - 10 / 35],  # reuses 5 (2 of 3 numbers given); value 25
        [0, 0, 0],  # duplicate of the first answer
        [1, 1, 1 - 25 / 35],  # 60
    ], atol=1e-6)
    np.testing.assert_array_equal(valid, [True, True, True, True, False, True])
    assert [bool(task.solved(r)) for r in rewards] == [True] + [False] * 5


def test_host_reward_truncated_and_missing_answers(task):
    problem = arithmetic.ArithmeticProblems(np.array([3, 4, 5], np.int32), np.int32(12))
    rewards, valid = task.host_reward(problem, "3 * 4 <sep> 4 + 5", 3)  # no eos: truncated
    np.testing.assert_array_equal(valid, [True, False, False])
    np.testing.assert_allclose(rewards[0], [1, 1, 1])
    assert not rewards[1:].any()


def test_problems_are_reachable_and_demos_use_given_numbers(task):
    problems = task.make_problems(5, 8)
    assert problems.numbers.shape == (8, 3)
    assert np.all((1 <= problems.target) & (problems.target <= 99))
    rng = np.random.default_rng(0)
    for i in range(8):
        problem = base.index_problem(problems, i)
        text = task.vocab.decode(task.demonstrations(problem, rng, 3))
        rewards, valid = task.host_reward(problem, text, 3)
        assert valid.all() and np.all(rewards[:, :2] == 1)  # well formed, only given numbers
