"""`vpo compare --data FILE --reward MODULE:FUNCTION ...`: the main job on a user's own rows and
reward functions, with the same stages and report as on a built-in task.

The rows are split once, before any stage, by `vpo.tasks.dataset.split_rows` (a seeded
permutation: `--eval-fraction` of --data's rows are held out, or `--eval-data FILE` holds its own
rows out and every --data row trains), into three parts no row is in twice:

    train    the warm start's SFT demonstrations, the pilot gate's step-0 groups and every arm's
             RL; the recorded `vpo train` command of an arm (`flags`) reads exactly these rows
    eval     held out: the init policy's parse check, the pilot gate (its first
             `gate_problems` rows), the evaluation (its first `eval_problems`) and the entropy
             law's scores (its first `law_problems`)
    search   held out, the last `search_pool` held-out rows: the pool the warm start's hardest
             `search_problems` are picked from, and searched on

The search rows are a part of their own, not the evaluation rows again, for the reason the
built-in tasks draw them from a seed of their own (`search_split_seed`): the search claims and the
evaluation claims then rest on different problems, and the problems picked for being hard for the
warm start are not also evaluation problems. It costs held-out rows (eval_problems + search_pool
of them); `check_sizes` names the setting to lower when there are too few. A dataset is a fixed
list, so the built-in tasks' problem seeds (eval_seed, search_split_seed) choose no rows here.

Every stage generates `answer_tokens` new tokens per free-text answer (m x that for m answers),
the default of `vpo train --data` (`vpo.tasks.dataset.ANSWER_TOKENS`), so arms with 1 and m
answers get the same budget per answer.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from vpo.config import ConfigError
from vpo.launch import rules
from vpo.tasks import dataset
from vpo.tasks.bound import BoundTask, HostTask

# the dataset task's keyword arguments the `vpo train` / `vpo compare` flags give
_FLAG_KWARGS = {"path", "rewards", "weights", "reward_ranges", "reward_workers", "reward_timeout",
                "split", "eval_fraction", "split_seed", "eval_path", "solved_by"}


@dataclasses.dataclass(frozen=True, eq=False)
class DataPart(HostTask):
    """One part of a user's rows ("train", "eval" or "search") read through the policy's
    tokenizer, `answer_tokens` new tokens per answer. The evaluation part, the task every stage
    of `run_compare` reads, carries the other two (`training`, `search_pool`)."""

    part: str = "eval"
    answer_tokens: int = dataset.ANSWER_TOKENS
    train: BoundTask | None = None
    search: BoundTask | None = None

    def completion_len(self, num_answers: int) -> int:
        return max(super().completion_len(num_answers), num_answers * self.answer_tokens)


def data_overrides(preset_primary: str, overrides: list[str]) -> list[str]:
    """The overrides of `vpo compare --data` on a preset: its own, plus `primary=` the preset's
    claims with each cover claim made a best claim at the same k when the preset's primary
    claims are on cover@k, which needs a task's cover components (countdown2's two targets)
    that your data has not; added to the command line, so the report's command shows it."""
    if ":cover" in preset_primary and not any(o.startswith("primary=") for o in overrides):
        keys = [k.strip().replace(":cover", ":best") for k in preset_primary.split(",")]
        return [*overrides, "primary=" + ",".join(keys)]
    return list(overrides)


def compare_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`CompareConfig.task_kwargs` of `vpo.cli.arguments.dataset_kwargs` (the --data flags): the
    held-out split always explicit (--eval-fraction 0.2 and --split-seed 0 unless given), no
    `split` (each stage reads its own part)."""
    kw = {k: v for k, v in kwargs.items() if k != "split"}
    if "eval_path" not in kw:
        kw.setdefault("eval_fraction", dataset.EVAL_FRACTION)
    kw.setdefault("split_seed", 0)
    return kw


def train_kwargs(cfg) -> dict[str, Any]:
    """The task_kwargs of every arm's run: the training part (with --eval-data: every --data
    row, as `vpo train --data FILE` reads them)."""
    kw = dict(cfg.task_kwargs)
    if "eval_path" in kw:
        return {k: v for k, v in kw.items() if k not in ("eval_path", "split_seed")}
    return kw | {"split": "train"}


def run_changes(cfg) -> dict[str, Any]:
    """The `RunConfig` changes an arm's run needs for its task's keyword arguments: the data's
    training part on your data, a built-in task's own `task_kwargs`, or {} for none."""
    if cfg.task == "dataset":
        return {"task_kwargs": train_kwargs(cfg)}
    return {"task_kwargs": dict(cfg.task_kwargs)} if cfg.task_kwargs else {}


