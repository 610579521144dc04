"""Sequence packing for the update's log-prob pass: the G completions of a prompt, of ragged
real lengths, laid end to end into `rows` ≤ G rows instead of G rows of the full budget T.

Packing without cross-contamination (Krell et al., 2021, arXiv 2107.02027): every completion
is a segment with its own id; a token attends to the prompt's shared prefix and causally to
the earlier tokens of its own segment only, and its positions restart where its prompt ends
(`Decoder.extend(segment_ids_BGO=...)`), so each log-prob is the padded layout's.

Layout. Completion g of real length L_g (up to its last real token, `mask_BGT`) predicts its
first token from the prompt's last hidden state and token t ≥ 1 from token t − 1, so the
decoder reads only its inputs y_0 … y_{L_g−2}: a segment of n_g = max(L_g − 1, 0) slots. A row
holds W = T − 1 slots, the most one segment needs, so a completion never straddles rows.
Segments are assigned by first-fit decreasing (Johnson, 1973): longest first, each into the
first row with room. The row count `rows` is static; `PackPlan.rows_needed_B` says whether a batch
fits, and a batch that does not is never packed (`vpo.rl.step.completion_logp` then takes the
padded path: no token is dropped).

Dimension key: B prompts, G completions per prompt, T completion budget, W = T − 1 slots per
row, N = rows·W slots per prompt. The packed rows of a prompt have no letter of their own:
packed arrays are [B, rows, W] and named without a suffix.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

NO_SEGMENT = -1  # segment id of the unused slots at the end of a row


class PackPlan(NamedTuple):
    """Where each completion's segment lies; rows counted as if G were available (first fit
    then places a segment in the same row whatever the row count, as long as it fits)."""

    row_BG: jax.Array  # int32, row of completion g's segment
    offset_BG: jax.Array  # int32, its first slot in that row
    size_BG: jax.Array  # int32, n_g = max(L_g − 1, 0) slots
    rows_needed_B: jax.Array  # int32, rows that hold a non-empty segment of prompt b

    def fits(self, rows: int) -> jax.Array:
        """bool scalar: every prompt's segments lie in its first `rows` rows."""
        return jnp.all(self.rows_needed_B <= rows)


def plan_rows(mask_BGT) -> PackPlan:
    """First-fit decreasing assignment of each completion's segment to rows of W = T − 1 slots.

    L_g = 1 + the index of completion g's last real token (0 when it has none); every token
    before it is packed whether or not it is masked, as the padded layout computes it.
    """
    B, G, T = mask_BGT.shape
    W = T - 1
    t_T = jnp.arange(1, T + 1, dtype=jnp.int32)
    length_BG = jnp.max(jnp.where(mask_BGT, t_T, 0), axis=-1)
    size_BG = jnp.maximum(length_BG - 1, 0)
    order_BG = jnp.argsort(-size_BG, axis=1, stable=True)
    row_ids_G = jnp.arange(G, dtype=jnp.int32)

    def place(free_BG, g_B):  # free_BG: free slots of each of G rows
        s_B = jnp.take_along_axis(size_BG, g_B[:, None], axis=1)[:, 0]
        row_B = jnp.argmax(free_BG >= s_B[:, None], axis=1).astype(jnp.int32)  # an empty row fits
        off_B = W - jnp.take_along_axis(free_BG, row_B[:, None], axis=1)[:, 0]
        taken_BG = jnp.where(row_ids_G[None, :] == row_B[:, None], s_B[:, None], 0)
        return free_BG - taken_BG, (row_B, off_B)

    _, (row_GB, off_GB) = jax.lax.scan(place, jnp.full((B, G), W, jnp.int32), order_BG.T)
    b_BG = jnp.broadcast_to(jnp.arange(B)[:, None], (B, G))
    row_BG = jnp.zeros((B, G), jnp.int32).at[b_BG, order_BG].set(row_GB.T)
    offset_BG = jnp.zeros((B, G), jnp.int32).at[b_BG, order_BG].set(off_GB.T)
    rows_needed_B = jnp.max(jnp.where(size_BG > 0, row_BG + 1, 0), axis=1)
    return PackPlan(row_BG, offset_BG, size_BG, rows_needed_B)


def _slots_BGW(plan: PackPlan, rows: int, W: int):  # noqa: N802  (shape suffix)
    """(slot_BGW, valid_BGW): the packed slot (row·W + offset + s) of segment input s of each
    completion, and whether s is one of its n_g inputs in the first `rows` rows."""
    s_W = jnp.arange(W, dtype=jnp.int32)
    valid = (s_W[None, None, :] < plan.size_BG[..., None]) & (plan.row_BG < rows)[..., None]
    slot = (plan.row_BG * W + plan.offset_BG)[..., None] + s_W[None, None, :]
    return slot, valid


def pack(tokens_BGT, plan: PackPlan, rows: int):
    """Completions → packed rows: (inputs, targets, segment), each [B, rows, W].

    Slot s of completion g's segment holds input y_s and target y_{s+1} (s < n_g), segment id
    g; unused slots hold token 0 and segment id `NO_SEGMENT`. Segments beyond `rows` rows are
    left out: check `plan.fits(rows)` first.
    """
    B, G, T = tokens_BGT.shape
    W = T - 1
    slot_BGW, valid_BGW = _slots_BGW(plan, rows, W)
    slot_BGW = jnp.where(valid_BGW, slot_BGW, rows * W)  # out of range: dropped by the scatter
    b_BGW = jnp.broadcast_to(jnp.arange(B)[:, None, None], slot_BGW.shape)
    g_BGW = jnp.broadcast_to(jnp.arange(G, dtype=jnp.int32)[None, :, None], slot_BGW.shape)

    def scatter(values_BGW, fill):
        out_BN = jnp.full((B, rows * W), fill, values_BGW.dtype)
        return out_BN.at[b_BGW, slot_BGW].set(values_BGW, mode="drop").reshape(B, rows, W)

    return (scatter(tokens_BGT[:, :, :-1], 0), scatter(tokens_BGT[:, :, 1:], 0),
            scatter(g_BGW, NO_SEGMENT))


def unpack(x, first_BG, plan: PackPlan):
    """Per-slot values x [B, rows, W] of the packed rows (the prediction of each slot's target)
    → x_BGT.

    Token 0 of completion g takes `first_BG` (predicted from the prompt), token t ≥ 1 its
    segment's slot t − 1 for t ≤ n_g, and 0 after its last real token.
    """
    B, rows, W = x.shape
    slot_BGW, valid_BGW = _slots_BGW(plan, rows, W)
    x_BN = x.reshape(B, rows * W)
    G = first_BG.shape[1]
    taken = jnp.take_along_axis(x_BN, jnp.where(valid_BGW, slot_BGW, 0).reshape(B, G * W),
                                axis=1).reshape(B, G, W)
    rest_BGW = jnp.where(valid_BGW, taken, jnp.zeros((), x.dtype))
    return jnp.concatenate([first_BG[..., None].astype(x.dtype), rest_BGW], axis=-1)
