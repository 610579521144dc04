"""Command line: `vpo <command> [options]`. The commands are the one dict at the bottom.

    vpo sample [--policy DIR | --preset tiny] [--task maze] [--data FILE --reward M:F ...]
    vpo sft    --task maze [--preset tiny] [--steps 300] [--answers 3] --out DIR
    vpo train  [--preset NAME | --config FILE] [section.key=value ...] [model=NAME] [--init DIR]
               [--data FILE --reward MODULE:FUNCTION ... [--weights 0.7,0.3]] --out DIR [--resume]
    vpo eval   --policy DIR [--policy DIR ...] [--task maze] [--budget 12] [--problems 32] --out DIR
    vpo search --policy DIR [--task program] [--difficulty hard] [--problems 8] --out DIR
    vpo search --policy hf:PATH --data FILE --reward MODULE:FUNCTION [...] --out DIR
    vpo compare [--preset smoke|default|full|paper] [section.key=value ...] [--out DIR] [--resume]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from vpo import presets
from vpo.cli_checks import add_data_args, check_args, check_fit, check_out, dataset_kwargs
from vpo.host_memory import keep_freed_memory_for
from vpo.tasks import TASK_NAMES as TASKS  # the one task table: vpo.tasks.make_task


def load_task(name: str, model_spec: str | None = None, task_kwargs: dict | None = None):
    """`vpo.checkpoint.load_task`, imported on first use (keeps `vpo --help` fast)."""
    from vpo.checkpoint import load_task as _load_task

    return _load_task(name, model_spec, task_kwargs)


def cmd_sample(args: argparse.Namespace) -> int:
    """Sample answers from a policy and score them with the task's vector reward; prints
    completions, rewards and tokens/s. --policy is a trained policy or a checkpoint (its own
    task and m by default; --data/--reward for your prompts); without it, a randomly
    initialised --preset model (a speed check)."""
    import jax
    import numpy as np
    from flax import nnx

    from vpo import sampler
    from vpo.checkpoint import load_model
    from vpo.config import ConfigError, SamplerConfig, model_preset
    from vpo.model import Decoder
    from vpo.tasks.bound import seq_len_for

    check_args(args, positive=("prompts", "samples", "answers", "max_new_tokens"))
    dataset = dataset_kwargs(args)
    if args.policy is None:
        if dataset is not None:
            raise ConfigError("--data: your text is read through a checkpoint's tokenizer; "
                              "pass --policy (a policy folder, hf:PATH or smollm2)")
        task = load_task(args.task or "maze", args.preset)
        M = args.answers or 3
        records = task.make_problems(args.seed, args.prompts)
        prompts, mask = task.prompt_arrays(records, M)
        model_cfg = model_preset(args.preset, vocab_size=task.tokenizer.size,
                                 max_seq_len=prompts.shape[1] + task.completion_len(M))
        model = Decoder(model_cfg, rngs=nnx.Rngs(args.seed))
        source = f"policy '{args.preset}' ({model_cfg.num_params:,} params, random init, seed " \
                 f"{args.seed})"
    else:
        model, _, info = load_model(args.policy)
        own = info.get("task")
        if dataset is not None:
            task = load_task("dataset", args.policy, dataset)
        else:
            name = args.task or own or "maze"
            task = load_task(name, args.policy, info.get("task_kwargs") if name == own else None)
        M = args.answers or int(info.get("num_answers", 1))
        records = task.make_problems(args.seed, args.prompts)
        check_fit(model.cfg, task, records, M, args.policy)
        need = seq_len_for(task, records, M)
        if need > model.cfg.max_seq_len:
            model, _, _ = load_model(args.policy, max_seq_len=need)
        prompts, mask = task.prompt_arrays(records, M)
        source = f"policy {args.policy} ({model.cfg.num_params:,} params)"
    tok = task.tokenizer
    T = task.completion_len(M)
    if args.max_new_tokens is not None:
        if not task.is_host:
            raise ConfigError(f"--max-new-tokens: the {task.name} task's answers have their own "
                              "budget in one jit; the flag sets the budget of host-scored tasks "
                              "(--data, arithmetic). Drop it")
        T = args.max_new_tokens
        if prompts.shape[1] + T > model.cfg.max_seq_len:  # room for the longer budget
            if args.policy is None:
                model = Decoder(dataclasses.replace(model.cfg, max_seq_len=prompts.shape[1] + T),
                                rngs=nnx.Rngs(args.seed))
            else:
                model, _, _ = load_model(args.policy, max_seq_len=prompts.shape[1] + T)
    cfg = SamplerConfig(max_new_tokens=T, num_samples=args.samples,
                        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    key = jax.random.key(args.seed)
    kw = dict(stop_ids=tok.stop_ids, pad_id=tok.pad_id)
    t0 = time.perf_counter()
    rollout = jax.block_until_ready(sampler.sample(model, prompts, mask, key, cfg, **kw))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax.block_until_ready(sampler.sample(model, prompts, mask, jax.random.fold_in(key, 1), cfg,
                                         **kw))
    warm = time.perf_counter() - t0
    print(f"task {task.name}: {len(records)} prompts x {args.samples} samples x {M} answers, "
          f"{source}")
    tokens = np.asarray(rollout.tokens_BGT)
    gmask = np.asarray(rollout.mask_BGT)
    for b in range(len(records)):
        print(f"\nprompt {b}: {tok.decode(prompts[b][mask[b]])}")
        texts = task.completion_texts(tokens[b], gmask[b])
        rewards, valid = task.host_score([records[b]] * args.samples, tokens[b], gmask[b], M)
        for g in range(args.samples):
            scores = np.where(valid[g], rewards[g] @ task.eval_weights_R, 0.0)
            r = rewards[g][int(np.argmax(scores))]
            vector = ", ".join(f"{n} {v:.2f}" for n, v in zip(task.reward_names, r, strict=True))
            print(f"  sample {g}: {texts[g]!r}\n    valid answers {int(np.sum(valid[g]))}/{M}, "
                  f"best w*·r {float(np.max(scores)):.2f} (its rewards: {vector})")
    n_tok = int(gmask.sum())
    print(f"\ncompile + first call {first:.2f}s; warm call {warm * 1e3:.1f} ms "
          f"({len(records) * args.samples * T / warm:,.0f} tokens/s at the full budget T={T}; "
          f"{n_tok} tokens before a stop token)")
    return 0


def _add_sample(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default=None, help="policy folder (vpo sft / vpo train --out), "
                   "hf:PATH or smollm2; default: a random --preset model")
    p.add_argument("--task", choices=TASKS, default=None,
                   help="default: the policy's task (maze without --policy)")
    p.add_argument("--preset", default="tiny", help="model preset without --policy "
                   "(vpo.config.MODEL_PRESETS)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--answers", type=int, default=None, help="answers per generation (VPO's "
                   "m); default: the policy's (3 without --policy)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="generation budget of "
                   "host-scored tasks (--data, arithmetic); default: the task's for m answers")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    add_data_args(p)


# -- sft ------------------------------------------------------------------------------------

def cmd_sft(args: argparse.Namespace) -> int:
    """Supervised warm start on a task's demonstrations; writes a policy folder (weights and
    the tokenizer) to --out. --model is a preset (trained from scratch on the task's word-level
    tokenizer), a policy folder or hf:/path (fine-tuned in its own tokenizer and chat format)."""
    from vpo import checkpoint, loop
    from vpo.config import MODEL_PRESETS, ConfigError, model_preset
    from vpo.sft import run_sft
    from vpo.tasks.bound import seq_len_for
    from vpo.train_config import pretrained_lr

    check_args(args, positive=("steps", "batch", "answers"), finite=("lr",))
    loop.check_new_run(args.out, overwrite=args.overwrite)
    if args.model and args.preset:
        raise ConfigError(f"--preset {args.preset} and --model {args.model}: choose one (a "
                          "model preset trained from scratch, or a checkpoint to fine-tune)")
    spec = args.model or args.preset or "tiny"
    dataset = dataset_kwargs(args)
    if dataset is not None and spec in MODEL_PRESETS:
        raise ConfigError("--data: SFT on your text needs a checkpoint's tokenizer; pass "
                          "--model hf:PATH or a policy folder")
    if args.model is None and spec not in MODEL_PRESETS:
        raise ConfigError(f"--preset: unknown model preset {args.preset!r}; choose one of "
                          f"{', '.join(MODEL_PRESETS)}")
    task = load_task("dataset", spec, dataset) if dataset else load_task(args.task, spec)
    problems = task.make_problems(args.seed, 64)
    task.check_num_answers(args.answers)
    need = max(512, seq_len_for(task, problems, args.answers, num_parents=2) + 64)
    init, pretrained, src = None, False, spec
    if spec in MODEL_PRESETS:
        cfg = model_preset(spec, vocab_size=task.tokenizer.size, max_seq_len=need)
    else:
        init, _, info = checkpoint.load_model(spec, max_seq_len=need)
        cfg = init.cfg
        pretrained = str(info.get("source", "")).startswith("hf:")  # or its SFT
        src = info["source"] if pretrained else spec  # the pretrained weights it came from
        check_fit(cfg, task, problems, args.answers, spec)
    if args.overwrite:
        loop.clear_run(args.out)
    lr = args.lr or (pretrained_lr("sft", cfg.lora_rank) if pretrained else 3e-3)
    print(f"SFT {task.name}: {spec} policy ({cfg.num_params:,} params), {args.steps} "
          f"steps of {args.batch} demonstrations with {args.answers} answers each, learning "
          f"rate {lr:g}")
    _, state, losses = run_sft(task, cfg, args.steps, batch_size=args.batch,
                               learning_rate=lr, num_answers=args.answers, seed=args.seed,
                               init=init, consume_init=True)  # the weights held once
    checkpoint.save_policy(args.out, cfg, state.params,
                           {"task": "dataset" if dataset else args.task,
                            "task_kwargs": dataset or {},
                            "num_answers": args.answers, "sft_steps": args.steps,
                            "sft_loss_first": losses[0], "sft_loss_last": losses[-1],
                            "source": src}, tokenizer=task.tokenizer)
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; policy written to {args.out}")
    return 0


def _add_sft(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", choices=TASKS, default="maze")
    p.add_argument("--preset", default=None, help="model preset (vpo.config.MODEL_PRESETS; "
                   "default tiny)")
    p.add_argument("--model", default=None, help="instead of --preset: a policy folder or "
                   "hf:/path/to/checkpoint (its own tokenizer and chat template)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=None,
                   help="default 3e-3 for a preset trained from scratch; for a checkpoint 2e-5 "
                        "(1e-4 with LoRA adapters)")
    p.add_argument("--answers", type=int, default=3, help="answers per demonstration (m)")
    p.add_argument("--seed", type=int, default=0)
    add_data_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true", help="replace a policy already in --out")


# -- train ----------------------------------------------------------------------------------

def _use_compile_cache(folder: str) -> None:
    """Keep compiled steps on disk (a resumed or repeated run skips XLA compilation)."""
    import jax

    if folder and not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(folder))


def _load_init(spec: str, run, overrides: list[str], config_file: str | None = None):
    """(Decoder, run with the checkpoint's model config, info) for `--init` / `model=hf:`.
    `model.*` overrides are applied to the loaded model (dtype, max_seq_len, rope, norm eps) or
    kept for `vpo train` (LoRA), or rejected by name (shapes the checkpoint fixes). A --config
    file's model fields count as given too (unless `model=` replaced its model section): the
    same ones are applied, and a shape field must equal the checkpoint's."""
    import dataclasses

    from vpo import lora
    from vpo.checkpoint import SHAPE_FIELDS, load_model
    from vpo.config import ConfigError

    keys = {item.partition("=")[0].split(".")[1] for item in overrides
            if item.startswith("model.") and "." in item.partition("=")[0]}
    file_keys = set()
    if config_file and not any(item.partition("=")[0] == "model" for item in overrides):
        file_keys = set(presets.config_file_fields(config_file).get("model", {}))
    lora_keys = set(lora.settings(run.model))
    fixed = sorted((keys & set(SHAPE_FIELDS)) - lora_keys)
    if fixed:
        raise ConfigError(f"model.{fixed[0]}: the checkpoint {spec} fixes it (its parameters "
                          "have that shape); drop the override, or train a preset model "
                          "(model=tiny|small) from scratch instead")
    extra = {k: getattr(run.model, k)
             for k in (keys | file_keys) - set(SHAPE_FIELDS) - lora_keys - {"max_seq_len"}}
    init, _, info = load_model(spec, max_seq_len=run.model.max_seq_len, **extra)
    for k in sorted((file_keys & set(SHAPE_FIELDS)) - lora_keys):
        if getattr(run.model, k) != getattr(init.cfg, k):
            raise ConfigError(f"model.{k}: the --config file {config_file} has "
                              f"{getattr(run.model, k)!r}, the checkpoint {spec} "
                              f"{getattr(init.cfg, k)!r} (its parameters fix it); remove "
                              f"model.{k} from the file")
    if init.cfg != run.model:
        run = dataclasses.replace(run, model=dataclasses.replace(init.cfg,
                                                                 **lora.settings(run.model)))
    return init, run, info


def _loadable_fields(model_cfg) -> dict:
    """The ModelConfig fields a checkpoint can be loaded with (not its shapes, not LoRA)."""
    import dataclasses

    from vpo.checkpoint import SHAPE_FIELDS

    return {f.name: getattr(model_cfg, f.name) for f in dataclasses.fields(model_cfg)
            if f.name not in SHAPE_FIELDS}


def _resume_args(args: argparse.Namespace):
    """(run, bound task, starting policy spec or None) of `vpo train --out RUN --resume`."""
    import json

    from vpo import loop
    from vpo.config import ConfigError
    from vpo.tasks import make_task
    from vpo.tasks.bound import bind
    from vpo.tokenizer import load_tokenizer

    for flag, given in (("--preset", args.preset), ("--config", args.config),
                        ("--init", args.init), ("--data", args.data), ("--reward", args.reward),
                        ("--weights", args.weights), ("--reward-workers", args.reward_workers),
                        ("--reward-timeout", args.reward_timeout),
                        ("--overwrite", args.overwrite)):
        if given:
            raise ConfigError(f"{flag}: not with --resume (the run in {args.out} keeps its own "
                              "config, data and starting policy); drop it, or start a new run "
                              "with another --out")
    run = loop.resume_config(args.out, args.overrides)
    task = bind(make_task(run.task, **run.task_kwargs), load_tokenizer(args.out))
    init_spec = None
    path = os.path.join(args.out, loop.INIT_FILE)
    if os.path.exists(path) and not loop.has_checkpoint(args.out):
        with open(path) as f:  # killed before its first checkpoint: start again from the init
            init_spec = json.load(f)["init"]
    return run, task, init_spec


def cmd_train(args: argparse.Namespace) -> int:
    """RL training (GRPO family or VPO) on a task; metrics, checkpoints and the final policy
    go to --out. `--resume` continues exactly from the latest complete checkpoint there
    (`train.steps=N` extends the run to N steps); --out must not hold a run otherwise
    (`--overwrite` replaces it)."""
    import json

    from vpo import loop, sharding
    from vpo.checkpoint import load_model

    # Multi-host: before anything touches the JAX backend (TPU / SLURM discover the cluster).
    _use_compile_cache(args.compile_cache)
    sharding.initialize_distributed(sharding.DistributedConfig(
        enabled=args.distributed, coordinator=args.coordinator,
        num_processes=args.num_processes, process_id=args.process_id))
    init = None
    if args.resume:
        run, task, init_spec = _resume_args(args)
        keep_freed_memory_for(run.model.num_params)  # before jax starts its threads
        if init_spec:  # the run's own model settings (dtype, rope, ...), not the file's
            init, _, _ = load_model(init_spec, **_loadable_fields(run.model))
    else:
        loop.check_new_run(args.out, overwrite=args.overwrite)
        run, task, init_spec = presets.build_run_config(args.preset, args.config, args.overrides,
                                                init=args.init, dataset=dataset_kwargs(args))
        keep_freed_memory_for(run.model.num_params)  # before jax starts its threads
        if init_spec:
            base = presets.TRAIN_PRESETS[args.preset][1] if args.preset else []
            init, run, info = _load_init(init_spec, run, [*base, *args.overrides],
                                         args.config)
            print(f"starting from the policy in {init_spec} "
                  f"({info.get('task', info.get('source'))})")
        if args.overwrite:
            loop.clear_run(args.out)
        if init_spec:
            os.makedirs(args.out, exist_ok=True)
            spec = init_spec if init_spec.startswith("hf:") else os.path.abspath(init_spec)
            with open(os.path.join(args.out, loop.INIT_FILE), "w") as f:
                json.dump({"init": spec}, f)
    print(f"training {run.objective.advantage} on {run.task}: {run.train.steps} steps x "
          f"{run.train.batch_size} prompts x {run.sampler.num_samples} samples x "
          f"{run.train.num_answers} answers, learning rate {run.train.learning_rate:g}; model "
          f"{run.model.num_params:,} params -> {args.out}")
    loop.train(run, args.out, resume=args.resume, task=task, init=init,
               consume_init=True)  # the loaded weights are not held twice through the run
    print(f"metrics: {os.path.join(args.out, 'metrics.jsonl')}; policy: "
          f"{os.path.join(args.out, 'policy')}")
    return 0


def _add_train(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.steps=6 "
                   "objective.advantage=vpo model=small task=maze")
    p.add_argument("--preset", default=None, help=f"one of {', '.join(presets.TRAIN_PRESETS)}")
    p.add_argument("--config", default=None, help="a JSON RunConfig (e.g. a run's config.json)")
    p.add_argument("--init", default=None, help="policy folder to start from (vpo sft --out)")
    add_data_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its "
                   "newest checkpoint (train.steps=N extends it)")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    p.add_argument("--compile-cache", default="~/.cache/vpo/jax",
                   help="persistent XLA compile cache ('' to disable)")
    p.add_argument("--distributed", action="store_true", help="multi-host: run the same command "
                   "on every host; calls jax.distributed.initialize() first")
    p.add_argument("--coordinator", default="", help="host:port of process 0 (GPU hosts; empty "
                   "on TPU / SLURM, where it is discovered)")
    p.add_argument("--num-processes", type=int, default=1)
    p.add_argument("--process-id", type=int, default=0)


