"""Countdown with two targets, a HOST task with a real conflict at the optimum.

Each problem gives K distinct numbers (1..max_number) and two targets t1 != t2. An answer is one
expression over some of the given numbers (each at most once), `+ - *` and parentheses, written
with spaces as in `vpo.tasks.arithmetic` (same parser; at most A = 4K - 1 words). Reward vector
(R = 3), each exactly 0 or 1:

    hit1        1 iff the answer parses, uses only given numbers (each at most once) and its
                value equals t1
    hit2        the same for t2
    given_only  1 iff the answer parses and uses only given numbers, each at most once

An expression has one value, so no answer hits both targets: the Pareto front is {(1, 0, 1),
(0, 1, 1)} and a SET of answers that hits both targets is worth more than any single answer.
Writing a target itself scores (0, 0, 0): the targets are never given numbers. An unparseable
answer still occupies a valid slot (zero row); only missing slots, answers of more than A words
and later duplicates (same words) of an earlier valid slot are invalid.

    w* = (0.4, 0.4, 0.2): a hit scores 0.6, a miss over given numbers 0.2, anything else 0.
    solved (per answer, what pass@k counts) = hit1 or hit2.

Covering both targets. The `Task` contract scores single answers, so best@k under w* and pass@k with
`solved` treat the two targets alike and cannot see whether a set covers both; the set-level notion
is cover@k (`vpo.eval.metrics.cover_at_k` over `COVER`: the unbiased probability that k of the N
candidates hit both targets, pass@k's estimator by inclusion-exclusion). It is what the Dirichlet
evaluation sees: with w ~ Dir(1, 1, 1), the expected best of a k-subset S (`E_w[max_{j in S} wᵀ
r_j]`, the pool version is `vpo.eval.metrics.expected_max_pool`) is 1/3 + E[max(w1, w2)] = 5/6 when
S hits both targets, 2/3 when it hits one, 1/3 when it only has misses over given numbers
(`DIRICHLET_SET_VALUE`). So E_w[best@k] = 5/6 cover@k + 2/3 (pass@k - cover@k) + 1/3 P(no hit, some
miss over given numbers): covering both is visible there, while best@k under w* is 0.6 for either
target.

Generator (`make_problems`): draw K distinct numbers; enumerate every fully parenthesised
expression over them (`expression_counts`); draw t1 and then t2 uniformly from the eligible
values: in min_target..max_target, not a given number, not reachable with fewer than `min_ops`
operators, and reached by at least `max_answers` distinct expressions (so a demonstration set of
m answers can aim at one target). Both targets are reachable by construction.
`random_hit_rate(record)` is the exact probability that a uniformly random fully parenthesised
expression over the given numbers (each at most once, at least one operator) hits t1 or t2.

Demonstrations (SFT warm start): the format, aimed at ONE target. Each call picks t1 or t2 at
random and returns m distinct expressions that all reach it (drawn uniformly from the expressions
that do), so a demonstration never hedges and the warm start is not taught to cover both targets.

Record: {"numbers": [n_1..n_K], "targets": [t1, t2]}.

The one-operation variant (`make_countdown2_1op_task`, task "countdown2_1op") is sized for a
small pretrained model: four numbers from 2..12, t1 = a ∘ b and t2 = c ∘ d on disjoint pairs
(∘ in + or *), reward (hit1, hit2) with w* = (1/2, 1/2) and no valid-answer component, so every
reward is a hit and a set covering both targets is worth E[max(w1, w2)] = 3/4 under Dir(1, 1)
against 1/2 for either target alone.

Statement: `Use some of the numbers n_1 .. n_K each at most once with + - * ( ) to reach t1 or
t2`.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from vpo.tasks import answers as answers_lib
from vpo.tasks import base
from vpo.tasks.arithmetic import ANSWER_HINT, OPS, PARENS, parse

REWARD_NAMES = ("hit1", "hit2", "given_only")
EVAL_WEIGHTS = (0.4, 0.4, 0.2)
ONE_OP_OPS = ("+", "*")  # commutative: a target of a ∘ b has at least two expressions
# E_{w ~ Dir(1,1,1)}[max_{j in S} wᵀ r_j] of a set S that hits both targets / one / none but has
# a miss over given numbers: 1/3 + E[max(w1, w2)] = 1/3 + 1/2, 2/3, 1/3.
COVER = (0, 1)  # the components a set must both hit: hit1 and hit2
DIRICHLET_SET_VALUE = {"both": 5.0 / 6.0, "one": 2.0 / 3.0, "given_only": 1.0 / 3.0}


def countdown2_statement(record: base.Record) -> str:
    """`Use some of the numbers n_1 .. n_K each at most once with + - * ( ) to reach t1 or t2`."""
    numbers = " ".join(str(n) for n in record["numbers"])
    t1, t2 = record["targets"]
    return (f"Use some of the numbers {numbers} each at most once with {' '.join(OPS + PARENS)} "
            f"to reach {t1} or {t2}")


def score_expression(words: list[str], numbers: Sequence[int], targets: Sequence[int]
                     ) -> tuple[float, float, float]:
    """(hit1, hit2, given_only) of one answer's words (see the module docstring)."""
    parsed = parse(words)
    if parsed is None:
        return (0.0, 0.0, 0.0)
    value, used = parsed
    pool = Counter(int(n) for n in numbers)
    if any(c > pool[n] for n, c in Counter(used).items()):
        return (0.0, 0.0, 0.0)
    t1, t2 = (int(t) for t in targets)
    return (float(value == t1), float(value == t2), 1.0)


