"""The three-armed vector bandit of the VPO toy (digest §1.10, `notebooks/01_vpo_from_scratch`).

One fixed prompt `<bos> bandit m<k>`; each answer is a single token A, B or C with reward vectors
(1, 0), (0, 1) and (0.6, 0.6) (R = 2, w* = (0.5, 0.5)). Under w* the compromise C is best
(0.6 > 0.5), so scalar GRPO collapses every slot onto C; the Dirichlet expected max
E_w[max_j wᵀr_j] is 0.75 for {A, B} but 0.60 for {C, C}, so VPO spreads its slots over the corners
(digest §8 unit checks). Repeated arms inside one generation are duplicates (masked).

Solved (pass@k): the answer attains the w*-optimal score 0.6 (arm C); the corners are what
E_w[max] and reward-space diversity measure.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from vpo.tasks import answers as answers_lib
from vpo.tasks import base, prompting
from vpo.tasks import vocab as vocab_lib

ARMS = ("A", "B", "C")
ARM_REWARDS_3R = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.6]], np.float32)
PROMPT_WORD = "bandit"


class BanditProblems(NamedTuple):
    """index: int32 [N]; every problem is the same fixed prompt (the index only counts them)."""

    index: np.ndarray


def make_bandit_task(*, max_answers: int = 8) -> base.Task:
    """The bandit `Task` (P = 3, A = 1, R = 2)."""
    vocab = vocab_lib.make_vocab(vocab_lib.common_tokens(max_answers) + (PROMPT_WORD,) + ARMS)
    arm0 = vocab.id(ARMS[0])
    w_R = np.full((2,), 0.5, np.float32)

    def make_problems(seed: int, num: int) -> BanditProblems:
        del seed
        return BanditProblems(np.arange(num, dtype=np.int32))

    prompts = prompting.prompt_functions(
        vocab, lambda problem: [prompting.fixed([vocab.id(PROMPT_WORD)])], statement_len=1,
        answer_len=1, num_rewards=2, max_answers=max_answers)

    def reward(problem, completion_T, mask_T, num_answers: int):
        del problem
        answers_MA, amask_MA, valid_M = answers_lib.split_answers(
            completion_T, mask_T, num_answers=num_answers, answer_len=1)
        arm_M = answers_MA[:, 0] - arm0
        valid_M = valid_M & (arm_M >= 0) & (arm_M < len(ARMS))
        valid_M = answers_lib.first_occurrence(answers_MA, amask_MA, valid_M)
        rewards_MR = jnp.asarray(ARM_REWARDS_3R)[jnp.clip(arm_M, 0, len(ARMS) - 1)]
        return jnp.where(valid_M[:, None], rewards_MR, 0.0), valid_M

    def solved(rewards_R):
        return jnp.dot(jnp.asarray(w_R), rewards_R) >= 0.6 - 1e-6

    def demonstrations(problem, rng: np.random.Generator, num_answers: int) -> list[int]:
        del problem
        arms = [int(a) for a in rng.permutation(len(ARMS))]
        picks = [arms[i % len(ARMS)] for i in range(num_answers)]
        return base.join_answers([[arm0 + a] for a in picks])

    return base.Task(
        name="bandit", vocab=vocab, reward_names=("first", "second"), eval_weights_R=w_R,
        answer_len=1, make_problems=make_problems, reward=reward, solved=solved,
        demonstrations=demonstrations, max_answers=max_answers, **prompts._asdict())
