"""The tiny maze RL step of this code against another checkout (issue 14's speed bound).

Run:  git clone -q . /tmp/old && git -C /tmp/old checkout -q 6b3d369   (the pre-text-native code)
      python experiments/ab_tiny_step.py --old /tmp/old --rounds 16 --calls 15

Two warm worker processes (this checkout and --old, chosen by PYTHONPATH) build the same fused RL
step (maze, tiny model, B=8 prompts x G=4 samples, m=3 answers, VPO) and its sampling-only jit;
each round asks both in turn (alternating order) for the median of `calls` timed calls. Printed:
per round the medians and the load average, then for the fused step and for sampling the median
of the per-round ratios new/old with a 95% sign-test interval (order statistics of the ratios).
No assertions: the script prints what it measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERRIDES = ["model=tiny", "sampler.num_samples=4", "train.batch_size=8", "train.num_answers=3",
             "objective.advantage=vpo"]


def worker() -> None:
    """Build the step of whichever `vpo` PYTHONPATH selects; on each stdin line N, print the
    median seconds of N fused steps and of N sampling calls."""
    import jax
    from bench_train import _median_time  # this script's folder is on sys.path

    from vpo.launch.assemble import assemble_run
    from vpo.model import sharding
    from vpo.rl import step as step_lib
    from vpo.run import data as data_lib
    from vpo.run.loop import shard_batch

    plan = assemble_run("maze", None, OVERRIDES)
    run, task = plan.run, plan.task
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    tx = step_lib.make_optimizer(run.train)
    graphdef, state, _ = step_lib.init_state(run.model, tx, mesh)
    cfg = step_lib.step_config(run, task)
    batch = shard_batch(next(data_lib.problem_iterator(
        task, run.train.batch_size, run.train.num_answers, num_problems=64, seed=0)), mesh)
    fused = jax.jit(functools.partial(step_lib.rl_step, graphdef=graphdef, tx=tx, task=task,
                                      cfg=cfg))
    sample = step_lib.make_sample_step(graphdef, cfg)
    for _ in range(3):  # compile and warm both
        jax.block_until_ready(fused(state, batch))
        jax.block_until_ready(sample(state, batch))
    print("ready", flush=True)

    for line in sys.stdin:
        n = int(line)
        print(_median_time(lambda: fused(state, batch), n),
              _median_time(lambda: sample(state, batch), n), flush=True)


def sign_test_ci(ratios):
    """Median and 95% sign-test interval of the median (order statistics)."""
    r, m, k = sorted(ratios), len(ratios), 0
    while sum(math.comb(m, j) for j in range(k + 1)) / 2 ** m <= 0.025:
        k += 1
    return statistics.median(r), ((r[k - 1], r[m - k]) if k else (math.nan, math.nan))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="a checkout of the code to compare against")
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--json", help="also write the rounds and the summary here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker()

    def start(path):
        env = dict(os.environ, PYTHONPATH=path, JAX_PLATFORMS="cpu")
        p = subprocess.Popen([sys.executable, __file__, "--old", path, "--worker"], cwd=path,
                             env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if not p.stdout.readline().startswith("ready"):
            raise RuntimeError(f"the worker on {path} failed to start")
        return p

    procs = {"new": start(ROOT), "old": start(os.path.abspath(a.old))}
    rows = []
    for i in range(a.rounds):
        row = {}
        for name in (("new", "old") if i % 2 == 0 else ("old", "new")):
            procs[name].stdin.write(f"{a.calls}\n")
            procs[name].stdin.flush()
            row[name] = [float(x) for x in procs[name].stdout.readline().split()]
        row["load1"] = os.getloadavg()[0]
        rows.append(row)
        print(f"round {i:2d}: fused new {row['new'][0]:.4f} s old {row['old'][0]:.4f} s | "
              f"sampling new {row['new'][1]:.4f} s old {row['old'][1]:.4f} s | "
              f"load {row['load1']:.1f}", flush=True)
    for p in procs.values():
        p.stdin.close()
        p.wait()
    summary = {}
    for idx, part in enumerate(("fused step", "sampling")):
        med, (lo, hi) = sign_test_ci([r["new"][idx] / r["old"][idx] for r in rows])
        summary[part] = [med, lo, hi]
        print(f"{part} new/old: median {med:.3f}, 95% CI [{lo:.3f}, {hi:.3f}]")
    loads = [r["load1"] for r in rows]
    print(f"load average min {min(loads):.1f} median {statistics.median(loads):.1f} "
          f"max {max(loads):.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
