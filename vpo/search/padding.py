"""Search prompts as one left-padded batch, at a few compiled lengths."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vpo.errors import ConfigError


def bucket(n: int) -> int:
    """Prompt lengths rounded up to a power of two (≥ 32), so the sampler compiles a few times."""
    return max(32, 1 << (n - 1).bit_length())


def left_pad_rows(rows: Sequence[Sequence[int]], pad_id: int, max_seq_len: int,
                  max_new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompts_BP int32, mask_BP bool): `rows` left-padded to P = the bucket of the longest
    (at most the room `max_seq_len − max_new_tokens` leaves); a ConfigError when the longest
    does not fit."""
    longest = max(len(r) for r in rows)
    room = max_seq_len - max_new_tokens
    if longest > room:
        raise ConfigError(f"model.max_seq_len: a search prompt of {longest} tokens plus "
                          f"{max_new_tokens} new tokens exceeds {max_seq_len}; lower "
                          "search.parents or the generation budget")
    P = min(bucket(longest), room)
    prompts_BP = np.full((len(rows), P), pad_id, np.int32)
    mask_BP = np.zeros((len(rows), P), bool)
    for b, r in enumerate(rows):
        prompts_BP[b, P - len(r):], mask_BP[b, P - len(r):] = r, True
    return prompts_BP, mask_BP
