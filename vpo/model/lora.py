"""LoRA: low-rank adapters on a frozen base policy (Hu et al., 2021, arXiv 2106.09685).

A targeted projection W [*in, *out] (`ModelConfig.lora_targets`, names in `LORA_TARGETS`) gets
A [*in, r] and B [r, *out] (`nnx.LoRAParam`, `vpo.model.adapter.LoRA`):

    y = x·W + s·(x·A)·B,    s = lora_alpha / r,    A ~ N(0, 1/fan_in),  B = 0,

so training starts at the base policy. Only A and B get gradients and optimiser state (per
layer r·(fan_in + fan_out) numbers instead of fan_in·fan_out); W stays frozen. The base policy
(adapters off) is the KL reference, read from the same W, never copied. Export folds the
adapters in, W ← W + s·A·B, giving a plain Decoder (`lora_rank=0`) that every tool reads.

Pure functions over `vpo.model.decoder.Decoder`s; the trainer stores `split`'s two states as
`TrainState.params` (adapters) and `TrainState.frozen` (base weights).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from vpo.config import LORA_TARGETS, ConfigError, ModelConfig
from vpo.model.adapter import add_adapters
from vpo.model.decoder import Decoder

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)
             if f.name.startswith("lora_")}


def settings(cfg: ModelConfig) -> dict:
    """The LoRA fields of a config (lora_rank, lora_alpha, lora_targets), to carry them over to
    another model's config: `dataclasses.replace(other, **settings(cfg))`."""
    return {name: getattr(cfg, name) for name in _DEFAULTS}


def base_config(cfg: ModelConfig) -> ModelConfig:
    """`cfg` without adapters (LoRA fields at their defaults: lora_rank = 0)."""
    return dataclasses.replace(cfg, **_DEFAULTS)


@functools.lru_cache(maxsize=16)
def _base_graphdef(cfg: ModelConfig) -> nnx.GraphDef:
    abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    return nnx.split(abstract, nnx.Param)[0]


def split(model: Decoder) -> tuple[nnx.GraphDef, nnx.State, nnx.State | None]:
    """(graphdef, trainable, frozen): with adapters, trainable = the `nnx.LoRAParam`s (A, B) and
    frozen = every other `nnx.Param` (the base); without, trainable = all params, frozen = None."""
    if model.cfg.lora_rank:
        return nnx.split(model, nnx.LoRAParam, nnx.Param)
    graphdef, params = nnx.split(model, nnx.Param)
    return graphdef, params, None


def merge(graphdef: nnx.GraphDef, trainable: nnx.State, frozen: nnx.State | None) -> Decoder:
    """The inverse of `split`."""
    if frozen is None:
        return nnx.merge(graphdef, trainable)
    return nnx.merge(graphdef, trainable, frozen)


def with_adapters(model: Decoder, rank: int, *, alpha: float = _DEFAULTS["lora_alpha"],
                  targets=_DEFAULTS["lora_targets"], seed: int = 0) -> Decoder:
    """A copy of the plain `model` (an HF load, a policy folder) with fresh adapters of rank
    `rank` on `targets`: A ~ N(0, 1/fan_in) from `seed`, B = 0, so its outputs equal the base's.
    The base arrays are shared, not copied (jax arrays are immutable)."""
    if model.cfg.lora_rank:
        raise ValueError(f"model already has rank-{model.cfg.lora_rank} adapters; fold them in "
                         "first with vpo.model.lora.merged")
    if rank < 1:
        raise ConfigError(f"model.lora_rank: adapters need rank >= 1; got {rank}")
    cfg = dataclasses.replace(model.cfg, lora_rank=rank, lora_alpha=alpha,
                              lora_targets=targets)  # validates (ConfigError naming the field)
    out = nnx.clone(model)  # new Variables around the same arrays
    out.cfg = cfg
    add_adapters(out, jax.random.key(seed))
    return out


def as_configured(model: Decoder, cfg: ModelConfig, *, seed: int = 0) -> Decoder:
    """`model` with the adapters `cfg` asks for: new ones (`with_adapters`) when cfg.lora_rank > 0
    and the model has none; folded in (`merged`) when cfg.lora_rank = 0; else unchanged."""
    if cfg.lora_rank and not model.cfg.lora_rank:
        return with_adapters(model, cfg.lora_rank, alpha=cfg.lora_alpha,
                             targets=cfg.lora_targets, seed=seed)
    if not cfg.lora_rank and model.cfg.lora_rank:
        return merged(model)
    return model


def base_model(model: Decoder, *, copy: bool = False) -> Decoder:
    """The frozen base of an adapted model (adapters off: y = x·W), the KL reference under LoRA.
    It shares the model's W Variables (`copy=True`: new Variables around the same arrays).
    A plain model is returned as is."""
    if not model.cfg.lora_rank:
        return model
    return nnx.merge(_base_graphdef(base_config(model.cfg)),
                     nnx.state(model, nnx.Not(nnx.LoRAParam)), copy=copy)


def merged(model: Decoder) -> Decoder:
    """A plain Decoder (lora_rank = 0) with every adapter folded in: W ← W + s·A·B (summed in
    float32, stored in W's dtype). Its logits equal the adapted model's up to rounding. The
    input model is not changed."""
    if not model.cfg.lora_rank:
        return model
    out = base_model(model, copy=True)  # its own Variables: writing them leaves `model` as is
    for layer_out, layer in zip(out.layers, model.layers, strict=True):
        for name in model.cfg.lora_targets:
            weight = LORA_TARGETS[name]
            owner_out, owner = ((layer_out.attn, layer.attn) if hasattr(layer.attn, weight)
                                else (layer_out.mlp, layer.mlp))
            w = getattr(owner_out, weight)
            delta = getattr(owner, weight + "_lora").delta()
            w[...] = (w[...].astype(jnp.float32) + delta).astype(w.dtype)
    return out
