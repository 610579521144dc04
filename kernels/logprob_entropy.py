"""Per-token log-prob and entropy from hidden states, tiled over the vocabulary.

For hidden states h_n (n < N), unembedding W [D, V] and target tokens y_n, with z = h_n W:

    logZ_n    = log Σ_v exp z_nv
    logp_n    = z_{n,y_n} − logZ_n
    entropy_n = logZ_n − Σ_v softmax(z_n)_v z_nv

computed with an online (streaming) log-sum-exp over vocabulary tiles (Milakov & Gimelshein,
2018, arXiv 1805.02867), so the [N, V] logits never exist at once: memory is O(N · block_v)
instead of O(N · V), which is what caps the batch for 150k-token vocabularies.

Three implementations with one signature:
  * `logprob_entropy_reference` — plain jnp, materialises the logits (the definition).
  * `logprob_entropy_chunked` — plain jnp `lax.scan` over vocabulary tiles (any backend; used on
    CPU); differentiable, with the tile body rematerialised in the backward pass.
  * `logprob_entropy` — the Pallas kernel (grid over row blocks × vocabulary tiles, accumulators
    in the output blocks), with a `custom_vjp` whose backward recomputes through the chunked
    path. `interpret=True` runs it on CPU (slowly; tests only).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from vpo.kernels.precision import dot_f32, einsum_f32

_NEG = -1e30


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes: `block_n` rows of hidden states × `block_v` vocabulary columns per step."""

    block_n: int = 128
    block_v: int = 512

    @classmethod
    def get_default(cls) -> BlockSizes:
        return cls()


def _validate(hidden_ND, w_DV, targets_N):
    if hidden_ND.ndim != 2 or w_DV.ndim != 2 or targets_N.ndim != 1:
        raise ValueError(f"expected hidden_ND [N, D], w_DV [D, V], targets_N [N]; got shapes "
                         f"{hidden_ND.shape}, {w_DV.shape}, {targets_N.shape}")
    if hidden_ND.shape[1] != w_DV.shape[0] or hidden_ND.shape[0] != targets_N.shape[0]:
        raise ValueError(f"shape mismatch: hidden_ND {hidden_ND.shape}, w_DV {w_DV.shape}, "
                         f"targets_N {targets_N.shape}")


def logprob_entropy_reference(hidden_ND, w_DV, targets_N):
    """(logp_N, entropy_N) from the full [N, V] logits (float32)."""
    _validate(hidden_ND, w_DV, targets_N)
    logits = dot_f32(hidden_ND, w_DV)
    logp_NV = jax.nn.log_softmax(logits, axis=-1)
    logp_N = jnp.take_along_axis(logp_NV, targets_N[:, None], axis=-1)[:, 0]
    entropy_N = -jnp.sum(jnp.exp(logp_NV) * logp_NV, axis=-1)
    return logp_N, entropy_N


def _merge(carry, z_NC, targets_N, offset):
    """Fold one vocabulary tile of logits into the running (max, sum, Σe·z, target logit)."""
    m, s, sz, tgt = carry
    m_new = jnp.maximum(m, jnp.max(z_NC, axis=-1))
    scale = jnp.exp(m - m_new)
    e = jnp.exp(z_NC - m_new[:, None])
    cols = offset + jax.lax.broadcasted_iota(jnp.int32, z_NC.shape, 1)
    hit = cols == targets_N[:, None]
    tgt = tgt + jnp.sum(jnp.where(hit, z_NC, 0.0), axis=-1)
    return m_new, s * scale + e.sum(-1), sz * scale + (e * z_NC).sum(-1), tgt


def _finish(m, s, sz, tgt):
    log_z = m + jnp.log(s)
    return tgt - log_z, log_z - sz / s


