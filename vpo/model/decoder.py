"""Flax NNX decoder for the Llama 3 / Qwen2 / Qwen2.5 / Qwen3 families, with a shared-prefix KV
cache.

Architecture: token embedding → L × [RMSNorm → GQA attention with RoPE (optional qkv bias, optional
per-head q/k RMSNorm) → residual → RMSNorm → SwiGLU MLP → residual] → RMSNorm → LM head (tied to
the embedding or separate). Parameters carry `logical_axes` metadata that `vpo.model.sharding` maps
to mesh axes. With `cfg.lora_rank` r > 0 the projections named in `cfg.lora_targets` carry a `LoRA`
adapter (`nnx.LoRAParam` A, B): y = x·W + (α/r)·(x·A)·B (see `vpo.model.lora`).

Three entry points share one attention routine:
  * `model(tokens_BO, mask_BO)` — full causal forward over left-padded sequences → logits_BOV.
  * `model.prefill(tokens_BP, mask_BP)` — the prompt once → (hidden_BPD, Prefix): the prompt's
    keys/values, shared by every continuation of that prompt.
  * `model.extend(tokens_BGO, prefix, cache, start)` — G continuations per prompt attend to the
    shared prefix and to their own suffix cache (`cache=None`: only to the new tokens), so
    prefill work and prefix memory do not grow with G. Decoding is `extend` with O = 1; the
    training forward is `extend` over all T completion tokens, or over packed rows of several
    continuations each (`segment_ids_BGO`, `vpo.rl.packing`).

Decode attention reads the whole suffix cache it is given, so the sampler keeps the cache as
long as the tokens so far need (`KVCache.grown`, doubling): a step at position t costs O(P + t),
not O(P + budget). On GPU / TPU a decode step can run the Pallas kernel
(`vpo.kernels.decode_attention`, `decode_attention_impl`), which bounds its reads itself.
Products that accumulate in float32 go through `vpo.kernels.precision`, so bfloat16 parameters
also run on CPU (whose runtime lacks a bf16 × bf16 → f32 dot); their gradient products run in
the operands' dtype (`einsum_f32_low_grad`: bf16 ones on an accelerator, not float32 ones).

`Decoder.platform` ("tpu" / "gpu" / "cpu", or None for the default backend) is the platform
the model's programs are built for (`vpo.kernels.hardware.platform_of` of its mesh): it picks
the kernels and the float32 products, so a program compiled ahead of time for a TPU mesh on a
CPU host takes the TPU branches.

Dimension key: B batch (prompts), G continuations per prompt, O new tokens, P prompt length,
C suffix-cache length, V vocab, D width, F MLP width, H query heads, Z KV heads, E head dim,
L layers.
"""

# size: one job, the decoder: its layers, attention over the shared-prefix cache and the cache
# itself; the adapter (`adapter`), LoRA on a policy (`lora`) and the mesh (`sharding`) are apart.

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from vpo.config import ModelConfig
from vpo.kernels import choice as choice_lib
from vpo.kernels import decode_attention as decode_lib
from vpo.kernels import hardware
from vpo.kernels.precision import einsum_f32_low_grad as _einsum_f32
from vpo.model import draw as draw_lib
from vpo.model.adapter import add_adapters, plus_lora

_MASKED = -1e30  # finite, so fully masked rows (left padding) give no NaN


_KERNELS = ("pallas", "interpret")  # `Decoder.extend(attention=...)` besides "xla"
_KERNEL_BLOCK_K = decode_lib.BlockSizes.get_default().block_k


def decode_attention_impl(devices=None, *, platform: str | None = None, choice: str = "auto",
                          keys: int | None = None) -> str:
    """The decode-attention path, "pallas" or "xla", for `devices` (a Mesh, a Sharding, a
    device or a sequence of devices; None: the default backend's). `choice` "auto"
    (`ModelConfig.decode_attention`): the Pallas kernel only on one GPU / TPU chip (XLA cannot
    partition a kernel over a mesh of several devices) and where the committed measurements
    show it faster than XLA at `keys` = prompt + completion positions
    (`vpo.kernels.choice.default_impl`); "xla" as given; "pallas" as given where it can run,
    else a ValueError. `platform` (a model's `Decoder.platform`, set when it is built for a
    target other than this process's backend) replaces the devices' own; the devices are then
    counted on the mesh the program is built under (`jax.set_mesh`), if any."""
    if devices is None and platform is not None:
        mesh = jax.sharding.get_abstract_mesh()
        count = 1 if mesh.empty else mesh.size
    else:
        if devices is None:
            devices = jax.devices()
        elif isinstance(devices, jax.sharding.Mesh):
            devices = devices.devices.flat
        elif isinstance(devices, jax.sharding.Sharding):
            devices = devices.device_set
        elif hasattr(devices, "platform"):
            devices = [devices]
        devices = list(devices)
        count = len(devices)
        platform = platform or hardware.platform_of(devices)
    if choice == "pallas" and (count > 1 or not decode_lib.supported(platform)):
        raise ValueError(f"model.decode_attention=pallas: the Pallas decode kernel runs on one "
                         f"GPU or TPU chip; this program is built for {count} "
                         f"{hardware.resolve_platform(platform)} device(s). Use auto or xla.")
    if count > 1:
        return "xla"
    return choice_lib.default_impl("decode_attention", platform, choice, keys=keys)


