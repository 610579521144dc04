"""SmolLM2-135M RL step time against rows per step and the sampler's settings, in one run.

Run:  python experiments/bench_rl_rows.py --init WARM_START_DIR    (~25 min on 2 CPU cores)
      python experiments/bench_rl_rows.py --points 2x8,4x8 --steps 4   (a smaller table)

Each point is a `vpo train` run of GRPO on countdown2_1op from SmolLM2-135M-Instruct
(`--init`: the warm start `vpo compare --preset smollm` makes, `<out>/sft`, or `smollm2`
itself; LoRA rank 8, the preset's settings otherwise), B prompts x
G samples = B·G rows a step, for `--steps` steps in this process; its time is the median
`step_time_s` of the steps after the first (the first compiles), and the trained samples per
second is B·G over it. Variants, joined by ':' after the shape:
`slots` (the refilled-slots sampler, `sampler.num_slots` = B·G/2), `packR` (`train.pack_rows=R`:
each prompt's G completions laid end to end in R rows of the budget in the training forward,
`vpo.rl.packing`; the default pads each completion to the budget below
`vpo.launch.rules.PACK_MIN_BUDGET` = 128 tokens, and this task's budget is 71) and `accumK`
(`train.grad_accum=K`: the update in K micro-batches, one optimizer step).
Every point runs in the same process one after another (`x 2x8`: samples/s over the first
point's); the `load` column is the 1-minute load average at each point's start and end, so a
ratio measured while something else ran beside it says so. From `smollm2`
itself the completions run to the task's answer budget more often than a warm start's (it has
not learnt the format), so its times are an upper bound for a trained policy at that shape.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from vpo.launch.start import start_new
from vpo.run import loop, metrics_log

BASE = ["task=countdown2_1op", 'task_kwargs={"aim": "each"}', "model.lora_rank=8",
        "train.learning_rate=3e-4", "objective.advantage=grpo", "train.log_every=1",
        "train.profile_every=3", "train.sample_every=0", "train.checkpoint_every=1000"]


def get_config():
    return dict(points=["2x8", "4x8", "8x8", "16x8", "8x8:slots", "8x8:pack2", "8x8:pack3"],
                steps=4, init="smollm2")


def point_overrides(point: str) -> tuple[int, list[str]]:
    """'BxG[:variant[:variant...]]' -> (rows, overrides); variants: slots (`sampler.num_slots`
    = B·G/2), packR (`train.pack_rows=R`), accumK (`train.grad_accum=K`: the update in K
    micro-batches of B/K prompts, one optimizer step)."""
    shape, *variants = point.split(":")
    B, G = (int(x) for x in shape.split("x"))
    extra = []
    for v in variants:
        if v == "slots":
            extra.append(f"sampler.num_slots={B * G // 2}")
        elif v.startswith("pack"):
            extra.append(f"train.pack_rows={int(v[4:])}")
        elif v.startswith("accum"):
            extra.append(f"train.grad_accum={int(v[5:])}")
        else:
            raise SystemExit(f"--points: unknown variant {v!r} in {point!r} (slots, packR, "
                             "accumK)")
    return B * G, [f"train.batch_size={B}", f"sampler.num_samples={G}", *extra]


def bench_point(point: str, steps: int, root: str, init: str) -> dict:
    rows, extra = point_overrides(point)
    out = os.path.join(root, point.replace(":", "_"))
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    ready = start_new(out, overrides=[*BASE, *extra, f"train.steps={steps}"], init=init,
                      overwrite=True)
    loop.train(ready.run, out, task=ready.task, init=ready.init, consume_init=True,
               progress=False)
    wall = time.perf_counter() - t0
    log = metrics_log.read_rows(os.path.join(out, "metrics.jsonl"))
    # rows after the first (compiles); the profiled ones (every 3rd step) also time a sampling
    # probe, so the step time is the others' and the split theirs
    warm = [r["step_time_s"] for r in log[1:] if "sampling_time_s" not in r]
    split = [r for r in log[1:] if "sampling_time_s" in r]
    step = statistics.median(warm)
    return {"point": point, "rows": rows, "step_s": step, "first_step_s": log[0]["step_time_s"],
            "sampling_s": split[0]["sampling_time_s"] if split else None,
            "update_s": split[0]["update_time_s"] if split else None,
            "tokens": statistics.mean(r.get("generated_tokens", 0) for r in log),
            "samples_per_s": rows / step, "wall_s": wall,
            "load": [load0, os.getloadavg()[0]]}  # 1-minute load average at start and end


def main():
    cfg = get_config()
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default=",".join(cfg["points"]))
    ap.add_argument("--steps", type=int, default=cfg["steps"])
    ap.add_argument("--init", default=cfg["init"],
                    help="the policy: smollm2, or a warm-start folder (vpo compare's <out>/sft)")
    ap.add_argument("--json", default="", help="also write the table's rows to this file")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as root:
        for point in args.points.split(","):
            results.append(bench_point(point, args.steps, root, args.init))
            print(json.dumps(results[-1]), flush=True)
    base = results[0]["samples_per_s"]
    print(f"\n| B x G | rows | step s | sampling s | update s | gen. tokens | samples/s | "
          f"x {results[0]['point']} | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    def fmt(v):
        return "" if v is None else f"{v:.1f}"

    for r in results:
        print(f"| {r['point']} | {r['rows']} | {r['step_s']:.1f} | {fmt(r['sampling_s'])} | "
              f"{fmt(r['update_s'])} | {r['tokens']:.0f} | {r['samples_per_s']:.2f} | "
              f"{r['samples_per_s'] / base:.2f} | {r['load'][0]:.1f}-{r['load'][1]:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
