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
    CPU); its backward is one more pass over the tiles with the logit gradient in closed form.
  * `logprob_entropy` — the Pallas kernel, with a `custom_vjp` whose backward recomputes through
    the chunked path. `interpret=True` runs it on CPU (slowly; tests only).

The kernel per platform (`platform=` argument, else the default backend):
  * TPU (Mosaic): grid (row blocks, vocabulary tiles); the TPU runs the grid in order, so the
    running (max m, Σe, Σe·z, target logit) of each row block sit in its output blocks across
    the vocabulary axis ("arbitrary"). Blocks: `block_sizes_for` fits double-buffered hidden
    [block_n, D] and weight [D, block_v] tiles plus the [block_n, block_v] f32 temporaries in
    `TPU_VMEM_BUDGET_BYTES`.
  * GPU (Triton): programs of a grid run at once, so no grid axis may carry state. Grid (row
    blocks, vocabulary ranges); each program loops over its range's tiles and, inside, over D in
    power-of-two steps of `block_d` (D = 896 = 7·128 needs no padding), and writes partial
    (m_s, Σe_s, Σe·z_s, tgt_s); the ranges are merged afterwards:
        m = max_s m_s,  Σe = Σ_s Σe_s · exp(m_s − m),  Σe·z likewise,  tgt = Σ_s tgt_s.
    Weight tiles past V are loaded masked (no out-of-bounds reads). Triton, not Mosaic GPU:
    Mosaic GPU does not take a plain `pallas_call` with `jnp.dot` (its copies are limited to
    256 elements per dimension and its dot needs `plgpu` warpgroup code), so on jax ≥ 0.11,
    which drops the Triton lowering, `supported("gpu")` is False and callers take the XLA path.
The vocabulary is never padded (the weight table is not copied): the last tile's columns ≥ V
are masked to −1e30; rows are padded up to a multiple of `block_n` (a small copy of hidden).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from vpo.kernels import hardware
from vpo.kernels.precision import dot_f32, einsum_f32

