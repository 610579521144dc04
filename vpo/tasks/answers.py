"""The multi-answer format: `ans_1 <sep> ans_2 <sep> ... ans_m <eos>`, parsed in-graph or on host.

One generation carries up to M answers (VPO, arXiv 2605.22817 §1.3 of the digest). Answer i is the
span between delimiter i-1 and delimiter i, where the delimiters are `sep` tokens and the first
`eos`. A slot is *valid* iff its span exists, is terminated by a delimiter, and holds 1..A tokens:

- missing (the generation ended after fewer answers)       -> invalid
- empty (two delimiters in a row, or `<sep> <eos>`)          -> invalid
- longer than `answer_len` tokens                            -> invalid
- truncated (generation ran out of tokens before a delimiter) -> invalid
- answers after the M-th, and everything after `eos`, are ignored.

Invalid slots are masked, never errors; tasks give them zero reward rows (an implicit format
penalty, as in the paper). `split_answers` is pure jnp (jit/vmap over batch dims);
`split_answer_words` applies the identical rules to decoded text for host-reward tasks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vpo.tasks import vocab as vocab_lib


def split_answers(completion_T: jax.Array, mask_T: jax.Array, *, num_answers: int,
                  answer_len: int, sep_id: int = vocab_lib.SEP, eos_id: int = vocab_lib.EOS
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Split one completion into M answer slots of at most A tokens.

    Args:
      completion_T: int token ids of the generated tokens.
      mask_T: bool, True where a token was generated. Only the leading run of True counts: the
        first False ends the generation (as running out of tokens does).
      num_answers: M (static).
      answer_len: A, the most tokens one answer may hold, delimiter excluded (static).

    Returns:
      answers_MA: int32 answer tokens, left-aligned, `pad` (0) outside the answer and in
        invalid slots.
      answer_mask_MA: bool, True on the tokens of valid answers.
      valid_M: bool, True for the slots that hold a well-formed answer.
    """
    M, A = num_answers, answer_len
    T = completion_T.shape[-1]
    tokens_T = completion_T.astype(jnp.int32)
    live_T = jnp.cumprod(mask_T.astype(jnp.int32)) > 0
    is_eos_T = live_T & (tokens_T == eos_id)
    # Live tokens up to and including the first eos.
    eos_before_T = jnp.cumsum(is_eos_T.astype(jnp.int32)) - is_eos_T.astype(jnp.int32)
    live_T = live_T & (eos_before_T == 0)
    is_delim_T = live_T & ((tokens_T == sep_id) | (tokens_T == eos_id))
    delims_before_T = jnp.cumsum(is_delim_T.astype(jnp.int32)) - is_delim_T.astype(jnp.int32)
    is_content_T = live_T & ~is_delim_T

    slot_T = delims_before_T  # answer index of each content token
    # Position inside the answer: t minus the index just after the previous delimiter.
    t_T = jnp.arange(T, dtype=jnp.int32)
    last_delim_T = jax.lax.cummax(jnp.where(is_delim_T, t_T, -1))
    prev_delim_T = jnp.concatenate([jnp.full((1,), -1, jnp.int32), last_delim_T[:-1]])
    pos_T = t_T - prev_delim_T - 1

    in_range_T = is_content_T & (slot_T < M)
    length_M = jnp.zeros((M,), jnp.int32).at[jnp.where(in_range_T, slot_T, M)].add(
        1, mode="drop")
    num_delims = jnp.sum(is_delim_T.astype(jnp.int32))
    m_M = jnp.arange(M, dtype=jnp.int32)
    valid_M = (m_M < num_delims) & (length_M >= 1) & (length_M <= A)

    keep_T = in_range_T & (pos_T < A)
    row_T = jnp.where(keep_T, slot_T, M)  # out-of-range rows are dropped
    answers_MA = jnp.zeros((M, A), jnp.int32).at[row_T, jnp.clip(pos_T, 0, A - 1)].set(
        tokens_T, mode="drop")
    a_1A = jnp.arange(A, dtype=jnp.int32)[None, :]
    answer_mask_MA = (a_1A < length_M[:, None]) & valid_M[:, None]
    answers_MA = jnp.where(answer_mask_MA, answers_MA, vocab_lib.PAD)
    return answers_MA, answer_mask_MA, valid_M


def first_occurrence(answers_MA: jax.Array, answer_mask_MA: jax.Array,
                     valid_M: jax.Array) -> jax.Array:
    """valid_M with later exact duplicates removed: slot j survives iff no valid i < j equals it.

    Two answers are structurally identical when their token sequences (and so lengths) agree;
    the paper de-duplicates identical solutions inside one generation (`dedup_routes`).
    """
    a_MA = jnp.where(answer_mask_MA, answers_MA, -1)
    same_MM = jnp.all(a_MA[:, None, :] == a_MA[None, :, :], axis=-1)
    M = valid_M.shape[0]
    earlier_MM = jnp.arange(M)[None, :] < jnp.arange(M)[:, None]  # [j, i]: i < j
    dup_M = jnp.any(same_MM & earlier_MM & valid_M[None, :], axis=-1)
    return valid_M & ~dup_M


def split_answer_words(text: str, *, num_answers: int, answer_len: int
                       ) -> list[list[str] | None]:
    """Host twin of `split_answers` on decoded text: M entries, each a token list or None.

    The text is the decoded generation (tokens separated by spaces, `<sep>`/`<eos>` spelled out).
    The rules are those of `split_answers`; a slot is None when invalid. Like `first_occurrence`,
    an answer equal to an earlier valid one is None.
    """
    words = text.split()
    answers: list[list[str] | None] = []
    current: list[str] = []
    for w in words:
        if w in (vocab_lib.SPECIAL_TOKENS[vocab_lib.SEP], vocab_lib.SPECIAL_TOKENS[vocab_lib.EOS]):
            ok = 1 <= len(current) <= answer_len and current not in answers
            answers.append(current if ok else None)
            current = []
            if w == vocab_lib.SPECIAL_TOKENS[vocab_lib.EOS] or len(answers) == num_answers:
                break
        else:
            current.append(w)
    return (answers + [None] * num_answers)[:num_answers]
