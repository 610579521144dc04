"""`vpo export`: a trained policy as files other tools load.

    vpo export --policy RUN_OR_POLICY --out DIR --merged [--dtype bfloat16]
        transformers folder: config.json, model.safetensors, generation_config.json, tokenizer
        files (`vpo.io.hf.save_pretrained`), from any model argument: a `vpo train` run or
        policy folder, hf:PATH (a folder or .gguf file), smollm2
    vpo export --policy RUN --out DIR --adapter [--base NAME]
        PEFT LoRA adapter: adapter_config.json + adapter_model.safetensors (`vpo.io.peft`), from
        the `adapter/` folder a LoRA run's policy export writes beside its merged weights
"""

from __future__ import annotations

import argparse
import dataclasses
import os

DTYPES = ("float32", "bfloat16")


def cmd_export(args: argparse.Namespace) -> int:
    """Write a policy for other tools: a transformers folder with the LoRA adapters folded in
    (--merged, the default) or a LoRA run's PEFT adapter folder (--adapter). --policy takes a
    vpo train run or policy folder, hf:PATH (folder or .gguf) or smollm2."""
    from vpo.config import ConfigError

    if os.path.exists(args.out) and not (os.path.isdir(args.out) and not os.listdir(args.out)):
        raise ConfigError(f"--out {args.out}: exists and is not an empty folder; pick a new one")
    if args.adapter:
        _export_adapter(args)
    else:
        _export_merged(args)
    print(f"wrote {'the PEFT adapter' if args.adapter else 'the merged model'} of "
          f"{args.policy} to {args.out}")
    return 0


def _export_merged(args: argparse.Namespace) -> None:
    """The policy's plain weights (`vpo.io.policy_folder.load_model`) in `args.dtype` (default:
    as stored) through `hf.save_pretrained`; config fields we do not model (token ids) come
    from the Hugging Face folder or .gguf file the model, or the run it closes, started from."""
    import jax
    from flax import nnx

    from vpo.io import hf
    from vpo.io.policy_folder import load_model, resolve_model_spec
    from vpo.run import run_folder

    spec = resolve_model_spec(args.policy)
    model, tokenizer, _ = load_model(spec)
    if args.dtype:
        state = jax.tree.map(lambda x: x.astype(args.dtype), nnx.state(model, nnx.Param))
        nnx.update(model, state)
        model.cfg = dataclasses.replace(model.cfg, param_dtype=args.dtype)
    if hf.is_hf_spec(spec):
        source = hf.hf_spec_path(spec)
    else:  # a policy folder: its run's starting checkpoint, if that was a Hugging Face one
        init = run_folder.read_init(os.path.dirname(os.path.abspath(spec)))
        source = hf.hf_spec_path(init) if hf.is_hf_spec(init) else None
        if source is not None and not os.path.exists(source):
            source = None
    hf.save_pretrained(model, args.out, source=source)
    if not hf.is_hf_spec(spec):
        tokenizer.save(args.out)  # the policy's own tokenizer and stop ids


def _export_adapter(args: argparse.Namespace) -> None:
    """Copy the PEFT folder of a LoRA run's policy (`<policy>/adapter`), in `args.dtype`
    when given, `base_model_name_or_path` set to `args.base` when given."""
    from vpo.config import ConfigError
    from vpo.io import peft
    from vpo.io.policy_folder import resolve_model_spec

    policy = resolve_model_spec(args.policy)
    folder = os.path.join(policy, "adapter")
    if not os.path.isfile(os.path.join(folder, peft.CONFIG_FILE)):
        raise ConfigError(f"--adapter: {args.policy} holds no LoRA adapter ({folder} is missing:"
                          " not the policy of a finished vpo train run with model.lora_rank > 0,"
                          " or one exported by an older vpo); export its merged weights with "
                          "--merged")
    config, tensors = peft.load_adapter(folder)
    if args.base:
        config["base_model_name_or_path"] = args.base
    if args.dtype:
        import jax.numpy as jnp

        tensors = {k: v.astype(jnp.dtype(args.dtype)) for k, v in tensors.items()}
    peft.save_adapter(args.out, tensors, config)


def add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", required=True, help="a vpo train run or policy folder, "
                   "hf:PATH (Hugging Face folder or .gguf file) or smollm2")
    p.add_argument("--out", required=True, help="a new folder to write")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--merged", action="store_true", help="a transformers folder with the "
                      "LoRA adapters folded in (the default)")
    kind.add_argument("--adapter", action="store_true", help="a PEFT LoRA adapter folder "
                      "(adapter_config.json + adapter_model.safetensors) of a LoRA run")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="the written weights' dtype (default: as stored)")
    p.add_argument("--base", default=None, help="--adapter: base_model_name_or_path to record "
                   "(default: the path the run started from), e.g. a Hugging Face Hub id")
