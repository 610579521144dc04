"""The entropy law R = -a·exp(H) + b (Cui et al., arXiv 2505.22617) on GRPO, Clip-Cov and KL-Cov.

Run:  python experiments/entropy_law.py [section.key=value ...] [--out runs/entropy_law]

From one SFT warm start (vpo.compare.driver.warm_start), GRPO with one answer per generation is
trained plain, with Clip-Cov and with KL-Cov (vpo.compare.arms.train_arms: same seeds, steps, G,
lr). Each run checkpoints `law_points` times; at step 0 and at every checkpoint R is the policy's
HELD-OUT evaluation score (best@1 on `law_problems` problems the run never trains on, temperature
`eval_temperature`, the same key everywhere) and H the training token entropy of the 10 steps
before it, as in the paper (validation score against training entropy).

Per arm and seed, four models are fitted on the early half of the points and scored by RMSE on
the later half (vpo.eval.entropy_law.heldout_fits): the law, R linear in H, R linear in steps (a
trend that ignores entropy) and a constant. The law is reproduced only when it beats all three
on held-out points over seeds, with unbiased held-out residuals (vpo.eval.claims.entropy_law_claim:
paired t-interval, three-way verdict). Written to entropy_law.md and entropy_law.png (held-out
score against entropy, mean over seeds).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from vpo.compare import arms as compare_arms
from vpo.compare import config as compare_config
from vpo.compare import data as compare_data
from vpo.compare import driver
from vpo.compare import figures as compare_figures
from vpo.compare import numbers as compare_numbers
from vpo.compare import render as compare_render
from vpo.compare import report as compare_report
from vpo.eval import claims, entropy_law


def get_config(overrides: list[str] | None = None) -> compare_config.CompareConfig:
    base = ["arms=grpo,clip_cov,kl_cov", "num_seeds=3", "train.steps=300", "law_points=6"]
    return compare_config.make_config("maze", base + list(overrides or []))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*")
    p.add_argument("--out", default="runs/entropy_law")
    args = p.parse_args(argv)
    cfg = get_config(args.overrides)
    if not cfg.law_points:
        raise SystemExit("law_points=0 records no trajectory; give law_points >= 3")
    task = compare_data.load_tasks(cfg, with_search=False)
    t0 = time.perf_counter()
    policy = driver.warm_start(cfg, task, args.out)
    runs = compare_arms.train_arms(cfg, task, policy, args.out)
    wall = time.perf_counter() - t0
    law = compare_numbers.law_trajectories(runs)
    table = compare_numbers.law_table(law)
    lines = ["| arm | a | b | R² | " + " | ".join(f"RMSE {m}" for m in entropy_law.MODELS)
             + " | verdict |", "|---|---|---|---|" + "---|" * (len(entropy_law.MODELS) + 1)]
    verdicts = {}
    for arm, t in table.items():
        c = claims.entropy_law_claim(f"entropy law on {arm}", law[arm])
        verdicts[arm] = c
        lines.append(f"| {arm} | {compare_render.fmt(t['a'])} | {compare_render.fmt(t['b'])} "
                     f"| {compare_render.fmt(t['r2'])} | "
                     + " | ".join(compare_render.fmt(t["rmse"][m]) for m in entropy_law.MODELS)
                     + f" | {c['verdict']} |")
    floor = {arm: [compare_numbers.tail_mean(r.metrics, "entropy") for r in rs]
             for arm, rs in runs.items()}
    entropy_lines = [claims.compare_values(f"{arm} keeps training entropy above GRPO",
                                           floor[arm], floor["grpo"], names=(arm, "grpo"))
                     for arm in floor if arm != "grpo" and "grpo" in floor]
    cmd = " ".join(["python experiments/entropy_law.py", *args.overrides, f"--out {args.out}"])
    text = (f"# Entropy law on {cfg.task}\n\n`{cmd}` ({wall:.0f} s; "
            f"{compare_report.machine_load()})\n\n"
            f"{cfg.train.steps} steps x {cfg.train.batch_size} prompts x G = "
            f"{cfg.sampler.num_samples}, seeds {cfg.seeds}; R = held-out best@1 on "
            f"{cfg.law_problems} problems at step 0 and {cfg.law_points} checkpoints, H = "
            "training token entropy. Mean ± 95% interval over seeds.\n\n"
            + "\n".join(lines) + "\n\n"
            + "\n".join(f"- **{c['verdict']}**: {c['claim']}. {c['evidence']}."
                        for c in [*verdicts.values(), *entropy_lines])
            + "\n\n![entropy law](entropy_law.png)\n")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "entropy_law.md"), "w") as f:
        f.write(text)
    curves = {arm: (np.mean([t["entropy"] for t in ts], 0), np.mean([t["score"] for t in ts], 0),
                    None) for arm, ts in law.items()}
    compare_figures.plot_bands(os.path.join(args.out, "entropy_law.png"), curves, marker="o",
                                xlabel="training token entropy H",
                                ylabel="held-out score R (best@1)",
                                title="entropy law R = -a exp(H) + b")
    print(text)
    return {arm: {k: v for k, v in t.items() if k != "fits"} for arm, t in table.items()}


if __name__ == "__main__":
    main(sys.argv[1:])