# -- eval -----------------------------------------------------------------------------------

def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate one or more policies at an equal candidate budget per problem; writes a table
    (eval.md), eval.json and best@k / pass@k plots to --out."""
    import jax

    from vpo.policy_eval import default_ks, evaluate_policy, write_report

    results = {}
    task = None
    from vpo.checkpoint import load_model
    from vpo.tasks.bound import seq_len_for

    check_args(args, positive=("budget", "problems", "answers"), finite=("temperature",))
    check_out(args.out)
    dataset = dataset_kwargs(args)
    for path in args.policy:
        model, _, info = load_model(path)
        if dataset is not None:
            task = load_task("dataset", path, dataset)
        else:
            task = load_task(args.task or info.get("task", "maze"), path,
                             None if args.task and args.task != info.get("task")
                             else info.get("task_kwargs"))
        m = args.answers or int(info.get("num_answers", 1))
        problems = task.make_problems(args.seed, args.problems)
        check_fit(model.cfg, task, problems, m, path)
        need = seq_len_for(task, problems, m)
        if need > model.cfg.max_seq_len:
            model, _, _ = load_model(path, max_seq_len=need)
        name = os.path.basename(os.path.normpath(path))
        if name == "policy":
            name = os.path.basename(os.path.dirname(os.path.normpath(path)))
        results[f"{name} (m={m})"] = evaluate_policy(
            model, task, problems, num_answers=m, budget=args.budget,
            ks=default_ks(args.budget), key=jax.random.key(args.seed),
            temperature=args.temperature)
    table = write_report(args.out, results, default_ks(args.budget),
                         title=f"{task.name}: {len(problems)} problems, {args.budget} candidates")
    print(table)
    print(f"written to {args.out}")
    return 0


def _add_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", action="append", required=True,
                   help="policy folder (vpo sft --out, or <vpo train --out>/policy); repeat")
    p.add_argument("--task", choices=TASKS, default=None, help="default: the policy's task")
    p.add_argument("--answers", type=int, default=None, help="default: the policy's m")
    p.add_argument("--budget", type=int, default=12, help="candidates per problem")
    p.add_argument("--problems", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=4242, help="problem-set seed (test split)")
    add_data_args(p)
    p.add_argument("--out", required=True)


# -- search ---------------------------------------------------------------------------------

def cmd_search(args: argparse.Namespace) -> int:
    """Evolutionary search (islands, the policy as mutation operator) vs best-of-N vs sequential
    revision at an equal candidate budget; writes search_traces.json and search_solved.png.
    Built-in tasks search in one jit; `--data/--reward` (and arithmetic) score on the host
    between generations, with the parents and their scores written into the prompt."""
    import jax

    from vpo import host_search, search, sharding
    from vpo.checkpoint import load_model
    from vpo.config import ConfigError

    check_args(args, positive=("problems", "answers", "max_new_tokens", "parents"),
               finite=("temperature",))
    check_out(args.out)
    model, _, info = load_model(args.policy, max_seq_len=4096)
    dataset = dataset_kwargs(args)
    own_task = info.get("task")  # the task the policy was trained on (none for hf:)
    if dataset is None and not args.task and own_task == "dataset":
        raise ConfigError(f"{args.policy} was trained on your data: pass the same --data and "
                          "--reward to search with it, or --task for a built-in task")
    task_name = args.task or own_task or "program"
    for flag, value in (("--task", args.task), ("--difficulty", args.difficulty)):
        if value and dataset is not None:
            raise ConfigError(f"{flag} {value}: --data makes your data the task; drop {flag}")
    if args.difficulty and task_name != "program":
        raise ConfigError(f"--difficulty {args.difficulty}: only --task program has "
                          "difficulties; drop it")
    if dataset is not None:
        task = load_task("dataset", args.policy, dataset)
    else:
        if task_name == "program":
            kwargs = {"difficulty": args.difficulty
                      or (info.get("task_kwargs") or {}).get("difficulty", "hard")}
        else:  # the policy's own settings of its own task
            kwargs = info.get("task_kwargs") or {} if task_name == own_task else {}
        task = load_task(task_name, args.policy, kwargs)
    if args.max_new_tokens is not None and not task.is_host:
        raise ConfigError(f"--max-new-tokens: the {task.name} task searches in one jit with its "
                          "own answer budget; the flag sets the budget of host-scored tasks "
                          "(--data, arithmetic). Drop it")
    parents = {} if args.parents is None else {"parents": args.parents}
    try:
        cfg = search.SearchConfig(islands=args.islands, members=args.members,
                                  children=args.children, generations=args.generations,
                                  num_answers=args.answers or int(info.get("num_answers", 1)),
                                  temperature=args.temperature, **parents)
    except ConfigError as e:  # name the flags the user typed beside the config keys
        message = str(e)
        for flag in ("islands", "members", "children", "generations", "parents", "temperature",
                     "num_answers"):
            cli_flag = "--answers" if flag == "num_answers" else f"--{flag}"
            message = message.replace(f"search.{flag}", f"{cli_flag} (search.{flag})")
        raise ConfigError(message) from None
    records = task.make_problems(args.seed, args.problems)
    check_fit(model.cfg, task, records, cfg.num_answers, args.policy)
    where = "on the host" if task.is_host else "in one jit per method"
    print(f"{task.name}: {len(records)} problems, budget {cfg.budget} candidates per problem "
          f"and method, scored {where}")
    best: dict = {}
    traces = host_search.run_all_methods(model, task, records, cfg, jax.random.key(args.seed),
                                         mesh=sharding.make_mesh(),
                                         max_new_tokens=args.max_new_tokens, best=best)
    search.write_report(args.out, traces, title=f"{task.name}, {len(records)} problems")
    if best:  # host-scored tasks: what each method found, readable
        with open(os.path.join(args.out, "best_answers.jsonl"), "w", encoding="utf-8") as f:
            for method, found in best.items():
                for n, b in enumerate(found):
                    rewards = None if b is None else dict(zip(task.reward_names, b["rewards"],
                                                              strict=True))
                    f.write(json.dumps({"method": method, "problem": n,
                                        "prompt": records[n].get("prompt"),
                                        "answer": None if b is None else b["answer"],
                                        "fitness": None if b is None else b["fitness"],
                                        "rewards": rewards}, ensure_ascii=False) + "\n")
    for name, s in search.summarize(traces).items():
        print(f"{name:>10}: solved {s['solved_count'][-1]}/{len(records)}, mean best fitness "
              f"{s['mean_best_fitness'][-1]:.3f}")
    print(f"written to {args.out}")
    return 0


def _add_search(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", required=True, help="policy folder or hf:/path")
    p.add_argument("--task", choices=TASKS, default=None,
                   help="default: the policy's task (program for an hf: checkpoint)")
    p.add_argument("--difficulty", choices=("easy", "hard"), default=None,
                   help="of --task program (default hard)")
    p.add_argument("--answers", type=int, default=None, help="answers per call (m)")
    p.add_argument("--parents", type=int, default=None, help="parents per mutation prompt "
                   "(default: vpo.search.SearchConfig's)")
    p.add_argument("--problems", type=int, default=8)
    p.add_argument("--islands", type=int, default=4)
    p.add_argument("--members", type=int, default=8)
    p.add_argument("--children", type=int, default=8)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=None, help="generation budget per "
                   "call for host-scored tasks (default: the task's budget for m answers)")
    p.add_argument("--seed", type=int, default=4242)
    add_data_args(p)
    p.add_argument("--out", required=True)


# -- compare --------------------------------------------------------------------------------

def cmd_compare(args: argparse.Namespace) -> int:
    """GRPO vs VPO side by side: SFT warm start -> RL arms (same seeds and compute) ->
    evaluation at an equal candidate budget -> island search on the hardest problems; writes
    --out/report.md."""
    from vpo import compare

    _use_compile_cache(args.compile_cache)
    cfg = compare.make_config(args.preset, args.overrides)
    command = " ".join(["vpo compare", f"--preset {args.preset}", *args.overrides,
                        f"--out {args.out}"])
    print(f"{command}: arms {', '.join(cfg.arm_names)} x seeds {cfg.seeds}, {cfg.train.steps} "
          f"RL steps each -> {args.out}")
    summary = compare.run_compare(cfg, args.out, command=command,
                                  with_search=not args.no_search, resume=args.resume,
                                  overwrite=args.overwrite)
    for c in summary["claims"]:
        holm = "" if c["verdict"] != "reproduced" else (
            " [survives Holm's correction]" if c["survives_holm"] else
            f" [not after Holm's correction: adjusted p = {c['holm_p']:.3g}]")
        print(f"  {c['verdict']}: {c['claim']} ({c['evidence']}){holm}")
    return 0


def _add_compare(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.steps=50 "
                   "num_seeds=1 arms=grpo,vpo,kl_cov search.generations=4")
    p.add_argument("--preset", default="default", help="smoke (CI), default (the quickstart, "
                   "<= 10 min on 2 CPU cores), full (all arms, 9x9 maze, 5 seeds; hours on CPU, "
                   "its estimate printed first) or paper (accelerators; init=<policy folder or "
                   "hf:folder>)")
    p.add_argument("--out", default="runs/compare")
    p.add_argument("--resume", action="store_true", help="continue an interrupted comparison "
                   "in --out (same preset and overrides): finished stages and RL runs are read "
                   "back, an unfinished run continues from its last checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the comparison already in --out")
    p.add_argument("--no-search", action="store_true", help="skip the search stage")
    p.add_argument("--compile-cache", default="~/.cache/vpo/jax",
                   help="persistent XLA compile cache ('' to disable)")


COMMANDS = {
    "sample": (cmd_sample, _add_sample),
    "sft": (cmd_sft, _add_sft),
    "train": (cmd_train, _add_train),
    "eval": (cmd_eval, _add_eval),
    "search": (cmd_search, _add_search),
    "compare": (cmd_compare, _add_compare),
}


DEBUG_ENV = "VPO_DEBUG"  # =1: errors show their traceback (as `--debug` does)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vpo", description="GRPO and VPO post-training in JAX")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error "
                        f"(or set {DEBUG_ENV}=1)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (fn, add_args) in COMMANDS.items():
        first_sentence = " ".join(fn.__doc__.split()).split(". ")[0]
        p = sub.add_parser(name, help=first_sentence, description=fn.__doc__)
        add_args(p)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the traceback of an error")
        p.set_defaults(fn=fn)
    args, extra = parser.parse_known_args(argv)
    # `section.key=value` overrides may sit between options (`--data F model=hf:X --out D`):
    # argparse keeps one positional run, so the rest arrive here
    stray = [a for a in extra if "=" not in a or a.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def _is_user_error(e: BaseException) -> bool:
    """The library's typed errors, file-system errors, and ValueErrors raised by vpo's own
    code (the innermost frame is in the package): what is wrong with the input, not a bug."""
    from vpo.errors import CheckpointError, ConfigError, RewardError

    if isinstance(e, (ConfigError, CheckpointError, RewardError, OSError)):
        return True
    if isinstance(e, ValueError) and e.__traceback__ is not None:
        tb = e.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        package = os.path.dirname(os.path.abspath(__file__))
        return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(package + os.sep)
    return False


def error_message(command: str, e: BaseException, limit: int = 1500) -> str:
    """The one paragraph a user sees for `e`: what is wrong and how to fix it (the library's
    message, cut at `limit` characters), and how to see the traceback."""
    text = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, OSError) and e.filename and str(e.filename) not in text:
        text = f"{e.filename}: {text}"
    if len(text) > limit:
        text = text[:limit] + " [...]"
    return (f"vpo {command}: error: {text}\n(run with --debug or {DEBUG_ENV}=1 for the "
            "traceback)")


def main(argv: list[str] | None = None) -> int:
    """Run one command. An error in the input (a bad value, file, checkpoint or reward) prints
    one paragraph to stderr and returns 2; `--debug` / `VPO_DEBUG=1` re-raises it instead."""
    try:
        args = _parse(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else 2
    debug = args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"vpo {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if debug or not _is_user_error(e):
            raise
        print(error_message(args.command, e), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