class Prefix(NamedTuple):
    """Keys/values of each prompt, computed once and shared by its G continuations.

    One [B, Z, P, E] array per layer, laid out so that attention contracts E with (B, Z) as
    batch dims: a tuple of L arrays from an unrolled decoder (reading a layer then costs no slice
    copy), one stacked [L, B, Z, P, E] array from a scanned one (`ModelConfig.scan`; the layer
    scan reads its slice). `k_BZPE[i]` is layer i's either way.
    """

    k_BZPE: tuple[jax.Array, ...] | jax.Array  # one per layer
    v_BZPE: tuple[jax.Array, ...] | jax.Array
    mask_BP: jax.Array  # True on real prompt tokens (prompts are left-padded)
    length_B: jax.Array  # number of real prompt tokens = position of the first new token


class KVCache(NamedTuple):
    """Per-continuation keys/values of generated tokens, written at slots [0, C).

    Unrolled decoder: one [B, G, Z, C, E] buffer per layer (a tuple); inside the decode
    `while_loop` each is updated in place by one dynamic-update-slice per step and read by
    attention without a transpose. Scanned decoder (`ModelConfig.scan`): one stacked
    [L, B, G, Z, C, E] buffer, carried through the layer scan and updated in place at
    (layer, slot). `k_BGZCE[i]` is layer i's either way.
    """

    k_BGZCE: tuple[jax.Array, ...] | jax.Array  # one per layer
    v_BGZCE: tuple[jax.Array, ...] | jax.Array

    def grown(self, length: int) -> KVCache:
        """This cache with zero slots appended up to `length` slots (a copy; the same cache
        if it has that many already). A decode loop that doubles the cache when full copies
        fewer than 2·T slots in all and attends to O(t) slots at step t."""
        C = self.k_BGZCE[0].shape[3]
        if length <= C:
            return self

        def grow(x):  # the slot axis C is the second to last of both layouts
            return jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, length - C), (0, 0)])

        def each(xs):
            return grow(xs) if isinstance(xs, jax.Array) else tuple(map(grow, xs))

        return KVCache(each(self.k_BGZCE), each(self.v_BGZCE))


def _lead(x, ndim: int):
    """Reshape x to rank `ndim` by adding leading unit axes (explicit broadcasting)."""
    return x.reshape((1,) * (ndim - x.ndim) + x.shape)


def _dense(x, w):
    """x [..., D] · w [D, *out] → [..., *out] as one 2-D product over the flattened tokens.

    The same value as `einsum("...d,d...")`, but the backward's weight gradient then contracts
    one token axis, not B, G and O: XLA:CPU fed a multi-axis contraction through transposing
    copies of the activations ([2, 8, 63, 1536] → [1536, 2, 8, 63], ~20-40 ms each on SmolLM2),
    1.4x slower over an MLP block's forward and backward."""
    lead, d = x.shape[:-1], x.shape[-1]
    return (x.reshape(-1, d) @ w.reshape(d, -1)).reshape(lead + w.shape[1:])


_NORMAL = draw_lib.normal(0.02)
_ZEROS = draw_lib.zeros


def _param(init, key, shape, dtype, axes):
    return nnx.Param(draw_lib.draw_weight(init, key, shape, dtype, axes), logical_axes=axes)


class RMSNorm(nnx.Module):
    """y = x / sqrt(mean(x²) + eps) · scale, computed in float32 (Zhang & Sennrich, 2019)."""

    def __init__(self, dim: int, eps: float, param_dtype, axis: str):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=(axis,))

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * _lead(self.scale[...].astype(jnp.float32), y.ndim)).astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> jax.Array:
    """Inverse frequencies θ^(-2i/E), i < E/2, with Llama-3 scaling when configured.

    Llama 3 scaling (Meta, 2024): wavelengths longer than original_max_position / low_freq_factor
    are divided by `factor`, shorter than original_max_position / high_freq_factor are kept, and
    the band between is interpolated linearly in 1/wavelength.
    """
    E = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (jnp.arange(0, E, 2, dtype=jnp.float32) / E))
    s = cfg.rope_scaling
    if s is None:
        return inv
    wavelen = 2 * math.pi / inv
    low_wl = s.original_max_position / s.low_freq_factor
    high_wl = s.original_max_position / s.high_freq_factor
    scaled = jnp.where(wavelen > low_wl, inv / s.factor, inv)
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wl) & (wavelen <= low_wl)
    return jnp.where(medium, blended, scaled)


