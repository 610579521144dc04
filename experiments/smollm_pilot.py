"""The SmolLM2 design's pilot: does GRPO raise held-out hits above its warm start, and at which
learning rate and step count? Seeds and problems the main run never uses.

Run:  python experiments/smollm_pilot.py --warm /tmp/ws/out/sft              (~35 min, 2 cores)
      python experiments/smollm_pilot.py --warm DIR --lrs 1e-3 --steps 20 --every 10

`--warm` is the warm-start policy folder `vpo compare --preset smollm` makes (`<out>/sft`;
the same SFT every arm starts from). For each learning rate, the GRPO arm of
`vpo compare --preset smollm` (its run, assembled by `vpo.compare.arms.arm_run_config`) with
the rows per step `--rows` B x G trains `--steps` steps from the warm start (training seed
`--seed`, not one of the main run's), checkpointing every `--every` steps; the warm start and
every checkpoint answer the same `--problems` held-out problems (problem seed
`--problem-seed`, not the main run's evaluation or search seeds) with `--budget` candidates
each at the evaluation temperature, under one key. Per checkpoint: pass@1 (the mean over
problems of the share of candidates hitting a target) and its paired difference from the
warm start's over the problems (mean and 95% Student-t half-width): a statement about this
one training seed, which is what a pilot can say.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import jax
import numpy as np
from flax import nnx
from scipy import stats

from vpo.compare import data as compare_data
from vpo.compare.arms import arm_run_config
from vpo.compare.config import make_config
from vpo.eval import policies as policy_eval
from vpo.io import run_checkpoint
from vpo.io.policy_folder import load_model
from vpo.rl.step import model_of
from vpo.run import metrics_log
from vpo.run.loop import train


def fresh(model):
    """The policy on fresh buffers (a run donates its state; the warm start is reused)."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(jax.numpy.copy, state))


def paired(a, b) -> tuple[float, float]:
    """(mean of a − b, 95% Student-t half-width) over problems."""
    d = np.asarray(a, float) - np.asarray(b, float)
    return float(d.mean()), float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warm", required=True, help="the warm-start policy folder")
    ap.add_argument("--lrs", default="3e-4,1e-3")
    ap.add_argument("--rows", default="8x8", help="B prompts x G samples per step")
    ap.add_argument("--pack", type=int, default=0, help="train.pack_rows (0: padded)")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--every", type=int, default=8)
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--problems", type=int, default=64)
    ap.add_argument("--problem-seed", type=int, default=777)
    ap.add_argument("--budget", type=int, default=12)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    B, G = (int(x) for x in args.rows.split("x"))
    base = make_config("smollm", [f"train.batch_size={B}", f"sampler.num_samples={G}",
                                  f"train.steps={args.steps}", "num_seeds=1",
                                  f"train.seed={args.seed}"])
    task = compare_data.load_tasks(base, with_search=False)
    policy = load_model(args.warm)[0]  # at the context its SFT recorded
    records = task.make_problems(args.problem_seed, args.problems)
    key = jax.random.key(args.problem_seed)

    def hits(model) -> np.ndarray:
        _, per = policy_eval.evaluate_policy_per_problem(
            model, task, records, num_answers=1, budget=args.budget, ks=[1], key=key,
            temperature=base.eval_temperature, per_problem=["pass@1"])
        return per["pass@1_P"]

    t0 = time.perf_counter()
    warm = hits(policy)
    out = {"rows": args.rows, "pack_rows": args.pack, "steps": args.steps, "seed": args.seed,
           "problems": args.problems, "problem_seed": args.problem_seed,
           "budget": args.budget, "warm_pass@1": float(warm.mean()),
           "warm_eval_s": time.perf_counter() - t0, "runs": []}
    print(f"warm start pass@1 {warm.mean():.3f} ({out['warm_eval_s']:.0f} s)", flush=True)
    train_task = compare_data.training(task)
    with tempfile.TemporaryDirectory() as root:
        for lr in (float(x) for x in args.lrs.split(",")):
            cfg = make_config("smollm", [f"train.batch_size={B}", f"sampler.num_samples={G}",
                                         f"train.steps={args.steps}", "num_seeds=1",
                                         f"train.seed={args.seed}",
                                         f"train.learning_rate={lr}",
                                         f"train.pack_rows={args.pack}",
                                         f"train.checkpoint_every={args.every}",
                                         f"train.keep_checkpoints={args.steps // args.every + 1}"])
            path = os.path.join(root, f"lr{lr:g}")
            run, _ = arm_run_config(cfg, train_task, "grpo", args.seed, args.warm, policy)
            t1 = time.perf_counter()
            graphdef, state = train(run, path, task=train_task, init=fresh(policy),
                                    progress=False)
            train_s = time.perf_counter() - t1
            rows = metrics_log.read_rows(os.path.join(path, "metrics.jsonl"))
            mngr = run_checkpoint.CheckpointManager(os.path.join(path, "checkpoints"),
                                                    keep=args.steps // args.every + 1)
            points = []
            try:
                for s in mngr.all_steps():
                    restored, _ = mngr.restore(state, step=s)
                    h = hits(model_of(graphdef, restored))
                    d, hw = paired(h, warm)
                    points.append({"step": s, "pass@1": float(h.mean()), "minus_warm": d,
                                   "half_width": hw})
                    print(f"lr {lr:g} step {s}: pass@1 {h.mean():.3f}, minus warm start "
                          f"{d:+.3f} +/- {hw:.3f}", flush=True)
            finally:
                mngr.close()
            out["runs"].append({"lr": lr, "train_s": train_s, "points": points,
                                "step_s": float(np.median([r["step_time_s"] for r in rows[1:]])),
                                "reward": [r["reward"] for r in rows],
                                "entropy": [r["entropy"] for r in rows]})
            print(f"lr {lr:g}: trained {train_s:.0f} s, median step "
                  f"{out['runs'][-1]['step_s']:.1f} s", flush=True)
    out["wall_s"] = time.perf_counter() - t0
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
