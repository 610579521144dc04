"""In-graph prompt assembly shared by the tasks: packing, left padding, rendering parents.

Prompts are fixed-length int32 token arrays, LEFT-padded with `pad`, so every prompt of a task
ends at the same position and generation starts right after it. Variable-length pieces (parent
answers in a mutation prompt) are written as (tokens, keep-mask) segments of static size and
packed: kept tokens keep their order and are pushed to the right end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vpo.tasks import vocab as vocab_lib


def pack_left_padded(segments: list[tuple[jax.Array, jax.Array]], length: int) -> jax.Array:
    """Concatenate the kept tokens of `segments` and left-pad them to `length`.

    Args:
      segments: (tokens_X int, keep_X bool) pairs of static sizes X.
      length: output length; must be >= the summed segment sizes (checked statically).

    Returns:
      tokens_P: int32, `pad` on the left, then the kept tokens in order.
    """
    tokens_L = jnp.concatenate([jnp.asarray(t, jnp.int32).reshape(-1) for t, _ in segments])
    keep_L = jnp.concatenate([jnp.broadcast_to(jnp.asarray(k, bool), jnp.shape(t)).reshape(-1)
                              for t, k in segments])
    L = tokens_L.shape[0]
    if length < L:
        raise ValueError(f"length={length} is shorter than the {L} tokens the segments can hold; "
                         "raise the prompt length")
    n = jnp.sum(keep_L.astype(jnp.int32))
    pos_L = jnp.cumsum(keep_L.astype(jnp.int32)) - 1 + (length - n)
    pos_L = jnp.where(keep_L, pos_L, length)
    return jnp.full((length,), vocab_lib.PAD, jnp.int32).at[pos_L].set(tokens_L, mode="drop")


def fixed(ids: list[int] | np.ndarray | jax.Array) -> tuple[jax.Array, jax.Array]:
    """A segment of tokens that are always kept."""
    ids = jnp.asarray(ids, jnp.int32)
    return ids, jnp.ones(ids.shape, bool)


def quantize_tenths(values_R: jax.Array) -> jax.Array:
    """round(10 * v) clipped to 0..10 (int32): the index of a score token `q0..q10`."""
    return jnp.clip(jnp.round(values_R * 10.0), 0, 10).astype(jnp.int32)


def parents_segment(vocab: vocab_lib.Vocab, parent_answers_QA: jax.Array,
                    parent_mask_QA: jax.Array, parent_rewards_QR: jax.Array
                    ) -> tuple[jax.Array, jax.Array]:
    """Render Q parents as `parent <answer tokens> score q.. q..` (one score token per reward).

    A parent whose mask is all False (an empty slot) is left out entirely. Static size
    Q * (A + R + 2) tokens (see `parents_len`).
    """
    Q, A = parent_answers_QA.shape
    R = parent_rewards_QR.shape[-1]
    present_Q = jnp.any(parent_mask_QA, axis=-1)
    q0 = vocab.id(vocab_lib.score_token(0))
    scores_QR = q0 + quantize_tenths(parent_rewards_QR.astype(jnp.float32))
    tokens_QX = jnp.concatenate([
        jnp.full((Q, 1), vocab.id(vocab_lib.PARENT), jnp.int32),
        parent_answers_QA.astype(jnp.int32),
        jnp.full((Q, 1), vocab.id(vocab_lib.SCORE), jnp.int32),
        scores_QR], axis=-1)
    keep_QX = jnp.concatenate([
        present_Q[:, None], parent_mask_QA & present_Q[:, None],
        jnp.broadcast_to(present_Q[:, None], (Q, R + 1))], axis=-1)
    return tokens_QX, keep_QX


def parents_len(num_parents: int, answer_len: int, num_rewards: int) -> int:
    """Static token count of `parents_segment`: Q * (A + R + 2)."""
    return num_parents * (answer_len + num_rewards + 2)


def answer_count(vocab: vocab_lib.Vocab, num_answers: int, max_answers: int
                 ) -> tuple[jax.Array, jax.Array]:
    """The `m<k>` segment; raises if `num_answers` is outside 1..max_answers."""
    if not 1 <= num_answers <= max_answers:
        raise ValueError(f"num_answers={num_answers}: this task's vocabulary requests 1.."
                         f"{max_answers} answers; lower num_answers or build the task with a "
                         "larger max_answers")
    return fixed([vocab.id(vocab_lib.answer_count_token(num_answers))])


class PromptFunctions(NamedTuple):
    """The standard prompt layout of a task, as the `Task` fields of the same names."""

    prompt_len: int
    prompt_tokens: Callable[..., jax.Array]
    mutation_prompt: Callable[..., jax.Array]
    mutation_prompt_len: Callable[[int], int]


def prompt_functions(vocab: vocab_lib.Vocab, statement: Callable[[Any], list],
                     *, statement_len: int, answer_len: int, num_rewards: int,
                     max_answers: int) -> PromptFunctions:
    """Prompt builders around a task's problem statement (its segments, `statement_len` tokens):

        prompt:           <bos> <statement> m<k>                            P = S + 2
        mutation prompt:  <bos> evolve <statement> <parents> m<k>           P2 = P + 1 + Q(A+R+2)

    with <parents> = `parents_segment` (Q parents, absent ones dropped) and everything packed
    and LEFT-padded to the static length.
    """
    prompt_len = statement_len + 2

    def prompt_tokens(problem, num_answers: int) -> jax.Array:
        return pack_left_padded([fixed([vocab.bos_id]), *statement(problem),
                                 answer_count(vocab, num_answers, max_answers)], prompt_len)

    def mutation_prompt_len(num_parents: int) -> int:
        return prompt_len + 1 + parents_len(num_parents, answer_len, num_rewards)

    def mutation_prompt(problem, parent_answers_QA, parent_mask_QA, parent_rewards_QR,
                        num_answers: int) -> jax.Array:
        return pack_left_padded(
            [fixed([vocab.bos_id, vocab.id(vocab_lib.EVOLVE)]), *statement(problem),
             parents_segment(vocab, parent_answers_QA, parent_mask_QA, parent_rewards_QR),
             answer_count(vocab, num_answers, max_answers)],
            mutation_prompt_len(parent_answers_QA.shape[0]))

    return PromptFunctions(prompt_len, prompt_tokens, mutation_prompt, mutation_prompt_len)