# -- every fully parenthesised expression over the given numbers -----------------------------

def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def expression_counts(numbers: Sequence[int]) -> list[dict[int, int]]:
    """counts[mask][v]: how many fully parenthesised expressions use exactly the numbers in
    `mask` (bit i: numbers[i]), each once, in any order, and have value v.

    An expression is a number or `(x) op (y)` over two disjoint non-empty parts, a compound part
    in parentheses (so distinct trees are distinct texts when the numbers are distinct).
    """
    K = len(numbers)
    counts: list[dict[int, int]] = [{} for _ in range(1 << K)]
    for i, n in enumerate(numbers):
        counts[1 << i] = {int(n): 1}
    for mask in sorted(range(1, 1 << K), key=lambda m: bin(m).count("1")):
        if mask & (mask - 1) == 0:
            continue
        out: dict[int, int] = {}
        sub = (mask - 1) & mask
        while sub:  # every ordered split (sub, mask ^ sub)
            left, right = counts[sub], counts[mask ^ sub]
            for a, ca in left.items():
                for b, cb in right.items():
                    c = ca * cb
                    for v in (a + b, a - b, a * b):
                        out[v] = out.get(v, 0) + c
            sub = (sub - 1) & mask
        counts[mask] = out
    return counts


def _expression_text(numbers: Sequence[int], tree) -> list[str]:
    if isinstance(tree, int):
        return [str(numbers[tree])]
    op, left, right = tree
    parts = []
    for t in (left, right):
        words = _expression_text(numbers, t)
        parts.append(words if isinstance(t, int) else ["(", *words, ")"])
    return [*parts[0], op, *parts[1]]


