"""Hugging Face checkpoints in and out (config.json + safetensors ⇄ `Decoder`), and tokenizers.

Reads and writes the folders `transformers` saves for Qwen2 / Qwen2.5 (`model_type` "qwen2"),
Qwen3 ("qwen3") and Llama 3 / 3.1 / 3.2 ("llama"): config.json in the transformers 4 and 5
spellings, one model.safetensors or shards listed in model.safetensors.index.json; the tokenizer
(tokenizer.json and its special ids and chat template) through `vpo.io.tokenizer.load_tokenizer`.
A llama.cpp `.gguf` file (Llama architecture, e.g. SmolLM2) is read too, dequantized to float32
(`vpo.io.gguf`); `save_pretrained(model, out, source=file.gguf)` turns it into an ordinary folder.
No torch or transformers.

    model = hf.from_pretrained("/ckpt/Qwen2.5-0.5B-Instruct", mesh=mesh)   # born sharded
    model = hf.from_pretrained(vpo.io.gguf.smollm2_path())                     # a .gguf file
    tok = hf.load_tokenizer("/ckpt/Qwen2.5-0.5B-Instruct")   # vpo.io.tokenizer.Tokenizer
    ids = tok.encode(tok.render_chat([{"role": "user", "content": "2+2?"}]))
    hf.save_pretrained(model, "/out/step-1000", source="/ckpt/Qwen2.5-0.5B-Instruct")

Tensor layouts (torch Linear stores [out, in]; ours are einsum-shaped, see `vpo.model.decoder`):
    q_proj.weight [(H E), D] → wq [D, H, E]        o_proj.weight [D, (H E)] → wo [H, E, D]
    k/v_proj.weight [(N E), D] → wk/wv [D, N, E]   q/k/v_proj.bias → bq [H, E], bk/bv [N, E]
    gate/up_proj.weight [F, D] → w_gate/w_up [D, F]  down_proj.weight [D, F] → w_down [F, D]
    embed_tokens.weight [V, D] → embed [V, D]       lm_head.weight [V, D] → lm_head [D, V]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import pathlib
import re
import shutil
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vpo.config import ModelConfig, RopeScaling
from vpo.errors import CheckpointError  # noqa: F401  (re-exported: vpo.io.hf.CheckpointError)
from vpo.io import gguf
from vpo.io.files import read_json_object, reading
from vpo.model.decoder import Decoder
from vpo.model.sharding import param_shardings

ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "llama": "LlamaForCausalLM"}
HF_PREFIX = "hf:"
_FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
                    "tokenizer.model")


def is_hf_spec(spec: Any) -> bool:
    """True for a model spec of the form `hf:/path/to/folder` (as in `model=hf:/path`)."""
    return isinstance(spec, str) and spec.startswith(HF_PREFIX)


def hf_spec_path(spec: str) -> str:
    """The folder (or .gguf file) of an `hf:/path/to/folder` spec (`~` expanded)."""
    if not is_hf_spec(spec) or not spec[len(HF_PREFIX):]:
        raise ValueError(f"model spec {spec!r}: expected hf:/path/to/checkpoint-folder")
    return os.path.expanduser(spec[len(HF_PREFIX):])


# -- config.json ⇄ ModelConfig ----------------------------------------------------------------

REDOWNLOAD = "download or save the checkpoint again"


def _read_json(path: pathlib.Path, default=None):
    if not path.exists():
        if default is not None:
            return default
        raise CheckpointError(f"{path} does not exist; is {path.parent} a Hugging Face folder?")
    return read_json_object(path, f"fix the file, or {REDOWNLOAD}")


def _dtype_name(dtype) -> str:
    return jnp.dtype(str(dtype).removeprefix("torch.") if isinstance(dtype, str) else dtype).name


def _number(key: str, value) -> float:
    """A config.json number, or a CheckpointError naming the key and the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckpointError(f"config.json: {key}={value!r} is not a number; fix the value (a "
                              "float such as 1000000.0) or restore the file")
    return float(value)


