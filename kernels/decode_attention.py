"""Decode attention: one new token per sample over its prompt's shared prefix plus its own suffix.

Query head h of sample g of prompt b reads KV head n = h // (H/N) (grouped-query attention) of

  * the prompt's prefix keys/values [P, E], shared by its G samples (`prefix_mask_BP` marks the
    real prompt tokens; prompts are left-padded), and
  * the sample's suffix cache [C, E], of which only slots [0, length) hold tokens;

    out = Σ_j softmax_j(scale · q·k_j) v_j   over those keys, scale = 1/√E by default.

The kernel visits the keys in blocks of `block_k` with an online softmax (running max m, sum l
and unnormalised accumulator a; Milakov & Gimelshein, 2018, arXiv 1805.02867), so prefix and
suffix are never concatenated and the suffix loop runs ⌈length / block_k⌉ times: a decode step
at position t reads O(P + t) keys, not O(P + C). One kernel body, two passes:

  1. prefix: grid (B, N); the rows are all G·(H/N) queries that read KV head n of prompt b, so
     each prefix block is read once per prompt and multiplied as one [G·H/N, E]×[E, block_k]
     product, not once per sample;
  2. suffix: grid (B, G, N); the rows are the H/N queries of one sample, starting from the
     prefix pass's (m, l, a), finishing with out = a / l.

Rows are padded to multiples of `block_rows` (16: Triton's smallest dot, a multiple of the TPU's
8 sublanes); key lengths to multiples of `block_k` (a multiple of the TPU's 128 lanes). The
key loop is inside the kernel (GPU programs of one grid run in parallel, so a grid axis cannot
carry the softmax state). `decode_attention_reference` is the plain-jnp definition.

Status: checked against the reference in interpret mode on CPU; compiled for GPU / TPU it is
untested (no accelerator was available when it was written).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from vpo.kernels.precision import einsum_f32

_NEG = -1e30  # finite: a block with no valid key leaves no NaN; a later real key wipes it out


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """`block_k` keys per loop step (multiple of 128); query rows padded to `block_rows`."""

    block_k: int = 128
    block_rows: int = 16

    @classmethod
    def get_default(cls) -> BlockSizes:
        return cls()


def _validate(q_BGNHE, k_BNPE, v_BNPE, prefix_mask_BP, k_BGNCE, v_BGNCE):
    if q_BGNHE.ndim != 5 or k_BNPE.ndim != 4 or k_BGNCE.ndim != 5 or prefix_mask_BP.ndim != 2:
        raise ValueError(f"expected q [B, G, N, H/N, E], prefix k/v [B, N, P, E], prefix mask "
                         f"[B, P], suffix k/v [B, G, N, C, E]; got {q_BGNHE.shape}, "
                         f"{k_BNPE.shape}, {prefix_mask_BP.shape}, {k_BGNCE.shape}")
    B, G, N, _, E = q_BGNHE.shape
    P, C = k_BNPE.shape[2], k_BGNCE.shape[3]
    want = {"prefix k": (k_BNPE.shape, (B, N, P, E)), "prefix v": (v_BNPE.shape, (B, N, P, E)),
            "prefix mask": (prefix_mask_BP.shape, (B, P)),
            "suffix k": (k_BGNCE.shape, (B, G, N, C, E)),
            "suffix v": (v_BGNCE.shape, (B, G, N, C, E))}
    for name, (got, expected) in want.items():
        if tuple(got) != expected:
            raise ValueError(f"shape mismatch: {name} is {tuple(got)}, expected {expected} from "
                             f"q {q_BGNHE.shape}, prefix length {P}, cache length {C}")


def decode_attention_reference(q_BGNHE, k_BNPE, v_BNPE, prefix_mask_BP, k_BGNCE, v_BGNCE,
                               length, *, scale: float | None = None):
    """The definition in plain jnp: one softmax over [prefix keys ‖ suffix slots < length].

    Args:
      q_BGNHE: the new token's queries, H/N query heads per KV head.
      k_BNPE, v_BNPE: prefix keys/values; prefix_mask_BP: True on real prompt tokens.
      k_BGNCE, v_BGNCE: suffix caches; slots [0, length) are valid (length ≥ 1, traced).
    Returns out_BGNHE (q's dtype); scores and softmax in float32.
    """
    _validate(q_BGNHE, k_BNPE, v_BNPE, prefix_mask_BP, k_BGNCE, v_BGNCE)
    scale = 1.0 / math.sqrt(q_BGNHE.shape[-1]) if scale is None else scale
    P, C = k_BNPE.shape[2], k_BGNCE.shape[3]
    s_pre = einsum_f32("bgnhe,bnpe->bgnhp", q_BGNHE, k_BNPE) * scale
    s_pre = jnp.where(prefix_mask_BP[:, None, None, None, :], s_pre, -jnp.inf)
    s_suf = einsum_f32("bgnhe,bgnce->bgnhc", q_BGNHE, k_BGNCE) * scale
    s_suf = jnp.where(jnp.arange(C) < length, s_suf, -jnp.inf)
    p = jax.nn.softmax(jnp.concatenate([s_pre, s_suf], axis=-1), axis=-1)
    out = (einsum_f32("bgnhp,bnpe->bgnhe", p[..., :P], v_BNPE)
           + einsum_f32("bgnhc,bgnce->bgnhe", p[..., P:], v_BGNCE))
    return out.astype(q_BGNHE.dtype)


def _kernel(*refs, block_k: int, scale: float, num_blocks: int | None, masked: bool,
            resume: bool, finish: bool):
    """Online softmax of the block's query rows over its keys, in blocks of `block_k`.

    refs, in order: [length (1,) if num_blocks is None] q [R, E], k [K, E], v [K, E],
    [bias [1, K] if masked], [m0 [R, 1], l0 [R, 1], a0 [R, E] if resume]; outputs: out [R, E]
    (= a / l) if finish, else a [R, E], m [R, 1], l [R, 1].
    """
    refs = list(refs)
    length_ref = refs.pop(0) if num_blocks is None else None
    q_ref, k_ref, v_ref = refs.pop(0), refs.pop(0), refs.pop(0)
    bias_ref = refs.pop(0) if masked else None
    state_refs = (refs.pop(0), refs.pop(0), refs.pop(0)) if resume else None
    q = q_ref[...]
    R, E = q.shape
    if resume:
        init = tuple(r[...] for r in state_refs)
    else:
        init = (jnp.full((R, 1), _NEG, jnp.float32), jnp.zeros((R, 1), jnp.float32),
                jnp.zeros((R, E), jnp.float32))
    length = None if num_blocks is None else num_blocks * block_k
    if length_ref is not None:
        length = length_ref[0]

    def body(i, carry):
        m, l, a = carry
        at = pl.ds(pl.multiple_of(i * block_k, block_k), block_k)
        k, v = k_ref[at, :], v_ref[at, :]
        s = einsum_f32("re,ke->rk", q, k) * scale
        if masked:
            s = s + bias_ref[:, at]
        cols = i * block_k + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(cols < length, s, _NEG)
        m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        alpha = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new)
        l = l * alpha + jnp.sum(p, axis=1, keepdims=True)
        a = a * alpha + einsum_f32("rk,ke->re", p.astype(v.dtype), v)
        return m_new, l, a

    trips = num_blocks if num_blocks is not None else pl.cdiv(length, block_k)
    m, l, a = jax.lax.fori_loop(0, trips, body, init)
    if finish:
        out_ref, = refs
        out_ref[...] = (a / l).astype(out_ref.dtype)
    else:
        a_ref, m_ref, l_ref = refs
        a_ref[...], m_ref[...], l_ref[...] = a, m, l


def _pad_axis(x, axis: int, multiple: int, value=0):
    extra = -x.shape[axis] % multiple
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def _scalar_spec():
    """Block spec of a (1,) int32 scalar: SMEM on TPU (scalars cannot live in vector memory)."""
    if jax.default_backend() == "tpu":
        from jax.experimental.pallas import tpu as pltpu
        return pl.BlockSpec(memory_space=pltpu.SMEM)
    return pl.BlockSpec((1,), lambda *_: (0,))


@functools.partial(jax.jit, static_argnames=("scale", "block_sizes", "interpret"))
def _decode_attention(q_BGNHE, k_BNPE, v_BNPE, prefix_mask_BP, k_BGNCE, v_BGNCE, length, *,
                      scale: float, block_sizes: BlockSizes, interpret: bool):
    B, G, N, H, E = q_BGNHE.shape
    bk, br = block_sizes.block_k, block_sizes.block_rows
    f32 = jnp.float32
    kernel = functools.partial(_kernel, block_k=bk, scale=scale)

    # pass 1: prefix, rows g·H + h of KV head n, all G samples together
    R = G * H
    q_BNRE = _pad_axis(q_BGNHE.transpose(0, 2, 1, 3, 4).reshape(B, N, R, E), 2, br)
    Rp = q_BNRE.shape[2]
    k_pre, v_pre = _pad_axis(k_BNPE, 2, bk), _pad_axis(v_BNPE, 2, bk)
    Pp = k_pre.shape[2]
    bias_B1P = _pad_axis(jnp.where(prefix_mask_BP, 0.0, _NEG).astype(f32), 1, bk, _NEG)[:, None]
    rows = pl.BlockSpec((None, None, Rp, E), lambda b, n: (b, n, 0, 0))
    col = pl.BlockSpec((None, None, Rp, 1), lambda b, n: (b, n, 0, 0))
    keys = pl.BlockSpec((None, None, Pp, E), lambda b, n: (b, n, 0, 0))
    a_BNRE, m_BNR1, l_BNR1 = pl.pallas_call(
        functools.partial(kernel, num_blocks=Pp // bk, masked=True, resume=False, finish=False),
        out_shape=(jax.ShapeDtypeStruct((B, N, Rp, E), f32),
                   jax.ShapeDtypeStruct((B, N, Rp, 1), f32),
                   jax.ShapeDtypeStruct((B, N, Rp, 1), f32)),
        grid=(B, N),
        in_specs=[rows, keys, keys, pl.BlockSpec((None, 1, Pp), lambda b, n: (b, 0, 0))],
        out_specs=(rows, col, col),
        interpret=interpret,
    )(q_BNRE, k_pre, v_pre, bias_B1P)

    # pass 2: each sample's suffix, rows h of (b, g, n), resuming from the prefix state
    def per_sample(x_BNRX):  # [B, N, Rp, X] -> [B, G, N, Hp, X]
        x = x_BNRX[:, :, :R].reshape(B, N, G, H, -1).transpose(0, 2, 1, 3, 4)
        return _pad_axis(x, 3, br)

    q_BGNHE_p = _pad_axis(q_BGNHE, 3, br)
    Hp = q_BGNHE_p.shape[3]
    k_suf, v_suf = _pad_axis(k_BGNCE, 3, bk), _pad_axis(v_BGNCE, 3, bk)
    Cp = k_suf.shape[3]
    rows = pl.BlockSpec((None, None, None, Hp, E), lambda b, g, n: (b, g, n, 0, 0))
    col = pl.BlockSpec((None, None, None, Hp, 1), lambda b, g, n: (b, g, n, 0, 0))
    keys = pl.BlockSpec((None, None, None, Cp, E), lambda b, g, n: (b, g, n, 0, 0))
    out = pl.pallas_call(
        functools.partial(kernel, num_blocks=None, masked=False, resume=True, finish=True),
        out_shape=jax.ShapeDtypeStruct((B, G, N, Hp, E), q_BGNHE.dtype),
        grid=(B, G, N),
        in_specs=[_scalar_spec(), rows, keys, keys, col, col, rows],
        out_specs=rows,
        interpret=interpret,
    )(jnp.reshape(length, (1,)).astype(jnp.int32), q_BGNHE_p, k_suf, v_suf,
      per_sample(m_BNR1), per_sample(l_BNR1), per_sample(a_BNRE))
    return out[:, :, :, :H]


def decode_attention(q_BGNHE, k_BNPE, v_BNPE, prefix_mask_BP, k_BGNCE, v_BGNCE, length, *,
                     scale: float | None = None, block_sizes: BlockSizes | None = None,
                     interpret: bool = False):
    """Pallas decode attention; same arguments and result as `decode_attention_reference`.

    Key lengths that are not multiples of `block_k` are padded here (a copy per call): callers
    on an accelerator allocate caches in multiples of `block_k`. On CPU only `interpret=True`
    works (Pallas compiles for GPU / TPU only); the library uses the XLA path there.
    """
    _validate(q_BGNHE, k_BNPE, v_BNPE, prefix_mask_BP, k_BGNCE, v_BGNCE)
    scale = 1.0 / math.sqrt(q_BGNHE.shape[-1]) if scale is None else float(scale)
    return _decode_attention(q_BGNHE, k_BNPE, v_BNPE, prefix_mask_BP.astype(bool), k_BGNCE,
                             v_BGNCE, jnp.asarray(length, jnp.int32), scale=scale,
                             block_sizes=block_sizes or BlockSizes.get_default(),
                             interpret=interpret)
