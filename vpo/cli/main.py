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
import errno
import os
import sys

from vpo.cli.arguments import (
    add_data_args,
    add_env_args,
    add_split_args,
    check_args,
    dataset_kwargs,
    env_kwargs,
)
from vpo.cli.export import add_export_args, cmd_export
from vpo.cli.plan import add_plan_args, cmd_plan
from vpo.cli.policy import (
    add_eval_args,
    add_search_args,
    cmd_eval,
    cmd_search,
)
from vpo.cli.sample import add_sample_args, cmd_sample
from vpo.cli.serve import add_serve_args, cmd_serve
from vpo.launch import presets
from vpo.run import run_folder
from vpo.tasks import TASK_NAMES as TASKS  # the one task table: vpo.tasks.make_task

# -- sft ------------------------------------------------------------------------------------

def cmd_sft(args: argparse.Namespace) -> int:
    """Supervised warm start on a task's demonstrations; writes a policy folder (weights and
    the tokenizer) to --out. --model is a preset (trained from scratch on the task's word-level
    tokenizer), a policy folder or hf:/path (fine-tuned in its own tokenizer and chat format)."""
    from vpo.config import (
        MODEL_PRESETS,
        PRETRAINED_CHOICES,
        ConfigError,
        ModelConfig,
        preset_list,
    )
    from vpo.launch.rules import check_fit, checkpoint_needed, load_task
    from vpo.launch.warm_start import assemble_sft, run_warm_start, save_warm_start

    check_args(args, positive=("steps", "batch", "answers"), finite=("lr",))
    run_folder.check_new_run(args.out, overwrite=args.overwrite)
    if args.model and args.preset:
        raise ConfigError(f"--preset {args.preset} and --model {args.model}: choose one (a "
                          "model preset trained from scratch, or a checkpoint to fine-tune)")
    spec = args.model or args.preset or "tiny"
    dataset = dataset_kwargs(args)
    if dataset is not None and spec in MODEL_PRESETS:
        raise checkpoint_needed("--data", args.model or args.preset, opt="--model ",
                                folder="--model POLICY_DIR")
    if args.model is None and spec not in MODEL_PRESETS:
        hint = (f"; a pretrained checkpoint is --model, not --preset: "
                f"{PRETRAINED_CHOICES.format(opt='--model ')}"
                if spec == "smollm2" or spec.startswith("hf:") else "")
        raise ConfigError(f"--preset: unknown model preset {args.preset!r}; choose one of "
                          f"{preset_list()}{hint}")
    task = load_task("dataset", spec, dataset) if dataset else load_task(args.task, spec)
    task.check_num_answers(args.answers)
    plan = assemble_sft(task, spec, num_answers=args.answers, seed=args.seed, num_parents=2,
                        learning_rate=args.lr, at_least=ModelConfig.max_seq_len)
    if plan.init is not None:
        check_fit(plan.model, task, task.make_problems(args.seed, 64), args.answers, spec)
    if args.overwrite:
        run_folder.clear_run(args.out)
    print(f"SFT {task.name}: {spec} policy ({plan.model.num_params:,} params), {args.steps} "
          f"steps of {args.batch} demonstrations with {args.answers} answers each, learning "
          f"rate {plan.learning_rate:g}")
    policy, losses = run_warm_start(plan, steps=args.steps, batch_size=args.batch,
                                    num_answers=args.answers, seed=args.seed, progress=True)
    save_warm_start(args.out, plan, policy, losses, steps=args.steps, num_answers=args.answers,
                    info={"task": "dataset" if dataset else args.task,
                          "task_kwargs": dataset or {}, "source": plan.source or spec})
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; policy written to {args.out}")
    return 0


