"""What the `vpo` command checks and reads from its arguments before any work starts: numeric
options, report folders, and the `--data/--reward` options."""

from __future__ import annotations

import argparse
import os


def check_args(args: argparse.Namespace, *, positive: tuple[str, ...] = (),
               finite: tuple[str, ...] = ()) -> None:
    """Options in `positive` are integers >= 1 (when given); those in `finite` are finite
    numbers >= 0 (> 0 for --lr); else a ConfigError naming the option."""
    import math

    from vpo.config import ConfigError

    for name in positive:
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be >= 1; got {v}")
    for name in finite:
        v = getattr(args, name)
        if v is not None and (not math.isfinite(v) or v < 0 or (name == "lr" and v == 0)):
            raise ConfigError(f"--{name.replace('_', '-')}: must be a finite number "
                              f"{'> 0' if name == 'lr' else '>= 0'}; got {v}")


def check_out(out: str) -> None:
    """A report folder (`vpo eval` / `vpo search --out`) must not be a run or policy folder."""
    from vpo.config import ConfigError
    from vpo.run import run_folder

    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"--out {out}: is a file, not a folder; pick a folder path")
    found = [n for n in run_folder.run_contents(out) if n != "tb"]
    if found:
        raise ConfigError(f"--out {out}: holds a run or policy ({', '.join(found)}); write the "
                          "report to its own folder")


def dataset_kwargs(args: argparse.Namespace) -> dict | None:
    """task_kwargs of `--data FILE --reward MODULE:FUNCTION ...` (None without --data); paths
    made absolute, so `--resume` and `vpo eval` find them from any directory."""
    from vpo.config import ConfigError

    workers = getattr(args, "reward_workers", None)
    if workers is not None and workers < 0:
        raise ConfigError(f"--reward-workers {workers}: the number of worker processes must be "
                          ">= 1 (or 0, the default: reward functions run in this process)")
    timeout = getattr(args, "reward_timeout", None)
    if timeout is not None and not timeout > 0:
        raise ConfigError(f"--reward-timeout {timeout}: seconds per reward call must be > 0")
    if getattr(args, "reward_timeout", None) is not None and not args.reward_workers:
        raise ConfigError("--reward-timeout needs --reward-workers N (the timeout applies to "
                          "reward calls in worker processes)")
    if not getattr(args, "data", None):
        for flag, given in (("--reward", getattr(args, "reward", None)),
                            ("--weights", getattr(args, "weights", None)),
                            ("--reward-workers", getattr(args, "reward_workers", None)),
                            ("--reward-range", getattr(args, "reward_range", None)),
                            ("--solved", getattr(args, "solved", None)),
                            ("--eval-data", getattr(args, "eval_data", None)),
                            ("--eval-fraction", getattr(args, "eval_fraction", None)),
                            ("--split-seed", getattr(args, "split_seed", None))):
            if given or (given is not None and flag in ("--eval-fraction", "--split-seed")):
                raise ConfigError(f"{flag} needs --data FILE (your prompts and reward "
                                  "functions); a preset's own data keeps its own settings")
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
    if getattr(args, "reward_range", None):
        kw["reward_ranges"] = parse_reward_ranges(args.reward_range)
    if getattr(args, "solved", None):
        kw["solved_by"] = [x.strip() for x in args.solved.split(",") if x.strip()]
    if args.reward_workers:
        kw["reward_workers"] = args.reward_workers
        kw["reward_timeout"] = args.reward_timeout
    return kw | split_kwargs(args)


def split_kwargs(args: argparse.Namespace) -> dict:
    """The held-out split of `--eval-fraction F` / `--eval-data FILE` and `--split-seed S`
    (`vpo.tasks.dataset.split_rows`): {} without them; `vpo train` trains on the training part
    (split "train": the rows `vpo compare` with the same flags trains on)."""
    from vpo.config import ConfigError

    fraction = getattr(args, "eval_fraction", None)
    eval_data = getattr(args, "eval_data", None)
    seed = getattr(args, "split_seed", None)
    if eval_data and fraction is not None:
        raise ConfigError("--eval-data and --eval-fraction: choose one (the held-out rows come "
                          "from their own file, or are a share of --data's rows)")
    if seed is not None and fraction is None and not eval_data:
        raise ConfigError("--split-seed needs --eval-fraction F (it orders the rows held out)")
    if eval_data:
        return {"eval_path": os.path.abspath(eval_data), "split_seed": seed or 0}
    if fraction is None:
        return {}
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"--eval-fraction {fraction}: the share of --data's rows held out must "
                          "be between 0 and 1, e.g. 0.2")
    return {"split": "train", "eval_fraction": fraction, "split_seed": seed or 0}


def parse_reward_ranges(items: list[str]) -> dict[str, list[float]]:
    """{component: [lo, hi]} of `--reward-range NAME=LO:HI` items."""
    from vpo.config import ConfigError

    out = {}
    for item in items:
        name, _, bounds = item.partition("=")
        lo, sep, hi = bounds.partition(":")
        try:
            if not (name and sep):
                raise ValueError
            out[name] = [float(lo), float(hi)]
        except ValueError:
            raise ConfigError(f"--reward-range {item!r}: expected NAME=LO:HI, e.g. "
                              "reward_len=-50:0 (the component's worst and best values)") from None
    return out


