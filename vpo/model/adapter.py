"""One LoRA adapter as a module of the decoder (Hu et al., 2021, arXiv 2106.09685), and
`add_adapters`, which puts one on each targeted projection of a decoder.

`vpo.model.lora` holds what acts on a whole adapted policy (split, merge, export); this module is
what the decoder's layers call, so it imports nothing of the decoder.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from vpo.config import LORA_TARGETS
from vpo.model import draw as draw_lib


class LoRA(nnx.Module):
    """Low-rank adapter of one weight W [*in, *out] (Hu et al., 2021, arXiv 2106.09685).

    W' = W + s·A·B with A [*in, r], B [r, *out] (`nnx.LoRAParam`, so the trainer can tell them
    from the base `nnx.Param`s) and s = alpha / r. A ~ N(0, 1/fan_in), B = 0: an adapted model
    starts equal to its base. The rank axis has the logical name "lora_rank" (replicated); the
    others keep W's names, so the adapter shards like its weight.
    """

    def __init__(self, w: nnx.Param, num_in: int, rank: int, alpha: float, dtype, key):
        shape, axes = tuple(w.shape), tuple(w.get_metadata("logical_axes"))
        in_shape, out_shape = shape[:num_in], shape[num_in:]
        init = draw_lib.normal(1.0 / math.sqrt(math.prod(in_shape)))
        self.scale = alpha / rank
        self.dtype = dtype
        a_axes = axes[:num_in] + ("lora_rank",)
        self.a = nnx.LoRAParam(draw_lib.draw_weight(init, key, in_shape + (rank,), w.dtype,
                                                    a_axes), logical_axes=a_axes)
        self.b = nnx.LoRAParam(jnp.zeros((rank,) + out_shape, w.dtype),
                               logical_axes=("lora_rank",) + axes[num_in:])

    def __call__(self, x):
        """x [..., *in] → s·(x·A)·B [..., *out]: the adapter's term of x·W' (never forms the
        [*in, *out] product). Both products are plain 2-D matmuls over the flattened tokens:
        XLA's CPU backward of a dot contracting several token axes ran ~1.6x slower."""
        a, b = self.a[...].astype(self.dtype), self.b[...].astype(self.dtype)
        r = b.shape[0]
        lead = x.shape[:x.ndim - (a.ndim - 1)]
        down = x.reshape(-1, a.size // r) @ a.reshape(-1, r)
        return ((down * self.scale) @ b.reshape(r, -1)).reshape(lead + b.shape[1:])

    def delta(self):
        """s·A·B [*in, *out] in float32: what `vpo.model.lora.merged` adds to W."""
        a, b = self.a[...].astype(jnp.float32), self.b[...].astype(jnp.float32)
        return self.scale * jnp.tensordot(a, b, axes=1)


def plus_lora(y, lora: LoRA | None, x):
    return y if lora is None else y + lora(x)


def add_adapters(model, key) -> None:
    """In place: a `LoRA` (rank, alpha, targets of `model.cfg`) on each targeted projection of
    every layer, A drawn from `key` folded with (layer, target). Leaves the base weights as they
    are, so a Decoder built with LoRA has the same W as the plain one of the same seed."""
    cfg = model.cfg
    for i, layer in enumerate(model.layers):
        for j, name in enumerate(cfg.lora_targets):
            weight = LORA_TARGETS[name]
            owner = layer.attn if name in ("q", "k", "v", "o") else layer.mlp
            k = jax.random.fold_in(jax.random.fold_in(key, i), j)
            setattr(owner, weight + "_lora", nnx.data(
                LoRA(getattr(owner, weight), 2 if name == "o" else 1, cfg.lora_rank,
                     cfg.lora_alpha, jnp.dtype(cfg.dtype), k)))
