"""A shipped tool environment: reach a target from given numbers, with a calculator to call.

`vpo train --env vpo.env.calculator:make_env`. A row gives four numbers and a target; the
assistant may call the calculator with a line `calc: <expression>` (the environment answers
`= <value>` as a tool message) and ends with a line `answer: <expression>` (or with a message
that calls nothing). The reward vector (R = 3) pulls in different directions:

- hit: the answer's value equals the target (exact, 0 or 1);
- given_only: the answer uses only the given numbers, each at most once (an expression that
  writes the target itself, or repeats a number, scores 0);
- few_calls: 1 − calls / max_calls: checking with the calculator costs, so the surest answer
  (check every step) and the cheapest one (no call) conflict.

w* = (0.6, 0.2, 0.2). Expressions are + − × and parentheses over integers, read by `ast`
(never `eval`).
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any

import numpy as np

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_CALL = re.compile(r"^\s*calc\s*:\s*(.+?)\s*$", re.I | re.M)
_ANSWER = re.compile(r"^\s*answer\s*:\s*(.+?)\s*$", re.I | re.M)


def evaluate(text: str) -> tuple[int | None, list[int]]:
    """(value, the integer literals in order) of an expression of + − × and parentheses over
    integers; (None, []) when it is anything else or too large."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None, []
    numbers: list[int] = []

    def walk(node) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            numbers.append(node.value)
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            value = _OPS[type(node.op)](walk(node.left), walk(node.right))
            if abs(value) > 10**9:
                raise ValueError("too large")
            return value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise ValueError("not an arithmetic expression")

    try:
        return walk(tree.body), numbers
    except (ValueError, RecursionError):
        return None, []


class CalculatorEnv:
    """One episode (see the module docstring). `max_calls`: calls counted by few_calls."""

    reward_names = ("hit", "given_only", "few_calls")
    weights = (0.6, 0.2, 0.2)

    def __init__(self, max_calls: int = 3):
        self.max_calls = max_calls
        self.row: dict[str, Any] = {}
        self.calls = 0

    def problems(self, seed: int, num: int) -> list[dict[str, Any]]:
        """`num` rows: four numbers in 1..9 and a target reached by some expression over
        three of them (so every row is solvable)."""
        rng = np.random.default_rng(seed)
        rows = []
        for _ in range(num):
            nums = [int(x) for x in rng.integers(1, 10, size=4)]
            a, b, c = (nums[i] for i in rng.permutation(4)[:3])
            target = [a * b + c, a * b - c, (a + b) * c, a + b + c][int(rng.integers(4))]
            rows.append({"numbers": nums, "target": int(target)})
        return rows

    def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
        self.row, self.calls = row, 0
        nums = ", ".join(map(str, row["numbers"]))
        return [{"role": "user", "content": (
            f"Reach {row['target']} using some of the numbers {nums} (each at most once) with "
            "+ - * and parentheses. You may check a calculation by writing a line "
            "'calc: <expression>'. End with a line 'answer: <expression>'.")}]

    def step(self, messages: list[dict[str, str]]) -> list[dict[str, str]] | None:
        said = messages[-1]["content"]
        if _ANSWER.search(said):
            return None
        call = _CALL.search(said)
        if call is None:
            return None
        self.calls += 1
        value, _ = evaluate(call.group(1))
        result = "error: not an expression of + - * over integers" if value is None else (
            f"= {value}")
        return [{"role": "tool", "content": result}]

    def score(self, messages: list[dict[str, str]]) -> list[float]:
        answers = [m["content"] for m in messages if m["role"] == "assistant"]
        found = _ANSWER.search(answers[-1]) if answers else None
        few = 1.0 - min(self.calls, self.max_calls) / self.max_calls
        if found is None:
            return [0.0, 0.0, few]
        value, used = evaluate(found.group(1))
        if value is None:
            return [0.0, 0.0, few]
        pool = list(self.row["numbers"])
        given = bool(used)
        for n in used:
            if n in pool:
                pool.remove(n)
            else:
                given = False
        return [float(value == self.row["target"]), float(given), few]


def make_env() -> CalculatorEnv:
    """The factory `vpo train --env vpo.env.calculator:make_env` calls, once per episode."""
    return CalculatorEnv()
