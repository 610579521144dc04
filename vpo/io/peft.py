"""LoRA adapters as a Hugging Face PEFT adapter folder (adapter_config.json +
adapter_model.safetensors), written and read without torch or peft.

Layouts and scale (r = lora_rank, s = lora_alpha / r in both; PEFT's use_rslora is false):

    vpo   W [*in, *out], A [*in, r], B [r, *out]          y = x·W + s·(x·A)·B
    PEFT  weight [out, in], lora_A.weight [r, in],        y = x·weightᵀ + s·(x·lora_Aᵀ)·lora_Bᵀ
          lora_B.weight [out, r]

so lora_A.weight = A.reshape(in, r)ᵀ and lora_B.weight = B.reshape(r, out)ᵀ, the grouped axes
flattened in vpo's order exactly as `vpo.io.hf` flattens the base weights (wq [D, H, E] →
q_proj.weight [(H E), D], wo [H, E, D] → o_proj.weight [D, (H E)]): PEFT's merged weight
weight + s·lora_B.weight @ lora_A.weight is `vpo.io.hf`'s tensor of vpo's merged W + s·A·B.

Tensor names as PEFT saves them for Llama / Qwen2 / Qwen3 causal LMs:
`base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight` and
`base_model.model.model.layers.{i}.mlp.{gate,up,down}_proj.lora_{A,B}.weight`.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from vpo.config import LORA_TARGETS, ModelConfig
from vpo.errors import CheckpointError
from vpo.io.files import read_json_object
from vpo.io.hf import _host

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# vpo's target name → the module PEFT adapts (under model.layers.{i}.)
MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
           "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
           "down": "mlp.down_proj"}
PREFIX = "base_model.model.model.layers."


def adapter_config(cfg: ModelConfig, base: str | None = None) -> dict:
    """adapter_config.json of `cfg`'s adapters (PEFT `LoraConfig` fields); `base`: the base
    model's name or path (`base_model_name_or_path`)."""
    alpha = cfg.lora_alpha
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
            "r": cfg.lora_rank, "lora_alpha": int(alpha) if float(alpha).is_integer() else alpha,
            "lora_dropout": 0.0, "target_modules": [MODULES[t].split(".")[1]
                                                    for t in cfg.lora_targets],
            "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
            "init_lora_weights": True, "use_rslora": False, "use_dora": False,
            "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None,
            "rank_pattern": {}, "alpha_pattern": {}, "revision": None}


def adapter_tensors(model, dtype=None) -> dict[str, np.ndarray]:
    """PEFT name → lora_A.weight [r, in] / lora_B.weight [out, r] of an adapted `Decoder`
    (`vpo.model.lora.with_adapters`), in `dtype` (default: the adapters'). Every process of a
    multi-host run must call it (the arrays are gathered)."""
    cfg = model.cfg
    if not cfg.lora_rank:
        raise ValueError("adapter_tensors: the model has no LoRA adapters (lora_rank = 0)")
    r, out = cfg.lora_rank, {}
    for i, layer in enumerate(model.layers):
        for name in cfg.lora_targets:
            owner = layer.attn if MODULES[name].startswith("self_attn") else layer.mlp
            lora = getattr(owner, LORA_TARGETS[name] + "_lora")
            a, b = _host(lora.a[...]), _host(lora.b[...])
            key = f"{PREFIX}{i}.{MODULES[name]}"
            for part, x in (("lora_A", a.reshape(-1, r).T), ("lora_B", b.reshape(r, -1).T)):
                out[f"{key}.{part}.weight"] = np.ascontiguousarray(
                    x if dtype is None else x.astype(dtype))
    return out


def save_adapter(directory, tensors: dict[str, np.ndarray], config: dict) -> None:
    """Write `config` (`adapter_config`) and `tensors` (`adapter_tensors`) as a PEFT folder."""
    import jax.numpy as jnp  # noqa: F401  (registers bfloat16 with numpy for safetensors)
    from safetensors.numpy import save_file

    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def load_adapter(directory) -> tuple[dict, dict[str, np.ndarray]]:
    """(adapter_config.json, tensors) of a PEFT adapter folder."""
    from safetensors.numpy import load_file

    cfg_path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(cfg_path):
        raise CheckpointError(f"{directory}: no {CONFIG_FILE}; not a PEFT adapter folder")
    return (read_json_object(cfg_path, "export the adapter again"),
            load_file(os.path.join(directory, WEIGHTS_FILE)))


def merged_weight(weight: np.ndarray, lora_a: np.ndarray, lora_b: np.ndarray,
                  config: dict) -> np.ndarray:
    """PEFT's merge of one module in its layout: weight + (lora_alpha / r)·lora_B @ lora_A,
    computed in float32."""
    scale = config["lora_alpha"] / config["r"]
    return (weight.astype(np.float32)
            + scale * (lora_b.astype(np.float32) @ lora_a.astype(np.float32)))