def _rope(hf: dict) -> tuple[float, RopeScaling | None]:
    """(theta, Llama-3 scaling) as transformers reads them: `rope_scaling` (4.x) wins over
    `rope_parameters` (5.x); `rope_theta` inside that dict wins over the top-level one."""
    params = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    theta = _number("rope_theta", params.get("rope_theta", hf.get("rope_theta", 10_000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError("config.json: partial_rotary_factor != 1 is not supported")
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise CheckpointError(f"config.json: rope type {kind!r} is not supported (only default "
                              "and llama3); see rope_scaling / rope_parameters")
    try:
        return theta, RopeScaling(
            factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position=int(params.get("original_max_position_embeddings",
                                                 hf["max_position_embeddings"])))
    except KeyError as e:
        raise CheckpointError(f"config.json: llama3 rope parameters lack {e.args[0]!r}") from None


def read_config(path) -> dict:
    """The config.json dict of a checkpoint folder, or the one a .gguf file's metadata states
    (`vpo.io.gguf.hf_config`); `model_config(read_config(path))` is its `ModelConfig`."""
    p = pathlib.Path(path).expanduser()
    return gguf.hf_config(p) if gguf.is_gguf(p) else _read_json(p / "config.json")


def model_config(hf: dict, *, dtype=None, **overrides: Any) -> ModelConfig:
    """`ModelConfig` of a config.json dict; `dtype` (default: the checkpoint's) sets the param
    and compute dtypes, `overrides` any other field (e.g. `param_dtype="float32"`)."""
    mt = hf.get("model_type")
    if mt not in ARCHITECTURES:
        raise CheckpointError(f"config.json: model_type {mt!r} is not supported; vpo.io.hf reads "
                              f"{', '.join(ARCHITECTURES)} (Qwen2/Qwen2.5, Qwen3, Llama 3)")
    unsupported = {
        "hidden_act": hf.get("hidden_act", "silu") != "silu",
        "attention_bias": mt != "qwen2" and hf.get("attention_bias", False),  # o_proj bias too
        "mlp_bias": hf.get("mlp_bias", False),
        "use_sliding_window": hf.get("use_sliding_window", False),
        "layer_types": any(t != "full_attention" for t in hf.get("layer_types") or ()),
    }
    for field, bad in unsupported.items():
        if bad:
            raise CheckpointError(f"config.json: {field}={hf[field]!r} is not supported by "
                                  f"vpo.model.decoder ({mt})")
    missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads", "vocab_size") if k not in hf]
    if missing:
        raise CheckpointError(f"config.json ({mt}) lacks {', '.join(missing)}")
    D, H = hf["hidden_size"], hf["num_attention_heads"]
    theta, scaling = _rope(hf)
    dt = _dtype_name(dtype or hf.get("dtype") or hf.get("torch_dtype") or "float32")
    fields = dict(
        vocab_size=hf["vocab_size"], dim=D, num_layers=hf["num_hidden_layers"], num_heads=H,
        num_kv_heads=hf.get("num_key_value_heads") or H, head_dim=hf.get("head_dim") or D // H,
        mlp_dim=hf["intermediate_size"], rope_theta=theta, rope_scaling=scaling,
        norm_eps=_number("rms_norm_eps", hf.get("rms_norm_eps", 1e-6)), qkv_bias=mt == "qwen2",
        qk_norm=mt == "qwen3", tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_seq_len=hf.get("max_position_embeddings", 2048), param_dtype=dt, dtype=dt)
    return ModelConfig(**{**fields, **overrides})


def _model_type(cfg: ModelConfig, requested: str | None = None) -> str:
    """The family `cfg` belongs to (qwen2: q/k/v bias; qwen3: q/k norm; llama: neither)."""
    implied = "qwen3" if cfg.qk_norm else "qwen2" if cfg.qkv_bias else "llama"
    if (cfg.qk_norm and cfg.qkv_bias) or requested not in (None, implied):
        raise CheckpointError(
            f"model_type {requested!r} does not fit a model with qkv_bias={cfg.qkv_bias}, "
            f"qk_norm={cfg.qk_norm} (qwen2: q/k/v bias; qwen3: q/k norm; llama: neither)")
    return implied


def hf_config(cfg: ModelConfig, model_type: str | None = None, base: dict | None = None) -> dict:
    """config.json for `cfg`, readable by transformers 4 and 5 (both rope/dtype spellings).

    `model_type` defaults to the family `cfg` implies. Fields of `base` (the source checkpoint's
    config.json) that `cfg` does not decide, such as token ids, are kept.
    """
    model_type = _model_type(cfg, model_type)
    rope = {"rope_type": "default"}
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        rope = {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position}
    out = {k: v for k, v in (base or {}).items() if k not in ("rope_scaling", "rope_parameters")}
    out.update(
        architectures=[ARCHITECTURES[model_type]], model_type=model_type,
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.mlp_dim,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, hidden_act="silu",
        rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
        max_position_embeddings=cfg.max_seq_len, rope_theta=cfg.rope_theta,
        rope_scaling=None if cfg.rope_scaling is None else rope,
        rope_parameters={**rope, "rope_theta": cfg.rope_theta},
        dtype=cfg.param_dtype, torch_dtype=cfg.param_dtype)
    out.update({"qwen2": dict(use_sliding_window=False), "qwen3": dict(attention_bias=False),
                "llama": dict(attention_bias=False, mlp_bias=False)}[model_type])
    return out


# -- tensor names and layouts -----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Layout:
    """How a checkpoint tensor holds one parameter: `"(h e) d -> d h e"` reads the file's
    [(H·E), D] matrix as [H, E, D] and transposes it to our [D, H, E]."""

    file: tuple[tuple[str, ...], ...]  # file dimensions, each a group of our axis letters
    ours: tuple[str, ...]

    @classmethod
    def parse(cls, spec: str) -> _Layout:
        src, dst = spec.split("->")
        groups = re.findall(r"\(([^)]*)\)|(\w)", src)
        return cls(tuple(tuple(g.split()) if g else (a,) for g, a in groups), tuple(dst.split()))

    def file_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        size = dict(zip(self.ours, shape, strict=True))
        return tuple(math.prod(size[a] for a in g) for g in self.file)

    def _order(self) -> list[str]:
        return [a for g in self.file for a in g]

    def read(self, tensor, shape: Sequence[int], index: tuple[slice, ...]) -> np.ndarray:
        """`ours[index]` read from `tensor` (a safetensors slice or an array): only the rows and
        columns holding the block are read (whole groups when an inner axis is sliced)."""
        size = dict(zip(self.ours, shape, strict=True))
        bounds = {a: s.indices(size[a])[:2] for a, s in zip(self.ours, index, strict=True)}
        file_index, view, inner = [], [], []
        for lead, *rest in self.file:
            block = math.prod(size[a] for a in rest)
            lo, hi = bounds[lead]
            file_index.append(slice(lo * block, hi * block))
            view += [hi - lo] + [size[a] for a in rest]
            inner += [slice(None)] + [slice(*bounds[a]) for a in rest]
        x = np.asarray(tensor[tuple(file_index)]).reshape(view)[tuple(inner)]
        order = self._order()
        return x.transpose([order.index(a) for a in self.ours])

    def write(self, x: np.ndarray) -> np.ndarray:
        """The checkpoint tensor of our array `x` (inverse of a full `read`)."""
        y = x.transpose([self.ours.index(a) for a in self._order()])
        return np.ascontiguousarray(y.reshape(self.file_shape(x.shape)))


def tensor_map(cfg: ModelConfig) -> dict[str, tuple[str, _Layout]]:
    """Our parameter path ("layers.0.attn.wq") → (checkpoint tensor name, layout)."""
    m = {"embed": ("model.embed_tokens.weight", "v d -> v d"),
         "final_norm.scale": ("model.norm.weight", "d -> d")}
    if not cfg.tie_embeddings:
        m["lm_head"] = ("lm_head.weight", "v d -> d v")
    for i in range(cfg.num_layers):
        ours, hf = f"layers.{i}.", f"model.layers.{i}."
        m[ours + "attn_norm.scale"] = (hf + "input_layernorm.weight", "d -> d")
        m[ours + "mlp_norm.scale"] = (hf + "post_attention_layernorm.weight", "d -> d")
        for p, h in (("q", "h"), ("k", "n"), ("v", "n")):  # h: query heads, n: KV heads
            m[f"{ours}attn.w{p}"] = (f"{hf}self_attn.{p}_proj.weight", f"({h} e) d -> d {h} e")
            if cfg.qkv_bias:
                m[f"{ours}attn.b{p}"] = (f"{hf}self_attn.{p}_proj.bias", f"({h} e) -> {h} e")
            if cfg.qk_norm and p != "v":
                m[f"{ours}attn.{p}_norm.scale"] = (f"{hf}self_attn.{p}_norm.weight", "e -> e")
        m[ours + "attn.wo"] = (hf + "self_attn.o_proj.weight", "d (h e) -> h e d")
        m[ours + "mlp.w_gate"] = (hf + "mlp.gate_proj.weight", "f d -> d f")
        m[ours + "mlp.w_up"] = (hf + "mlp.up_proj.weight", "f d -> d f")
        m[ours + "mlp.w_down"] = (hf + "mlp.down_proj.weight", "d f -> f d")
    return {k: (name, _Layout.parse(spec)) for k, (name, spec) in m.items()}


def _flat_params(state) -> list[tuple[tuple, str, nnx.Variable]]:
    return [(path, ".".join(map(str, path)), v) for path, v in nnx.to_flat_state(state)]


# -- loading ----------------------------------------------------------------------------------

def _open_checkpoint(folder: pathlib.Path, stack: contextlib.ExitStack) -> dict[str, tuple]:
    """Checkpoint tensor name → (file, open safetensors handle), over all shards; for a .gguf
    file, (file, `vpo.io.gguf.TensorFile`), which dequantizes each tensor when it is read."""
    if gguf.is_gguf(folder):
        handle = gguf.TensorFile(folder)
        return {k: (folder, handle) for k in handle.keys()}  # noqa: SIM118 (not a dict)
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.exists():
        with reading(index, "no weight_map of tensor name -> file", REDOWNLOAD):
            files = sorted(set(_read_json(index)["weight_map"].values()))
    elif (folder / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        hint = " (it holds PyTorch .bin weights: convert them to safetensors)" if any(
            folder.glob("*.bin")) else ""
        raise CheckpointError(f"{folder}: no model.safetensors or model.safetensors.index.json"
                              f"{hint}")
    out: dict[str, tuple] = {}
    for name in files:
        path = folder / name
        if not path.exists():
            raise CheckpointError(f"{index}: lists {name}, which is not in {folder}")
        with reading(path, "not a readable safetensors file (truncated, or its header is "
                     "damaged)", REDOWNLOAD):
            handle = stack.enter_context(safe_open(str(path), framework="numpy"))
        out.update((k, (path, handle)) for k in handle.keys())  # noqa: SIM118 (not a dict)
    return out


def _check_names(folder, found: dict, tmap: dict, cfg: ModelConfig, model_type: str) -> None:
    source = "the GGUF metadata" if gguf.is_gguf(folder) else "config.json"
    expected = {name for name, _ in tmap.values()}
    ignored = {"lm_head.weight"} if cfg.tie_embeddings else set()  # transformers re-ties it too
    missing = sorted(expected - set(found))
    unexpected = sorted(n for n in set(found) - expected - ignored
                        if not n.endswith("rotary_emb.inv_freq"))
    if missing:
        raise CheckpointError(
            f"{folder}: {len(missing)} tensor(s) that {source} ({model_type}, "
            f"{cfg.num_layers} layers, tie_word_embeddings={cfg.tie_embeddings}) requires are "
            f"missing: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        where = ", ".join(f"{n} (in {found[n][0].name})" for n in unexpected[:8])
        raise CheckpointError(f"{folder}: unexpected tensor(s) that a {model_type} model as "
                              f"configured in {source} has no place for: {where}")


def _load_tensor(found, name, layout, shape, dtype, sharding):
    path = found[name][0]
    with reading(path, f"tensor {name} does not read", REDOWNLOAD):
        return _read_tensor(found, name, layout, shape, dtype, sharding)


def _read_tensor(found, name, layout, shape, dtype, sharding):
    path, handle = found[name]
    tensor = handle.get_slice(name)
    got, want = tuple(tensor.get_shape()), layout.file_shape(shape)
    if got != want:
        source = "the GGUF metadata implies" if gguf.is_gguf(path) else "config.json implies"
        raise CheckpointError(f"{path}: tensor {name} has shape {list(got)}, but {source} "
                              f"{list(want)}")
    if tensor.get_dtype() not in _FLOAT_DTYPES:
        raise CheckpointError(f"{path}: tensor {name} has dtype {tensor.get_dtype()}; "
                              "expected a float type")
    blocks: dict[tuple, np.ndarray] = {}  # replicas ask for the same block: read it once

    def block(index):
        key = tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))
        if key not in blocks:
            blocks[key] = layout.read(tensor, shape, index).astype(dtype, copy=False)
        return blocks[key]

    if sharding is None:
        return jnp.asarray(block(tuple(slice(None) for _ in shape)))
    return jax.make_array_from_callback(tuple(shape), sharding, block)


def from_pretrained(path, dtype=None, mesh=None, **overrides: Any) -> Decoder:
    """The `Decoder` of a local Hugging Face folder (config.json + safetensors) or .gguf file.

    Args:
      path: the folder (model.safetensors, or shards + model.safetensors.index.json), or a
        llama.cpp .gguf file (Llama architecture; dequantized to float32, see `vpo.io.gguf`).
      dtype: param and compute dtype (default: the checkpoint's `dtype` / `torch_dtype`;
        float32 for a .gguf file).
      mesh: place every tensor straight into its `vpo.model.sharding` target sharding; each device
        reads only its own block from the file, so none holds a full copy of a sharded tensor.
      overrides: other `ModelConfig` fields, e.g. `param_dtype="float32"`, `max_seq_len=4096`.
    Raises `CheckpointError` naming the file and tensor when the folder does not match its config.
    """
    folder = pathlib.Path(path).expanduser()
    hf = read_config(folder)
    source = folder if gguf.is_gguf(folder) else folder / "config.json"
    with reading(source, "does not describe a model (a setting has the wrong type)", REDOWNLOAD):
        cfg = model_config(hf, dtype=dtype, **overrides)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
    shardings = {} if mesh is None else {
        key: v.get_value() for _, key, v in _flat_params(param_shardings(state, mesh))}
    tmap = tensor_map(cfg)
    with contextlib.ExitStack() as stack:
        found = _open_checkpoint(folder, stack)
        _check_names(folder, found, tmap, cfg, hf["model_type"])
        leaves = []
        for p, key, var in _flat_params(state):
            name, layout = tmap[key]
            shape, dt = var.get_value().shape, var.get_value().dtype
            leaves.append((p, var.replace(_load_tensor(found, name, layout, shape, dt,
                                                       shardings.get(key)))))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


# -- saving -----------------------------------------------------------------------------------

def _host(x: jax.Array) -> np.ndarray:
    if not x.is_fully_addressable:  # multi-host: gather the global array on every process
        from jax.experimental import multihost_utils
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def save_pretrained(model: Decoder, path, *, model_type: str | None = None,
                    source=None) -> None:
    """Write model.safetensors + config.json + generation_config.json that transformers loads.

    `model_type` ("qwen2" | "qwen3" | "llama") defaults to `source`'s, else to what the config
    implies (q/k norm → qwen3, qkv bias → qwen2, else llama). `source`, usually the folder the
    model came from, supplies config fields we do not model (token ids, ...), generation_config
    and the tokenizer files, which are copied; a .gguf `source` supplies its metadata's config and
    its tokenizer, written as tokenizer.json etc. (`Tokenizer.save`), so the folder is complete.
    Parameters are written in their own dtype, so saving and loading again is bit-exact. Under
    multi-host, every process must call this; only process 0 writes.
    """
    cfg = model.cfg
    src = None if source is None else pathlib.Path(source).expanduser()
    from_gguf = src is not None and gguf.is_gguf(src)
    base = None if src is None else read_config(src)
    config = hf_config(cfg, model_type or (base or {}).get("model_type"), base)
    tmap = tensor_map(cfg)
    tensors = {}
    for _, key, var in _flat_params(nnx.state(model, nnx.Param)):
        name, layout = tmap[key]
        tensors[name] = layout.write(_host(var.get_value()))
    if jax.process_index() != 0:
        return
    out = pathlib.Path(path).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    if (out / "model.safetensors.index.json").exists():
        raise CheckpointError(f"{out} already holds a sharded checkpoint; save to a new folder")
    from safetensors.numpy import save_file

    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if src is None or from_gguf or not (src / "generation_config.json").exists():
        gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
               if config.get(k) is not None}
        (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    if from_gguf:  # also rewrites generation_config.json with every stop id
        load_tokenizer(src).save(out)
    elsewhere = src is not None and not from_gguf and src.resolve() != out.resolve()
    for name in ("generation_config.json", *_TOKENIZER_FILES) if elsewhere else ():
        if (src / name).exists():
            shutil.copyfile(src / name, out / name)


def load_tokenizer(path):
    """The checkpoint's tokenizer (see `vpo.io.tokenizer.load_tokenizer`)."""
    from vpo.io.tokenizer import load_tokenizer as _load

    return _load(path)