def _add_sft(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", choices=TASKS, default="maze")
    p.add_argument("--preset", default=None, help="model preset trained from scratch on a "
                   "built-in task (docs/usage.md#model-presets; default tiny)")
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


def cmd_train(args: argparse.Namespace) -> int:
    """RL training (GRPO family or VPO) on a task; metrics, checkpoints and the final policy
    go to --out. `--resume` continues exactly from the latest complete checkpoint there
    (`train.steps=N` extends the run to N steps); --out must not hold a run otherwise
    (`--overwrite` replaces it)."""
    from vpo.launch import start
    from vpo.model import sharding
    from vpo.run import loop, metrics_log

    report_to = metrics_log.parse_report_to(args.report_to)  # a missing wandb: before any work
    # Multi-host: before anything touches the JAX backend (TPU / SLURM discover the cluster).
    _use_compile_cache(args.compile_cache)
    sharding.initialize_distributed(sharding.DistributedConfig(
        enabled=args.distributed, coordinator=args.coordinator,
        num_processes=args.num_processes, process_id=args.process_id))
    data = env_kwargs(args) or dataset_kwargs(args)
    parts = dict(preset=args.preset, config_file=args.config, overrides=args.overrides,
                 init=args.init, dataset=data, overwrite=args.overwrite)
    if args.resume:
        flags = tuple(flag for flag, given in (
            ("--preset", args.preset), ("--config", args.config), ("--init", args.init),
            ("--data", args.data), ("--reward", args.reward), ("--weights", args.weights),
            ("--env", args.env),
            ("--eval-fraction", args.eval_fraction is not None),
            ("--split-seed", args.split_seed is not None))
            if given)
        ready = start.start_resume(args.out, **parts, data_changed_ok=args.data_changed_ok,
                                   flags=flags,
                                   reward_flags={"--reward-workers": args.reward_workers,
                                                 "--reward-timeout": args.reward_timeout})
    else:
        ready = start.start_new(args.out, **parts)
        if ready.init_spec:
            print(f"starting from the policy in {ready.init_spec} "
                  f"({ready.info.get('task', ready.info.get('source'))})")
    run = ready.run
    print(f"training {run.objective.advantage} on {run.task}: {run.train.steps} steps x "
          f"{run.train.batch_size} prompts x {run.sampler.num_samples} samples x "
          f"{run.train.num_answers} answers, learning rate {run.train.learning_rate:g}; model "
          f"{run.model.num_params:,} params -> {args.out}")
    loop.train(run, args.out, resume=args.resume, task=ready.task, init=ready.init,
               report_to=report_to, consume_init=True)  # the weights are not held twice
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
    add_env_args(p)
    add_split_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its "
                   "newest checkpoint (train.steps=N extends it)")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    p.add_argument("--data-changed-ok", action="store_true",
                   help="with --resume: continue on a --data file whose rows changed since the "
                   "run started (its new hash is recorded); without it such a run is refused")
    p.add_argument("--report-to", default="tensorboard", help="metric sinks beside metrics.jsonl "
                   "(always written): tensorboard, wandb (pip install 'vpo[wandb]'; its run "
                   "folder is <out>/wandb), all, none, or a comma list")
    p.add_argument("--compile-cache", default="~/.cache/vpo/jax",
                   help="persistent XLA compile cache ('' to disable)")
    p.add_argument("--distributed", action="store_true", help="multi-host: run the same command "
                   "on every host; calls jax.distributed.initialize() first")
    p.add_argument("--coordinator", default="", help="host:port of process 0 (GPU hosts; empty "
                   "on TPU / SLURM, where it is discovered)")
    p.add_argument("--num-processes", type=int, default=1)
    p.add_argument("--process-id", type=int, default=0)


# -- compare --------------------------------------------------------------------------------

def cmd_compare(args: argparse.Namespace) -> int:
    """GRPO vs VPO side by side: SFT warm start -> RL arms (same seeds and compute) ->
    evaluation at an equal candidate budget -> island search on the hardest problems; writes
    --out/report.md. With --data FILE --reward MODULE:FUNCTION: on your rows and reward
    functions, a seeded share of the rows (or --eval-data) held out for evaluation and search."""
    import dataclasses
    import shlex

    from vpo.compare import config as compare_config
    from vpo.compare import data as compare_data
    from vpo.compare import driver

    _use_compile_cache(args.compile_cache)
    dataset = dataset_kwargs(args)
    preset = args.preset or ("smollm" if dataset else "default")
    if dataset and preset in compare_config.PRESETS:
        args.overrides = compare_data.data_overrides(compare_config.PRESETS[preset].primary,
                                                     args.overrides)
    cfg = compare_config.make_config(preset, args.overrides)
    if dataset:
        cfg = dataclasses.replace(cfg, task="dataset",
                                  task_kwargs=compare_data.compare_kwargs(dataset))
    command = " ".join(["vpo compare", f"--preset {preset}",
                        *([shlex.join(compare_data.flags(cfg.task_kwargs))] if dataset else []),
                        *args.overrides, f"--out {args.out}"])
    print(f"{command}: arms {', '.join(cfg.arm_names)} x seeds {cfg.seeds}, {cfg.train.steps} "
          f"RL steps each -> {args.out}")
    summary = driver.run_compare(cfg, args.out, command=command,
                                  with_search=not args.no_search, resume=args.resume,
                                  overwrite=args.overwrite, progress=True)
    for label, family in (("primary", summary.get("primary", [])),
                          ("exploratory", summary["claims"])):
        for c in family:
            shown = c.get("family_verdict", c["verdict"])
            holm = "" if "holm_p" not in c else (
                f" [Holm-adjusted p = {c['holm_p']:.3g} over {c.get('family_size', '?')}]")
            print(f"  {shown} ({label}): {c['claim']} ({c['evidence']}){holm}")
    return 0


