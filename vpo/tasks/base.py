"""The task contract: one frozen dataclass of data and pure functions (no subclassing, no registry).

A task is built by a factory (`maze.make_maze_task(...)`, `program.make_program_task(...)`, ...)
that closes its configuration over the functions below. Conventions (DESIGN.md dimension key):
N problems, P prompt tokens, T generated tokens, M answers per generation, A tokens per answer,
R reward components, Q parents in a mutation prompt.

Answer format (see `vpo.tasks.answers`): `ans_1 <sep> ans_2 <sep> ... ans_M <eos>`, so the
generation budget is `completion_len(M) = M * (A + 1)` tokens.

Problems are pytrees (NamedTuples) of numpy arrays with a leading N axis; the in-graph functions
take ONE problem (the same pytree without the N axis) and callers `jax.vmap` them. `num_answers`
(and the task's A) are static Python ints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from vpo.tasks import vocab as vocab_lib

Problem = Any  # a pytree (NamedTuple) of arrays; with a leading N axis from make_problems


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
    """A task with vector rewards in [0, 1]^R (higher is better).

    Fields:
      name: short identifier (logs, file names).
      vocab: the task's word-level vocabulary (ids 0..3 = pad, bos, eos, sep).
      reward_names: names of the R reward components, in order.
      eval_weights_R: the fixed scalarization w* (non-negative, sums to 1): what GRPO trains on
        and what best@k scores (`score = w*ᵀ r`).
      prompt_len: P; `prompt_tokens` returns exactly P tokens, LEFT-padded with pad.
      answer_len: A, the most tokens of one answer, delimiter excluded.
      make_problems(seed, num) -> Problems: host-side and deterministic in `seed`; numpy arrays
        with leading dim N = num.
      prompt_tokens(problem, num_answers) -> tokens_P: pure jnp, int32; ends with the `m<k>`
        token that requests k = num_answers answers.
      reward(problem, completion_T, mask_T, num_answers) -> (rewards_MR float32,
        solution_mask_M bool): pure jnp; invalid and duplicate slots get zero rows and False.
        None for host tasks.
      solved(rewards_R) -> bool: pure jnp predicate counted by pass@k.
      demonstrations(problem, rng, num_answers) -> list[int]: host-side SFT target completion
        (answer ids with `sep` between answers and a final `eos`), diverse valid answers.
      mutation_prompt(problem, parent_answers_QA, parent_mask_QA, parent_rewards_QR,
        num_answers) -> tokens_P2: pure jnp prompt for evolutionary search that shows the Q
        parents (answer tokens + rewards quantised to tenths as `q0..q10` tokens) and asks for
        `num_answers` improved answers; LEFT-padded to `mutation_prompt_len(Q)`.
      mutation_prompt_len(num_parents) -> int: the static length P2 of `mutation_prompt`.
      host_reward(problem, text, num_answers) -> (rewards_MR np.float32, solution_mask_M
        np.bool_): host tasks only, on the decoded generation text. None for in-graph tasks.
      mutation_demonstrations(problem, rng, num_parents, num_answers) -> (parents, children):
        host-side material for SFT on mutation prompts (`vpo.sft.mutation_demonstration_set`):
        1..num_parents weaker parent answers and num_answers distinct improved child answers
        (lists of ids), drawn from the task's reference solutions. The scores the prompt shows
        are computed later by `reward`. None where the task has none (SFT then uses plain
        prompts only).
      max_answers: the largest num_answers the vocabulary can request (tokens `m1..m<max>`).
    """

    name: str
    vocab: vocab_lib.Vocab
    reward_names: tuple[str, ...]
    eval_weights_R: np.ndarray
    prompt_len: int
    answer_len: int
    make_problems: Callable[[int, int], Problem]
    prompt_tokens: Callable[..., Any]
    reward: Callable[..., Any] | None
    solved: Callable[[Any], Any]
    demonstrations: Callable[..., list[int]]
    mutation_prompt: Callable[..., Any]
    mutation_prompt_len: Callable[[int], int]
    host_reward: Callable[..., Any] | None = None
    mutation_demonstrations: Callable[..., tuple[list[list[int]], list[list[int]]]] | None = None
    max_answers: int = 8

    def __post_init__(self):
        w = np.asarray(self.eval_weights_R, np.float32)
        object.__setattr__(self, "eval_weights_R", w)
        R = len(self.reward_names)
        if w.shape != (R,):
            raise ValueError(f"{self.name}: eval_weights_R has shape {w.shape} but reward_names "
                             f"has {R} entries; give one weight per reward component")
        if np.any(w < 0) or not np.isclose(w.sum(), 1.0, atol=1e-5):
            raise ValueError(f"{self.name}: eval_weights_R must be non-negative and sum to 1; "
                             f"got {w.tolist()}")
        if (self.reward is None) == (self.host_reward is None):
            raise ValueError(f"{self.name}: set exactly one of `reward` (in-graph jnp) and "
                             "`host_reward` (Python on decoded text)")
        for field in ("prompt_len", "answer_len", "max_answers"):
            if getattr(self, field) < 1:
                raise ValueError(f"{self.name}: {field} must be >= 1; got {getattr(self, field)}")

    @property
    def num_rewards(self) -> int:
        """R."""
        return len(self.reward_names)

    @property
    def is_host(self) -> bool:
        """True when the reward runs in Python on decoded text (one host boundary per step)."""
        return self.reward is None

    def completion_len(self, num_answers: int) -> int:
        """T budget for `num_answers` answers: M * (A + 1) (each answer plus its delimiter)."""
        self.check_num_answers(num_answers)
        return num_answers * (self.answer_len + 1)

    def check_num_answers(self, num_answers: int) -> None:
        """Raise a ValueError naming `num_answers` when the vocabulary cannot request it."""
        if not 1 <= num_answers <= self.max_answers:
            raise ValueError(f"{self.name}: num_answers={num_answers} must be in 1.."
                             f"{self.max_answers}; build the task with a larger max_answers")


def join_answers(answers: list[list[int]]) -> list[int]:
    """The completion ids of answers: `a_1 <sep> a_2 ... a_m <eos>`."""
    out: list[int] = []
    for i, a in enumerate(answers):
        out.extend(a)
        out.append(vocab_lib.EOS if i == len(answers) - 1 else vocab_lib.SEP)
    return out


def index_problem(problems: Problem, i: int) -> Problem:
    """Problem i of a batched Problems pytree (numpy), e.g. for `demonstrations`/`host_reward`."""
    return type(problems)(*(np.asarray(x)[i] for x in problems))


def encode_completion(vocab: vocab_lib.Vocab, completion: str | list[int], length: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(tokens_T int32, mask_T bool) of a completion (text or ids) right-padded to T = length,
    as the sampler returns it; e.g. to score a hand-written or demonstrated completion."""
    ids = vocab.encode(completion) if isinstance(completion, str) else list(completion)
    if len(ids) > length:
        raise ValueError(f"the completion has {len(ids)} tokens but length={length}; pass a "
                         "larger length (task.completion_len(num_answers))")
    tokens_T = np.zeros((length,), np.int32)
    tokens_T[:len(ids)] = ids
    return tokens_T, np.arange(length) < len(ids)