_NEG = -1e30
_H100_CORES = 132  # programs in flight to aim for: 2 per streaming multiprocessor


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes: `block_n` rows of hidden states × `block_v` vocabulary columns per step.

    GPU only: `block_d` hidden columns per product step (a power of two dividing D) and
    `num_splits` vocabulary ranges run as separate programs. `block_v_backward`: vocabulary tile
    of the chunked backward pass.
    """

    block_n: int = 128
    block_v: int = 512
    block_d: int | None = None
    num_splits: int = 1
    block_v_backward: int = 2048

    @classmethod
    def get_default(cls) -> BlockSizes:
        return cls()


def block_sizes_for(platform: str | None, shape: tuple[int, int, int],
                    dtype=jnp.bfloat16) -> BlockSizes:
    """Legal, fitting tile sizes for hidden [N, D] × weight [D, V] of `dtype` on `platform`.

    TPU: block_n a multiple of the sublane tile (8 · 4/itemsize), block_v of 128, the largest
      pair (block_n ≤ 512, block_v ≤ 2048) with 2·itemsize·D·(block_n + block_v)
      + 5·4·block_n·block_v ≤ `TPU_VMEM_BUDGET_BYTES` (double-buffered inputs, f32 temporaries).
    GPU: powers of two (Triton), block_n ∈ [16, 64], block_v = 128, block_d = the largest power
      of two ≤ 64 dividing D (≥ 16; D is padded otherwise), num_splits so that about 2 programs
      per H100 core run, each range holding at least one real tile.
    CPU (interpret mode): the TPU rule.
    """
    N, D, V = (int(x) for x in shape)
    name = hardware.resolve_platform(platform)
    itemsize = jnp.dtype(dtype).itemsize
    if name == "gpu":
        block_n = max(16, min(64, hardware.pow2_ceil(N)))
        block_d = max(16, min(64, hardware.pow2_factor(D)))
        block_v = 128
        tiles = -(-V // block_v)
        rows = -(-N // block_n)
        per_split = -(-tiles // max(1, min(tiles, -(-2 * _H100_CORES // rows))))
        return BlockSizes(block_n=block_n, block_v=block_v, block_d=block_d,
                          num_splits=-(-tiles // per_split))
    sublanes = 8 * max(1, 4 // itemsize)
    v_cap = hardware.round_up(V, 128)
    n_cap = hardware.round_up(N, sublanes)

    def vmem(bn, bv):
        return 2 * itemsize * D * (bn + bv) + 5 * 4 * bn * bv

    for v_floor in (min(512, v_cap), 128):
        for bn in (512, 256, 128, 64, 32, 16, 8):
            bn = min(bn, n_cap)
            if bn % sublanes:
                continue
            for bv in (2048, 1024, 512, 256, 128):
                bv = min(bv, v_cap)
                if bv >= v_floor and vmem(bn, bv) <= hardware.TPU_VMEM_BUDGET_BYTES:
                    return BlockSizes(block_n=bn, block_v=bv)
    raise ValueError(f"no logprob_entropy tiles fit {hardware.TPU_VMEM_BUDGET_BYTES} bytes of "
                     f"VMEM at D={D}, {jnp.dtype(dtype).name}: use logprob_entropy_chunked")


def supported(platform: str | None = None) -> bool:
    """Whether `logprob_entropy` compiles for `platform` (see `hardware.pallas_supported`);
    where False, use `logprob_entropy_chunked`."""
    return hardware.pallas_supported(platform)


def _validate(hidden_ND, w_DV, targets_N):
    if hidden_ND.ndim != 2 or w_DV.ndim != 2 or targets_N.ndim != 1:
        raise ValueError(f"expected hidden_ND [N, D], w_DV [D, V], targets_N [N]; got shapes "
                         f"{hidden_ND.shape}, {w_DV.shape}, {targets_N.shape}")
    if hidden_ND.shape[1] != w_DV.shape[0] or hidden_ND.shape[0] != targets_N.shape[0]:
        raise ValueError(f"shape mismatch: hidden_ND {hidden_ND.shape}, w_DV {w_DV.shape}, "
                         f"targets_N {targets_N.shape}")


def logprob_entropy_reference(hidden_ND, w_DV, targets_N, *, platform: str | None = None):
    """(logp_N, entropy_N) from the full [N, V] logits (float32)."""
    _validate(hidden_ND, w_DV, targets_N)
    logits = dot_f32(hidden_ND, w_DV, platform=platform)
    logp_NV = jax.nn.log_softmax(logits, axis=-1)
    logp_N = jnp.take_along_axis(logp_NV, targets_N[:, None], axis=-1)[:, 0]
    entropy_N = -jnp.sum(jnp.exp(logp_NV) * logp_NV, axis=-1)
    return logp_N, entropy_N


def _merge(carry, z_NV, cols_NV, targets):
    """Fold one vocabulary tile of logits into the running (max, Σe, Σe·z, target logit).

    The carry arrays and `targets` are [N] or [N, 1]; `cols_NV` are the tile's vocabulary ids.
    """
    m, s, sz, tgt = carry
    keep = m.ndim == 2

    def total(x):
        return jnp.sum(x, axis=-1, keepdims=keep)

    m_new = jnp.maximum(m, jnp.max(z_NV, axis=-1, keepdims=keep))
    scale = jnp.exp(m - m_new)
    e = jnp.exp(z_NV - (m_new if keep else m_new[:, None]))
    hit = cols_NV == (targets if keep else targets[:, None])
    tgt = tgt + total(jnp.where(hit, z_NV, 0.0))
    return m_new, s * scale + total(e), sz * scale + total(e * z_NV), tgt


def _finish(m, s, sz, tgt):
    log_z = m + jnp.log(s)
    return tgt - log_z, log_z - sz / s


def _tiles(w_DV, block_v: int):
    """W^T [V, D] as `nb` row tiles [nb, block_v, D] (the last padded), their valid columns
    [nb, block_v] and first vocabulary ids [nb]. The tiles are rows of W^T, the layout of a
    tied embedding: given `embed_VD.T` the two transposes cancel, so neither the tiles nor the
    weight gradient (stacked row tiles) copy the whole table through a transpose."""
    D, V = w_DV.shape
    nb = -(-V // block_v)
    w_blocks = jnp.pad(w_DV.T, ((0, nb * block_v - V), (0, 0))).reshape(nb, block_v, D)
    valid_blocks = (jnp.arange(nb * block_v) < V).reshape(nb, block_v)
    return w_blocks, valid_blocks, jnp.arange(nb, dtype=jnp.int32) * block_v


def _tile_logits(hidden_ND, w_VD, valid_V, offset, platform):
    """One tile's logits z [N, block_v] (float32, columns past V at −1e30) and vocabulary ids."""
    z = einsum_f32("nd,cd->nc", hidden_ND, w_VD, platform=platform)
    z = jnp.where(valid_V[None, :], z, _NEG)
    return z, offset + jax.lax.broadcasted_iota(jnp.int32, z.shape, 1)