def _add_compare(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.steps=50 "
                   "num_seeds=1 arms=grpo,vpo,kl_cov search.generations=4")
    p.add_argument("--preset", default=None, help="smoke (CI), default (the quickstart, "
                   "GRPO vs VPO, 8 seeds, <= 20 min on 2 CPU cores), full (all arms, 9x9 maze, "
                   "5 seeds; hours on CPU, its estimate printed first), smollm (SmolLM2 with "
                   "LoRA on countdown2; the default with --data) or paper (accelerators; "
                   "init=<policy folder or hf:folder>)")
    add_data_args(p)
    add_split_args(p, eval_data=True)
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
    "sample": (cmd_sample, add_sample_args),
    "sft": (cmd_sft, _add_sft),
    "train": (cmd_train, _add_train),
    "eval": (cmd_eval, add_eval_args),
    "search": (cmd_search, add_search_args),
    "compare": (cmd_compare, _add_compare),
    "plan": (cmd_plan, add_plan_args),
    "export": (cmd_export, add_export_args),
    "serve": (cmd_serve, add_serve_args),
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
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra and not hasattr(args, "overrides"):  # `vpo sft model=X`: its options are flags
        flags = " ".join(f"--{a.partition('=')[0].split('.')[-1].replace('_', '-')} "
                         f"{a.partition('=')[2]}" for a in extra)
        parser.error(f"vpo {args.command} takes no section.key=value settings ({' '.join(extra)})"
                     f"; did you mean {flags}? (vpo {args.command} --help lists its options)")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def _is_user_error(e: BaseException) -> bool:
    """The library's typed errors, file-system errors, and ValueErrors raised by vpo's own
    code (the innermost frame is in the package): what is wrong with the input, not a bug."""
    from vpo.errors import CheckpointError, ConfigError, EnvError, RewardError

    if isinstance(e, (ConfigError, CheckpointError, EnvError, RewardError, OSError)):
        return True
    if isinstance(e, ValueError) and e.__traceback__ is not None:
        tb = e.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # vpo/
        return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(package + os.sep)
    return False


def error_message(command: str, e: BaseException, limit: int = 1500,
                  out: str | None = None) -> str:
    """The one paragraph a user sees for `e`: what is wrong and how to fix it (the library's
    message, cut at `limit` characters), and how to see the traceback. A full disk names the
    folder being written (`out`) and how to continue."""
    text = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, OSError) and e.filename and str(e.filename) not in text:
        text = f"{e.filename}: {text}"
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        from vpo.io.files import free_space

        where = f" under {out}; {free_space(out)} free" if out else ""
        text += (f" (writing{where}): free space on that disk, then run the same command with "
                 "--resume to continue from the last complete checkpoint")
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
    if not debug:  # a named error stays one paragraph: orbax may leave a metadata read of a
        # damaged checkpoint un-awaited, which Python reports at exit ("coroutine ... was never
        # awaited"); with --debug it shows
        import warnings

        warnings.filterwarnings("ignore", message="coroutine .* was never awaited",
                                category=RuntimeWarning)
    from vpo.accel.targets import default_xla_flags

    default_xla_flags()  # before any command starts a backend
    try:
        return args.fn(args)
    except KeyboardInterrupt as e:
        if debug:
            raise
        signum = getattr(e, "signum", None)  # vpo.run.stopping.RunInterrupted: a clean stop
        print(f"vpo {args.command}: {e if signum else 'interrupted'}", file=sys.stderr)
        return 128 + signum if signum else 130
    except Exception as e:
        if debug or not _is_user_error(e):
            raise
        print(error_message(args.command, e, out=getattr(args, "out", None)), file=sys.stderr)
        return 2
    finally:
        # the run-folder locks a command took are let go when it returns, whatever happened
        # (an in-process caller must not keep --out locked after an error)
        run_folder.release_locks()


if __name__ == "__main__":
    sys.exit(main())
