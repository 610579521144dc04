"""The three-armed vector bandit of the VPO toy (Bahlous-Boldi et al., arXiv 2605.22817; the
authors' `notebooks/01_vpo_from_scratch`).

Every problem is the same fixed statement; each answer is one arm, A, B or C, with reward
vectors (1, 0), (0, 1) and (0.6, 0.6) (R = 2, w* = (0.5, 0.5)). Under w* the compromise C is best
(0.6 > 0.5), so scalar GRPO collapses every slot onto C; the Dirichlet expected max
E_w[max_j wᵀr_j] is 0.75 for {A, B} but 0.60 for {C, C}, so VPO spreads its slots over the corners
(the authors' notebook's unit checks). Repeated arms inside one generation are duplicates (masked).

Record: {"index": i} (the index only counts problems). Solved (pass@k): w*ᵀr >= 0.6, i.e. the
w*-optimal arm C; the corners are what E_w[max] and reward-space diversity measure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vpo.tasks import base

ARMS = ("A", "B", "C")
ARM_REWARDS_3R = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.6]], np.float32)
ANSWER_HINT = "one arm: A, B or C"
STATEMENT = "Three arms with two scores each: " + " ; ".join(
    f"{arm} {r[0]:g} {r[1]:g}" for arm, r in zip(ARMS, ARM_REWARDS_3R.tolist(), strict=True))


class BanditArrays(NamedTuple):
    """index: int32 [N]; every problem is the same fixed statement."""

    index: np.ndarray


def make_bandit_task(*, max_answers: int = 8) -> base.Task:
    """The bandit `Task` (A = 1, R = 2)."""
    w_R = np.full((2,), 0.5, np.float32)

    def make_problems(seed: int, num: int) -> list[base.Record]:
        del seed
        return [{"index": i} for i in range(num)]

    def statement(record: base.Record) -> str:
        del record
        return STATEMENT

    def arrays(records: Sequence[base.Record]) -> BanditArrays:
        return BanditArrays(np.asarray([r["index"] for r in records], np.int32).reshape(-1))

    def symbol_reward(problem: BanditArrays, symbols_A: jax.Array, mask_A: jax.Array
                      ) -> jax.Array:
        del problem, mask_A
        return jnp.asarray(ARM_REWARDS_3R)[symbols_A[0]]

    def score(records, answers):
        return base.score_symbol_answers(
            records, answers, ARMS, 1, 2, lambda record, words: ARM_REWARDS_3R[
                ARMS.index(words[0])])

    def solved(rewards_R):
        return jnp.dot(jnp.asarray(w_R), jnp.asarray(rewards_R)) >= 0.6 - 1e-6

    def demonstrations(record: base.Record, rng: np.random.Generator,
                       num_answers: int) -> list[str]:
        del record
        arms = [int(a) for a in rng.permutation(len(ARMS))]
        return [ARMS[arms[i % len(ARMS)]] for i in range(num_answers)]

    words = tuple(dict.fromkeys([*STATEMENT.split(), *ARMS, *ANSWER_HINT.split()]))
    return base.Task(
        name="bandit", reward_names=("first", "second"), eval_weights_R=w_R,
        make_problems=make_problems, statement=statement, answer_hint=ANSWER_HINT, score=score,
        solved=solved, demonstrations=demonstrations, symbols=ARMS, answer_len=1, arrays=arrays,
        symbol_reward=symbol_reward, words=words, max_answers=max_answers)
