"""Host-side building blocks of mutation-prompt demonstrations (parents → improved children).

Evolutionary search (`vpo.search.ingraph`) shows the policy K scored parents in
`task.mutation_prompt` and asks for m better answers. A policy trained only on plain prompts ignores
the parents, so SFT also needs demonstrations of the mutation step. A task's
`mutation_demonstrations(problem, rng, num_parents, num_answers) -> (parents, children)` draws m
improved children from its reference solutions and 1..K weaker parents as random edits of them
(`weaker_parents`); the children are then, for the parents, a repair of a few edits.
`vpo.rl.sft.mutation_demonstration_set` scores both sides with the task's in-graph reward and keeps
only pairs in which every child beats every parent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def corrupt(answer: Sequence[str], alphabet: Sequence[str], rng: np.random.Generator, *,
            num_edits: int, max_len: int) -> list[str]:
    """`num_edits` random edits of an answer: substitute, insert or delete a token, or swap two
    neighbours; the result keeps 1..max_len tokens (an edit that would break that is skipped)."""
    out = list(answer)
    for _ in range(num_edits):
        kind = int(rng.integers(4))
        i = int(rng.integers(len(out)))
        if kind == 0:
            out[i] = str(alphabet[rng.integers(len(alphabet))])
        elif kind == 1 and len(out) < max_len:
            out.insert(int(rng.integers(len(out) + 1)), str(alphabet[rng.integers(len(alphabet))]))
        elif kind == 2 and len(out) > 1:
            del out[i]
        elif kind == 3 and len(out) > 1:
            j = min(i + 1, len(out) - 1) if i < len(out) - 1 else i - 1
            out[i], out[j] = out[j], out[i]
    return out


def weaker_parents(sources: Sequence[Sequence[str]], score: Callable[[list[str]], float],
                   threshold: float, alphabet: Sequence[str], rng: np.random.Generator, *,
                   num_parents: int, max_len: int, exclude: Sequence[Sequence[str]] = (),
                   max_edits: int = 3, draws: int = 3, tries: int = 40) -> list[list[str]]:
    """1..num_parents distinct parents (count uniform), each 0..max_edits random edits of a
    random source with `score(parent) < threshold` (score: the host twin of the fitness) and
    not in `exclude` (the children). Each parent is the best of `draws` such candidates, so
    parents are near misses, like the fittest members that search selects. Fewer come back when
    `tries` draws do not yield enough."""
    want = int(rng.integers(1, num_parents + 1))
    known = [list(s) for s in exclude]
    parents: list[list[str]] = []
    pool: list[tuple[float, list[str]]] = []
    for _ in range(tries):
        if len(parents) == want:
            break
        src = sources[rng.integers(len(sources))]
        cand = corrupt(src, alphabet, rng, num_edits=int(rng.integers(max_edits + 1)),
                       max_len=max_len)
        if cand in parents or cand in known or any(cand == c for _, c in pool):
            continue
        s = score(cand)
        if s < threshold:
            pool.append((s, cand))
        if len(pool) == draws:
            parents.append(max(pool, key=lambda p: p[0])[1])
            pool = []
    return parents
