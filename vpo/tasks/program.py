"""Program synthesis from examples in a tiny stack language, as an in-graph task.

Each problem hides a random target program (`program_lang`) and shows R input/output examples;
an answer is a program; the reward vector is the per-test pass indicator (R components, as the
LiveCodeBench case study of VPO, Bahlous-Boldi et al., arXiv 2605.22817):

    r_i = [run(answer, x_i) == y_i],  i = 1..R;   w* = (1/R, ..., 1/R);   solved = all r_i = 1

This is the main target of the in-graph evolutionary search (as in VPO's test-time search,
arXiv 2605.22817: fitness = pass fraction, the policy is the mutation operator).

Record: {"inputs": [x_1..x_R], "outputs": [y_1..y_R], "target": "x 3 + dup *"}.
Statement: the language in one sentence, then `Examples: x_1 -> y_1 ; ... ; x_R -> y_R`.
Answer: 1..A program words `x 0..9 + - * dup swap` (A = answer_len); a foreign word makes the
answer invalid (zero row, masked), a run-time error just fails every test.

Difficulty (the `difficulty` argument or explicit `min_len/max_len/reject_short_len`): target
programs of `min_len..max_len` tokens whose behaviour on the shown inputs no program of at most
`reject_short_len` tokens reproduces. "hard" (7-10 tokens, nothing of <= 5 tokens fits) is a set a
small policy rarely solves by sampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vpo.tasks import base, mutation_demos, program_lang
from vpo.tasks.program_lang import MOD

ARROW, END = "->", ";"
LANGUAGE = ("Stack program: x pushes the input, 0 to 9 push themselves, + - * pop two and push "
            "the result mod 10 on the stack, dup copies the top, swap swaps the top two; the "
            "output is the top.")
ANSWER_HINT = "a program: tokens separated by spaces"
DIFFICULTIES = {  # (min_len, max_len, reject_short_len)
    "easy": (3, 5, 0),
    "medium": (5, 7, 3),
    "hard": (7, 10, 5),
}


class ProgramArrays(NamedTuple):
    """inputs, outputs: int32 [N, R] examples (digits 0..9)."""

    inputs: np.ndarray
    outputs: np.ndarray


def program_statement(record: base.Record) -> str:
    """The language, then `Examples: x_1 -> y_1 ; ... ; x_R -> y_R`."""
    examples = f" {END} ".join(f"{x} {ARROW} {y}"
                               for x, y in zip(record["inputs"], record["outputs"], strict=True))
    return f"{LANGUAGE}\nExamples: {examples}"


def make_program_task(difficulty: str = "easy", *, num_tests: int = 5, answer_len: int = 12,
                      min_len: int | None = None, max_len: int | None = None,
                      reject_short_len: int | None = None, max_answers: int = 8,
                      max_tries: int = 10_000) -> base.Task:
    """The program-synthesis `Task`; explicit lengths override the `difficulty` preset."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty={difficulty!r}: choose one of {', '.join(DIFFICULTIES)}")
    lo, hi, short = DIFFICULTIES[difficulty]
    lo, hi = min_len or lo, max_len or hi
    short = short if reject_short_len is None else reject_short_len
    if not 1 <= num_tests <= MOD:
        raise ValueError(f"num_tests={num_tests} must be in 1..{MOD} (inputs are distinct digits)")
    if not 1 <= lo <= hi <= answer_len - 2:
        raise ValueError(f"target lengths {lo}..{hi} must satisfy 1 <= min_len <= max_len <= "
                         f"answer_len - 2 = {answer_len - 2} (demonstrations add up to 2 tokens)")
    R, A = num_tests, answer_len
    symbols = program_lang.PROGRAM_TOKENS
    # Symbol id s (an index into `symbols`) -> interpreter opcode and pushed constant.
    opcode_V, const_V = program_lang.opcode_table({t: i for i, t in enumerate(symbols)},
                                                  len(symbols))

    def make_problems(seed: int, num: int) -> list[base.Record]:
        rng = np.random.default_rng(seed)
        shorts = (program_lang.short_functions(short) if short > 0
                  else np.zeros((0, MOD), np.int64))
        records = []
        for _ in range(num):
            for _ in range(max_tries):
                prog = program_lang.sample_program(rng, int(rng.integers(lo, hi + 1)))
                table = program_lang.function_table(prog)
                xs = np.sort(rng.choice(MOD, size=R, replace=False))
                if len(set(table.tolist())) < 2 or len(set(table[xs].tolist())) < 2:
                    continue  # constant behaviour: nothing to learn from the examples
                if len(shorts) and np.any(np.all(shorts[:, xs] == table[xs], axis=1)):
                    continue  # a short program fits the examples: too easy for this difficulty
                break
            else:
                raise RuntimeError(f"no {difficulty} program found in {max_tries} tries; loosen "
                                   "min_len/max_len/reject_short_len")
            records.append({"inputs": [int(x) for x in xs],
                            "outputs": [int(y) for y in table[xs]],
                            "target": " ".join(prog)})
        return records

    def arrays(records: Sequence[base.Record]) -> ProgramArrays:
        return ProgramArrays(np.asarray([r["inputs"] for r in records], np.int32).reshape(-1, R),
                             np.asarray([r["outputs"] for r in records], np.int32).reshape(-1, R))

    def symbol_reward(problem: ProgramArrays, symbols_A: jax.Array, mask_A: jax.Array
                      ) -> jax.Array:
        op_A = jnp.asarray(opcode_V)[symbols_A]
        const_A = jnp.asarray(const_V)[symbols_A]
        run_R = jax.vmap(program_lang.run_jnp, in_axes=(None, None, None, 0))
        out_R = run_R(op_A, const_A, mask_A, jnp.asarray(problem.inputs, jnp.int32))
        return (out_R == jnp.asarray(problem.outputs, jnp.int32)).astype(jnp.float32)

    def pass_vector(record: base.Record, words: list[str]) -> list[float]:
        return [float(program_lang.run_py(words, x) == y)
                for x, y in zip(record["inputs"], record["outputs"], strict=True)]

    def score(records, answers):
        return base.score_symbol_answers(records, answers, symbols, A, R, pass_vector)

    def solved(rewards_R):
        return jnp.all(jnp.asarray(rewards_R) >= 1.0 - 1e-6)

    def demonstrations(record: base.Record, rng: np.random.Generator,
                       num_answers: int) -> list[str]:
        progs = equivalent_programs(record["target"].split(), rng, num_answers, A)
        return [" ".join(p) for p in progs]

    def mutation_demonstrations(record: base.Record, rng: np.random.Generator, num_parents: int,
                                num_answers: int) -> tuple[list[str], list[str]]:
        # Children: programs equivalent to the target (all tests pass). Parents: 1..3 random
        # edits of a child that fail at least one shown test (the host twin of the reward).
        children = equivalent_programs(record["target"].split(), rng, num_answers, A)
        parents = mutation_demos.weaker_parents(
            children, lambda prog: float(np.mean(pass_vector(record, prog))), 1.0, symbols, rng,
            num_parents=num_parents, max_len=A, exclude=children)
        return [" ".join(p) for p in parents], [" ".join(c) for c in children]

    example = {"inputs": list(range(R)), "outputs": list(range(R)), "target": "x"}
    words = tuple(dict.fromkeys([*program_statement(example).split(), *symbols, ARROW, END,
                                 *program_lang.DIGITS, *ANSWER_HINT.split()]))
    return base.Task(
        name=f"program-{difficulty}", reward_names=tuple(f"test_{i}" for i in range(R)),
        eval_weights_R=np.full((R,), 1.0 / R, np.float32), make_problems=make_problems,
        statement=program_statement, answer_hint=ANSWER_HINT, score=score, solved=solved,
        demonstrations=demonstrations, symbols=symbols, answer_len=A, arrays=arrays,
        symbol_reward=symbol_reward, mutation_demonstrations=mutation_demonstrations,
        words=words, max_answers=max_answers)