def rope_cos_sin(positions, inv_freq_E2):
    """cos, sin of shape positions.shape + (E,) in the half-split layout of HF Llama/Qwen."""
    angles = positions.astype(jnp.float32)[..., None] * _lead(inv_freq_E2, positions.ndim + 1)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x_BGOHE, cos_BGOE, sin_BGOE):
    """Rotary embedding (Su et al., 2021, arXiv 2104.09864): x·cos + rotate_half(x)·sin."""
    half = x_BGOHE.shape[-1] // 2
    rotated = jnp.concatenate([-x_BGOHE[..., half:], x_BGOHE[..., :half]], axis=-1)
    cos, sin = cos_BGOE[..., None, :], sin_BGOE[..., None, :]
    out = x_BGOHE.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin
    return out.astype(x_BGOHE.dtype)


def attend(q_BGOHE, k_BGZCE, v_BGZCE, mask_BGOC, prefix_kv=None, prefix_mask_BP=None, *,
           platform: str | None = None):
    """softmax(q·kᵀ/√E + mask)·v over [prefix keys ‖ suffix keys], one softmax over both.

    Grouped-query attention: query head h reads KV head h // (H/Z). prefix_kv, if given, is
    (k_BZPE, v_BZPE), shared by the G continuations of each prompt. Scores and softmax in float32.
    The two key blocks are never concatenated: with m the row max over both,
    out = (Σ_p e^(s_p - m) v_p + Σ_c e^(s_c - m) v_c) / (Σ_p e^(s_p - m) + Σ_c e^(s_c - m)),
    normalised after the value products (fewer elements than the scores). Returns out_BGZHOE
    (H = H/Z query heads per KV head), the layout the output projection contracts directly.
    `platform`: the target of the float32 products (`vpo.kernels.precision`).
    """
    einsum_f32 = functools.partial(_einsum_f32, platform=platform)
    B, G, O, H, E = q_BGOHE.shape
    Z = k_BGZCE.shape[2]
    q = (q_BGOHE * (1.0 / math.sqrt(E))).reshape(B, G, O, Z, H // Z, E)
    q = q.transpose(0, 1, 3, 4, 2, 5)  # bgzhoe
    s_own = einsum_f32("bgzhoe,bgzce->bgzhoc", q, k_BGZCE)
    s_own = jnp.where(mask_BGOC[:, :, None, None], s_own, _MASKED)
    m = jnp.max(s_own, axis=-1, keepdims=True)
    if prefix_kv is not None:
        kp, vp = prefix_kv
        s_pre = einsum_f32("bgzhoe,bzpe->bgzhop", q, kp)
        s_pre = jnp.where(prefix_mask_BP[:, None, None, None, None, :], s_pre, _MASKED)
        m = jnp.maximum(m, jnp.max(s_pre, axis=-1, keepdims=True))
    m = jax.lax.stop_gradient(m)  # any shift gives the same softmax
    e_own = jnp.exp(s_own - m)
    z = jnp.sum(e_own, axis=-1, keepdims=True)
    out = einsum_f32("bgzhoc,bgzce->bgzhoe", e_own.astype(v_BGZCE.dtype), v_BGZCE)
    if prefix_kv is not None:
        e_pre = jnp.exp(s_pre - m)
        z = z + jnp.sum(e_pre, axis=-1, keepdims=True)
        out = out + einsum_f32("bgzhop,bzpe->bgzhoe", e_pre.astype(vp.dtype), vp)
    return (out / z).astype(v_BGZCE.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        D, H, Z, E = cfg.dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        pd = jnp.dtype(cfg.param_dtype)
        init = _NORMAL
        self.dtype = jnp.dtype(cfg.dtype)
        self.wq = _param(init, rngs.params(), (D, H, E), pd, ("embed", "heads", "head_dim"))
        self.wk = _param(init, rngs.params(), (D, Z, E), pd, ("embed", "kv_heads", "head_dim"))
        self.wv = _param(init, rngs.params(), (D, Z, E), pd, ("embed", "kv_heads", "head_dim"))
        self.wo = _param(init, rngs.params(), (H, E, D), pd, ("heads", "head_dim", "embed"))
        if cfg.qkv_bias:
            zeros = _ZEROS
            self.bq = _param(zeros, rngs.params(), (H, E), pd, ("heads", "head_dim"))
            self.bk = _param(zeros, rngs.params(), (Z, E), pd, ("kv_heads", "head_dim"))
            self.bv = _param(zeros, rngs.params(), (Z, E), pd, ("kv_heads", "head_dim"))
        else:
            self.bq = self.bk = self.bv = None
        if cfg.qk_norm:
            self.q_norm = RMSNorm(E, cfg.norm_eps, pd, "head_dim")
            self.k_norm = RMSNorm(E, cfg.norm_eps, pd, "head_dim")
        else:
            self.q_norm = self.k_norm = None
        self.wq_lora = self.wk_lora = self.wv_lora = self.wo_lora = None  # `add_adapters`

    def _project(self, x, w, b, lora, y=None):
        """x·w (or its precomputed product `y`), then the adapter and the bias."""
        y = _dense(x, w[...].astype(self.dtype)) if y is None else y
        y = plus_lora(y, lora, x)
        return y if b is None else y + _lead(b[...].astype(self.dtype), y.ndim)

    def merged_weight(self):
        """[wq ‖ wk ‖ wv] as one [D, (H + 2Z)·E] matrix in the compute dtype."""
        D = self.wq.shape[0]
        return jnp.concatenate([w[...].astype(self.dtype).reshape(D, -1)
                                for w in (self.wq, self.wk, self.wv)], axis=1)

    def _project_merged(self, x_BGOD, w_qkv):
        """q, k, v from one product with `merged_weight()` (then each projection's adapter and
        bias): the same values as three products."""
        H, Z, E = self.wq.shape[1], self.wk.shape[1], self.wq.shape[2]
        parts = jnp.split(_dense(x_BGOD, w_qkv), [H * E, (H + Z) * E], axis=-1)
        return [self._project(x_BGOD, w, b, lora, part.reshape(x_BGOD.shape[:-1] + w.shape[1:]))
                for part, w, b, lora in zip(parts, (self.wq, self.wk, self.wv),
                                            (self.bq, self.bk, self.bv),
                                            (self.wq_lora, self.wk_lora, self.wv_lora),
                                            strict=True)]

    def __call__(self, x_BGOD, cos, sin, mask_BGOC, cache_kv, start, prefix_kv, prefix_mask_BP,
                 kernel=None, platform=None, w_qkv=None):
        """Attention of the O new tokens. `kernel` ("pallas" | "interpret"): one decode token
        (O = 1) through the Pallas kernel, which reads only cache slots [0, start + 1).
        `platform`: the target (`Decoder.platform`). `w_qkv`: `merged_weight()` made once
        outside a decode loop (`Decoder.merged_weights`); None: three products.
        Returns (y_BGOD, (k, v)): the whole cache with the new keys written (without a cache:
        the new keys)."""
        if w_qkv is None:
            q = self._project(x_BGOD, self.wq, self.bq, self.wq_lora)
            k = self._project(x_BGOD, self.wk, self.bk, self.wk_lora)
            v = self._project(x_BGOD, self.wv, self.bv, self.wv_lora)
        else:
            q, k, v = self._project_merged(x_BGOD, w_qkv)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = k.transpose(0, 1, 3, 2, 4), v.transpose(0, 1, 3, 2, 4)  # BGSZE -> BGZSE
        if cache_kv is not None:  # write the new keys at slots [start, start + O)
            at = (0, 0, 0, start, 0)
            k = jax.lax.dynamic_update_slice(cache_kv[0], k.astype(cache_kv[0].dtype), at)
            v = jax.lax.dynamic_update_slice(cache_kv[1], v.astype(cache_kv[1].dtype), at)
        H, E, D = self.wo.shape
        Z = k.shape[2]
        if kernel is not None:
            Bt, G = q.shape[:2]
            out_BGZHE = decode_lib.decode_attention(
                q[:, :, 0].reshape(Bt, G, Z, H // Z, E), *prefix_kv, prefix_mask_BP, k, v,
                start + 1, interpret=kernel == "interpret", platform=platform)
            out_BGZHOE = out_BGZHE[:, :, :, :, None].astype(v.dtype)
        else:
            out_BGZHOE = attend(q, k, v, mask_BGOC, prefix_kv, prefix_mask_BP,
                                platform=platform)
        # query head z·(H/Z) + h is row block h of wo; the small activation is brought into that
        # order (given the [Z,H/Z,O,E] layout XLA relaid out the whole weight instead, inside the
        # decode loop at every token: ~5% of SmolLM2's sampling on CPU)
        Bt, G, _, _, O, _ = out_BGZHOE.shape
        out_BGOHE = out_BGZHOE.transpose(0, 1, 4, 2, 3, 5).reshape(Bt, G, O, H, E)
        y = _dense(out_BGOHE.reshape(Bt, G, O, H * E),
                   self.wo[...].astype(self.dtype).reshape(H * E, D))
        if self.wo_lora is not None:
            y = y + self.wo_lora(out_BGOHE)
        return y, (k, v)


class MLP(nnx.Module):
    """SwiGLU (Shazeer, 2020, arXiv 2002.05202): down(silu(gate(x)) ⊙ up(x))."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        D, F = cfg.dim, cfg.mlp_dim
        pd = jnp.dtype(cfg.param_dtype)
        init = _NORMAL
        self.dtype = jnp.dtype(cfg.dtype)
        self.w_gate = _param(init, rngs.params(), (D, F), pd, ("embed", "mlp"))
        self.w_up = _param(init, rngs.params(), (D, F), pd, ("embed", "mlp"))
        self.w_down = _param(init, rngs.params(), (F, D), pd, ("mlp", "embed"))
        self.w_gate_lora = self.w_up_lora = self.w_down_lora = None  # `add_adapters`

    def merged_weight(self):
        """[w_gate ‖ w_up] as one [D, 2F] matrix in the compute dtype."""
        return jnp.concatenate([self.w_gate[...].astype(self.dtype),
                                self.w_up[...].astype(self.dtype)], axis=1)

    def __call__(self, x, w_gate_up=None):
        """`w_gate_up`: `merged_weight()` made once outside a decode loop; gate and up are
        then one product (the same values)."""
        if w_gate_up is None:
            gate = _dense(x, self.w_gate[...].astype(self.dtype))
            up = _dense(x, self.w_up[...].astype(self.dtype))
        else:
            gate, up = jnp.split(_dense(x, w_gate_up), [self.w_gate.shape[1]], axis=-1)
        gate, up = plus_lora(gate, self.w_gate_lora, x), plus_lora(up, self.w_up_lora, x)
        h = jax.nn.silu(gate) * up
        return plus_lora(_dense(h, self.w_down[...].astype(self.dtype)), self.w_down_lora, h)


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps, pd, "embed")
        self.attn = Attention(cfg, rngs)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps, pd, "embed")
        self.mlp = MLP(cfg, rngs)

    def merged_weights(self):
        """(w_qkv, w_gate_up): the block's products that share an input, concatenated."""
        return self.attn.merged_weight(), self.mlp.merged_weight()

    def __call__(self, x, cos, sin, mask, cache_kv, start, prefix_kv, prefix_mask, kernel=None,
                 platform=None, merged=None):
        w_qkv, w_gate_up = (None, None) if merged is None else merged
        h, kv = self.attn(self.attn_norm(x), cos, sin, mask, cache_kv, start, prefix_kv,
                          prefix_mask, kernel, platform, w_qkv)
        x = x + h
        return x + self.mlp(self.mlp_norm(x), w_gate_up), kv


class Decoder(nnx.Module):
    """The policy: a decoder-only transformer (see the module docstring). `platform`: the
    platform its programs are built for (None: the default backend at trace time)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, platform: str | None = None):
        self.cfg = cfg
        self.platform = None if platform is None else hardware.resolve_platform(platform)
        pd = jnp.dtype(cfg.param_dtype)
        self.dtype = jnp.dtype(cfg.dtype)
        self.embed = _param(_NORMAL, rngs.params(),
                            (cfg.vocab_size, cfg.dim), pd, ("vocab", "embed"))
        self.layers = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.dim, cfg.norm_eps, pd, "embed")
        self.lm_head = None if cfg.tie_embeddings else _param(
            _NORMAL, rngs.params(), (cfg.dim, cfg.vocab_size), pd,
            ("embed", "vocab"))
        if cfg.lora_rank:
            add_adapters(self, rngs.params())  # drawn after every base weight

    # -- pieces -------------------------------------------------------------------------------
    def logits(self, hidden_xD):
        """Unembedding: final hidden states [..., D] → logits [..., V] (float32)."""
        w = self.embed[...].T if self.lm_head is None else self.lm_head[...]
        return _einsum_f32("...d,dv->...v", hidden_xD, w.astype(self.dtype),
                           platform=self.platform)

    def rope(self, positions):
        """(cos, sin) of RoPE at integer `positions` (any shape) → positions.shape + (E,)."""
        return rope_cos_sin(positions, rope_inv_freq(self.cfg))

    @property
    def scanned(self) -> bool:
        """Whether the layer stack runs as one `lax.scan` (`ModelConfig.scan`)."""
        return self.cfg.scan

    def merged_weights(self):
        """Each block's products that share an input as one matrix: ([wq ‖ wk ‖ wv],
        [w_gate ‖ w_up]) in the compute dtype, a tuple of L pairs (unrolled) or one pair of
        stacked [L, ...] arrays (scanned). A decode loop makes them once before it and hands
        them to every `extend(..., merged=)`: one product instead of three and of two, and no
        concatenation inside the loop (XLA:GPU merges such products by itself, concatenating
        the weights again at every token: 0.94 GB a step for Qwen2.5-0.5B). The same values as
        the separate products; one more copy of those weights while the loop runs."""
        pairs = tuple(layer.merged_weights() for layer in self.layers)
        if self.scanned:
            return tuple(jnp.stack(ws) for ws in zip(*pairs, strict=True))
        return pairs

    def loop_weights(self) -> dict:
        """What a decode loop makes once before it and hands to every step
        (`vpo.rollout.sampler.step_kwargs`): `merged=merged_weights()` on a GPU; nothing
        elsewhere (on the CPU the merged products measured 0.94x the separate ones,
        `experiments/bench_merged.py`; a TPU build was not examined)."""
        if hardware.resolve_platform(self.platform) != "gpu":
            return {}
        return {"merged": self.merged_weights()}

    def _run(self, tokens_BGO, mask_BGOC, cache, start, prefix, cos_sin, kernel=None,
             remat=False, merged=None):
        """Embedding → the L blocks → final norm. Returns (hidden, keys, values): the keys and
        values of every layer (the whole caches when `cache` is given), a tuple of L arrays
        (unrolled) or one stacked [L, ...] array (scanned). `merged`: `merged_weights()`."""
        x = self.embed[...].astype(self.dtype)[tokens_BGO]
        cos, sin = cos_sin  # [B or 1, G or 1, O, E]: broadcast over the dims they lack
        prefix_mask = None if prefix is None else prefix.mask_BP
        block_def = nnx.graphdef(self.layers[0])

        def block(state, x, cache_kv, prefix_kv, merged_i=None):
            return nnx.merge(block_def, state)(x, cos, sin, mask_BGOC, cache_kv, start,
                                               prefix_kv, prefix_mask, kernel, self.platform,
                                               merged_i)

        if remat:  # keep only each block's input for the backward pass; recompute the rest
            block = jax.checkpoint(block, prevent_cse=not self.scanned)
        if self.scanned:
            x, ks, vs = self._scan_blocks(block, x, cache, prefix, merged)
            return self.final_norm(x), ks, vs
        ks, vs = [], []
        for i, layer in enumerate(self.layers):
            cache_kv = None if cache is None else (cache.k_BGZCE[i], cache.v_BGZCE[i])
            prefix_kv = None if prefix is None else (prefix.k_BZPE[i], prefix.v_BZPE[i])
            merged_i = None if merged is None else merged[i]
            if remat:
                x, (k, v) = block(nnx.state(layer), x, cache_kv, prefix_kv, merged_i)
            else:
                x, (k, v) = layer(x, cos, sin, mask_BGOC, cache_kv, start, prefix_kv,
                                  prefix_mask, kernel, self.platform, merged_i)
            ks.append(k)
            vs.append(v)
        return self.final_norm(x), tuple(ks), tuple(vs)

    def _scan_blocks(self, block, x, cache, prefix, merged=None):
        """The L blocks as one `lax.scan` over their stacked weights: one compiled block body
        instead of L (compile time and compile memory do not grow with L). The layers' weights
        are stacked [L, ...] for the scan (one copy of the blocks' weights, which the backward
        pass turns back into per-layer gradients). A cache is carried through the scan as one
        stacked buffer and updated in place at (layer, slot); a prefix is read per layer."""
        stacked = jax.tree.map(lambda *w: jnp.stack(w), *(nnx.state(b) for b in self.layers))
        kc = vc = pk = pv = None
        if cache is not None:
            kc, vc = stack_layers(cache.k_BGZCE), stack_layers(cache.v_BGZCE)
        if prefix is not None:
            pk, pv = stack_layers(prefix.k_BZPE), stack_layers(prefix.v_BZPE)

        def body(carry, xs):
            x, kc, vc = carry
            i, state, pk_i, pv_i, merged_i = xs
            cache_kv = None if kc is None else (kc[i], vc[i])
            x, (k, v) = block(state, x, cache_kv, None if pk_i is None else (pk_i, pv_i),
                              merged_i)
            if kc is None:
                return (x, None, None), (k, v)
            kc = jax.lax.dynamic_update_index_in_dim(kc, k.astype(kc.dtype), i, 0)
            vc = jax.lax.dynamic_update_index_in_dim(vc, v.astype(vc.dtype), i, 0)
            return (x, kc, vc), None

        layers = jnp.arange(self.cfg.num_layers, dtype=jnp.int32)
        (x, kc, vc), kv = jax.lax.scan(body, (x, kc, vc), (layers, stacked, pk, pv, merged))
        return (x, *kv) if kc is None else (x, kc, vc)

    # -- entry points -------------------------------------------------------------------------
    def prefill(self, tokens_BP, mask_BP=None, *, remat: bool = False):
        """Causal forward over left-padded prompts → (hidden_BPD, Prefix). `remat`: each block
        recomputed in the backward pass (`jax.checkpoint`), which keeps one [B, P, D] input
        per layer instead of every intermediate (for a forward that is differentiated)."""
        B, P = tokens_BP.shape
        mask_BP = jnp.ones((B, P), bool) if mask_BP is None else mask_BP.astype(bool)
        positions_BP = jnp.maximum(jnp.cumsum(mask_BP, axis=1) - 1, 0)
        causal_PP = jnp.tril(jnp.ones((P, P), bool))
        mask_B1PP = (causal_PP[None] & mask_BP[:, None, :])[:, None]
        h, k, v = self._run(tokens_BP[:, None], mask_B1PP, None, 0, None,
                            self.rope(positions_BP[:, None]), remat=remat)
        if self.scanned:  # [L, B, 1, Z, P, E] -> [L, B, Z, P, E]
            k, v = k[:, :, 0], v[:, :, 0]
        else:
            k, v = tuple(x[:, 0] for x in k), tuple(x[:, 0] for x in v)
        return h[:, 0], Prefix(k, v, mask_BP, mask_BP.sum(axis=1).astype(jnp.int32))

    def extend_masked(self, tokens_BGO, prefix: Prefix, cache: KVCache, start, mask_BGOC,
                      rope, *, merged=None):
        """`extend` with the attention mask and positions given per row: each continuation
        writes its O new tokens at slots [start, start + O) of `cache` and attends to the slots
        `mask_BGOC` marks (and to its prompt's prefix); `rope` is the (cos, sin) of each row's
        own positions, [B, G, O, E] (`self.rope(positions_BGO)`). For continuations that do not
        advance together (a multi-turn episode idles while others finish their turn): a slot
        left out of the mask is never read, so positions need not equal slots. Returns
        (hidden_BGOD, KVCache). `merged`: as in `extend`."""
        h, k, v = self._run(tokens_BGO, mask_BGOC, cache, start, prefix, rope, merged=merged)
        return h, KVCache(k, v)

    def __call__(self, tokens_BO, mask_BO=None):
        """Full causal forward → logits_BOV (float32)."""
        return self.logits(self.prefill(tokens_BO, mask_BO)[0])

    def extend(self, tokens_BGO, prefix: Prefix, cache: KVCache | None = None, start=0,
               rope=None, attention: str = "xla", *, remat: bool = False,
               segment_ids_BGO=None, merged=None):
        """G continuations per prompt: new tokens at suffix slots [start, start+O).

        Attends to the prompt's shared prefix and causally to the suffix: the cache's slots
        ≤ start + s, or with `cache=None` only the O new tokens (then `start` must be 0).
        `rope`: optional precomputed (cos, sin) [B, 1, O, E] of the new tokens' positions
        `prefix.length_B + start + s` (`self.rope(...)`); a decode loop computes them once for
        all steps instead of evaluating sin/cos every step. Computed per prompt, not per
        continuation (the G continuations share positions).
        Attention reads every cache slot (masked beyond start + s): a decode loop keeps the
        cache only as long as the tokens so far need (`KVCache.grown`), so a step costs
        O(tokens so far), not O(budget).
        `attention`: "xla" (any backend), or "pallas" / "interpret" for one decode token (O = 1)
        with a cache through `vpo.kernels.decode_attention` (`decode_attention_impl` picks by
        devices), which reads only slots [0, start + 1) of a cache of any length.
        `remat`: as in `prefill` (the training forward over all T completion tokens).
        `segment_ids_BGO` (packed rows, `vpo.rl.packing`; no cache, start 0): each row holds
        several continuations of its prompt end to end, runs of equal ids; a token attends to
        the prefix and causally to its own segment only, at position `prefix.length_B` + its
        offset in the segment (Krell et al., 2021, arXiv 2107.02027).
        `merged`: `self.merged_weights()`, made once before a decode loop (None: the separate
        products).
        Returns (hidden_BGOD, KVCache with the new keys written).
        """
        B, G, O = tokens_BGO.shape
        C = O if cache is None else cache.k_BGZCE[0].shape[3]
        kernel = None if attention == "xla" else attention
        if kernel is not None and (O != 1 or cache is None or kernel not in _KERNELS):
            raise ValueError(f"attention={attention!r} needs one new token (O = 1, got {O}) "
                             f"and a cache; choose one of 'xla', {', '.join(map(repr, _KERNELS))}")
        pos_O = start + jnp.arange(O)
        mask_OC = jnp.arange(C)[None, :] <= pos_O[:, None]
        mask_BGOC = jnp.broadcast_to(mask_OC, (B, G, O, C))
        if segment_ids_BGO is not None:
            if cache is not None or rope is not None:
                raise ValueError("segment_ids_BGO packs whole continuations: no cache, no rope")
            seg = segment_ids_BGO
            mask_BGOC = mask_BGOC & (seg[..., :, None] == seg[..., None, :])
            s_BGO = jnp.broadcast_to(jnp.arange(O, dtype=jnp.int32), (B, G, O))
            new_BGO = jnp.concatenate([jnp.ones((B, G, 1), bool), seg[..., 1:] != seg[..., :-1]],
                                      axis=-1)
            first_BGO = jax.lax.cummax(jnp.where(new_BGO, s_BGO, 0), axis=2)
            rope = self.rope(prefix.length_B[:, None, None] + (s_BGO - first_BGO))
        if rope is None:
            rope = self.rope(prefix.length_B[:, None, None] + pos_O[None, None, :])
        h, k, v = self._run(tokens_BGO, mask_BGOC, cache, start, prefix, rope, kernel, remat,
                            merged)
        return h, KVCache(k, v)

    def init_cache(self, batch: int, group: int, length: int, attention: str = "xla") -> KVCache:
        """Zeroed suffix cache for `group` continuations of `batch` prompts: `length` slots,
        rounded up to a whole number of kernel blocks for the Pallas decode kernel."""
        c = self.cfg
        if attention != "xla":
            length = -(-length // _KERNEL_BLOCK_K) * _KERNEL_BLOCK_K
        shape = (batch, group, c.num_kv_heads, length, c.head_dim)
        if self.scanned:  # one stacked buffer, carried through the layer scan
            shape = (c.num_layers, *shape)
            return KVCache(jnp.zeros(shape, self.dtype), jnp.zeros(shape, self.dtype))
        zeros = tuple(jnp.zeros(shape, self.dtype) for _ in range(c.num_layers))
        return KVCache(zeros, tuple(jnp.zeros(shape, self.dtype) for _ in range(c.num_layers)))

    def extend_rows(self, tokens_N, prefix: Prefix, cache: KVCache, start_N,
                    attention: str = "xla", *, merged=None) -> tuple[jax.Array, KVCache]:
        """One new token for each of N independent rows, row r at its own suffix slot
        start_N[r] (`extend` puts every row at one slot).

        Row r is a batch of one prompt with one continuation: `prefix` has N rows (its keys
        [N, Z, P, E] per layer, `mask_BP` [N, P], `length_B` [N]) and `cache` N rows of one
        continuation ([N, 1, Z, C, E] per layer; scanned: [L, N, 1, Z, C, E]). This is `extend`
        mapped over the rows (`jax.vmap`): each row writes its key/value at its own slot and
        attends to its prefix and to its slots ≤ start_N[r]; slots above are masked, so a row
        reused for a new continuation needs no cleared cache. With `attention="xla"` every row
        reads all C slots. `merged`: as in `extend` (shared by the rows). Returns (hidden_ND,
        KVCache of N rows).
        """
        ax = 1 if self.scanned else 0  # the row axis of a layer's keys: [(L,) N, ...]

        def unit(xs):  # one row's leaves → a batch of one
            return jax.tree.map(lambda x: jnp.expand_dims(x, ax), xs)

        def one(token, k, v, mask_P, length, ck, cv, start):
            row = Prefix(unit(k), unit(v), mask_P[None], length[None])
            h, c = self.extend(token.reshape(1, 1, 1), row, KVCache(unit(ck), unit(cv)), start,
                               attention=attention, merged=merged)
            squeeze = functools.partial(jax.tree.map, lambda x: jnp.squeeze(x, ax))
            return h[0, 0, 0], squeeze(c.k_BGZCE), squeeze(c.v_BGZCE)

        h_ND, k, v = jax.vmap(one, in_axes=(0, ax, ax, 0, 0, ax, ax, 0), out_axes=(0, ax, ax))(
            tokens_N, prefix.k_BZPE, prefix.v_BZPE, prefix.mask_BP, prefix.length_B,
            cache.k_BGZCE, cache.v_BGZCE, start_N)
        return h_ND, KVCache(k, v)


def stack_layers(xs) -> jax.Array:
    """Per-layer arrays as one stacked [L, ...] array (a stacked array is returned as is)."""
    return xs if isinstance(xs, jax.Array) else jnp.stack(xs)
