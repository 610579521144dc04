"""Reach-the-target arithmetic, a HOST task: the reward is computed in Python on the answer text.

Each problem gives K numbers (1..9, repeats allowed) and a target (1..max_target) that some
expression over all K numbers reaches. An answer is an expression over integers, `+ - *` and
parentheses, written with spaces: `( 3 + 4 ) * 5` (at most A = 4K - 1 words). Reward vector
(R = 3), all in [0, 1]:

    well_formed   1 iff the answer parses as an expression (integers, + - *, parentheses)
    given_only    fraction of the numbers used that can be matched to distinct given numbers
                  (each given number may be used at most once)
    closeness     max(0, 1 - |value - target| / max(target, 10))

`given_only` and `closeness` are 0 when the answer is not well formed. An unparseable answer
still occupies a valid slot (valid True, reward row 0); only missing slots, answers of more than
A words and later duplicates (same words) of an earlier valid slot are invalid. The components
conflict: writing the target itself is exact but uses a number that was not given. w* = the
mean; solved = all three equal 1 (exact, using only given numbers). This task exercises the
host-scoring path (no `symbols`) with any tokenizer.

Record: {"numbers": [n_1..n_K], "target": t}.
Statement: `Use the numbers n_1 .. n_K and + - * ( ) to reach t`.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from vpo.tasks import answers as answers_lib
from vpo.tasks import base

OPS = ("+", "-", "*")
PARENS = ("(", ")")
MAX_DIGITS = 100  # longer digit words do not parse (bounds int() on generated text)
ANSWER_HINT = "an expression with numbers, operators and parentheses separated by spaces"


def arithmetic_statement(record: base.Record) -> str:
    """`Use the numbers n_1 .. n_K and + - * ( ) to reach t`."""
    numbers = " ".join(str(n) for n in record["numbers"])
    return f"Use the numbers {numbers} and {' '.join(OPS + PARENS)} to reach {record['target']}"


def parse(words: list[str]) -> tuple[int, list[int]] | None:
    """(value, numbers used) of an expression's tokens, or None when it does not parse.

    Grammar: expr := term (("+" | "-") term)* ; term := factor ("*" factor)* ;
    factor := INTEGER | "(" expr ")";  INTEGER := 1..MAX_DIGITS ASCII digits.
    """
    pos = 0
    used: list[int] = []

    def peek():
        return words[pos] if pos < len(words) else None

    def factor():
        nonlocal pos
        tok = peek()
        if tok is not None and tok.isascii() and tok.isdigit() and len(tok) <= MAX_DIGITS:
            pos += 1
            used.append(int(tok))
            return int(tok)
        if tok == "(":
            pos += 1
            value = expr()
            if value is None or peek() != ")":
                return None
            pos += 1
            return value
        return None

    def term():
        nonlocal pos
        value = factor()
        while value is not None and peek() == "*":
            pos += 1
            rhs = factor()
            value = None if rhs is None else value * rhs
        return value

    def expr():
        nonlocal pos
        value = term()
        while value is not None and peek() in ("+", "-"):
            op = peek()
            pos += 1
            rhs = term()
            value = None if rhs is None else value + rhs if op == "+" else value - rhs
        return value

    value = expr()
    if value is None or pos != len(words):
        return None
    return value, used


def score_expression(words: list[str], numbers: list[int], target: int) -> tuple[float, ...]:
    """(well_formed, given_only, closeness) of one answer (see the module docstring)."""
    parsed = parse(words)
    if parsed is None:
        return (0.0, 0.0, 0.0)
    value, used = parsed
    pool = Counter(numbers)
    matched = sum(min(c, pool[n]) for n, c in Counter(used).items())
    given_only = matched / len(used) if used else 0.0
    diff, scale = abs(value - target), max(target, 10)
    closeness = 0.0 if diff >= scale else 1.0 - diff / scale  # no float of a huge value
    return (1.0, given_only, closeness)


def random_expression(rng: np.random.Generator, numbers: list[int]) -> list[str]:
    """A random fully parenthesised expression over `numbers` in the given order."""
    if len(numbers) == 1:
        return [str(numbers[0])]
    split = int(rng.integers(1, len(numbers)))
    parts = []
    for side in (numbers[:split], numbers[split:]):
        sub = random_expression(rng, side)
        parts.append(["("] + sub + [")"] if len(side) > 1 else sub)
    return parts[0] + [OPS[rng.integers(len(OPS))]] + parts[1]


def make_arithmetic_task(*, num_numbers: int = 3, max_target: int = 99, max_answers: int = 8,
                         max_tries: int = 1000) -> base.Task:
    """The arithmetic host `Task` (K = num_numbers; A = 4K - 1; R = 3)."""
    K, A = num_numbers, 4 * num_numbers - 1
    if K < 2:
        raise ValueError(f"num_numbers={K} must be >= 2 (an expression needs an operator)")
    if max_target < 10:
        raise ValueError(f"max_target={max_target} must be >= 10")

    def make_problems(seed: int, num: int) -> list[base.Record]:
        rng = np.random.default_rng(seed)
        records = []
        for _ in range(num):
            for _ in range(max_tries):
                nums = [int(v) for v in rng.integers(1, 10, size=K)]
                parsed = parse(random_expression(rng, [nums[i] for i in rng.permutation(K)]))
                if parsed is not None and 1 <= parsed[0] <= max_target:
                    break
            else:
                raise RuntimeError(f"no target in 1..{max_target} in {max_tries} tries")
            records.append({"numbers": nums, "target": int(parsed[0])})
        return records

    def score(records: Sequence[base.Record], answers: Sequence[Sequence[str | None]]
              ) -> tuple[np.ndarray, np.ndarray]:
        return base.score_word_answers(
            records, answers, 3,
            lambda rec, words: score_expression(words, [int(v) for v in rec["numbers"]],
                                                int(rec["target"])),
            functools.partial(answers_lib.expression_words, max_words=A))

    def solved(rewards_R):
        return jnp.all(jnp.asarray(rewards_R) >= 1.0 - 1e-6)

    def demonstrations(record: base.Record, rng: np.random.Generator,
                       num_answers: int) -> list[str]:
        exprs = demo_expressions([int(v) for v in record["numbers"]], int(record["target"]), rng,
                                 num_answers)
        return [" ".join(e) for e in exprs]

    example = {"numbers": [1] * K, "target": 1}
    words = tuple(dict.fromkeys([*arithmetic_statement(example).split(),
                                 *(str(i) for i in range(max(max_target, 9) + 1)), *OPS, *PARENS,
                                 *ANSWER_HINT.split()]))
    return base.Task(
        name="arithmetic", reward_names=("well_formed", "given_only", "closeness"),
        eval_weights_R=np.full((3,), 1.0 / 3.0, np.float32), make_problems=make_problems,
        statement=arithmetic_statement, answer_hint=ANSWER_HINT, score=score, solved=solved,
        demonstrations=demonstrations, answer_len=A, words=words, max_answers=max_answers)


def demo_expressions(numbers: list[int], target: int, rng: np.random.Generator, num: int,
                     draws: int = 200) -> list[list[str]]:
    """`num` distinct expressions over the given numbers, the closest to the target first.

    Draws random orders and bracketings of all numbers (and of pairs of them), keeps distinct
    ones, ranks them by closeness, and returns the best `num` in random order: diverse answers
    that are well formed and use only given numbers.
    """
    seen: dict[tuple[str, ...], float] = {}
    for _ in range(draws):
        k = len(numbers) if rng.random() < 0.7 else 2
        picks = [numbers[i] for i in rng.permutation(len(numbers))[:k]]
        expr = tuple(random_expression(rng, picks))
        seen.setdefault(expr, score_expression(list(expr), numbers, target)[2])
    ranked = sorted(seen, key=lambda e: -seen[e])[:num]
    ranked += [ranked[-1]] * (num - len(ranked))  # only for tiny pools; repeats are masked
    return [list(ranked[i]) for i in rng.permutation(len(ranked))]