def flags(kwargs: dict[str, Any]) -> list[str]:
    """The command-line flags that give the dataset task `kwargs` (`train_kwargs` for `vpo
    train`, `CompareConfig.task_kwargs` for `vpo compare`), as
    `vpo.cli.arguments.dataset_kwargs` reads them back."""
    unknown = sorted(set(kwargs) - _FLAG_KWARGS)
    if unknown:
        raise ConfigError(f"task_kwargs: {', '.join(unknown)} have no command-line flag")
    out = ["--data", kwargs["path"]]
    for spec in kwargs["rewards"]:
        out += ["--reward", spec]
    if kwargs.get("weights") is not None:
        out += ["--weights", ",".join(repr(float(w)) for w in kwargs["weights"])]
    for name, (lo, hi) in (kwargs.get("reward_ranges") or {}).items():
        out += ["--reward-range", f"{name}={float(lo)!r}:{float(hi)!r}"]
    if kwargs.get("solved_by"):
        out += ["--solved", ",".join(kwargs["solved_by"])]
    if kwargs.get("reward_workers"):
        out += ["--reward-workers", str(kwargs["reward_workers"])]
        if kwargs.get("reward_timeout") is not None:
            out += ["--reward-timeout", repr(float(kwargs["reward_timeout"]))]
    if kwargs.get("eval_path"):
        out += ["--eval-data", kwargs["eval_path"]]
    elif "eval_fraction" in kwargs:
        out += ["--eval-fraction", repr(float(kwargs["eval_fraction"]))]
    if "split_seed" in kwargs:
        out += ["--split-seed", str(kwargs["split_seed"])]
    return out


def load_tasks(cfg, *, with_search: bool = True) -> BoundTask:
    """The task every stage of `vpo compare` reads, bound to the init policy's tokenizer: a
    built-in task, or, for `task=dataset`, the evaluation part (`DataPart`) carrying the
    training and search parts (`search_pool` rows; none without the search stage), after
    `check_sizes`."""
    if cfg.task != "dataset":
        return rules.load_task(cfg.task, cfg.init or None, cfg.task_kwargs or None)
    if not rules.source_of(cfg.init):
        raise ConfigError(f"--data: init={cfg.init} is not a pretrained checkpoint (nor a policy "
                          "trained from one), so it has no tokenizer for your text; pass "
                          "init=hf:PATH (a checkpoint folder or .gguf file) or init=smollm2")
    names = ("train", "eval", "search") if with_search else ("train", "eval")
    tasks = dataset.dataset_tasks(**cfg.task_kwargs, splits=names,
                                  search_rows=cfg.search_pool if with_search else 0)
    tokenizer = rules.tokenizer_for(tasks["eval"], cfg.init)

    def part(name: str, **more) -> DataPart:
        return DataPart(tasks[name], tokenizer, part=name, answer_tokens=cfg.answer_tokens,
                        **more)

    held = part("eval", train=part("train"), search=part("search") if with_search else None)
    check_sizes(cfg, held)
    return held


def training(task: BoundTask) -> BoundTask:
    """The rows the warm start and the arms train on: a data task's training part, else the
    task itself (a built-in task draws training problems by seed)."""
    return task.train if isinstance(task, DataPart) and task.train is not None else task


def search_pool(cfg, task: BoundTask) -> list:
    """The search stage's pool of problems: a data task's search rows, else `search_pool`
    problems of the split `search_split_seed`."""
    source = task.search if isinstance(task, DataPart) and task.search is not None else task
    return source.make_problems(cfg.search_split_seed, cfg.search_pool)


def _rows(task: BoundTask | None) -> list:
    return [] if task is None else task.make_problems(0, 1 << 62)  # a part: all its rows


def _held_out_text(kw: dict[str, Any], total: int | None) -> str:
    if kw.get("eval_path"):
        return f"the rows of {kw['eval_path']} (--eval-data, split seed {kw['split_seed']})"
    return (f"--eval-fraction {kw['eval_fraction']:g} of the {total} rows of {kw['path']}, "
            f"drawn by split seed {kw['split_seed']}")


