"""A tiny stack language: its tokens, a jnp interpreter, a Python reference, and a program sampler.

Programs are token sequences over
    x            push the input
    0 .. 9       push that constant
    + - *        pop b, pop a, push (a op b) mod 10
    dup          push a copy of the top
    swap         exchange the two top values
Values are integers mod 10 (a bounded range, so nothing overflows). The result is the top of the
stack after the last token. At most `DEPTH` values fit on the stack and a program has at most
`answer_len` tokens, which is also the step bound (no loops). Errors never crash: popping from a
short stack, pushing onto a full one, an unknown token, or ending with an empty stack yields the
failure value `FAIL = -1`, which matches no expected output (all outputs are 0..9).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

MOD, DEPTH, FAIL = 10, 6, -1
DIGITS = tuple(str(d) for d in range(10))
OPS = ("+", "-", "*")
PROGRAM_TOKENS = ("x",) + DIGITS + OPS + ("dup", "swap")
# Opcodes of the jnp interpreter (index into these by token via `opcode_table`).
PUSH_CONST, PUSH_X, ADD, SUB, MUL, DUP, SWAP, BAD = range(8)
_OPCODE = {"x": PUSH_X, "+": ADD, "-": SUB, "*": MUL, "dup": DUP, "swap": SWAP,
           **{d: PUSH_CONST for d in DIGITS}}


def run_py(program: list[str], x: int) -> int:
    """Reference interpreter: the program's output on input x (FAIL on any error)."""
    stack: list[int] = []
    for tok in program:
        op = _OPCODE.get(tok, BAD)
        if op in (PUSH_CONST, PUSH_X, DUP):
            if len(stack) >= DEPTH or (op == DUP and not stack):
                return FAIL
            stack.append(int(tok) if op == PUSH_CONST else x if op == PUSH_X else stack[-1])
        elif op in (ADD, SUB, MUL, SWAP):
            if len(stack) < 2:
                return FAIL
            b, a = stack.pop(), stack.pop()
            if op == SWAP:
                stack += [b, a]
            else:
                stack.append((a + b if op == ADD else a - b if op == SUB else a * b) % MOD)
        else:
            return FAIL
    return stack[-1] if stack else FAIL