def logprob_entropy_chunked(hidden_ND, w_DV, targets_N, block_v: int = 2048):
    """Same values as the reference with a `lax.scan` over vocabulary tiles of `block_v`.

    The tiles are rows of W^T [V, D], the layout of a tied embedding: given `embed_VD.T` the two
    transposes cancel, so neither the forward tiles nor the weight gradient (stacked [V, D] row
    tiles) copy the whole table through a transpose.
    """
    _validate(hidden_ND, w_DV, targets_N)
    N = hidden_ND.shape[0]
    D, V = w_DV.shape
    nb = -(-V // block_v)
    w_BCD = jnp.pad(w_DV.T, ((0, nb * block_v - V), (0, 0))).reshape(nb, block_v, D)
    valid_BC = (jnp.arange(nb * block_v) < V).reshape(nb, block_v)

    @jax.checkpoint
    def body(carry, xs):
        w_CD, valid_C, offset = xs
        z = einsum_f32("nd,cd->nc", hidden_ND, w_CD)
        z = jnp.where(valid_C[None, :], z, _NEG)
        return _merge(carry, z, targets_N, offset), None

    init = (jnp.full((N,), _NEG, jnp.float32), jnp.zeros((N,), jnp.float32),
            jnp.zeros((N,), jnp.float32), jnp.zeros((N,), jnp.float32))
    offsets = jnp.arange(nb, dtype=jnp.int32) * block_v
    carry, _ = jax.lax.scan(body, init, (w_BCD, valid_BC, offsets))
    return _finish(*carry)


def _kernel(h_ref, w_ref, t_ref, m_ref, s_ref, sz_ref, tgt_ref, *, block_v: int, vocab: int):
    """One (row block, vocab tile) step; the four [block_n] accumulators live in the outputs."""
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _():
        m_ref[...] = jnp.full(m_ref.shape, _NEG, jnp.float32)
        s_ref[...] = jnp.zeros(s_ref.shape, jnp.float32)
        sz_ref[...] = jnp.zeros(sz_ref.shape, jnp.float32)
        tgt_ref[...] = jnp.zeros(tgt_ref.shape, jnp.float32)

    z = dot_f32(h_ref[...], w_ref[...])
    cols = j * block_v + jax.lax.broadcasted_iota(jnp.int32, z.shape, 1)
    z = jnp.where(cols < vocab, z, _NEG)
    carry = (m_ref[...], s_ref[...], sz_ref[...], tgt_ref[...])
    m, s, sz, tgt = _merge(carry, z, t_ref[...], j * block_v)
    m_ref[...], s_ref[...], sz_ref[...], tgt_ref[...] = m, s, sz, tgt


def _forward(hidden_ND, w_DV, targets_N, block_sizes: BlockSizes, interpret: bool):
    N, D = hidden_ND.shape
    V = w_DV.shape[1]
    bn, bv = min(block_sizes.block_n, N), block_sizes.block_v
    n_pad, v_pad = -(-N // bn) * bn, -(-V // bv) * bv
    h = jnp.pad(hidden_ND, ((0, n_pad - N), (0, 0)))
    w = jnp.pad(w_DV, ((0, 0), (0, v_pad - V)))
    t = jnp.pad(targets_N.astype(jnp.int32), (0, n_pad - N))
    acc = jax.ShapeDtypeStruct((n_pad,), jnp.float32)
    row = pl.BlockSpec((bn,), lambda i, j: (i,))
    m, s, sz, tgt = pl.pallas_call(
        functools.partial(_kernel, block_v=bv, vocab=V),
        out_shape=(acc, acc, acc, acc),
        grid=(n_pad // bn, v_pad // bv),
        in_specs=[pl.BlockSpec((bn, D), lambda i, j: (i, 0)),
                  pl.BlockSpec((D, bv), lambda i, j: (0, j)),
                  row],
        out_specs=(row, row, row, row),
        interpret=interpret,
    )(h, w, t)
    logp, ent = _finish(m, s, sz, tgt)
    return logp[:N], ent[:N]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _logprob_entropy(hidden_ND, w_DV, targets_N, block_sizes, interpret):
    return _forward(hidden_ND, w_DV, targets_N, block_sizes, interpret)


def _fwd(hidden_ND, w_DV, targets_N, block_sizes, interpret):
    out = _forward(hidden_ND, w_DV, targets_N, block_sizes, interpret)
    return out, (hidden_ND, w_DV, targets_N)


def _bwd(block_sizes, interpret, res, cotangents):
    hidden_ND, w_DV, targets_N = res
    _, vjp = jax.vjp(lambda h, w: logprob_entropy_chunked(h, w, targets_N, block_sizes.block_v),
                     hidden_ND, w_DV)
    dh, dw = vjp(cotangents)
    return dh, dw, None


_logprob_entropy.defvjp(_fwd, _bwd)


def logprob_entropy(hidden_ND, w_DV, targets_N, *, block_sizes: BlockSizes | None = None,
                    interpret: bool = False):
    """Pallas (logp_N, entropy_N); differentiable in hidden_ND and w_DV.

    On CPU only `interpret=True` works (Pallas compiles for GPU / TPU only); the library calls
    `logprob_entropy_chunked` there instead.
    """
    _validate(hidden_ND, w_DV, targets_N)
    return _logprob_entropy(hidden_ND, w_DV, targets_N,
                            block_sizes or BlockSizes.get_default(), interpret)
