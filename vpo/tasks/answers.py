"""The m-answer format, read on the host from text and in the graph from token bytes.

A generation holds its m answers in numbered tags (as the VPO authors' prompts do):

    <answer 1> U R R D </answer 1>
    <answer 2> D D R R </answer 2>

Slot k is the text between the first `<answer k>` and the first `</answer k>` after it; text
outside the tags is ignored. A slot is invalid (masked, zero reward), never an error, when its
open tag is missing, its close tag is missing (truncated generation), or it holds no word.
Words of an answer are maximal runs of bytes other than ASCII whitespace and `<` `>`, and `<` or
`>` alone (so a stray tag inside an answer is a word that no alphabet contains). Symbol tasks
(`Task.symbols`) then require 1..A words, each a symbol, and drop later duplicates.

The generation's text is the first `num_bytes` bytes of its tokens' bytes (`Tokenizer.
token_bytes`, special tokens adding none): the host functions read
`tokenizer.completion_text(ids, max_bytes=num_bytes)` and the graph functions the same bytes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

MAX_TAG = 9  # one-digit tag numbers
_SPACE = b" \t\n\r\x0b\x0c"
_WORD = re.compile(r"[<>]|[^ \t\n\r\x0b\x0c<>]+")


def open_tag(k: int) -> str:
    return f"<answer {k}>"


def close_tag(k: int) -> str:
    return f"</answer {k}>"


def tag_strings(max_answers: int = MAX_TAG) -> tuple[str, ...]:
    """Every open and close tag up to `max_answers` (added tokens of the word-level tokenizer)."""
    return tuple(t for k in range(1, max_answers + 1) for t in (open_tag(k), close_tag(k)))


def format_answers(answers: Sequence[str]) -> str:
    """The completion text of m answers: `<answer k> a_k </answer k>`, one per line."""
    return "\n".join(f"{open_tag(k)} {a} {close_tag(k)}" for k, a in enumerate(answers, 1))


def parse_answers(text: str, num_answers: int) -> list[str | None]:
    """Slot contents (stripped) of a generation's text; None where missing, truncated or empty."""
    out: list[str | None] = []
    for k in range(1, num_answers + 1):
        start = text.find(open_tag(k))
        end = -1 if start < 0 else text.find(close_tag(k), start + len(open_tag(k)))
        content = None if end < 0 else text[start + len(open_tag(k)):end].strip(" \t\n\r\x0b\x0c")
        out.append(content or None)
    return out


def answer_words(answer: str) -> list[str]:
    """The words of an answer as the in-graph reader splits them (see the module docstring)."""
    return _WORD.findall(answer)


def without_duplicates(answers: Sequence[str | None]) -> list[str | None]:
    """Later answers equal (word by word) to an earlier one become None."""
    seen: list[list[str]] = []
    out: list[str | None] = []
    for a in answers:
        words = None if a is None else answer_words(a)
        out.append(None if words is None or words in seen else a)
        if words is not None and words not in seen:
            seen.append(words)
    return out


# -- in the graph ---------------------------------------------------------------------------

def completion_bytes(tokens_T: jax.Array, mask_T: jax.Array, bytes_VW: jax.Array,
                     length_V: jax.Array, num_bytes: int) -> tuple[jax.Array, jax.Array]:
    """The generation's text as bytes → (bytes_X int32, live_X bool), X = num_bytes.

    Token t (where mask_T; only the leading run of True counts) writes its length_V bytes at the
    running offset; ids outside the byte table (a model vocabulary padded beyond the
    tokenizer's) add none; bytes past X are cut. Positions at or after the end hold 0 and live
    False.
    """
    X = num_bytes
    live_T = jnp.cumprod(mask_T.astype(jnp.int32)) > 0
    V = bytes_VW.shape[0]
    known_T = (tokens_T >= 0) & (tokens_T < V)  # ids past the tokenizer (a padded model vocab)
    tok_T = jnp.clip(tokens_T.astype(jnp.int32), 0, V - 1)
    len_T = jnp.where(live_T & known_T, length_V[tok_T], 0)
    off_T = jnp.cumsum(len_T) - len_T
    W = bytes_VW.shape[1]
    j_W = jnp.arange(W, dtype=jnp.int32)
    pos_TW = jnp.where(j_W[None, :] < len_T[:, None], off_T[:, None] + j_W[None, :], X)
    bytes_X = jnp.zeros((X,), jnp.int32).at[pos_TW].set(
        bytes_VW[tok_T].astype(jnp.int32), mode="drop")
    return bytes_X, jnp.arange(X) < jnp.sum(len_T)


def _shifted(bytes_X: jax.Array, width: int) -> jax.Array:
    """[X, width] windows: row i holds bytes i .. i+width-1 (-1 past the end)."""
    X = bytes_X.shape[0]
    padded = jnp.concatenate([bytes_X, jnp.full((width,), -1, jnp.int32)])
    return jnp.stack([jax.lax.dynamic_slice_in_dim(padded, j, X) for j in range(width)], axis=1)


def _matches(win_XW: jax.Array, pattern: bytes, at: int = 0) -> jax.Array:
    """[X] True where the window holds `pattern` starting at column `at`."""
    p = jnp.asarray(np.frombuffer(pattern, np.uint8).astype(np.int32))
    return jnp.all(win_XW[:, at:at + len(pattern)] == p[None, :], axis=1)


