"""A hidden code read from clues, with per-position feedback: the positive control of the search.

Each problem hides a code of L letters (alphabet `LETTERS[:K]`); the statement gives, for every
position, a clue of c letters one of which is the code's. A letter is written with its position,
`3e` (letter e at position 3), so that an answer's words say where they go; an answer is the L
positions in order, and the reward vector has one exact-match component per position:

    r_i = [answer_i == code_i],  i = 1..L;   w* = (1/L, ..., 1/L);   solved = all r_i = 1

The statement leaves c^L codes equally likely, so a plain sample that reads the clues solves with
probability c^-L (1/729 at the default L = 6, c = 3) and best-of-N with about N c^-L. A search
whose mutation prompt shows a parent's per-position scores (`vpo.tasks.prompts.mutation_text`;
here each letter's 1.0 / 0.0 beside it, `Task.scores_per_symbol`) can keep the right letters
and try the clue's other letters elsewhere, so its children compound: fitness is graded and
local. This is
the refinement-with-feedback mechanism of Mind Evolution (Lee et al., arXiv 2501.09891: an
evaluator's feedback names the violated constraints) reduced to its core; the policy has to read
the clues (for plain samples) and the scores (for children) to use it.

Record: {"clues": ["1a 1c 1f", "2b 2d 2e", ...] (L strings of c words), "code": "1c 2b ..."}.
Statement: `Code of L letters, each one of its position's clue:` then one clue per line.
Answer: 1..L words, the i-th for position i (a shorter answer scores its positions only); a
foreign word or more than L words makes it invalid.

SFT demonstrations never show the code: plain ones are letters drawn uniformly from each clue
(redrawn when none is right), mutation ones (`mutation_demonstrations`) keep every position some
parent got right and draw each other position from the clue letters no parent tried there.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from vpo.tasks import base

LETTERS = tuple(string.ascii_lowercase)
ANSWER_HINT = "a code: position-numbered letters in order, separated by spaces"


class CodewordArrays(NamedTuple):
    """code: int32 [N, L] symbol ids of the hidden code (position-numbered letters)."""

    code: np.ndarray


def codeword_statement(record: base.Record) -> str:
    """The clues, one position per line."""
    clues = record["clues"]
    return (f"Code of {len(clues)} letters, each one of its position's clue:\n"
            + "\n".join(clues))


def clue_guess(clues: Sequence[Sequence[str]], rng: np.random.Generator) -> list[str]:
    """One letter drawn uniformly from each position's clue."""
    return [str(clue[rng.integers(len(clue))]) for clue in clues]


def refine(clues: Sequence[Sequence[str]], parents: Sequence[Sequence[str]],
           scores: Sequence[Sequence[float]], rng: np.random.Generator) -> list[str]:
    """The child the feedback allows: each position some parent got right (score 1) keeps that
    letter; every other position draws uniformly from its clue letters that no parent tried
    there (all of the clue if every letter was tried)."""
    child = []
    for i, clue in enumerate(clues):
        right = [p[i] for p, s in zip(parents, scores, strict=True) if i < len(p) and s[i] >= 1]
        if right:
            child.append(right[0])
            continue
        tried = {p[i] for p in parents if i < len(p)}
        left = [x for x in clue if x not in tried] or list(clue)
        child.append(str(left[rng.integers(len(left))]))
    return child


