"""The commands that read a trained policy or a checkpoint, `vpo eval` and `vpo search`, and
what `vpo sample` (`vpo.cli.sample`) shares with them: loading a policy and its task, the
generation budget, the rows (`vpo.cli.main` holds the parser and the commands that train)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from vpo.cli.arguments import (
    add_data_args,
    add_env_args,
    check_args,
    check_fit,
    check_out,
    dataset_kwargs,
    env_kwargs,
)
from vpo.tasks import TASK_NAMES as TASKS

BUDGET_HELP = ("new tokens per generation on host-scored tasks (--data, arithmetic); default: "
               "the policy's own budget when it is a vpo train run, else the task's answer "
               "budget (your data: 64 per answer)")
SLOTS_HELP = ("rows decoding at once (sampler.num_slots): between 0 and prompts x samples, a "
              "row whose completion stops takes the next one, so a long completion does not "
              "hold the batch (each completion keeps its own key's draws); 0: every "
              "completion its own row while their caches fit a quarter of device memory")


def load_task(name: str, model_spec: str | None = None, task_kwargs: dict | None = None):
    """`vpo.launch.rules.load_task`, imported on first use (keeps `vpo --help` fast)."""
    from vpo.launch.rules import load_task as _load_task

    return _load_task(name, model_spec, task_kwargs)


def policy_and_task(policy: str, task_name: str | None, dataset: dict | None, *,
                    default: str = "maze", difficulty: str | None = None,
                    env: dict | None = None, **overrides):
    """(model, policy info, bound task) of a policy argument: `dataset` (from `--data`) is the
    task when given; else `task_name`, else the task the policy was trained on (its own
    settings, e.g. a maze size or your data's files; trained on a share of your rows
    (`--eval-fraction`): the rows held out from it), else `default` (an hf: checkpoint).
    `difficulty` is --difficulty, which only `program` has. `env`: the task_kwargs of `--env`
    (`arguments.env_kwargs`), an environment as the task. `overrides`: `load_model`'s."""
    from vpo.config import ConfigError

    model, info = load_policy_model(policy, **overrides)
    if env is not None:
        return model, info, load_task("env", policy, env)
    if dataset is not None:
        return model, info, load_task("dataset", policy, dataset)
    own = info.get("task")
    name = task_name or own or default
    if difficulty and name != "program":
        raise ConfigError(f"--difficulty {difficulty}: only --task program has difficulties; "
                          "drop it")
    kwargs = dict(info.get("task_kwargs") or {}) if name == own else {}
    if kwargs.get("split") == "train":  # trained on a share of your rows: read the others
        kwargs["split"] = "eval"
        stage(f"{policy} was trained with rows of {kwargs.get('path')} held out "
              f"(--eval-fraction {kwargs.get('eval_fraction')}): reading those held-out rows")
    if name == "program":
        kwargs["difficulty"] = difficulty or kwargs.get("difficulty", "hard")
    return model, info, load_task(name, policy, kwargs or None)


def stage(text: str) -> None:
    """A progress line on stderr (a stage of a command that takes a while)."""
    print(text, file=sys.stderr, flush=True)


def load_policy_model(policy: str, **overrides):
    """`load_model(policy)` → (model, info), with a line on stderr before and after (reading
    a checkpoint can take a while)."""
    from vpo.io.policy_folder import load_model

    stage(f"loading {policy} ...")
    t0 = time.perf_counter()
    model, _, info = load_model(policy, **overrides)
    stage(f"loaded {policy} ({model.cfg.num_params:,} params) in "
          f"{time.perf_counter() - t0:.1f}s")
    return model, info


