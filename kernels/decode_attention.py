"""Decode attention: one new token per sample over its prompt's shared prefix plus its own suffix.

Query head h of sample g of prompt b reads KV head z = h // (H/Z) (grouped-query attention) of

  * the prompt's prefix keys/values [P, E], shared by its G samples (`prefix_mask_BP` marks the
    real prompt tokens; prompts are left-padded), and
  * the sample's suffix cache [C, E], of which only slots [0, length) hold tokens;

    out = Σ_j softmax_j(scale · q·k_j) v_j   over those keys, scale = 1/√E by default.

The kernel streams the keys in blocks of `block_k` with an online softmax (running max m, sum l
and unnormalised accumulator a; Milakov & Gimelshein, 2018, arXiv 1805.02867): per block
    m' = max(m, max_j s_j),  l' = l·e^{m−m'} + Σ_j e^{s_j−m'},
    a' = a·e^{m−m'} + Σ_j e^{s_j−m'} v_j,
and out = a / l at the end. Prefix and suffix are never concatenated, and only the first
⌈length / block_k⌉ suffix blocks are read: a decode step at position t reads O(P + t) keys,
not O(P + C). Two passes:

  1. prefix: per (b, z), the rows are all G·(H/Z) queries that read KV head z of prompt b, so
     each prefix block is read once per prompt as one [G·H/Z, E]×[E, block_k] product;
  2. suffix: per (b, g, z), the rows are the H/Z queries of one sample, starting from the
     prefix pass's (m, l, a), finishing with out = a / l.

Per platform (`platform=` argument, else the default backend):
  * TPU (Mosaic): the key blocks are the last grid axis ("arbitrary"), (m, l, a) live in VMEM
    scratch, so VMEM holds two [block_k, E] tiles per operand, never a whole cache. The
    length is a scalar-prefetch operand: blocks past it are neither computed nor fetched (their
    index map repeats the last needed block). Rows are padded to the sublane tile, block_k is a
    multiple of 128 lanes.
  * GPU (Triton): a grid axis cannot carry the softmax state (programs run at once), so each
    program loops over its key blocks, loading [block_k, E] tiles from the cache in place.
    Rows are padded to a power of two ≥ 16 (Triton's tile and dot rules): one query array
    [B, Z, G', H', E] (samples and heads each padded to a power of two) serves both passes, the
    prefix reading (b, z)'s rows in blocks of 64, the suffix reading (b, z, g)'s, so no copy
    is made between the passes; ragged key tails are loaded masked. Triton, not Mosaic GPU:
    Mosaic GPU does not lower this `jnp.dot` of a plain `pallas_call` (it needs `plgpu`
    warpgroup code); on jax ≥ 0.11, which drops the Triton lowering, `supported("gpu")` is
    False and callers take the XLA path.
Key lengths need not be multiples of `block_k`: the tail block's slots past the array are
masked (their values zeroed), nothing is copied. `decode_attention_reference` is the plain-jnp
definition.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from vpo.kernels import hardware
from vpo.kernels.precision import einsum_f32

_NEG = -1e30  # finite: a block with no valid key leaves no NaN; a later real key wipes it out


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """`block_k` keys per step (TPU: a multiple of 128; GPU: a power of two ≥ 16); query rows
    padded to a multiple of `block_rows` (GPU: to a power of two ≥ it)."""

    block_k: int = 128
    block_rows: int = 16

    @classmethod
    def get_default(cls) -> BlockSizes:
        return cls()


def block_sizes_for(platform: str | None, shape: tuple[int, ...], dtype=jnp.bfloat16
                    ) -> BlockSizes:
    """Legal, fitting block sizes for `shape` = (B, G, Z, H/Z, E, P, C) of `dtype`.

    TPU: block_rows = the sublane tile 8 · 4/itemsize; block_k the largest multiple of 128
      ≤ min(1024, max(P, C) rounded up to 128) with 2 buffers · 2 operands · block_k · E ·
      itemsize + 3 · 4 · G·(H/Z) · block_k ≤ `TPU_VMEM_BUDGET_BYTES`.
    GPU: block_rows = 16; block_k the largest power of two in [16, 128] with 2 stages · 2
      operands · block_k · E · itemsize ≤ `GPU_SMEM_BUDGET_BYTES`.
    """
    _, G, _, Hn, E, P, C = (int(x) for x in shape)
    name = hardware.resolve_platform(platform)
    itemsize = jnp.dtype(dtype).itemsize
    if name == "gpu":
        bk = 128
        while bk > 16 and 2 * 2 * bk * E * itemsize > hardware.GPU_SMEM_BUDGET_BYTES:
            bk //= 2
        return BlockSizes(block_k=min(bk, max(16, hardware.pow2_ceil(max(P, C)))), block_rows=16)
    rows = hardware.round_up(G * Hn, 16)
    bk = min(1024, hardware.round_up(max(P, C), 128))
    while bk > 128 and (4 * bk * E * itemsize + 12 * rows * bk) > hardware.TPU_VMEM_BUDGET_BYTES:
        bk -= 128
    return BlockSizes(block_k=bk, block_rows=8 * max(1, 4 // itemsize))


def supported(platform: str | None = None) -> bool:
    """Whether `decode_attention` compiles for `platform` (see `hardware.pallas_supported`);
    where False, use the XLA path."""
    return hardware.pallas_supported(platform)


def _validate(q_BGZHE, k_BZPE, v_BZPE, prefix_mask_BP, k_BGZCE, v_BGZCE):
    if q_BGZHE.ndim != 5 or k_BZPE.ndim != 4 or k_BGZCE.ndim != 5 or prefix_mask_BP.ndim != 2:
        raise ValueError(f"expected q [B, G, Z, H/Z, E], prefix k/v [B, Z, P, E], prefix mask "
                         f"[B, P], suffix k/v [B, G, Z, C, E]; got {q_BGZHE.shape}, "
                         f"{k_BZPE.shape}, {prefix_mask_BP.shape}, {k_BGZCE.shape}")
    B, G, Z, _, E = q_BGZHE.shape
    P, C = k_BZPE.shape[2], k_BGZCE.shape[3]
    want = {"prefix k": (k_BZPE.shape, (B, Z, P, E)), "prefix v": (v_BZPE.shape, (B, Z, P, E)),
            "prefix mask": (prefix_mask_BP.shape, (B, P)),
            "suffix k": (k_BGZCE.shape, (B, G, Z, C, E)),
            "suffix v": (v_BGZCE.shape, (B, G, Z, C, E))}
    for name, (got, expected) in want.items():
        if tuple(got) != expected:
            raise ValueError(f"shape mismatch: {name} is {tuple(got)}, expected {expected} from "
                             f"q {q_BGZHE.shape}, prefix length {P}, cache length {C}")


def decode_attention_reference(q_BGZHE, k_BZPE, v_BZPE, prefix_mask_BP, k_BGZCE, v_BGZCE,
                               length, *, scale: float | None = None,
                               platform: str | None = None):
    """The definition in plain jnp: one softmax over [prefix keys ‖ suffix slots < length].

    Args:
      q_BGZHE: the new token's queries, H/Z query heads per KV head.
      k_BZPE, v_BZPE: prefix keys/values; prefix_mask_BP: True on real prompt tokens.
      k_BGZCE, v_BGZCE: suffix caches; slots [0, length) are valid (length ≥ 1, traced).
    Returns out_BGZHE (q's dtype); scores and softmax in float32.
    """
    _validate(q_BGZHE, k_BZPE, v_BZPE, prefix_mask_BP, k_BGZCE, v_BGZCE)
    scale = 1.0 / math.sqrt(q_BGZHE.shape[-1]) if scale is None else scale
    P, C = k_BZPE.shape[2], k_BGZCE.shape[3]
    f32 = functools.partial(einsum_f32, platform=platform)
    s_pre = f32("bgzhe,bzpe->bgzhp", q_BGZHE, k_BZPE) * scale
    s_pre = jnp.where(prefix_mask_BP[:, None, None, None, :], s_pre, -jnp.inf)
    s_suf = f32("bgzhe,bgzce->bgzhc", q_BGZHE, k_BGZCE) * scale
    s_suf = jnp.where(jnp.arange(C) < length, s_suf, -jnp.inf)
    p = jax.nn.softmax(jnp.concatenate([s_pre, s_suf], axis=-1), axis=-1)
    out = (f32("bgzhp,bzpe->bgzhe", p[..., :P], v_BZPE)
           + f32("bgzhc,bgzce->bgzhe", p[..., P:], v_BGZCE))
    return out.astype(q_BGZHE.dtype)


def _online_step(carry, q_NE, k_block, v_block, bias, start, limit, *, scale: float,
                 ragged: bool, dot_platform: str):
    """Fold keys [start, start + block) into (m, l, a); keys ≥ `limit` are masked out, and with
    `ragged` their values (past the array's end: unspecified) are zeroed first."""
    m, l, a = carry
    s = einsum_f32("re,ke->rk", q_NE, k_block, platform=dot_platform) * scale
    if bias is not None:
        s = s + bias
    cols = start + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    s = jnp.where(cols < limit, s, _NEG)
    if ragged:
        slots = start + jax.lax.broadcasted_iota(jnp.int32, (v_block.shape[0], 1), 0)
        v_block = jnp.where(slots < limit, v_block, jnp.zeros_like(v_block))
    m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
    alpha = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new)
    l = l * alpha + jnp.sum(p, axis=1, keepdims=True)
    a = a * alpha + einsum_f32("rk,ke->re", p.astype(v_block.dtype), v_block,
                               platform=dot_platform)
    return m_new, l, a


# -- TPU: key blocks on the last grid axis, state in VMEM scratch ----------------------------

def _tpu_kernel(*refs, block_k: int, scale: float, keys: int, prefix: bool, dot_platform: str):
    """One key block of one (b, z) [prefix] or (b, g, z) [suffix] row block.

    refs: length (SMEM, scalar prefetch), q, k, v, then bias [1, block_k] (prefix) or m0, l0, a0
    (suffix); outputs a, m, l (prefix) or out (suffix); scratch m, l, a.
    """
    length_ref, q_ref, k_ref, v_ref, *rest = refs
    m_sc, l_sc, a_sc = rest[-3:]
    j = pl.program_id(2 if prefix else 3)
    last = pl.num_programs(2 if prefix else 3) - 1
    limit = keys if prefix else length_ref[0]

    @pl.when(j == 0)
    def _():
        if prefix:
            m_sc[...] = jnp.full(m_sc.shape, _NEG, jnp.float32)
            l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
            a_sc[...] = jnp.zeros(a_sc.shape, jnp.float32)
        else:
            m0_ref, l0_ref, a0_ref = rest[:3]
            m_sc[...], l_sc[...], a_sc[...] = m0_ref[...], l0_ref[...], a0_ref[...]

    start = j * block_k

    @pl.when(start < limit)
    def _():
        bias = rest[0][...] if prefix else None
        m_sc[...], l_sc[...], a_sc[...] = _online_step(
            (m_sc[...], l_sc[...], a_sc[...]), q_ref[...], k_ref[...], v_ref[...], bias, start,
            limit, scale=scale, ragged=keys % block_k != 0, dot_platform=dot_platform)

    @pl.when(j == last)
    def _():
        if prefix:
            a_ref, m_ref, l_ref = rest[1:4]
            a_ref[...], m_ref[...], l_ref[...] = a_sc[...], m_sc[...], l_sc[...]
        else:
            out_ref = rest[3]
            out_ref[...] = (a_sc[...] / l_sc[...]).astype(out_ref.dtype)


def _tpu_passes(q_BZNE, k_BZPE, v_BZPE, bias_B1P, q_BGZHE, k_BGZCE, v_BGZCE, length_1, *,
                scale, bk, interpret, per_sample, platform):
    from jax.experimental.pallas import tpu as pltpu

    B, Z, Np, E = q_BZNE.shape
    P = k_BZPE.shape[2]
    _, G, _, Hp, _ = q_BGZHE.shape
    C = k_BGZCE.shape[3]
    f32 = jnp.float32
    dot_platform = "cpu" if interpret else platform
    params = functools.partial(hardware.compiler_params, platform)

    def scratch(N):
        return [pltpu.VMEM((N, 1), f32), pltpu.VMEM((N, 1), f32), pltpu.VMEM((N, E), f32)]

    rows = pl.BlockSpec((None, None, Np, E), lambda b, z, j, _: (b, z, 0, 0))
    col = pl.BlockSpec((None, None, Np, 1), lambda b, z, j, _: (b, z, 0, 0))
    keys = pl.BlockSpec((None, None, bk, E), lambda b, z, j, _: (b, z, j, 0))
    a_BZNE, m_BZN1, l_BZN1 = pl.pallas_call(
        functools.partial(_tpu_kernel, block_k=bk, scale=scale, keys=P, prefix=True,
                          dot_platform=dot_platform),
        out_shape=(jax.ShapeDtypeStruct((B, Z, Np, E), f32),
                   jax.ShapeDtypeStruct((B, Z, Np, 1), f32),
                   jax.ShapeDtypeStruct((B, Z, Np, 1), f32)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(B, Z, pl.cdiv(P, bk)),
            in_specs=[rows, keys, keys,
                      pl.BlockSpec((None, 1, bk), lambda b, z, j, _: (b, 0, j))],
            out_specs=(rows, col, col), scratch_shapes=scratch(Np)),
        compiler_params=None if interpret else params(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
    )(length_1, q_BZNE, k_BZPE, v_BZPE, bias_B1P)

    def needed(j, length_ref):  # blocks past the length repeat the last needed one: no fetch
        return jnp.minimum(j, jnp.maximum(pl.cdiv(length_ref[0], bk) - 1, 0))

    rows = pl.BlockSpec((None, None, None, Hp, E), lambda b, g, z, j, _: (b, g, z, 0, 0))
    col = pl.BlockSpec((None, None, None, Hp, 1), lambda b, g, z, j, _: (b, g, z, 0, 0))
    keys = pl.BlockSpec((None, None, None, bk, E),
                        lambda b, g, z, j, ln: (b, g, z, needed(j, ln), 0))
    return pl.pallas_call(
        functools.partial(_tpu_kernel, block_k=bk, scale=scale, keys=C, prefix=False,
                          dot_platform=dot_platform),
        out_shape=jax.ShapeDtypeStruct((B, G, Z, Hp, E), q_BGZHE.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(B, G, Z, pl.cdiv(C, bk)),
            in_specs=[rows, keys, keys, col, col, rows],
            out_specs=rows, scratch_shapes=scratch(Hp)),
        compiler_params=None if interpret else params(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
        interpret=interpret,
    )(length_1, q_BGZHE, k_BGZCE, v_BGZCE, per_sample(m_BZN1), per_sample(l_BZN1),
      per_sample(a_BZNE))


# -- GPU: each program loops over its key blocks ---------------------------------------------

# query rows of one prefix program: the 64 x 128 score tile of the kernel as first measured
_GPU_PREFIX_ROWS = 64

def _gpu_kernel(*refs, block_k: int, scale: float, keys: int, prefix: bool, dot_platform: str):
    """All key blocks of one (b, z) [prefix] or (b, g, z) [suffix] row block.

    refs: length (1,), q, k, v, then bias [1, P'] (prefix, padded to whole blocks) or m0, l0,
    a0 (suffix); outputs a, m, l (prefix) or out (suffix).
    """
    from jax.experimental.pallas import triton as pltriton

    length_ref, q_ref, k_ref, v_ref, *rest = refs
    q = q_ref[...]
    N, E = q.shape
    ragged = keys % block_k != 0
    limit = keys if prefix else length_ref[0]
    if prefix:
        init = (jnp.full((N, 1), _NEG, jnp.float32), jnp.zeros((N, 1), jnp.float32),
                jnp.zeros((N, E), jnp.float32))
    else:
        init = tuple(r[...] for r in rest[:3])

    def body(i, carry):
        start = pl.multiple_of(i * block_k, block_k)
        at = pl.ds(start, block_k)
        if ragged:  # no read past the array's end
            inside = (start + jnp.arange(block_k, dtype=jnp.int32) < keys)[:, None]
            k = pltriton.load(k_ref.at[at, :], mask=inside, other=0)
            v = pltriton.load(v_ref.at[at, :], mask=inside, other=0)
        else:
            k, v = k_ref[at, :], v_ref[at, :]
        bias = rest[0][:, at] if prefix else None
        return _online_step(carry, q, k, v, bias, start, limit, scale=scale, ragged=False,
                            dot_platform=dot_platform)

    m, l, a = jax.lax.fori_loop(0, pl.cdiv(limit, block_k), body, init)
    if prefix:
        a_ref, m_ref, l_ref = rest[1:]
        a_ref[...], m_ref[...], l_ref[...] = a, m, l
    else:
        out_ref, = rest[3:]
        out_ref[...] = (a / l).astype(out_ref.dtype)


def _gpu_passes(q_BZGHE, k_BZPE, v_BZPE, bias_B1P, k_BGZCE, v_BGZCE, length_1, *, G: int,
                scale, bk, interpret, platform):
    """Both passes from one padded query array [B, Z, G', H', E] (G' ≥ G samples and H' ≥ H/Z
    heads, powers of two): the prefix pass reads the G'·H' rows of (b, z) in blocks of at most
    `_GPU_PREFIX_ROWS` (the prefix keys once per block), the suffix pass reads row block
    (b, z, g) of the same array and of the prefix's (m, l, a), so no transposed or padded copy
    is made between them. Returns [B, G, Z, H', E]."""
    B, Z, Gp, Hp, E = q_BZGHE.shape
    Np = Gp * Hp
    R = min(Np, _GPU_PREFIX_ROWS)
    P = k_BZPE.shape[2]
    C = k_BGZCE.shape[3]
    f32 = jnp.float32
    dot_platform = "cpu" if interpret else platform
    params = None if interpret else hardware.compiler_params(platform, num_warps=4,
                                                              num_stages=2)
    kernel = functools.partial(_gpu_kernel, block_k=bk, scale=scale, dot_platform=dot_platform)
    scalar = pl.BlockSpec((1,), lambda *_: (0,))
    rows = pl.BlockSpec((None, None, R, E), lambda b, z, r: (b, z, r, 0))
    col = pl.BlockSpec((None, None, R, 1), lambda b, z, r: (b, z, r, 0))
    keys = pl.BlockSpec((None, None, P, E), lambda b, z, r: (b, z, 0, 0))
    Pb = bias_B1P.shape[2]
    a_BZNE, m_BZN1, l_BZN1 = pl.pallas_call(
        functools.partial(kernel, keys=P, prefix=True),
        out_shape=(jax.ShapeDtypeStruct((B, Z, Np, E), f32),
                   jax.ShapeDtypeStruct((B, Z, Np, 1), f32),
                   jax.ShapeDtypeStruct((B, Z, Np, 1), f32)),
        grid=(B, Z, Np // R),
        in_specs=[scalar, rows, keys, keys,
                  pl.BlockSpec((None, 1, Pb), lambda b, z, r: (b, 0, 0))],
        out_specs=(rows, col, col),
        compiler_params=params,
        interpret=interpret,
    )(length_1, q_BZGHE.reshape(B, Z, Np, E), k_BZPE, v_BZPE, bias_B1P)

    def by_sample(x_BZN1):  # [B, Z, G'·H', d] -> [B, Z, G', H', d]: a free reshape
        return x_BZN1.reshape(B, Z, Gp, Hp, -1)

    rows = pl.BlockSpec((None, None, None, Hp, E), lambda b, g, z: (b, z, g, 0, 0))
    col = pl.BlockSpec((None, None, None, Hp, 1), lambda b, g, z: (b, z, g, 0, 0))
    keys = pl.BlockSpec((None, None, None, C, E), lambda b, g, z: (b, g, z, 0, 0))
    return pl.pallas_call(
        functools.partial(kernel, keys=C, prefix=False),
        out_shape=jax.ShapeDtypeStruct((B, G, Z, Hp, E), q_BZGHE.dtype),
        grid=(B, G, Z),
        in_specs=[scalar, rows, keys, keys, col, col, rows],
        out_specs=pl.BlockSpec((None, None, None, Hp, E), lambda b, g, z: (b, g, z, 0, 0)),
        compiler_params=params,
        interpret=interpret,
    )(length_1, q_BZGHE, k_BGZCE, v_BGZCE, by_sample(m_BZN1), by_sample(l_BZN1),
      by_sample(a_BZNE))


def _pad_axis(x, axis: int, size: int, value=0):
    extra = size - x.shape[axis]
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


@functools.partial(jax.jit, static_argnames=("scale", "block_sizes", "interpret", "platform"))
def _decode_attention(q_BGZHE, k_BZPE, v_BZPE, prefix_mask_BP, k_BGZCE, v_BGZCE, length, *,
                      scale: float, block_sizes: BlockSizes, interpret: bool, platform: str):
    B, G, Z, H, E = q_BGZHE.shape
    bk, br = block_sizes.block_k, block_sizes.block_rows
    gpu = platform == "gpu"

    def rows_for(r):  # GPU: a power of two (Triton); else a multiple of the sublane tile
        return max(br, hardware.pow2_ceil(r)) if gpu else hardware.round_up(r, br)

    P = k_BZPE.shape[2]
    bias_B1P = _pad_axis(jnp.where(prefix_mask_BP, 0.0, _NEG).astype(jnp.float32), 1,
                         hardware.round_up(P, bk), _NEG)[:, None]
    Hp = rows_for(H)
    length_1 = jnp.reshape(length, (1,)).astype(jnp.int32)
    if gpu:  # one padded query array serves both passes (`_gpu_passes`)
        q_BZGHE = _pad_axis(_pad_axis(q_BGZHE.transpose(0, 2, 1, 3, 4), 3, Hp), 2,
                            hardware.pow2_ceil(G))
        out = _gpu_passes(q_BZGHE, k_BZPE, v_BZPE, bias_B1P, k_BGZCE, v_BGZCE, length_1, G=G,
                          scale=scale, bk=bk, interpret=interpret, platform=platform)
        return out[:, :, :, :H]

    # pass 1 (prefix): rows g·H + h of KV head z, all G samples together
    N = G * H
    q_BZNE = _pad_axis(q_BGZHE.transpose(0, 2, 1, 3, 4).reshape(B, Z, N, E), 2, rows_for(N))

    def per_sample(x_rows):  # [B, Z, Np, ..] -> [B, G, Z, Hp, ..]
        x = x_rows[:, :, :N].reshape(B, Z, G, H, -1).transpose(0, 2, 1, 3, 4)
        return _pad_axis(x, 3, Hp)

    out = _tpu_passes(q_BZNE, k_BZPE, v_BZPE, bias_B1P, _pad_axis(q_BGZHE, 3, Hp), k_BGZCE,
                      v_BGZCE, length_1, scale=scale, bk=bk, interpret=interpret,
                      per_sample=per_sample, platform=platform)
    return out[:, :, :, :H]


def decode_attention(q_BGZHE, k_BZPE, v_BZPE, prefix_mask_BP, k_BGZCE, v_BGZCE, length, *,
                     scale: float | None = None, block_sizes: BlockSizes | None = None,
                     interpret: bool = False, platform: str | None = None):
    """Pallas decode attention; same arguments and result as `decode_attention_reference`.

    `platform`: "tpu" / "gpu" (None: the default backend) picks the kernel and, with
    `block_sizes=None`, its blocks (`block_sizes_for`). Compiled kernels exist for TPU and GPU
    only (`supported`); on CPU only `interpret=True` works (the TPU kernel, or the GPU one with
    platform="gpu"); the library uses the XLA path there.
    """
    _validate(q_BGZHE, k_BZPE, v_BZPE, prefix_mask_BP, k_BGZCE, v_BGZCE)
    name = hardware.resolve_platform(platform)
    if name == "cpu" and not interpret:
        raise ValueError("decode_attention compiles for TPU / GPU only: on CPU use "
                         "interpret=True or the XLA path")
    if block_sizes is None:
        B, G, Z, H, E = q_BGZHE.shape
        block_sizes = block_sizes_for(name, (B, G, Z, H, E, k_BZPE.shape[2], k_BGZCE.shape[3]),
                                      q_BGZHE.dtype)
    scale = 1.0 / math.sqrt(q_BGZHE.shape[-1]) if scale is None else float(scale)
    return _decode_attention(q_BGZHE, k_BZPE, v_BZPE, prefix_mask_BP.astype(bool), k_BGZCE,
                             v_BGZCE, jnp.asarray(length, jnp.int32), scale=scale,
                             block_sizes=block_sizes, interpret=interpret, platform=name)
