"""The commands that read a trained policy or a checkpoint, `vpo eval` and `vpo search`, and
the help texts `vpo sample` (`vpo.cli.sample`) shares with them; the runs are built in
`vpo.launch.policy_runs` (`vpo.cli.main` holds the parser and the commands that train)."""

from __future__ import annotations

import argparse
import json
import os

from vpo.cli.arguments import (
    add_data_args,
    add_env_args,
    check_args,
    check_out,
    dataset_kwargs,
    env_kwargs,
)
from vpo.config.fields import LEARN_OBJECTIVES
from vpo.config.sections import LearnConfig
from vpo.launch.policy_runs import stage
from vpo.tasks import TASK_NAMES as TASKS

BUDGET_HELP = ("new tokens per generation on host-scored tasks (--data, arithmetic); default: "
               "the policy's own budget when it is a vpo train run, else the task's answer "
               "budget (your data: 64 per answer)")
SLOTS_HELP = ("rows decoding at once (sampler.num_slots): between 0 and prompts x samples, a "
              "row whose completion stops takes the next one, so a long completion does not "
              "hold the batch (each completion keeps its own key's draws); 0: every "
              "completion its own row while their caches fit a quarter of device memory")


# -- eval -----------------------------------------------------------------------------------

def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate one or more policies at an equal candidate budget per problem; writes a table
    (eval.md), eval.json and best@k / pass@k plots to --out."""
    import jax

    from vpo.eval.policies import default_ks, evaluate_policy, write_eval_table
    from vpo.launch.policy_runs import eval_runs

    check_args(args, positive=("budget", "problems", "answers", "max_new_tokens"),
               finite=("temperature",))
    check_out(args.out)
    env = env_kwargs(args)
    dataset = None if env else dataset_kwargs(args)
    results = {}
    for run in eval_runs(args.policy, task_name=args.task, dataset=dataset, env=env,
                         answers=args.answers, problems=args.problems, seed=args.seed,
                         max_new_tokens=args.max_new_tokens):
        stage(f"sampling {len(run.problems)} problems x {args.budget} candidates "
              f"(m={run.num_answers}, up to {run.max_new_tokens} new tokens per generation)")
        results[f"{run.name} (m={run.num_answers})"] = evaluate_policy(
            run.model, run.task, run.problems, num_answers=run.num_answers, budget=args.budget,
            ks=default_ks(args.budget), key=jax.random.key(args.seed),
            temperature=args.temperature, max_new_tokens=run.max_new_tokens, progress=True,
            desc=run.name, num_slots=args.num_slots)
    table = write_eval_table(
        args.out, results, default_ks(args.budget),
        title=f"{run.task.name}: {len(run.problems)} problems, {args.budget} candidates")
    print(table)
    print(f"written to {args.out}")
    return 0


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

    from vpo.launch.policy_runs import learn_config, learning_result, search_run
    from vpo.search import ingraph
    from vpo.search.methods import run_all_methods

    check_args(args, positive=("problems", "answers", "max_new_tokens", "parents"),
               finite=("temperature",))
    check_out(args.out)
    learn = learn_config(args.learn, learning_rate=args.learn_lr, lora_rank=args.learn_rank,
                         kl_coef=args.learn_kl, every=args.learn_every)
    env = env_kwargs(args)
    dataset = None if env else dataset_kwargs(args)
    run = search_run(args.policy, task_name=args.task, difficulty=args.difficulty,
                     dataset=dataset, env=env, answers=args.answers, parents=args.parents,
                     problems=args.problems, seed=args.seed,
                     max_new_tokens=args.max_new_tokens, learn=learn, islands=args.islands,
                     members=args.members, children=args.children,
                     generations=args.generations, temperature=args.temperature,
                     num_slots=args.num_slots)
    task, records = run.task, run.records
    where = (f"on the host, up to {run.budget} new tokens per generation" if run.host
             else "in one jit per method")
    print(f"{task.name}: {len(records)} problems, budget {run.cfg.budget} candidates per "
          f"problem and method, scored {where}", flush=True)
    results = run_all_methods(jax.random.key(args.seed), run.model, task, records, run.cfg,
                              mesh=run.mesh, max_new_tokens=run.max_new_tokens, progress=True)
    if run.learn is not None:  # the same keys, the policy updated after every generation
        name = f"search+{run.learn.objective}"
        when = ("per generation" if run.learn.every == 1
                else f"after every {run.learn.every}th generation")
        print(f"{name}: one {run.learn.objective} step {when} on its children "
              f"(learning rate {run.learn.learning_rate:g})", flush=True)
        results[name], learned = learning_result(run, jax.random.key(args.seed))
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "learn_metrics.json"), "w", encoding="utf-8") as f:
            json.dump({k: [float(x) for x in v] for k, v in learned.items()}, f, indent=1)
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
    p.add_argument("--learn", choices=LEARN_OBJECTIVES, default=None,
                   help="also run the island search that learns: one policy-gradient step per "
                        "generation on its children (vpo.search.learn), with this objective; "
                        "in-graph tasks only")
    p.add_argument("--learn-lr", type=float, default=None,
                   help=f"its learning rate (default {LearnConfig.learning_rate:g})")
    p.add_argument("--learn-rank", type=int, default=None,
                   help=f"LoRA rank of the adapters it trains on a policy without them; 0 "
                        f"trains every weight (default {LearnConfig.lora_rank})")
    p.add_argument("--learn-kl", type=float, default=None,
                   help="k3 KL to the starting policy, per token (default 0)")
    p.add_argument("--learn-every", type=int, default=None,
                   help="update after every k-th generation only, on its children (default 1: "
                        "after every generation; k costs about 1/k of the update)")
    add_data_args(p)
    add_env_args(p)
    p.add_argument("--out", required=True)