def _chunked_stats(hidden_ND, w_DV, targets_N, block_v, platform):
    """(max, Σe, Σe·z, target logit) per row, streamed over the vocabulary tiles."""
    N = hidden_ND.shape[0]

    def body(carry, xs):
        w_VD, valid_V, offset = xs
        z, cols = _tile_logits(hidden_ND, w_VD, valid_V, offset, platform)
        return _merge(carry, z, cols, targets_N), None

    init = (jnp.full((N,), _NEG, jnp.float32), jnp.zeros((N,), jnp.float32),
            jnp.zeros((N,), jnp.float32), jnp.zeros((N,), jnp.float32))
    carry, _ = jax.lax.scan(body, init, _tiles(w_DV, block_v))
    return carry


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _chunked(hidden_ND, w_DV, targets_N, block_v, platform):
    return _finish(*_chunked_stats(hidden_ND, w_DV, targets_N, block_v, platform))


def _chunked_fwd(hidden_ND, w_DV, targets_N, block_v, platform):
    m, s, sz, tgt = _chunked_stats(hidden_ND, w_DV, targets_N, block_v, platform)
    log_z = m + jnp.log(s)
    return _finish(m, s, sz, tgt), (hidden_ND, w_DV, targets_N, log_z, sz / s)


def _chunked_bwd(block_v, platform, res, cotangents):
    """One pass over the tiles: each tile's logits recomputed, their gradient
        dz_v = g_logp · (1[v = y] − p_v) − g_ent · p_v · (z_v − E_p[z]),
    p = softmax(z) from the forward's log Z, rounded to the operands' dtype, then its two
    products dh += dz·W_tile and dW_tile = dzᵀ·h (bf16 products on an accelerator for a bf16
    policy, accumulated in float32)."""
    hidden_ND, w_DV, targets_N, log_z_N, mean_z_N = res
    g_logp_N, g_ent_N = cotangents
    dtype = jnp.promote_types(hidden_ND.dtype, w_DV.dtype)
    N, D = hidden_ND.shape
    V = w_DV.shape[1]

    def body(dh_ND, xs):
        w_VD, valid_V, offset = xs
        z, cols = _tile_logits(hidden_ND, w_VD, valid_V, offset, platform)
        p = jnp.exp(z - log_z_N[:, None])  # 0 on the padded columns
        hit = (cols == targets_N[:, None]).astype(jnp.float32)
        dz = (g_logp_N[:, None] * (hit - p)
              - g_ent_N[:, None] * p * (z - mean_z_N[:, None])).astype(dtype)
        dh_ND = dh_ND + dot_f32(dz, w_VD, platform=platform)
        dw_VD = einsum_f32("nc,nd->cd", dz, hidden_ND, platform=platform)
        return dh_ND, dw_VD.astype(w_DV.dtype)

    dh_ND, dw_blocks = jax.lax.scan(body, jnp.zeros((N, D), jnp.float32),
                                    _tiles(w_DV, block_v))
    dw_DV = dw_blocks.reshape(-1, D)[:V].T
    return dh_ND.astype(hidden_ND.dtype), dw_DV, None


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


def logprob_entropy_chunked(hidden_ND, w_DV, targets_N, block_v: int = 2048, *,
                            platform: str | None = None):
    """Same values as the reference, streamed over vocabulary tiles of `block_v` (`lax.scan`).

    Differentiable in hidden_ND and w_DV through its own backward (`_chunked_bwd`): one more
    pass over the tiles that recomputes each tile's logits and forms its logit gradient in
    closed form, instead of differentiating the streamed log-sum-exp (which kept float32
    gradient tiles and ran their products in float32).
    """
    _validate(hidden_ND, w_DV, targets_N)
    return _chunked(hidden_ND, w_DV, targets_N, block_v, platform)


