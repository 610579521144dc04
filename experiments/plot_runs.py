"""Reward components, entropy and response length over steps for several `vpo train` runs, one
line per run (moving average over `--window` steps), and a summary of the first and last
window of each.

    python experiments/plot_runs.py runs/smollm-grpo runs/smollm-vpo --out docs/smollm_arith.png
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from vpo.eval import plots


def read_metrics(run_dir: str) -> list[dict]:
    """metrics.jsonl rows (a torn last line, what a kill leaves, is skipped)."""
    rows = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            if line.endswith("\n"):
                rows.append(json.loads(line))
    return rows


def smooth(ys: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over `window` values (fewer at the start)."""
    c = np.cumsum(np.insert(np.asarray(ys, float), 0, 0.0))
    idx = np.arange(1, len(ys) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--window", type=int, default=10)
    args = p.parse_args(argv)
    runs = {os.path.basename(os.path.normpath(r)): read_metrics(r) for r in args.runs}
    # every run's reward components (runs on different reward functions share the panels they
    # have in common; a component only one run logs gets a panel with that run alone)
    metrics = ["reward"] + sorted({k for rows in runs.values() for k in rows[0]
                                   if k.startswith("reward/")})
    metrics += ["entropy", "response_length"]
    panels = {}
    for m in metrics:
        panels[m] = {}
        for name, rows in runs.items():
            if not any(m in r for r in rows):
                continue
            steps = np.array([r["step"] for r in rows if m in r], float)
            ys = np.array([r[m] for r in rows if m in r], float)
            panels[m][name] = (steps, smooth(ys, args.window))
    plots.plot_metrics_over_steps(args.out, panels, title=f"moving average over {args.window} "
                                  "steps")
    w = args.window
    for name, rows in runs.items():
        times = [r["step_time_s"] for r in rows[1:]]
        print(f"{name}: {len(rows)} steps, median step {np.median(times):.2f} s "
              f"(IQR {np.percentile(times, 25):.2f}-{np.percentile(times, 75):.2f}); first "
              f"compile+step {rows[0]['step_time_s']:.0f} s")
        for m in metrics:
            if not all(m in r for r in rows):
                continue
            ys = np.array([r[m] for r in rows], float)
            a, b = ys[:w], ys[-w:]
            half = 1.96 * np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
            print(f"  {m:24s} first {w}: {a.mean():.3f}  last {w}: {b.mean():.3f}  "
                  f"change {b.mean() - a.mean():+.3f} ± {half:.3f} (95%)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