def budget_of(task, num_answers: int, policy: str | None, given: int | None, *,
              records=None, num_parents: int = 0) -> int:
    """The generation budget of a command: `vpo.launch.rules.completion_budget` (the one
    rule: --max-new-tokens, else the policy's `vpo train` run budget, else the task's answer
    budget); --max-new-tokens on an in-graph task is refused. With `records`, a pretrained
    policy's context bounds it (`vpo.launch.rules.fit_budget`, the rule `vpo train` follows):
    a budget the user left out is fitted to what the longest prompt leaves, and one that still
    does not fit is refused naming what helps, instead of generating past the positions the
    checkpoint was trained on."""
    from vpo.config import ConfigError
    from vpo.launch.rules import SEQ_MARGIN, completion_budget, context_of, fit_budget, fit_seq_len
    from vpo.tasks.bound import HostTask

    if given is not None and not isinstance(task, HostTask):
        raise ConfigError(f"--max-new-tokens: the {task.name} task's answers have their own "
                          "budget in one jit; the flag sets the budget of host-scored tasks "
                          "(--data, arithmetic). Drop it")
    budget = completion_budget(task, num_answers, policy=policy, given=given)
    context = context_of(policy) if policy and records else None
    if context is None:
        return budget
    prompt_len = task.prompt_arrays(records, num_answers)[0].shape[1]
    need = max(fit_seq_len(task, num_answers, records=records, num_parents=num_parents,
                           max_new_tokens=budget) - SEQ_MARGIN, prompt_len + budget)
    try:
        fitted = fit_budget(task, num_answers, prompt_len, need, budget, context=context,
                            given=given is not None, spec=policy, num_parents=num_parents)
    except ConfigError as e:  # name the command's flags beside the run's settings
        text = (str(e).replace("sampler.max_new_tokens", "--max-new-tokens")
                .replace("train.num_answers", "--answers")
                .replace("set train.mutation_fraction=0", "lower --parents"))
        raise ConfigError(text) from None
    if fitted != budget:
        stage(f"generation budget fitted from {budget} to {fitted} tokens: the longest prompt "
              f"({prompt_len} tokens) leaves {fitted} of the {context} positions {policy} was "
              "trained on (--max-new-tokens sets it)")
    return fitted


# -- eval -----------------------------------------------------------------------------------