def make_codeword_task(length: int = 6, *, letters: int = 8, clue_size: int = 3,
                       max_answers: int = 8, scores_per_symbol: bool = True) -> base.Task:
    """The codeword `Task`: codes of `length` letters from the first `letters` of the alphabet,
    clues of `clue_size` letters per position (the code's and clue_size - 1 others).
    `scores_per_symbol`: mutation prompts write each parent letter's score beside it (False:
    the scores as one list after the answer, as every other task)."""
    if not 1 <= length <= 12:
        raise ValueError(f"codeword length={length} must be in 1..12")
    if not 2 <= letters <= len(LETTERS):
        raise ValueError(f"codeword letters={letters} must be in 2..{len(LETTERS)}")
    if not 2 <= clue_size <= letters:
        raise ValueError(f"codeword clue_size={clue_size} must be in 2..letters ({letters})")
    L = length
    symbols = tuple(f"{k}{x}" for k in range(1, L + 1) for x in LETTERS[:letters])
    index = {s: i for i, s in enumerate(symbols)}

    def make_problems(seed: int, num: int) -> list[base.Record]:
        rng = np.random.default_rng(seed)
        records = []
        for _ in range(num):
            clues, code = [], []
            for k in range(L):
                clue = sorted(rng.choice(letters, size=clue_size, replace=False).tolist())
                clues.append(" ".join(symbols[k * letters + i] for i in clue))
                code.append(symbols[k * letters + clue[rng.integers(clue_size)]])
            records.append({"clues": clues, "code": " ".join(code)})
        return records

    def arrays(records: Sequence[base.Record]) -> CodewordArrays:
        return CodewordArrays(np.asarray([[index[c] for c in r["code"].split()] for r in records],
                                         np.int32).reshape(-1, L))

    def symbol_reward(problem: CodewordArrays, symbols_A, mask_A):
        return (mask_A & (symbols_A == jnp.asarray(problem.code, jnp.int32))).astype(jnp.float32)

    def match_vector(record: base.Record, words: list[str]) -> list[float]:
        code = record["code"].split()
        return [float(i < len(words) and words[i] == c) for i, c in enumerate(code)]

    def score(records, answers):
        return base.score_symbol_answers(records, answers, symbols, L, L, match_vector)

    def solved(rewards_R):
        return jnp.all(jnp.asarray(rewards_R) >= 1.0 - 1e-6, axis=-1)

    def split_clues(record):
        return [clue.split() for clue in record["clues"]]

    def distinct(draw, num: int, tries: int = 50) -> list[list[str]]:
        out: list[list[str]] = []
        for _ in range(num):
            found = draw()
            for _ in range(tries):
                if found not in out:
                    break
                found = draw()
            out.append(found)  # a repeat only when the clues allow no other (scored invalid)
        return out

    def demonstrations(record, rng: np.random.Generator, num_answers: int) -> list[str]:
        # clue guesses with at least one letter right (every demonstration scores, as the task
        # contract asks; the code stays unreadable from the prompt, so nothing leaks)
        clues = split_clues(record)

        def guess():
            for _ in range(100):
                g = clue_guess(clues, rng)
                if sum(match_vector(record, g)) > 0:
                    return g
            return g

        return [" ".join(g) for g in distinct(guess, num_answers)]

    def mutation_demonstrations(record, rng: np.random.Generator, num_parents: int,
                                num_answers: int) -> tuple[list[str], list[str]]:
        # Parents: 1..U distinct clue guesses that miss the code; children: `refine` of them.
        clues, code = split_clues(record), record["code"].split()
        want = int(rng.integers(1, num_parents + 1))
        parents = [g for g in distinct(lambda: clue_guess(clues, rng), want) if g != code]
        parents = [p for i, p in enumerate(parents) if p not in parents[:i]] or [
            [x for x in clues[0] if x != code[0]][:1] + code[1:]]
        scores = [match_vector(record, p) for p in parents]
        best = max(map(sum, scores))
        children = distinct(lambda: refine(clues, parents, scores, rng), num_answers)
        # a child must beat every parent; redraw the others' unchanged positions when it ties
        for j, child in enumerate(children):
            for _ in range(20):
                if sum(match_vector(record, child)) > best and child not in children[:j]:
                    break
                child = refine(clues, parents, scores, rng)
            children[j] = child
        return [" ".join(p) for p in parents], [" ".join(c) for c in children]

    example = {"clues": [symbols[0]] * L, "code": symbols[0]}
    words = tuple(dict.fromkeys([*codeword_statement(example).split(), *symbols,
                                 *ANSWER_HINT.split()]))
    return base.Task(
        name=f"codeword{L}", reward_names=tuple(f"pos_{i}" for i in range(1, L + 1)),
        eval_weights_R=np.full((L,), 1.0 / L, np.float32), make_problems=make_problems,
        statement=codeword_statement, answer_hint=ANSWER_HINT, score=score, solved=solved,
        demonstrations=demonstrations, symbols=symbols, answer_len=L, arrays=arrays,
        symbol_reward=symbol_reward, mutation_demonstrations=mutation_demonstrations,
        words=words, max_answers=max_answers, scores_per_symbol=scores_per_symbol)
