"""`vpo plan`: whether each program of a run compiles and fits on an accelerator target,
built ahead of time on this host (`vpo.accel`; no accelerator, no weights).

    vpo plan --target v5e:2x2 [--preset NAME | --config FILE] [section.key=value ...]
             [--env MODULE:FACTORY [--data FILE] [--env-turns N] [--env-set m]]
             [--programs rl_step,sampler,sft_step,kernels] [--json FILE]
             [search.key=value ...] [learn.key=value ...] [--search-problems N]

The search programs (`--programs search,search_learn`, or all) take `search.key=value`
(`vpo.config.SearchConfig`) and `learn.key=value` (`vpo.config.LearnConfig`, the learning
search's objective, rate and LoRA rank) overrides beside the run's, and search
`--search-problems` problems at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os

DEFAULT_PROGRAMS = ("rl_step", "sampler", "sft_step", "kernels")
SEARCH_SECTIONS = ("search.", "learn.")  # overrides of the search programs, not of the run


def cmd_plan(args: argparse.Namespace) -> int:
    """Compile the run's programs (RL step, sampler, SFT step, searches, kernels) for an
    accelerator target ahead of time and print, per program, whether it compiles, its bytes per
    device against the chip's memory, its collectives and, when it does not compile or fit, the
    error and the setting to change. Exit status 0 when every program fits, 1 otherwise."""
    from vpo.accel import targets
    from vpo.cli.arguments import env_kwargs
    from vpo.config import ConfigError

    if args.data and not args.env:
        raise ConfigError("--data in vpo plan: the rows of an --env run; give --env "
                          "MODULE:FACTORY (plan a --data/--reward run from its config.json "
                          "with --config)")
    dataset = env_kwargs(args)
    target = targets.parse_target(args.target)
    missing = targets.missing_wheels(target.platform)
    if missing:
        raise ConfigError(f"--target {args.target}: {missing}")
    programs = _programs(args.programs)
    search = [o for o in args.overrides if o.startswith(SEARCH_SECTIONS)]
    overrides = [o for o in args.overrides if not o.startswith(SEARCH_SECTIONS)]
    if args.search_problems < 1:
        raise ConfigError(f"--search-problems {args.search_problems}: at least 1")
    targets.set_up_env(target)
    import jax

    # the CPU backend as default: the target's devices are described, never opened (a no-op
    # once a caller's own jax use has started the backends)
    with contextlib.suppress(RuntimeError):
        jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])
    from vpo.accel import program_report
    from vpo.accel.build import SearchSettings
    from vpo.launch.assemble import assemble_run

    assembled = assemble_run(args.preset, args.config, overrides, dataset=dataset)
    run, task = assembled.run, assembled.task
    m = run.model
    print(f"vpo plan: {target.name} ({target.n_devices} x {target.chip.name}, "
          f"{program_report.gib(target.chip.hbm_bytes)} each); mesh data={run.mesh_data} "
          f"fsdp={run.mesh_fsdp} tensor={run.mesh_tensor}; model {m.num_params / 1e6:.0f}M "
          f"parameters ({m.param_dtype}), "
          + (f"LoRA rank {m.lora_rank}" if m.lora_rank else "full fine-tune")
          + f"; task {run.task}, batch {run.train.batch_size} x {run.sampler.num_samples} "
          f"samples x {run.sampler.max_new_tokens} tokens, "
          + program_report.decoding(run, task), flush=True)
    settings = SearchSettings(tuple(search), args.search_problems)
    if {"search", "search_learn"} & set(programs):
        print(_search_line(run, target, settings, learning="search_learn" in programs),
              flush=True)
    header = program_report.render([]).splitlines()[0]
    print(header, flush=True)
    reports = program_report.plan(
        run, task, target, programs, search=settings,
        progress=lambda r: print(program_report.render([r]).split("\n", 1)[1], flush=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_json() for r in reports], f, indent=1)
    bad = [r for r in reports if r.applicable and not r.fits]
    n = sum(r.applicable for r in reports)
    print(f"{n - len(bad)} of {n} programs compile and fit on "
          f"{target.name}" + (f"; not: {', '.join(r.program for r in bad)}" if bad else ""))
    return 1 if bad else 0


def _search_line(run, target, settings, *, learning: bool) -> str:
    """The search programs' shape, in words (`vpo.accel.build.search_configs` on the target's
    mesh; an override the configs refuse stops here)."""
    from vpo.accel import targets
    from vpo.accel.build import search_configs

    mesh = targets.mesh(target, run.mesh_data, run.mesh_fsdp, run.mesh_tensor)
    cfg, learn = search_configs(run, mesh, settings)
    line = (f"search: {settings.problems} problem(s) at once, {cfg.islands} islands x "
            f"{cfg.members} members, {cfg.parents} parents, {cfg.children} children, "
            f"{cfg.generations} generations, m={cfg.num_answers}")
    if learning:
        rank = run.model.lora_rank or learn.lora_rank
        when = "per generation" if learn.every == 1 else f"every {learn.every} generations"
        line += (f"; learning: {learn.objective}, "
                 + (f"LoRA rank {rank}" if rank else "every weight") + f", one update {when}")
    return line


def _programs(text: str) -> tuple[str, ...]:
    from vpo.accel.build import PROGRAMS
    from vpo.config import ConfigError

    if text == "all":
        return PROGRAMS
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in names if x not in PROGRAMS]
    if bad or not names:
        raise ConfigError(f"--programs {text}: choose from {', '.join(PROGRAMS)} (comma-"
                          "separated) or all")
    return names


def add_plan_args(p: argparse.ArgumentParser) -> None:
    from vpo.cli.arguments import add_env_args
    from vpo.launch import presets

    p.add_argument("overrides", nargs="*", help="section.key=value, e.g. model=qwen2.5-0.5b "
                   "model.lora_rank=16 mesh_fsdp=4 (model=hf:PATH reads only the checkpoint's "
                   "config); search.key=value and learn.key=value set the search programs' "
                   "SearchConfig and LearnConfig (e.g. search.islands=2 learn.objective=vpo)")
    p.add_argument("--target", required=True, help="v5e, v5p, v6e or h100; a TPU topology "
                   "(v5e:2x2) or a device count (v5e-8, h100x8)")
    p.add_argument("--preset", default=None,
                   help=f"one of {', '.join(presets.TRAIN_PRESETS)}")
    p.add_argument("--config", default=None, help="a JSON RunConfig (e.g. a run's config.json)")
    p.add_argument("--programs", default=",".join(DEFAULT_PROGRAMS),
                   help="comma-separated: rl_step, sampler, sft_step, search, search_learn "
                        "(the island search that learns), kernels; or all "
                        f"(default {','.join(DEFAULT_PROGRAMS)})")
    p.add_argument("--json", default=None, help="also write the reports to this JSON file")
    p.add_argument("--search-problems", type=int, default=1,
                   help="problems the search programs search at once (default 1; the learning "
                        "search's one update per generation is over all of theirs)")
    add_env_args(p)
    p.add_argument("--data", default=None, help="with --env: the rows (JSONL / Parquet) of an "
                   "environment without problems(seed, n)")