def _grid_kernel(h_ref, w_ref, t_ref, m_ref, s_ref, sz_ref, tgt_ref, *, block_v: int,
                 vocab: int, dot_platform: str):
    """TPU: one (row block, vocab tile) step; the four [block_n, 1] accumulators are the
    output blocks, revisited along the vocabulary axis."""
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _():
        m_ref[...] = jnp.full(m_ref.shape, _NEG, jnp.float32)
        s_ref[...] = jnp.zeros(s_ref.shape, jnp.float32)
        sz_ref[...] = jnp.zeros(sz_ref.shape, jnp.float32)
        tgt_ref[...] = jnp.zeros(tgt_ref.shape, jnp.float32)

    z = dot_f32(h_ref[...], w_ref[...], platform=dot_platform)
    cols = j * block_v + jax.lax.broadcasted_iota(jnp.int32, z.shape, 1)
    z = jnp.where(cols < vocab, z, _NEG)  # the last tile's columns past V hold garbage
    carry = (m_ref[...], s_ref[...], sz_ref[...], tgt_ref[...])
    m_ref[...], s_ref[...], sz_ref[...], tgt_ref[...] = _merge(carry, z, cols, t_ref[...])


def _forward_grid(h_ND, w_DV, t_N, bs: BlockSizes, interpret: bool, platform: str):
    N, D = h_ND.shape
    V = w_DV.shape[1]
    bn, bv = bs.block_n, bs.block_v
    acc = jax.ShapeDtypeStruct((N, 1), jnp.float32)
    row = pl.BlockSpec((bn, 1), lambda i, j: (i, 0))
    return pl.pallas_call(
        functools.partial(_grid_kernel, block_v=bv, vocab=V,
                          dot_platform="cpu" if interpret else platform),
        out_shape=(acc, acc, acc, acc),
        grid=(N // bn, pl.cdiv(V, bv)),
        in_specs=[pl.BlockSpec((bn, D), lambda i, j: (i, 0)),
                  pl.BlockSpec((D, bv), lambda i, j: (0, j)),
                  row],
        out_specs=(row, row, row, row),
        compiler_params=None if interpret else hardware.compiler_params(
            platform, dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(h_ND, w_DV, t_N[:, None])


def _split_kernel(h_ref, w_ref, t_ref, m_ref, s_ref, sz_ref, tgt_ref, *, block_v: int,
                  block_d: int, tiles: int, vocab: int, dot_platform: str):
    """GPU: the row block's partial accumulators over vocabulary range `program_id(1)`:
    `tiles` tiles of `block_v` columns, each z = Σ_d h[:, d-step] · w[d-step, tile]."""
    from jax.experimental.pallas import triton as pltriton

    bn, D = h_ref.shape
    first = pl.program_id(1) * tiles * block_v
    t_N = t_ref[...]

    def tile(k, carry):
        start = pl.multiple_of(k * block_v, block_v)
        cols_V = first + start + jnp.arange(block_v, dtype=jnp.int32)
        valid_V = cols_V < vocab

        def step(i, z):
            d = pl.ds(pl.multiple_of(i * block_d, block_d), block_d)
            w = pltriton.load(w_ref.at[d, pl.ds(start, block_v)], mask=valid_V[None, :],
                              other=0)
            return z + dot_f32(h_ref[:, d], w, platform=dot_platform)

        z = jax.lax.fori_loop(0, D // block_d, step, jnp.zeros((bn, block_v), jnp.float32))
        z = jnp.where(valid_V[None, :], z, _NEG)
        cols = jnp.broadcast_to(cols_V[None, :], z.shape)
        return _merge(carry, z, cols, t_N)

    init = (jnp.full((bn,), _NEG, jnp.float32), jnp.zeros((bn,), jnp.float32),
            jnp.zeros((bn,), jnp.float32), jnp.zeros((bn,), jnp.float32))
    m_ref[...], s_ref[...], sz_ref[...], tgt_ref[...] = jax.lax.fori_loop(0, tiles, tile, init)


def _forward_split(h_ND, w_DV, t_N, bs: BlockSizes, interpret: bool, platform: str):
    N, D = h_ND.shape
    V = w_DV.shape[1]
    bn, bv = bs.block_n, bs.block_v
    bd = bs.block_d or max(16, min(64, hardware.pow2_factor(D)))
    if D % bd:  # D with a power-of-two factor below 16: pad D (copies the table)
        h_ND = jnp.pad(h_ND, ((0, 0), (0, -D % bd)))
        w_DV = jnp.pad(w_DV, ((0, -D % bd), (0, 0)))
        D = h_ND.shape[1]
    n_tiles = pl.cdiv(V, bv)
    per_split = pl.cdiv(n_tiles, max(1, min(bs.num_splits, n_tiles)))
    S = pl.cdiv(n_tiles, per_split)  # every range starts below V
    part = jax.ShapeDtypeStruct((S, N), jnp.float32)
    row = pl.BlockSpec((None, bn), lambda i, s: (s, i))
    m, s, sz, tgt = pl.pallas_call(
        functools.partial(_split_kernel, block_v=bv, block_d=bd, tiles=per_split, vocab=V,
                          dot_platform="cpu" if interpret else platform),
        out_shape=(part, part, part, part),
        grid=(N // bn, S),
        in_specs=[pl.BlockSpec((bn, D), lambda i, s: (i, 0)),
                  pl.BlockSpec((D, per_split * bv), lambda i, s: (0, s)),
                  pl.BlockSpec((bn,), lambda i, s: (i,))],
        out_specs=(row, row, row, row),
        compiler_params=None if interpret else hardware.compiler_params(platform),
        interpret=interpret,
    )(h_ND, w_DV, t_N)
    m_N = jnp.max(m, axis=0)
    scale = jnp.exp(m - m_N[None])
    return m_N, jnp.sum(s * scale, 0), jnp.sum(sz * scale, 0), jnp.sum(tgt, 0)


def _forward(hidden_ND, w_DV, targets_N, block_sizes: BlockSizes, interpret: bool,
             platform: str):
    N = hidden_ND.shape[0]
    bn = block_sizes.block_n
    Np = -(-N // bn) * bn
    h = jnp.pad(hidden_ND, ((0, Np - N), (0, 0)))
    t = jnp.pad(targets_N.astype(jnp.int32), (0, Np - N))
    forward = _forward_split if platform == "gpu" else _forward_grid
    m, s, sz, tgt = (x.reshape(Np) for x in forward(h, w_DV, t, block_sizes, interpret,
                                                    platform))
    logp, ent = _finish(m, s, sz, tgt)
    return logp[:N], ent[:N]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _logprob_entropy(hidden_ND, w_DV, targets_N, block_sizes, interpret, platform):
    return _forward(hidden_ND, w_DV, targets_N, block_sizes, interpret, platform)


def _fwd(hidden_ND, w_DV, targets_N, block_sizes, interpret, platform):
    out = _forward(hidden_ND, w_DV, targets_N, block_sizes, interpret, platform)
    return out, (hidden_ND, w_DV, targets_N)


def _bwd(block_sizes, interpret, platform, res, cotangents):
    hidden_ND, w_DV, targets_N = res
    bv = min(block_sizes.block_v_backward, w_DV.shape[1])
    _, vjp = jax.vjp(lambda h, w: logprob_entropy_chunked(
        h, w, targets_N, bv, platform="cpu" if interpret else platform), hidden_ND, w_DV)
    dh, dw = vjp(cotangents)
    return dh, dw, None


_logprob_entropy.defvjp(_fwd, _bwd)


def logprob_entropy(hidden_ND, w_DV, targets_N, *, block_sizes: BlockSizes | None = None,
                    interpret: bool = False, platform: str | None = None):
    """Pallas (logp_N, entropy_N); differentiable in hidden_ND and w_DV.

    `platform`: "tpu" / "gpu" (None: the default backend) picks the kernel and, with
    `block_sizes=None`, its tiles (`block_sizes_for`). Compiled kernels exist for TPU and GPU
    only (`supported`); on CPU only `interpret=True` works (the TPU kernel, or the GPU one with
    platform="gpu"); the library calls `logprob_entropy_chunked` there instead.
    """
    _validate(hidden_ND, w_DV, targets_N)
    name = hardware.resolve_platform(platform)
    if name == "cpu" and not interpret:
        raise ValueError("logprob_entropy compiles for TPU / GPU only: on CPU use "
                         "interpret=True or logprob_entropy_chunked")
    if block_sizes is None:
        block_sizes = block_sizes_for(name, (*hidden_ND.shape, w_DV.shape[1]),
                                      jnp.promote_types(hidden_ND.dtype, w_DV.dtype))
    return _logprob_entropy(hidden_ND, w_DV, targets_N, block_sizes, interpret, name)