def check_sizes(cfg, task: DataPart) -> None:
    """The evaluation part holds the `eval_problems` and `gate_problems` (and, with the entropy
    law, `law_problems`) rows the stages read, else a ConfigError saying how many rows there are
    and what to lower. (The search part is `search_pool` rows by construction; the training part
    may be smaller than `train.num_problems`: the arms train on all of it.)"""
    n_train, n_eval, n_search = (len(_rows(t)) for t in (task.train, task, task.search))
    held = n_eval + n_search
    total = None if task.train is None or cfg.task_kwargs.get("eval_path") else n_train + held
    asks = [("eval_problems", cfg.eval_problems), ("gate_problems", cfg.gate_problems)]
    if cfg.law_points:
        asks.append(("law_problems", cfg.law_problems))
    unmet = [(name, n) for name, n in asks if n > n_eval]
    if unmet:  # every unmet size at once, so one fix covers them
        search = (f", {n_search} of them the search pool (search_pool={n_search})"
                  if n_search else "")
        raise ConfigError(
            ", ".join(f"{name}={n}" for name, n in unmet) + f": {held} rows are held out "
            f"({_held_out_text(cfg.task_kwargs, total)}){search}, so {n_eval} are left to "
            "evaluate on; lower " + " and ".join(name for name, _ in unmet) + f" to at most "
            f"{n_eval}" + (" (or search_pool)" if n_search else "") + ", or hold out more "
            "rows (raise --eval-fraction, or pass --eval-data FILE)"
            + ("; law_points=0 turns the entropy law off"
               if any(name == "law_problems" for name, _ in unmet) else ""))


def _prompt_key(row: dict[str, Any]) -> str:
    return json.dumps(row["prompt"], sort_keys=True)


def describe(cfg, task: BoundTask) -> dict[str, Any] | None:
    """What the report says of the data (None on a built-in task): the files, reward functions
    and weights, the parts' sizes and how the held-out rows were drawn, and how many held-out
    prompts are also training prompts (a repeated prompt is not held out in earnest)."""
    if not isinstance(task, DataPart):
        return None
    kw = cfg.task_kwargs
    train, evaluation, search = _rows(task.train), _rows(task), _rows(task.search)
    seen = {_prompt_key(r) for r in train}
    held = evaluation + search
    return {"file": os.path.basename(kw["path"]), "path": kw["path"],
            "eval_path": kw.get("eval_path"), "eval_fraction": kw.get("eval_fraction"),
            "split_seed": kw["split_seed"], "rewards": list(kw["rewards"]),
            "reward_names": list(task.reward_names),
            "weights": [float(w) for w in task.eval_weights_R],
            "rows": {"train": len(train), "eval": len(evaluation), "search": len(search)},
            "repeated_prompts": sum(_prompt_key(r) in seen for r in held),
            "answer_tokens": cfg.answer_tokens}


def report_lines(data: dict[str, Any] | None, cfg) -> list[str]:
    """The report's data paragraph (`describe`'s record; [] on a built-in task)."""
    if not data:
        return []
    rows = data["rows"]
    how = (f"every row of `{os.path.basename(data['eval_path'])}` (--eval-data, split seed "
           f"{data['split_seed']})" if data["eval_path"] else
           f"--eval-fraction {data['eval_fraction']:g} of `{data['file']}`, drawn by split seed "
           f"{data['split_seed']}")
    fns = ", ".join(f"`{os.path.basename(s)}`" for s in data["rewards"])
    w = ", ".join(f"{n} {x:.3g}" for n, x in zip(data["reward_names"], data["weights"],
                                                strict=True))
    law = (f" (the entropy law's scores: its first {cfg.law_problems})" if cfg.law_points
           else "")
    search = (f"the other {rows['search']} held-out rows are the search pool the "
              f"{cfg.search_problems} hardest for the warm start are picked from, so search and "
              "evaluation rest on different rows" if rows["search"] else
              "no search stage, so no row is a search row")
    text = (f"Data: `{data['file']}`, reward functions {fns} (w*: {w}; solved: w*ᵀr = 1); "
            f"{data['answer_tokens']} new tokens per answer. {rows['train']} rows train the warm "
            f"start and every arm; {rows['eval'] + rows['search']} are held out ({how}): the "
            f"evaluation problems are the first {cfg.eval_problems} of {rows['eval']} evaluation "
            f"rows{law}; {search}. No held-out row is a training row")
    repeated = data["repeated_prompts"]
    text += (f", but {repeated} held-out prompt{'s are' if repeated > 1 else ' is'} also a "
             "training prompt (the same text in another row)." if repeated else ".")
    return [text, ""]
