"""The commands that read a trained policy or a checkpoint: `vpo sample`, `vpo eval` and `vpo
search` (`vpo.cli.main` holds the parser and the commands that train)."""

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
    from vpo.io.checkpoint import load_model

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

    if given is not None and not task.is_host:
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


def problems_of(task, seed: int, num: int) -> list:
    """`num` problems of `seed`; a data file's rows (which `make_problems` takes in file order)
    are a sample of `num` rows drawn with `seed`, kept in file order; an environment's are the
    first `num` of its --data file or of its `problems(seed, num)`."""
    import numpy as np

    from vpo.env.task import is_env_task
    from vpo.tasks.dataset import ROW

    records = task.make_problems(seed, num)
    if not records or ROW not in records[0] or is_env_task(task):  # an environment's: in order
        return records
    rows = task.make_problems(seed, 1 << 62)  # every row of the file
    if len(rows) <= num:
        return rows
    pick = np.sort(np.random.default_rng(seed).choice(len(rows), size=num, replace=False))
    return [rows[i] for i in pick]


def cmd_sample(args: argparse.Namespace) -> int:
    """Sample answers from a policy and score them with the task's vector reward; prints
    completions, rewards and tokens/s. --policy is a trained policy or a checkpoint (its own
    task and m by default; --data/--reward for your prompts); without it, a randomly
    initialised --preset model (a speed check)."""
    import jax
    import numpy as np
    from flax import nnx

    from vpo.config import ConfigError, SamplerConfig, model_preset
    from vpo.launch.rules import fit_seq_len
    from vpo.model.decoder import Decoder
    from vpo.rollout import sampler

    check_args(args, positive=("prompts", "samples", "answers", "max_new_tokens"))
    env = env_kwargs(args)
    dataset = None if env else dataset_kwargs(args)
    if args.policy is None:
        if dataset is not None or env is not None:
            raise ConfigError(f"{'--env' if env else '--data'}: your text is read through a "
                              "checkpoint's tokenizer; pass --policy (a policy folder, hf:PATH "
                              "or smollm2)")
        task, model, info = load_task(args.task or "maze", args.preset), None, {}
    else:
        model, info, task = policy_and_task(args.policy, args.task, dataset, env=env)
    from vpo.env.task import is_env_task

    if is_env_task(task):
        return _sample_episodes(args, model, task)
    M = args.answers or int(info.get("num_answers", 3 if model is None else 1))
    records = task.make_problems(args.seed, args.prompts)
    prompts, mask = task.prompt_arrays(records, M)
    T = budget_of(task, M, args.policy, args.max_new_tokens, records=records)
    need = fit_seq_len(task, M, records=records, max_new_tokens=T,
                       at_least=0 if model is None else model.cfg.max_seq_len)
    if model is None:
        model = Decoder(model_preset(args.preset, vocab_size=task.tokenizer.size,
                                     max_seq_len=need), rngs=nnx.Rngs(args.seed))
        source = (f"policy '{args.preset}' ({model.cfg.num_params:,} params, random init, "
                  f"seed {args.seed})")
    else:
        check_fit(model.cfg, task, records, M, args.policy)
        if need > model.cfg.max_seq_len:  # room for the prompts and the budget
            model, _ = load_policy_model(args.policy, max_seq_len=need)
        source = f"policy {args.policy} ({model.cfg.num_params:,} params)"
    tok = task.tokenizer
    cfg = SamplerConfig(max_new_tokens=T, num_samples=args.samples,
                        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                        num_slots=args.num_slots)
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


def _sample_episodes(args: argparse.Namespace, model, task) -> int:
    """`vpo sample` on an environment: --samples episodes of each of --prompts rows, printed
    turn by turn with the environment's reward vector."""
    import jax
    import numpy as np

    from vpo.config import ConfigError
    from vpo.env.episode import run_episodes
    from vpo.env.task import env_factory, env_settings

    if args.answers not in (None, 1):
        raise ConfigError(f"--answers {args.answers}: on an environment a sample is one "
                          "episode (m = 1); drop --answers")
    settings, factory = env_settings(task.task), env_factory(task)
    records = problems_of(task, args.seed, args.prompts)
    T = budget_of(task, 1, args.policy, args.max_new_tokens, records=records)
    keys = jax.random.split(jax.random.key(args.seed), len(records) * args.samples)
    t0 = time.perf_counter()
    ep = run_episodes(model, task.tokenizer, [[factory() for _ in range(args.samples)]
                                              for _ in records],
                      [dict(r) for r in records], keys.reshape(len(records), args.samples),
                      temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                      max_tokens=T, max_turns=settings.max_turns,
                      reward_names=task.reward_names, where=settings.spec,
                      timeout=settings.timeout,
                      row_ids=[int(r.get("_row", b)) for b, r in enumerate(records)])
    seconds = time.perf_counter() - t0
    print(f"environment {settings.spec}: {len(records)} rows x {args.samples} episodes, up to "
          f"{settings.max_turns} turns and {T} tokens each, policy {args.policy}")
    w_R = np.asarray(task.eval_weights_R)
    for b in range(len(records)):
        for g in range(args.samples):
            msgs = ep.messages[b][g]
            print(f"\nrow {b}, episode {g}:")
            for m in msgs:
                print(f"  [{m['role']}] {m['content']!r}")
            r = ep.rewards_BGR[b, g]
            vector = ", ".join(f"{n} {v:.2f}" for n, v in zip(task.reward_names, r, strict=True))
            print(f"  turns {int(ep.turns_BG[b, g])}, observation tokens "
                  f"{int(ep.observation_tokens_BG[b, g])}, w*·r {float(r @ w_R):.2f} ({vector})")
    n_tok = int(np.asarray(ep.rollout.mask_BGT).sum())
    print(f"\n{n_tok} assistant tokens in {seconds:.2f}s with compilation "
          f"({n_tok / seconds:,.0f} tokens/s)")
    return 0


def add_sample_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--max-new-tokens", type=int, default=None, help=BUDGET_HELP)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--num-slots", type=int, default=0, help=SLOTS_HELP)
    p.add_argument("--seed", type=int, default=0)
    add_data_args(p)
    add_env_args(p)


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
        problems = problems_of(task, args.seed, args.problems)
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
    from vpo.io.checkpoint import resolve_model_spec

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
    if args.max_new_tokens is not None and not task.is_host:
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
    where = (f"on the host, up to {T} new tokens per generation" if task.is_host
             else "in one jit per method")
    print(f"{task.name}: {len(records)} problems, budget {cfg.budget} candidates per problem "
          f"and method, scored {where}", flush=True)
    results = run_all_methods(jax.random.key(args.seed), model, task, records, cfg,
                              mesh=sharding.make_mesh(),
                              max_new_tokens=T if task.is_host else None, progress=True)
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