def _rewrite(prog: list[str], rng: np.random.Generator) -> list[str]:
    """One random semantics-preserving rewrite of a program (may not fit the length budget).

    Rewrites: append `0 +` or `1 *`; split a constant c into `a b +` with a + b = c (mod 10);
    turn `x` into `x 0 +` / `x 1 *`; insert `swap` before a commutative `+` / `*`.
    """
    kind = rng.integers(4)
    if kind == 0:
        return prog + (["0", "+"] if rng.random() < 0.5 else ["1", "*"])
    positions = {1: [i for i, t in enumerate(prog) if t in program_lang.DIGITS],
                 2: [i for i, t in enumerate(prog) if t == "x"],
                 3: [i for i, t in enumerate(prog) if t in ("+", "*") and i >= 2]}[int(kind)]
    if not positions:
        return prog + ["1", "*"]
    i = positions[rng.integers(len(positions))]
    if kind == 1:
        a = int(rng.integers(MOD))
        return prog[:i] + [str(a), str((int(prog[i]) - a) % MOD), "+"] + prog[i + 1:]
    if kind == 2:
        neutral = ["x", "0", "+"] if rng.random() < 0.5 else ["x", "1", "*"]
        return prog[:i] + neutral + prog[i + 1:]
    return prog[:i] + ["swap"] + prog[i:]


def equivalent_programs(target: list[str], rng: np.random.Generator, num: int, answer_len: int,
                        tries: int = 50) -> list[list[str]]:
    """`num` distinct programs with the target's behaviour on every input (target first, then
    random rewrites in random order), each at most `answer_len` tokens. If no new distinct one
    turns up in `tries` rewrites, the target repeats (scoring masks repeats as duplicates).
    """
    table = program_lang.function_table(target)
    progs = [target]
    for _ in range(num - 1):
        found = target
        for _ in range(tries):
            base_prog = progs[rng.integers(len(progs))]
            cand = _rewrite(base_prog, rng)
            if (len(cand) <= answer_len and cand not in progs
                    and np.array_equal(program_lang.function_table(cand), table)):
                found = cand
                break
        progs.append(found)
    order = rng.permutation(len(progs))
    return [progs[i] for i in order]