def sample_expression(numbers: Sequence[int], counts: list[dict[int, int]], value: int,
                      rng: np.random.Generator) -> list[str]:
    """A uniformly random fully parenthesised expression with value `value` (words), drawn
    backwards through `expression_counts`; raises ValueError when none exists."""
    masks = [m for m in range(1, len(counts)) if counts[m].get(value, 0)]
    if not masks:
        raise ValueError(f"no expression over {list(numbers)} reaches {value}")
    weights = np.array([counts[m][value] for m in masks], np.float64)
    mask = masks[int(rng.choice(len(masks), p=weights / weights.sum()))]

    def draw(mask: int, v: int):
        if mask & (mask - 1) == 0:
            return mask.bit_length() - 1
        options, weights = [], []
        sub = (mask - 1) & mask
        while sub:
            left, right = counts[sub], counts[mask ^ sub]
            for a, ca in left.items():
                for op in OPS:
                    if op == "*":
                        if a == 0:
                            bs = list(right) if v == 0 else []
                        else:
                            bs = [v // a] if v % a == 0 else []
                    else:
                        bs = [v - a] if op == "+" else [a - v]
                    for b in bs:
                        if right.get(b, 0) and _apply(op, a, b) == v:
                            options.append((sub, op, a, b))
                            weights.append(ca * right[b])
            sub = (sub - 1) & mask
        w = np.array(weights, np.float64)
        sub, op, a, b = options[int(rng.choice(len(options), p=w / w.sum()))]
        return (op, draw(sub, a), draw(mask ^ sub, b))

    return _expression_text(numbers, draw(mask, value))


def compound_counts(counts: list[dict[int, int]]) -> tuple[Counter, int]:
    """(value -> expressions with at least one operator, their total)."""
    per_value: Counter = Counter()
    for mask in range(1, len(counts)):
        if mask & (mask - 1):
            per_value.update(counts[mask])
    return per_value, sum(per_value.values())


def random_hit_rates(record: base.Record) -> tuple[float, float]:
    """Exact probabilities that a uniformly random fully parenthesised expression over the
    given numbers (each at most once, at least one operator) hits t1, and that it hits t2."""
    per_value, total = compound_counts(expression_counts(record["numbers"]))
    t1, t2 = (int(t) for t in record["targets"])
    return per_value[t1] / total, per_value[t2] / total


def random_hit_rate(record: base.Record) -> float:
    """Exact probability that a uniformly random fully parenthesised expression over the given
    numbers (each at most once, at least one operator) hits t1 or t2."""
    return sum(random_hit_rates(record))


def solve(numbers: Sequence[int], target: int) -> list[str] | None:
    """One expression over the given numbers (each at most once) with value `target`, or None."""
    try:
        return sample_expression(numbers, expression_counts(numbers), target,
                                 np.random.default_rng(0))
    except ValueError:
        return None


# -- the task ---------------------------------------------------------------------------------

def _score(records: Sequence[base.Record], answers: Sequence[Sequence[str | None]], *,
           num_rewards: int, max_words: int) -> tuple[np.ndarray, np.ndarray]:
    """(rewards_NMR, valid_NM): `score_expression`'s first `num_rewards` components per slot."""
    return base.score_word_answers(
        records, answers, num_rewards,
        lambda rec, words: score_expression(words, rec["numbers"],
                                            rec["targets"])[:num_rewards],
        functools.partial(answers_lib.expression_words, max_words=max_words))


def _hit_either(rewards_R):
    """solved: the answer hits t1 or t2."""
    r = jnp.asarray(rewards_R)
    return jnp.maximum(r[0], r[1]) >= 1.0 - 1e-6


def make_countdown2_task(*, num_numbers: int = 4, max_number: int = 15, min_target: int = 10,
                         max_target: int = 99, min_ops: int = 2, max_answers: int = 8,
                         max_tries: int = 100) -> base.Task:
    """The two-target countdown host `Task` (K = num_numbers; A = 4K - 1; R = 3).

    Defaults, measured on 500 problems (`experiments/countdown2_hit_rate.py`): a uniformly random
    expression over the given numbers hits t1 or t2 with probability 0.017 (median problem 0.012,
    90th percentile 0.036); 12 such answers hit some target with probability 0.18 and both with
    0.008. K = 5 lowers the rate to 0.0055.

    Args:
      num_numbers: K, the given numbers (distinct, 1..max_number).
      max_number: the largest given number.
      min_target, max_target: the targets' range.
      min_ops: a target needs at least this many operators (no expression with fewer reaches
        it); 1 allows `a + b` targets.
      max_answers: the most answers per generation; each target has at least this many
        expressions (for demonstrations that all aim at it).
      max_tries: number draws per problem before giving up (a RuntimeError names the knobs).
    """
    K, A = num_numbers, 4 * num_numbers - 1
    if K < 2:
        raise ValueError(f"num_numbers={K} must be >= 2 (an expression needs an operator)")
    if K > 6:
        raise ValueError(f"num_numbers={K} must be <= 6 (the generator enumerates every "
                         "expression)")
    if max_number < K:
        raise ValueError(f"max_number={max_number} must be >= num_numbers={K} (distinct numbers)")
    if not 1 <= min_target < max_target:
        raise ValueError(f"min_target={min_target}, max_target={max_target}: need "
                         "1 <= min_target < max_target")
    if not 1 <= min_ops <= K - 1:
        raise ValueError(f"min_ops={min_ops} must be in 1..num_numbers - 1 = {K - 1}")

    def eligible(nums: list[int]) -> tuple[list[int], list[dict[int, int]]]:
        counts = expression_counts(nums)
        easy = {v for m in range(1, 1 << K) if bin(m).count("1") <= min_ops for v in counts[m]}
        per_value, _ = compound_counts(counts)
        values = sorted(v for v, c in per_value.items()
                        if min_target <= v <= max_target and v not in easy
                        and c >= max_answers)
        return values, counts

    def make_problems(seed: int, num: int) -> list[base.Record]:
        rng = np.random.default_rng(seed)
        records = []
        for _ in range(num):
            for _ in range(max_tries):
                nums = [int(v) for v in rng.choice(np.arange(1, max_number + 1), K,
                                                   replace=False)]
                values, _ = eligible(nums)
                if len(values) >= 2:
                    break
            else:
                raise RuntimeError(
                    f"countdown2: no two targets in {min_target}..{max_target} needing >= "
                    f"{min_ops} operators in {max_tries} draws of {K} numbers; widen the target "
                    "range or lower min_ops")
            t1, t2 = (int(v) for v in rng.choice(values, 2, replace=False))
            records.append({"numbers": nums, "targets": [t1, t2]})
        return records

    score = functools.partial(_score, num_rewards=3, max_words=A)

    def demonstrations(record: base.Record, rng: np.random.Generator,
                       num_answers: int) -> list[str]:
        nums = [int(v) for v in record["numbers"]]
        counts = expression_counts(nums)
        target = int(record["targets"][int(rng.integers(2))])
        out: list[list[str]] = []
        for _ in range(50 * num_answers):
            words = sample_expression(nums, counts, target, rng)
            if words not in out:
                out.append(words)
                if len(out) == num_answers:
                    break
        else:
            raise RuntimeError(f"countdown2: fewer than {num_answers} distinct expressions "
                               f"reach {target} from {nums}")
        return [" ".join(w) for w in out]

    example = {"numbers": [1] * K, "targets": [1, 2]}
    words = tuple(dict.fromkeys([*countdown2_statement(example).split(),
                                 *(str(i) for i in range(max(max_target, max_number) + 1)),
                                 *OPS, *PARENS, *ANSWER_HINT.split()]))
    return base.Task(
        name="countdown2", reward_names=REWARD_NAMES,
        eval_weights_R=np.array(EVAL_WEIGHTS, np.float32), make_problems=make_problems,
        statement=countdown2_statement, answer_hint=ANSWER_HINT, score=score, solved=_hit_either,
        demonstrations=demonstrations, answer_len=A, words=words, max_answers=max_answers,
        cover_components=COVER)


def make_countdown2_1op_task(*, num_numbers: int = 4, min_number: int = 2, max_number: int = 12,
                             ops: Sequence[str] = ONE_OP_OPS, max_answers: int = 2,
                             aim: str = "one", max_tries: int = 100) -> base.Task:
    """Two-target countdown with one operation per target (see the module docstring): R = 2
    (hit1, hit2), w* = (1/2, 1/2), solved = hit1 or hit2, cover = both.

    Args:
      num_numbers: K >= 4, the given numbers (distinct, min_number..max_number); the first
        four (after a shuffle) make the targets.
      ops: the operations a target is made with (+ and * by default: each target then has at
        least two expressions, `a ∘ b` and `b ∘ a`, for m = 2 demonstrations).
      max_answers: the most answers per generation.
      aim: the demonstrations' aim: "one" (a set's m answers all reach one target, drawn per
        set: the format without coverage) or "each" (every answer its own target, drawn
        independently: a set of 2 covers both half the time).
      max_tries: draws per problem before a RuntimeError naming the knobs.
    """
    K, A = num_numbers, 4 * num_numbers - 1
    if aim not in ("one", "each"):
        raise ValueError(f"aim={aim!r}: choose 'one' (a set aims at one target) or 'each'")
    if K < 4 or K > 6:
        raise ValueError(f"num_numbers={K} must be in 4..6 (two disjoint pairs; the generator "
                         "enumerates every expression)")
    if not (min_number >= 1 and max_number - min_number + 1 >= K):
        raise ValueError(f"numbers {min_number}..{max_number}: need >= 1 and room for {K} "
                         "distinct numbers")
    if not ops or any(op not in OPS for op in ops):
        raise ValueError(f"ops={tuple(ops)}: choose from {OPS}")

    def make_problems(seed: int, num: int) -> list[base.Record]:
        rng = np.random.default_rng(seed)
        records = []
        for _ in range(num):
            for _ in range(max_tries):
                nums = [int(v) for v in rng.choice(np.arange(min_number, max_number + 1), K,
                                                   replace=False)]
                op1, op2 = (str(o) for o in rng.choice(list(ops), 2))
                t1, t2 = _apply(op1, nums[0], nums[1]), _apply(op2, nums[2], nums[3])
                if t1 != t2 and t1 > 0 and t2 > 0 and t1 not in nums and t2 not in nums:
                    break
            else:
                raise RuntimeError(f"countdown2_1op: no two distinct targets in {max_tries} "
                                   "draws; widen min_number..max_number")
            records.append({"numbers": nums, "targets": [int(t1), int(t2)]})
        return records

    score = functools.partial(_score, num_rewards=2, max_words=A)

    def demonstrations(record: base.Record, rng: np.random.Generator,
                       num_answers: int) -> list[str]:
        """m distinct one-operation answers `a ∘ b`: with aim "one" all reach one target (t1 or
        t2 at random), never a hedge over both; with "each" every answer draws its own."""
        nums = [int(v) for v in record["numbers"]]

        def reaching(target: int) -> list[str]:
            return [f"{a} {op} {b}" for a in nums for b in nums if a != b for op in OPS
                    if _apply(op, a, b) == target]

        if aim == "one":
            target = int(record["targets"][int(rng.integers(2))])
            simple = reaching(target)
            if len(simple) < num_answers:
                raise RuntimeError(f"countdown2_1op: fewer than {num_answers} one-operation "
                                   f"answers reach {target} from {nums}")
            return [simple[i] for i in rng.choice(len(simple), num_answers, replace=False)]
        pools = [reaching(int(t)) for t in record["targets"]]
        out: list[str] = []
        for _ in range(num_answers):
            left = [x for x in pools[int(rng.integers(2))] if x not in out]
            left = left or [x for p in pools for x in p if x not in out]
            if not left:
                raise RuntimeError(f"countdown2_1op: fewer than {num_answers} one-operation "
                                   f"answers reach a target of {nums}")
            out.append(left[int(rng.integers(len(left)))])
        return out

    example = {"numbers": [1] * K, "targets": [1, 2]}
    top = max(max_number * max_number, max_number)
    words = tuple(dict.fromkeys([*countdown2_statement(example).split(),
                                 *(str(i) for i in range(top + 1)),
                                 *OPS, *PARENS, *ANSWER_HINT.split()]))
    return base.Task(
        name="countdown2_1op", reward_names=REWARD_NAMES[:2],
        eval_weights_R=np.array([0.5, 0.5], np.float32), make_problems=make_problems,
        statement=countdown2_statement, answer_hint=ANSWER_HINT, score=score, solved=_hit_either,
        demonstrations=demonstrations, answer_len=A, words=words, max_answers=max_answers,
        cover_components=COVER)
