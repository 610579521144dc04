"""Program synthesis from examples in a tiny stack language, as an in-graph task.

Each problem hides a random target program (`program_lang`) and shows R input/output examples;
an answer is a program; the reward vector is the per-test pass indicator (R components, as the
LiveCodeBench case study of VPO, arXiv 2605.22817 §1.4 of the digest). w* = mean pass rate,
solved = all tests pass. This is the main target of the in-graph evolutionary search (digest §1.9:
fitness = pass fraction, the policy is the mutation operator).

Prompt (P = 4R + 2):  <bos> x_1 -> y_1 ; ... x_R -> y_R ; m<k>
Mutation prompt:      <bos> evolve <examples> parent <prog> score q.. (R tokens) ... m<k>
Answer: program tokens `x 0..9 + - * dup swap` (A = answer_len); a foreign token makes the
answer invalid (zero row, masked), a run-time error just fails every test.

Difficulty (the `difficulty` argument or explicit `min_len/max_len/reject_short_len`): target
programs of `min_len..max_len` tokens whose behaviour on the shown inputs no program of at most
`reject_short_len` tokens reproduces. "hard" (7-10 tokens, nothing of <= 5 tokens fits) is a set a
small policy rarely solves by sampling.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vpo.tasks import answers as answers_lib
from vpo.tasks import base, mutation_demos, program_lang, prompting
from vpo.tasks import vocab as vocab_lib
from vpo.tasks.program_lang import MOD

ARROW, END = "->", ";"
DIFFICULTIES = {  # (min_len, max_len, reject_short_len)
    "easy": (3, 5, 0),
    "medium": (5, 7, 3),
    "hard": (7, 10, 5),
}


class ProgramProblems(NamedTuple):
    """inputs, outputs: int32 [N, R] examples; target: int32 [N, A] token ids (pad-filled)."""

    inputs: np.ndarray
    outputs: np.ndarray
    target: np.ndarray


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
    vocab = vocab_lib.make_vocab(vocab_lib.common_tokens(max_answers) + program_lang.PROGRAM_TOKENS
                                 + (ARROW, END))
    R, A = num_tests, answer_len
    opcode_V, const_V = program_lang.opcode_table(
        {t: vocab.id(t) for t in program_lang.PROGRAM_TOKENS}, vocab.size)
    digit0 = vocab.id("0")
    shorts = program_lang.short_functions(short) if short > 0 else np.zeros((0, MOD), np.int64)

    def make_problems(seed: int, num: int) -> ProgramProblems:
        rng = np.random.default_rng(seed)
        inputs, outputs, targets = [], [], []
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
            inputs.append(xs)
            outputs.append(table[xs])
            targets.append(vocab.encode(prog) + [vocab_lib.PAD] * (A - len(prog)))
        return ProgramProblems(np.asarray(inputs, np.int32), np.asarray(outputs, np.int32),
                               np.asarray(targets, np.int32))

    def statement(problem):  # `x -> y ;` per example
        ex_R4 = jnp.stack([digit0 + jnp.asarray(problem.inputs, jnp.int32),
                           jnp.full((R,), vocab.id(ARROW), jnp.int32),
                           digit0 + jnp.asarray(problem.outputs, jnp.int32),
                           jnp.full((R,), vocab.id(END), jnp.int32)], axis=-1)
        return [prompting.fixed(ex_R4.reshape(-1))]

    prompts = prompting.prompt_functions(vocab, statement, statement_len=4 * R, answer_len=A,
                                         num_rewards=R, max_answers=max_answers)

    def reward(problem, completion_T, mask_T, num_answers: int):
        answers_MA, amask_MA, valid_M = answers_lib.split_answers(
            completion_T, mask_T, num_answers=num_answers, answer_len=A)
        # Ids beyond the task vocabulary (a model with a padded vocab) are foreign tokens.
        opcode_MA = jnp.take(jnp.asarray(opcode_V), answers_MA, mode="fill",
                             fill_value=program_lang.BAD)
        valid_M = valid_M & jnp.all((opcode_MA != program_lang.BAD) | ~amask_MA, axis=-1)
        valid_M = answers_lib.first_occurrence(answers_MA, amask_MA, valid_M)
        const_MA = jnp.take(jnp.asarray(const_V), answers_MA, mode="fill", fill_value=0)
        run_R = jax.vmap(program_lang.run_jnp, in_axes=(None, None, None, 0))
        out_MR = jax.vmap(run_R, in_axes=(0, 0, 0, None))(
            opcode_MA, const_MA, amask_MA, jnp.asarray(problem.inputs, jnp.int32))
        passed_MR = out_MR == jnp.asarray(problem.outputs, jnp.int32)[None, :]
        return (passed_MR & valid_M[:, None]).astype(jnp.float32), valid_M

    def solved(rewards_R):
        return jnp.all(rewards_R >= 1.0 - 1e-6)

    def demonstrations(problem, rng: np.random.Generator, num_answers: int) -> list[int]:
        target = [vocab.tokens[i] for i in np.asarray(problem.target) if i != vocab_lib.PAD]
        progs = equivalent_programs(target, rng, num_answers, A)
        return base.join_answers([vocab.encode(p) for p in progs])

    def mutation_demonstrations(problem, rng: np.random.Generator, num_parents: int,
                                num_answers: int) -> tuple[list[list[int]], list[list[int]]]:
        # Children: programs equivalent to the target (all tests pass). Parents: 1..3 random
        # edits of a child that fail at least one shown test (the host twin of the reward).
        target = [vocab.tokens[i] for i in np.asarray(problem.target) if i != vocab_lib.PAD]
        children = equivalent_programs(target, rng, num_answers, A)
        xs, ys = np.asarray(problem.inputs).tolist(), np.asarray(problem.outputs).tolist()

        def pass_rate(prog):
            return float(np.mean([program_lang.run_py(prog, x) == y for x, y in zip(xs, ys)]))

        parents = mutation_demos.weaker_parents(children, pass_rate, 1.0,
                                                program_lang.PROGRAM_TOKENS, rng,
                                                num_parents=num_parents, max_len=A,
                                                exclude=children)
        return [vocab.encode(p) for p in parents], [vocab.encode(c) for c in children]

    return base.Task(
        name=f"program-{difficulty}", vocab=vocab,
        reward_names=tuple(f"test_{i}" for i in range(R)),
        eval_weights_R=np.full((R,), 1.0 / R, np.float32), answer_len=A,
        make_problems=make_problems, reward=reward, solved=solved,
        demonstrations=demonstrations, mutation_demonstrations=mutation_demonstrations,
        max_answers=max_answers, **prompts._asdict())


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
    turns up in `tries` rewrites, the target repeats (the reward masks repeats as duplicates).
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