def add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None, help="your prompts: a JSONL or Parquet file with a "
                   "`prompt` column (text or chat messages) and any other columns")
    p.add_argument("--reward", action="append", default=[], metavar="MODULE:FUNCTION",
                   help="a reward function, called by keyword as TRL's GRPOTrainer calls it "
                   "(prompts, completions, completion_ids, every column, **kwargs) -> list of "
                   "floats in [0, 1], None where it does not apply (MODULE dotted or a .py "
                   "file); repeat: one reward component each")
    p.add_argument("--weights", default=None, help="w* over the components, e.g. 0.7,0.3 "
                   "(normalised; default equal)")
    p.add_argument("--reward-range", action="append", default=[], metavar="NAME=LO:HI",
                   help="a component's scale when its function returns values outside [0, 1] "
                   "(TRL's -abs(20 - len(c)): reward_len=-50:0): mapped to [0, 1], clipped; "
                   "repeat per component")
    p.add_argument("--solved", default=None, metavar="NAMES", help="the components that "
                   "define solved (pass@k, the gate), each at full marks, e.g. accuracy "
                   "(default: every weighted component, w*ᵀr = 1)")
    p.add_argument("--reward-workers", type=int, default=0, help="run reward functions in "
                   "this many worker processes (slow verifiers)")
    p.add_argument("--reward-timeout", type=float, default=None,
                   help="seconds per reward call with --reward-workers")


def add_env_args(p: argparse.ArgumentParser) -> None:
    """`--env MODULE:FACTORY` and its episode settings (train, plan, sample, eval, search)."""
    p.add_argument("--env", default=None, metavar="MODULE:FACTORY",
                   help="a multi-turn environment as the task: FACTORY() returns an environment "
                   "with reset / step / score, reward_names and weights "
                   "(vpo.env.base.Environment); rows from --data FILE or its problems(seed, n)")
    p.add_argument("--env-turns", type=int, default=4,
                   help="assistant messages per episode (default 4)")
    p.add_argument("--env-timeout", type=float, default=None,
                   help="seconds per environment call (default: none)")
    p.add_argument("--env-set", type=int, default=1, help="VPO's m over episodes: the G "
                   "episodes of a row form G/m sets of m (default 1: GRPO family)")
    p.add_argument("--env-workers", type=int, default=0, help="hold the environments in this "
                   "many worker processes: a turn's calls run in parallel, a call past "
                   "--env-timeout is killed (default 0: in this process)")


def env_kwargs(args: argparse.Namespace) -> dict | None:
    """task_kwargs of `--env MODULE:FACTORY [--data FILE]` (None without --env); paths made
    absolute, so `--resume` finds them from any directory."""
    from vpo.config import ConfigError

    if not getattr(args, "env", None):
        for flag, value, default in (("--env-turns", getattr(args, "env_turns", 4), 4),
                                     ("--env-timeout", getattr(args, "env_timeout", None), None),
                                     ("--env-set", getattr(args, "env_set", 1), 1),
                                     ("--env-workers", getattr(args, "env_workers", 0), 0)):
            if value != default:
                raise ConfigError(f"{flag} needs --env MODULE:FACTORY")
        return None
    for flag, given in (("--reward", getattr(args, "reward", None)),
                        ("--weights", getattr(args, "weights", None)),
                        ("--reward-range", getattr(args, "reward_range", None)),
                        ("--solved", getattr(args, "solved", None)),
                        ("--reward-workers", getattr(args, "reward_workers", None)),
                        ("--eval-fraction", getattr(args, "eval_fraction", None) is not None),
                        ("--split-seed", getattr(args, "split_seed", None) is not None)):
        if given:
            raise ConfigError(f"{flag} with --env: an environment scores its episodes itself "
                              "and trains on every row (its score method, reward_names and "
                              "weights); drop " + flag)
    module, _, factory = args.env.rpartition(":")
    spec = f"{os.path.abspath(module)}:{factory}" if module.endswith(".py") else args.env
    kw = {"env": spec, "max_turns": args.env_turns, "episodes_per_set": args.env_set}
    if args.env_timeout is not None:
        kw["timeout"] = args.env_timeout
    if getattr(args, "env_workers", 0):
        kw["workers"] = args.env_workers
    if args.data:
        kw["path"] = os.path.abspath(args.data)
    return kw


def add_split_args(p: argparse.ArgumentParser, *, eval_data: bool = False) -> None:
    """`--eval-fraction` and `--split-seed` (and, for `vpo compare`, `--eval-data`)."""
    if eval_data:
        p.add_argument("--eval-data", default=None, metavar="FILE", help="held-out rows of "
                       "their own (same columns as --data): evaluation and search read them, "
                       "every --data row trains")
    p.add_argument("--eval-fraction", type=float, default=None, help="hold out this share of "
                   "--data's rows, drawn by --split-seed" + (
                       " (default 0.2 without --eval-data)" if eval_data else
                       ": train on the others, the rows `vpo compare` with the same flags "
                       "trains on"))
    p.add_argument("--split-seed", type=int, default=None,
                   help="the seed of the held-out draw (default 0)")
