"""The entropy law R = -a·exp(H) + b (Cui et al., arXiv 2505.22617) on GRPO, Clip-Cov and KL-Cov.

Run:  python experiments/entropy_law.py [section.key=value ...] [--out runs/entropy_law]

From one SFT warm start (vpo.compare.warm_start), GRPO with one answer per generation is trained
plain, with Clip-Cov and with KL-Cov (vpo.compare.train_arms: same seeds, steps, G, lr). Per step
the trainer logs H = mean token entropy of the training rollouts and R = the mean training reward
w*ᵀr (no separate periodic evaluation: R is the on-policy training reward). Both are averaged over
seeds and into equal chunks of steps, then R = -a·exp(H) + b is fitted by least squares on
[-exp(H), 1] (vpo.entropy_law.fit_entropy_law). Printed and written to entropy_law.md: a, b, the
predicted ceiling b - a at H = 0, R² of the fit, and the RMSE on the later half of the chunks of
the fit made on the first half (next to the RMSE of predicting the early mean); the last-chunk
entropy of each arm shows the floor Clip-Cov / KL-Cov keep. entropy_law.png: entropy and reward
over steps with the early fit's prediction (dashed).

At this scale (8 prompts x 8 samples x ~16 tokens per step) Clip-Cov and KL-Cov act on
max(floor(2e-4 · N), 1) = 1 token per batch (their paper ratio); the ratios are not yet
ObjectiveConfig fields, so they cannot be raised from here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from vpo import compare, compare_report, entropy_law, plots


def get_config(overrides: list[str] | None = None) -> compare.CompareConfig:
    base = ["arms=grpo,clip_cov,kl_cov", "num_seeds=2", "train.steps=300"]
    return compare.make_config("default", base + list(overrides or []))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*")
    p.add_argument("--out", default="runs/entropy_law")
    args = p.parse_args(argv)
    cfg = get_config(args.overrides)
    task = compare.make_task(cfg)
    t0 = time.perf_counter()
    policies = compare.warm_start(cfg, task, args.out)
    runs = compare.train_arms(cfg, task, policies, args.out)
    wall = time.perf_counter() - t0
    fits, entropy, reward = {}, {}, {}
    for arm, rs in runs.items():
        steps = [r["step"] for r in rs[0].metrics]
        H = np.mean([[r["entropy"] for r in s.metrics] for s in rs], axis=0)
        R = np.mean([[r["reward"] for r in s.metrics] for s in rs], axis=0) / rs[0].num_answers
        fits[arm] = fit = entropy_law.entropy_law_report(H, R)
        window = max(1, len(steps) // 15)
        entropy[arm] = (steps, compare_report.smooth(H, window))
        reward[arm] = (steps, compare_report.smooth(R, window))
        pred = fit["early_b"] - fit["early_a"] * np.exp(compare_report.smooth(H, window))
        reward[f"{arm}: law, early fit"] = (steps, pred)
    lines = ["| arm | a | b | ceiling b-a | R² | held-out RMSE | constant RMSE | entropy first "
             "-> last |", "|---|---|---|---|---|---|---|---|"]
    for arm, r in fits.items():
        lines.append(f"| {arm} | {r['a']:.3f} | {r['b']:.3f} | {r['ceiling']:.3f} | "
                     f"{r['r2']:.2f} | {r['rmse_heldout']:.4f} | {r['rmse_constant']:.4f} | "
                     f"{r['entropy_first']:.3f} -> {r['entropy_last']:.3f} |")
    table = "\n".join(lines)
    floor = {arm: fits[arm]["entropy_last"] for arm in fits}
    verdicts = [f"- {arm} keeps a higher late entropy than GRPO: "
                f"{'yes' if floor[arm] > floor['grpo'] else 'no'} ({floor[arm]:.3f} vs "
                f"{floor['grpo']:.3f})" for arm in fits if arm != "grpo" and "grpo" in fits]
    cmd = " ".join(["python experiments/entropy_law.py", *args.overrides, f"--out {args.out}"])
    load = compare_report.machine_load()
    text = (f"# Entropy law on {cfg.task}\n\n`{cmd}` ({wall:.0f} s; {load})\n\n"
            f"{cfg.train.steps} steps x {cfg.train.batch_size} prompts x G = "
            f"{cfg.sampler.num_samples}, seeds {cfg.seeds}, R = training reward w*ᵀr, H = "
            f"training-rollout token entropy, {fits[next(iter(fits))]['chunks']} chunks.\n\n"
            f"{table}\n\n" + "\n".join(verdicts) + "\n\n![entropy law](entropy_law.png)\n")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "entropy_law.md"), "w") as f:
        f.write(text)
    plots.plot_metrics_over_steps(os.path.join(args.out, "entropy_law.png"),
                                  {"entropy": entropy, "reward per answer": reward},
                                  title="entropy law R = -a exp(H) + b",
                                  dashed=[k for k in reward if k.endswith("early fit")])
    print(text)
    return fits


if __name__ == "__main__":
    main(sys.argv[1:])
