"""Measure a SmolLM2 warm start on the one-operation two-target countdown before any RL: does it
hit each target at a rate RL can reinforce, and can a set of m answers cover both?

The design check the real-model comparison needs first (a warm start that hits each target
~1-2% of the time covers both with m = 2 about 3e-4 of the time, and VPO's set reward never
fires). Steps, all through the library:

1. the warm start exactly as `vpo compare --preset smollm task=countdown2_1op` would build it
   (`vpo.compare.driver.warm_start`: SmolLM2-135M-Instruct, LoRA rank 8, format SFT on
   demonstrations that aim m one-operation answers at ONE target);
2. on `--problems` held-out problems (seed 4242), `--budget` candidates per problem at the
   evaluation temperature, for m = 1 and m = 2: the per-target hit rates (hit1, hit2: the
   share of candidates hitting each), the parse rate, pass@k and cover@k (both targets among
   k candidates), and for m = 2 the share of generations whose two answers cover both targets;
3. the step-0 signal at the training temperature: the share of G-sample groups of training
   prompts with unequal rewards, and with at least one hit.

Prints one JSON line per m and the wall time of each step; `--out` keeps the warm start.

Run:  PYTHONPATH=. .venv/bin/python experiments/countdown2_1op_warmstart.py --out /tmp/c1op
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

from vpo.compare import data as compare_data
from vpo.compare import driver
from vpo.compare.config import make_config
from vpo.eval import policies as policy_eval


def hit_rates(pool, m: int) -> dict[str, float]:
    """Per-target hit shares over candidate slots, the parse rate and, for m > 1, the share of
    generations whose m answers hit both targets."""
    r = np.asarray(pool.rewards_BNR, float)  # [B, N, 2], zero rows for invalid slots
    valid = np.asarray(pool.valid_BN, bool)
    out = {"hit1": float(r[..., 0].mean()), "hit2": float(r[..., 1].mean()),
           "valid": float(valid.mean())}
    if m > 1:
        B, N, _ = r.shape
        gens = r.reshape(B, N // m, m, 2).max(2)  # [B, G, 2]: did the set hit each target
        out["set_covers_both"] = float((gens.min(-1) > 0).mean())
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/countdown2_1op_warmstart")
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--budget", type=int, default=12)
    ap.add_argument("overrides", nargs="*", help="vpo compare overrides (section.key=value)")
    args = ap.parse_args(argv)
    cfg = make_config("smollm", ["task=countdown2_1op", "primary=vpo-grpo:cover,vpo-grpo:pass",
                                 *args.overrides])
    task = compare_data.load_tasks(cfg, with_search=False)
    t0 = time.perf_counter()
    policy = driver.warm_start(cfg, task, args.out, resume=True)
    print(f"warm start: {time.perf_counter() - t0:.0f} s", flush=True)
    records = task.make_problems(cfg.eval_seed, args.problems)
    for m in cfg.all_answers:
        t0 = time.perf_counter()
        key = jax.random.key(cfg.eval_seed + 5)
        metrics = policy_eval.evaluate_policy(
            policy, task, records, num_answers=m, budget=args.budget, ks=[1, 2, args.budget],
            key=key, temperature=cfg.eval_temperature)
        pool = policy_eval.sample_pool(policy, task, records, num_answers=m,
                                       budget=args.budget, key=key,
                                       temperature=cfg.eval_temperature)[0]
        row = {"m": m, **hit_rates(pool, m),
               **{k: v for k, v in metrics.items() if k.startswith(("pass@", "cover@"))},
               "seconds": round(time.perf_counter() - t0, 1)}
        print(json.dumps(row), flush=True)
    t0 = time.perf_counter()
    G = cfg.sampler.num_samples
    train = compare_data.training(task).make_problems(cfg.train.seed, args.problems)
    pool = policy_eval.sample_pool(policy, task, train, num_answers=1, budget=G,
                                   key=jax.random.key(cfg.train.seed + 5),
                                   temperature=cfg.sampler.temperature)[0]
    s = np.asarray(pool.scores_BN, float)
    print(json.dumps({"step0_groups": args.problems, "G": G,
                      "unequal": float(np.mean(s.max(-1) - s.min(-1) > 1e-6)),
                      "some_hit": float(np.mean(s.max(-1) > 0)),
                      "seconds": round(time.perf_counter() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