def opcode_table(token_ids: dict[str, int], vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(opcode_V, const_V) lookup tables over a vocabulary; non-program tokens map to BAD."""
    opcode_V = np.full((vocab_size,), BAD, np.int32)
    const_V = np.zeros((vocab_size,), np.int32)
    for tok, op in _OPCODE.items():
        opcode_V[token_ids[tok]] = op
        const_V[token_ids[tok]] = int(tok) if op == PUSH_CONST else 0
    return opcode_V, const_V


def run_jnp(opcode_A: jax.Array, const_A: jax.Array, mask_A: jax.Array, x: jax.Array
            ) -> jax.Array:
    """In-graph twin of `run_py` on one input; masked-out positions are skipped. Returns int32."""
    S = DEPTH

    def step(carry, inp):
        stack, sp, err = carry
        op, const, live = inp
        a = stack[jnp.clip(sp - 2, 0, S - 1)]  # second from top
        b = stack[jnp.clip(sp - 1, 0, S - 1)]  # top
        pushes = (op == PUSH_CONST) | (op == PUSH_X) | (op == DUP)
        binary = (op == ADD) | (op == SUB) | (op == MUL)
        bad = ((op == BAD) | (pushes & (sp >= S)) | ((op == DUP) & (sp < 1))
               | ((binary | (op == SWAP)) & (sp < 2)))
        bad = live & ~err & bad
        act = live & ~err & ~bad
        res = jnp.where(op == ADD, a + b, jnp.where(op == SUB, a - b, a * b)) % MOD
        push_val = jnp.where(op == PUSH_CONST, const, jnp.where(op == PUSH_X, x, b))
        idx1 = jnp.where(pushes, sp, jnp.where(binary, sp - 2, sp - 1))
        val1 = jnp.where(pushes, push_val, jnp.where(binary, res, a))
        idx1 = jnp.where(act, idx1, S)  # S = dropped write
        idx2 = jnp.where(act & (op == SWAP), sp - 2, S)
        stack = stack.at[idx1].set(val1, mode="drop").at[idx2].set(b, mode="drop")
        dsp = jnp.where(pushes, 1, jnp.where(binary, -1, 0))
        return (stack, sp + jnp.where(act, dsp, 0), err | bad), None

    init = (jnp.zeros((S,), jnp.int32), jnp.int32(0), jnp.bool_(False))
    (stack, sp, err), _ = jax.lax.scan(
        step, init, (opcode_A.astype(jnp.int32), const_A.astype(jnp.int32), mask_A))
    return jnp.where(err | (sp == 0), FAIL, stack[jnp.clip(sp - 1, 0, S - 1)]).astype(jnp.int32)


def _depth_change(tok: str) -> tuple[int, int]:
    """(depth needed before, change) of a token."""
    op = _OPCODE[tok]
    return {PUSH_CONST: (0, 1), PUSH_X: (0, 1), DUP: (1, 1), SWAP: (2, 0)}.get(op, (2, -1))


@functools.cache
def _feasible(depth: int, remaining: int) -> bool:
    """Can `remaining` more tokens take the stack from `depth` to exactly 1 without error?"""
    if remaining == 0:
        return depth == 1
    return any(depth >= need and depth + d <= DEPTH and _feasible(depth + d, remaining - 1)
               for need, d in map(_depth_change, ("x", "+", "dup", "swap")))


# Relative sampling weight of each token in random target programs (0 and 1 are left out as
# constants: they mostly make no-op arithmetic).
_WEIGHTS = {"x": 6.0, **{d: 0.5 for d in DIGITS[2:]}, "+": 3.0, "-": 2.0, "*": 3.0,
            "dup": 1.0, "swap": 1.0}


_REDUNDANT = {("swap", "swap"), ("swap", "+"), ("swap", "*")}


def sample_program(rng: np.random.Generator, length: int) -> list[str]:
    """A random error-free program of exactly `length` tokens that leaves one value.

    Programs with an obviously redundant pair (`swap swap`, `swap +`, `swap *`) are redrawn, so
    the length measures real work.
    """
    if not _feasible(0, length):
        raise ValueError(f"no program of length {length} leaves exactly one value")
    while True:
        prog = _draw(rng, length)
        if not any(pair in _REDUNDANT for pair in zip(prog, prog[1:], strict=False)):
            return prog


def _draw(rng: np.random.Generator, length: int) -> list[str]:
    prog, depth = [], 0
    for i in range(length):
        remaining = length - i - 1
        options = [t for t in _WEIGHTS
                   if depth >= _depth_change(t)[0] and depth + _depth_change(t)[1] <= DEPTH
                   and _feasible(depth + _depth_change(t)[1], remaining)]
        w = np.array([_WEIGHTS[t] for t in options])
        tok = options[rng.choice(len(options), p=w / w.sum())]
        prog.append(tok)
        depth += _depth_change(tok)[1]
    return prog


def function_table(program: list[str]) -> np.ndarray:
    """The program's outputs on inputs 0..9 (int64 [10])."""
    return np.array([run_py(program, x) for x in range(MOD)])


@functools.lru_cache(maxsize=8)
def short_functions(max_len: int) -> np.ndarray:
    """Output tables [F, 10] of the results of all error-free programs of <= max_len tokens.

    Breadth-first over distinct stack contents (each a tuple of output tables), so programs that
    reach the same stack are expanded once.
    """
    xs = tuple(range(MOD))
    frontier: set[tuple[tuple[int, ...], ...]] = {()}
    results: set[tuple[int, ...]] = set()
    for _ in range(max_len):
        grown = set()
        for stack in frontier:
            for tok in PROGRAM_TOKENS:
                need, d = _depth_change(tok)
                if len(stack) < need or len(stack) + d > DEPTH:
                    continue
                op = _OPCODE[tok]
                if op in (PUSH_CONST, PUSH_X, DUP):
                    top = ((int(tok),) * MOD if op == PUSH_CONST else xs if op == PUSH_X
                           else stack[-1])
                    grown.add(stack + (top,))
                elif op == SWAP:
                    grown.add(stack[:-2] + (stack[-1], stack[-2]))
                else:
                    f = {ADD: int.__add__, SUB: int.__sub__, MUL: int.__mul__}[op]
                    res = tuple(f(a, b) % MOD for a, b in zip(stack[-2], stack[-1], strict=True))
                    grown.add(stack[:-2] + (res,))
        frontier = grown
        results |= {stack[-1] for stack in frontier}
    return np.array(sorted(results), np.int64).reshape(-1, MOD)