def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate one or more policies at an equal candidate budget per problem; writes a table
    (eval.md), eval.json and best@k / pass@k plots to --out."""
    import jax

    from vpo.eval.policies import default_ks, evaluate_policy, write_eval_table

    results, tasks = {}, []
    from vpo.config import ConfigError
    from vpo.launch.rules import fit_seq_len

    check_args(args, positive=("budget", "problems", "answers", "max_new_tokens"),
               finite=("temperature",))
    check_out(args.out)
    env = env_kwargs(args)
    dataset = None if env else dataset_kwargs(args)
    if env and args.task:
        raise ConfigError(f"--task {args.task} with --env: the environment is the task; drop "
                          "--task")
    names = arm_names(args.policy)
    if args.task is None and dataset is None and env is None:  # before loading any weights
        own = {path: _own_task(path) for path in args.policy}
        if len(set(own.values())) > 1:
            listing = ", ".join(f"{p}: {t or 'none (maze)'}" for p, t in own.items())
            raise ConfigError(f"the policies were trained on different tasks ({listing}): an "
                              "equal-budget table needs one task; pass --task (or --data) to "
                              "evaluate every policy on it")
    for i, (path, name) in enumerate(zip(args.policy, names, strict=True), 1):
        stage(f"policy {i}/{len(names)}: {name}")
        model, info, task = policy_and_task(path, args.task, dataset, env=env)
        if results and task.name != tasks[0]:
            raise ConfigError(f"--policy {path} was trained on {task.name}, --policy "
                              f"{args.policy[0]} on {tasks[0]}: an equal-budget table needs one "
                              "task; pass --task (or --data) to evaluate every policy on it")
        tasks.append(task.name)
        m = args.answers or int(info.get("num_answers", 1))
        problems = task.sample_problems(args.seed, args.problems)
        check_fit(model.cfg, task, problems, m, path)
        T = budget_of(task, m, path, args.max_new_tokens, records=problems)
        need = fit_seq_len(task, m, records=problems, at_least=model.cfg.max_seq_len,
                           max_new_tokens=T)
        if need > model.cfg.max_seq_len:
            model, _ = load_policy_model(path, max_seq_len=need)
        stage(f"sampling {len(problems)} problems x {args.budget} candidates (m={m}, up to {T} "
              "new tokens per generation)")
        results[f"{name} (m={m})"] = evaluate_policy(
            model, task, problems, num_answers=m, budget=args.budget,
            ks=default_ks(args.budget), key=jax.random.key(args.seed),
            temperature=args.temperature, max_new_tokens=T, progress=True, desc=name,
            num_slots=args.num_slots)
    table = write_eval_table(
        args.out, results, default_ks(args.budget),
        title=f"{task.name}: {len(problems)} problems, {args.budget} candidates")
    print(table)
    print(f"written to {args.out}")
    return 0


def _own_task(path: str) -> str | None:
    """The task a policy folder says it was trained on (policy.json), without loading it."""
    from vpo.io.policy_folder import resolve_model_spec

    info = os.path.join(resolve_model_spec(path), "policy.json")
    if not os.path.isfile(info):
        return None
    with open(info, encoding="utf-8") as f:
        try:
            return json.load(f).get("task")
        except (ValueError, AttributeError):
            return None  # load_model names what is wrong with it


def arm_names(paths: list[str]) -> list[str]:
    """Row names of policy paths: the folder's name (a `policy/` folder: its run's), lengthened
    by parent folders until every name is distinct (`vpo/seed0`, `grpo/seed0`)."""
    parts = []
    for path in paths:
        p = [x for x in os.path.normpath(path).split(os.sep) if x not in ("", ".")]
        parts.append(p[:-1] if len(p) > 1 and p[-1] == "policy" else p)
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [f"{n} [{i}]" for i, n in enumerate(names)]  # the same path given twice


def add_eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", action="append", required=True,
                   help="policy folder (vpo sft --out, or <vpo train --out>/policy); repeat")
    p.add_argument("--task", choices=TASKS, default=None, help="default: the policy's task")
    p.add_argument("--answers", type=int, default=None, help="default: the policy's m")
    p.add_argument("--budget", type=int, default=12, help="candidates per problem")
    p.add_argument("--problems", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=None, help=BUDGET_HELP)
    p.add_argument("--num-slots", type=int, default=0, help=SLOTS_HELP)
    p.add_argument("--seed", type=int, default=4242, help="problem-set seed (test split); with "
                   "--data it draws which --problems rows of the file are evaluated")
    add_data_args(p)
    add_env_args(p)
    p.add_argument("--out", required=True)


# -- search ---------------------------------------------------------------------------------

def cmd_search(args: argparse.Namespace) -> int:
    """Evolutionary search (islands, the policy as mutation operator) vs best-of-N vs sequential
    revision at an equal candidate budget; writes search_traces.json and search_solved.png.
    Built-in tasks search in one jit; `--data/--reward` (and arithmetic) score on the host
    between generations, with the parents and their scores written into the prompt; on an
    environment (`--env`, or a policy trained on one) each candidate is one episode and a
    mutation is an episode whose first message shows the parents (`vpo.search.episodes`)."""
    import jax

    from vpo.config import ConfigError
    from vpo.model import sharding
    from vpo.search import ingraph
    from vpo.search.methods import run_all_methods
    from vpo.tasks.bound import HostTask

    check_args(args, positive=("problems", "answers", "max_new_tokens", "parents"),
               finite=("temperature",))
    check_out(args.out)
    env = env_kwargs(args)
    dataset = None if env else dataset_kwargs(args)
    for flag, value in (("--task", args.task), ("--difficulty", args.difficulty)):
        if value and (dataset is not None or env is not None):
            what = "--env makes the environment" if env else "--data makes your data"
            raise ConfigError(f"{flag} {value}: {what} the task; drop {flag}")
    model, info, task = policy_and_task(args.policy, args.task, dataset, default="program",
                                        max_seq_len=4096, difficulty=args.difficulty, env=env)
    host = isinstance(task, HostTask)  # searched on the host, at a budget that is a setting
    if args.max_new_tokens is not None and not host:
        raise ConfigError(f"--max-new-tokens: the {task.name} task searches in one jit with its "
                          "own answer budget; the flag sets the budget of host-scored tasks "
                          "(--data, arithmetic). Drop it")
    parents = {} if args.parents is None else {"parents": args.parents}
    try:
        cfg = ingraph.SearchConfig(islands=args.islands, members=args.members,
                                   children=args.children, generations=args.generations,
                                   num_answers=args.answers or int(info.get("num_answers", 1)),
                                   temperature=args.temperature, num_slots=args.num_slots,
                                   **parents)
    except ConfigError as e:  # name the flags the user typed beside the config keys
        message = str(e)
        for flag in ("islands", "members", "children", "generations", "parents", "temperature",
                     "num_answers", "num_slots"):
            cli_flag = "--answers" if flag == "num_answers" else f"--{flag.replace('_', '-')}"
            message = message.replace(f"search.{flag}", f"{cli_flag} (search.{flag})")
        raise ConfigError(message) from None
    records = task.make_problems(args.seed, args.problems)
    check_fit(model.cfg, task, records, cfg.num_answers, args.policy)
    T = budget_of(task, cfg.num_answers, args.policy, args.max_new_tokens, records=records,
                  num_parents=cfg.parents)
    where = (f"on the host, up to {T} new tokens per generation" if host
             else "in one jit per method")
    print(f"{task.name}: {len(records)} problems, budget {cfg.budget} candidates per problem "
          f"and method, scored {where}", flush=True)
    results = run_all_methods(jax.random.key(args.seed), model, task, records, cfg,
                              mesh=sharding.make_mesh(),
                              max_new_tokens=T if host else None, progress=True)
    traces = {method: r.trace for method, r in results.items()}
    ingraph.write_search_traces(args.out, traces, title=f"{task.name}, {len(records)} problems")
    best = {method: r.best for method, r in results.items() if r.best is not None}
    if best:  # host-scored tasks: what each method found, readable
        with open(os.path.join(args.out, "best_answers.jsonl"), "w", encoding="utf-8") as f:
            for method, found in best.items():
                for n, b in enumerate(found):
                    rewards = None if b is None else dict(zip(task.reward_names, b["rewards"],
                                                              strict=True))
                    f.write(json.dumps({"method": method, "problem": n,
                                        "prompt": records[n].get(
                                            "prompt", task.task.statement(records[n])),
                                        "answer": None if b is None else b["answer"],
                                        "fitness": None if b is None else b["fitness"],
                                        "rewards": rewards}, ensure_ascii=False) + "\n")
    for name, s in ingraph.summarize(traces).items():
        print(f"{name:>10}: solved {s['solved_count'][-1]}/{len(records)}, mean best fitness "
              f"{s['mean_best_fitness'][-1]:.3f}")
    if dataset is not None:
        print("(on your data solved means w*ᵀr = 1, every weighted reward component at 1; each "
              "method's best answers with their rewards: best_answers.jsonl)")
    print(f"written to {args.out}")
    return 0


def add_search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", required=True, help="policy folder or hf:/path")
    p.add_argument("--task", choices=TASKS, default=None,
                   help="default: the policy's task (program for an hf: checkpoint)")
    p.add_argument("--difficulty", choices=("easy", "hard"), default=None,
                   help="of --task program (default hard)")
    p.add_argument("--answers", type=int, default=None, help="answers per call (m)")
    p.add_argument("--parents", type=int, default=None, help="parents per mutation prompt "
                   "(default: vpo.search.ingraph.SearchConfig's)")
    p.add_argument("--problems", type=int, default=8)
    p.add_argument("--islands", type=int, default=4)
    p.add_argument("--members", type=int, default=8)
    p.add_argument("--children", type=int, default=8)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=None, help=BUDGET_HELP)
    p.add_argument("--num-slots", type=int, default=0, help=SLOTS_HELP)
    p.add_argument("--seed", type=int, default=4242)
    add_data_args(p)
    add_env_args(p)
    p.add_argument("--out", required=True)