def answer_spans(bytes_X: jax.Array, live_X: jax.Array, num_answers: int
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Content spans of the m tags → (start_M, end_M int32, found_M bool): slot k's content is
    bytes [start, end), after the first `<answer k>`, before the first `</answer k>` after it."""
    X = bytes_X.shape[0]
    b_X = jnp.where(live_X, bytes_X, -1)
    win = _shifted(b_X, 11)  # "</answer 9>" is 11 bytes
    pos_X = jnp.arange(X, dtype=jnp.int32)
    k_M = jnp.arange(1, num_answers + 1, dtype=jnp.int32)
    digit_X_open, digit_X_close = win[:, 8] - ord("0"), win[:, 9] - ord("0")
    is_open_X = _matches(win, b"<answer ") & (win[:, 9] == ord(">"))
    is_close_X = _matches(win, b"</answer ") & (win[:, 10] == ord(">"))
    open_MX = is_open_X[None, :] & (digit_X_open[None, :] == k_M[:, None])
    start_M = jnp.min(jnp.where(open_MX, pos_X[None, :], X), axis=1) + 10
    close_MX = (is_close_X[None, :] & (digit_X_close[None, :] == k_M[:, None])
                & (pos_X[None, :] >= start_M[:, None]))
    end_M = jnp.min(jnp.where(close_MX, pos_X[None, :], X + 11), axis=1)
    found_M = (start_M <= X) & (end_M < X)
    return start_M, end_M, found_M


def symbol_table(symbols: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(bytes_VW int32, length_V int32) of an alphabet (ASCII words), W = the longest."""
    W = max(len(s) for s in symbols)
    table = np.full((len(symbols), W), -2, np.int32)
    for i, s in enumerate(symbols):
        table[i, :len(s)] = np.frombuffer(s.encode(), np.uint8)
    return table, np.array([len(s) for s in symbols], np.int32)


def read_symbols(bytes_X: jax.Array, live_X: jax.Array, symbols_VW: jax.Array,
                 symbol_len_V: jax.Array, *, num_answers: int, answer_len: int
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The m answers of a generation as symbol ids → (symbols_MA int32, mask_MA, valid_M).

    valid_M: slot found, 1..A words, every word a symbol (`answer_words` rules). Invalid slots
    hold zeros and an all-False mask. Duplicates are NOT removed here (`first_occurrence`).
    """
    X = bytes_X.shape[0]
    M, A = num_answers, answer_len
    V, W = symbols_VW.shape
    b_X = jnp.where(live_X, bytes_X, -1)
    space = jnp.asarray(np.frombuffer(_SPACE, np.uint8).astype(np.int32))
    angle_X = (b_X == ord("<")) | (b_X == ord(">"))
    boundary_X = jnp.any(b_X[:, None] == space[None, :], axis=1) | angle_X | (b_X < 0)
    prev_X = jnp.concatenate([jnp.ones((1,), bool), boundary_X[:-1]])
    start_X = ~boundary_X & prev_X  # first byte of a word of non-boundary bytes
    pos_X = jnp.arange(X, dtype=jnp.int32)
    next_X = jax.lax.cummin(jnp.where(boundary_X, pos_X, X), reverse=True)
    wlen_X = next_X - pos_X
    win = _shifted(b_X, W)
    col_W = jnp.arange(W)
    eq_XV = jnp.all((win[:, None, :] == symbols_VW[None, :, :])
                    | (col_W[None, None, :] >= symbol_len_V[None, :, None]), axis=-1)
    eq_XV = eq_XV & (wlen_X[:, None] == symbol_len_V[None, :])
    sym_X = jnp.argmax(eq_XV, axis=1).astype(jnp.int32)
    known_X = jnp.any(eq_XV, axis=1)

    start_M, end_M, found_M = answer_spans(bytes_X, live_X, M)
    inside_MX = (pos_X[None, :] >= start_M[:, None]) & (pos_X[None, :] < end_M[:, None])
    word_MX = inside_MX & start_X[None, :]
    bad_M = jnp.any(inside_MX & (angle_X[None, :] | (start_X & ~known_X)[None, :]), axis=1)
    count_M = jnp.sum(word_MX.astype(jnp.int32), axis=1)
    valid_M = found_M & ~bad_M & (count_M >= 1) & (count_M <= A)
    idx_MX = jnp.cumsum(word_MX.astype(jnp.int32), axis=1) - 1
    row_MX = jnp.where(word_MX & valid_M[:, None], jnp.arange(M)[:, None], M)
    symbols_MA = jnp.zeros((M, A), jnp.int32).at[row_MX, jnp.clip(idx_MX, 0, A - 1)].set(
        jnp.broadcast_to(sym_X[None, :], (M, X)), mode="drop")
    mask_MA = (jnp.arange(A)[None, :] < count_M[:, None]) & valid_M[:, None]
    return jnp.where(mask_MA, symbols_MA, 0), mask_MA, valid_M


def first_occurrence(symbols_MA: jax.Array, mask_MA: jax.Array, valid_M: jax.Array
                     ) -> jax.Array:
    """valid_M with later exact duplicates removed: slot j survives iff no valid i < j equals it
    (the paper de-duplicates identical solutions inside one generation)."""
    a_MA = jnp.where(mask_MA, symbols_MA, -1)
    same_MM = jnp.all(a_MA[:, None, :] == a_MA[None, :, :], axis=-1)
    M = valid_M.shape[0]
    earlier_MM = jnp.arange(M)[None, :] < jnp.arange(M)[:, None]  # [j, i]: i < j
    return valid_M & ~jnp.any(same_MM & earlier_MM & valid_M[None, :], axis=-1)


def expression_words(text: str | None, *, max_words: int) -> list[str] | None:
    """An expression answer's words (`answer_words`), or None when the slot is missing, empty or
    longer than `max_words` words (the arithmetic tasks' invalid slots)."""
    words = None if text is None else answer_words(text)
    return words if words and len(words) <= max_words else None
