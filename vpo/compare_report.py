"""The `vpo compare` report: headline table with Student-t intervals over seeds, the issue's
claims checked against the measured numbers, PNGs and report.md / summary.json.

Reads what the stages in `vpo.compare` produced (training metrics per arm and seed, the
budget-fair evaluation, the search traces, the entropy-law fits); computes nothing new about the
policies.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from vpo import plots, policy_eval

if TYPE_CHECKING:
    from vpo.compare import CompareConfig


def mean_ci(values) -> tuple[float, float]:
    """Mean and the half-width of a 95% Student-t interval over seeds, t_{0.975, n-1}·s/√n
    (s the unbiased std); half-width NaN for a single seed."""
    from scipy import stats

    x = np.asarray(values, float)
    if x.size < 2:
        return float(x.mean()), float("nan")
    return float(x.mean()), float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1)
                                  / math.sqrt(x.size))


def smooth(x, window: int) -> np.ndarray:
    """Trailing moving average over up to `window` steps (for plots of noisy per-step metrics)."""
    x = np.asarray(x, float)
    c = np.cumsum(np.concatenate([[0.0], x]))
    i = np.arange(1, x.size + 1)
    lo = np.maximum(i - window, 0)
    return (c[i] - c[lo]) / (i - lo)


TAIL_FRAC = 0.2  # "late training" = the last 20% of steps
TIE = 5e-4  # differences below this (the table's precision) count as ties, i.e. not "higher"


def _higher(v: float, g: float) -> bool:
    return v > g + TIE


def _tail_mean(rows: list[dict[str, float]], key: str) -> float:
    n = max(1, round(TAIL_FRAC * len(rows)))
    return float(np.mean([r[key] for r in rows[-n:]]))


def headline(cfg: CompareConfig, runs, evals, searches) -> dict[str, dict[str, Any]]:
    """Per row (warm starts, arms): seeds and {metric: [value per seed]} for the table."""
    N = cfg.eval_budget
    out = {}
    for name, rows in evals["rows"].items():
        vals = {"best@1": [r["best@1"] for r in rows], f"best@{N}": [r[f"best@{N}"] for r in rows],
                f"pass@{N}": [r[f"pass@{N}"] for r in rows],
                "diversity": [r["diversity"] for r in rows],
                "distinct": [r["distinct"] for r in rows], "entropy": [r["entropy"] for r in rows]}
        if name in runs:
            vals["train entropy"] = [_tail_mean(r.metrics, "entropy") for r in runs[name]]
            vals["train diversity"] = [_tail_mean(r.metrics, "diversity") for r in runs[name]]
        if searches is not None:
            vals["search solved"] = [s["solved_count"][-1] for s in searches["rows"][name]]
        out[name] = {"m": rows[0]["m"], "seeds": [r["seed"] for r in rows], "values": vals}
    return out


def _mean(head, row, metric) -> float:
    return float(np.mean(head[row]["values"][metric]))


def _fmt(values) -> str:
    mean, hw = mean_ci(values)
    return f"{mean:.3f}" if math.isnan(hw) else f"{mean:.3f} ± {hw:.3f}"


def claims(cfg: CompareConfig, head, evals, searches, law) -> list[dict[str, Any]]:
    """The issue's expected results, each checked against the measured numbers:
    {"claim", "holds" (bool), "evidence"}. A claim whose arms did not run is left out."""
    N, ks = cfg.eval_budget, evals["ks"]
    out = []

    def add(claim, holds, evidence):
        out.append({"claim": claim, "holds": bool(holds), "evidence": evidence})

    scalar = [a for a in ("grpo", "multi_rlvr") if a in head]
    if "vpo" in head:
        for base in scalar:
            v, g = _mean(head, "vpo", f"best@{N}"), _mean(head, base, f"best@{N}")
            add(f"VPO best@{N} >= {base} best@{N} (equal candidate budget)", v >= g - TIE,
                f"{v:.3f} vs {g:.3f}")
            gaps = [float(np.mean([r[f"best@{k}"] for r in evals["rows"]["vpo"]])
                          - np.mean([r[f"best@{k}"] for r in evals["rows"][base]])) for k in ks]
            add(f"the best@k gap VPO - {base} grows with k (k=1 -> k={N})",
                _higher(gaps[-1], gaps[0]),
                ", ".join(f"k={k}: {d:+.3f}" for k, d in zip(ks, gaps, strict=True)))
            for metric in ("diversity", "train diversity", "train entropy"):
                v, g = _mean(head, "vpo", metric), _mean(head, base, metric)
                what = {"diversity": "reward-space diversity of the eval candidates",
                        "train diversity": "reward-space diversity of training rollouts (last "
                                           "20% of steps)",
                        "train entropy": "token entropy of training rollouts (last 20% of "
                                         "steps)"}[metric]
                add(f"VPO keeps higher {what} than {base}", _higher(v, g),
                    f"{v:.3f} vs {g:.3f}")
            if searches is not None:
                solved = {a: np.any([s["solved_P"] for s in searches["rows"][a]], axis=0)
                          for a in ("vpo", base)}
                only_v = int(np.sum(solved["vpo"] & ~solved[base]))
                only_b = int(np.sum(solved[base] & ~solved["vpo"]))
                add(f"in search, VPO's policy solves problems {base}'s never does, more of them "
                    f"than the reverse (any seed, budget {searches['budget']})", only_v > only_b,
                    f"{only_v} solved only by VPO, {only_b} only by {base}, of "
                    f"{len(searches['problems'])} hardest problems")
    if "grpo" in law:
        r = law["grpo"]
        add("the entropy law R = -a·exp(H) + b fits GRPO's trajectory (R² >= 0.5, a > 0, and the "
            "early fit predicts later steps better than a constant)",
            r["r2"] >= 0.5 and r["a"] > 0 and r["rmse_heldout"] < r["rmse_constant"],
            f"a={r['a']:.3f}, b={r['b']:.3f}, ceiling {r['ceiling']:.3f}, R² {r['r2']:.2f}, "
            f"held-out RMSE {r['rmse_heldout']:.4f} vs constant {r['rmse_constant']:.4f}")
    for arm in ("clip_cov", "kl_cov", "entropy_mask"):
        if arm in head and "grpo" in head:
            v, g = _mean(head, arm, "train entropy"), _mean(head, "grpo", "train entropy")
            add(f"{arm} keeps training entropy above plain GRPO", _higher(v, g),
                f"{v:.3f} vs {g:.3f}")
    return out


def write_report(out_dir: str, cfg: CompareConfig, *, command: str, wall: dict[str, float],
                 runs, evals, searches, law, load: str = "") -> dict[str, Any]:
    """report.md, summary.json and the PNGs (best@k, pass@k, training curves, search, and all
    four in report.png) in out_dir; returns the summary."""
    head = headline(cfg, runs, evals, searches)
    checked = claims(cfg, head, evals, searches, law)
    ks, N = evals["ks"], cfg.eval_budget
    means = {}
    for name, h in head.items():
        rows = evals["rows"][name]
        label = name if name.startswith("sft") else f"{name} (m={h['m']})"
        means[label] = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]
                        if isinstance(rows[0][k], float)}
    policy_eval.write_report(out_dir, means, ks, title=f"{cfg.task}: {cfg.eval_problems} "
                             f"problems, {N} candidates each (mean over seeds)")
    window = max(1, cfg.train.steps // 15)
    panels: dict[str, dict] = {"entropy": {}, "diversity": {}, "reward per answer slot": {}}
    for arm, seed_runs in runs.items():
        steps = [r["step"] for r in seed_runs[0].metrics]
        for metric, key in (("entropy", "entropy"), ("diversity", "diversity"),
                            ("reward per answer slot", "reward")):
            ys = np.mean([[r[key] for r in s.metrics] for s in seed_runs], axis=0)
            ys = ys / seed_runs[0].num_answers if key == "reward" else ys
            panels[metric][arm] = (steps, smooth(ys, window))
    if runs:
        plots.plot_metrics_over_steps(os.path.join(out_dir, "training.png"), panels,
                                      title=f"training (mean over seeds, {window}-step average)")
    if searches is not None:
        curves = {name: (rows[0]["evaluated"], np.mean([r["solved_count"] for r in rows], 0))
                  for name, rows in searches["rows"].items()}
        plots.plot_metric_vs_k(os.path.join(out_dir, "search_solved.png"), curves,
                               metric=f"solved (of {len(searches['problems'])})", log_x=False,
                               xlabel="candidates evaluated per problem",
                               title="island search on the hardest problems (mean over seeds)")
    layout = [["best_at_k.png", "pass_at_k.png"]
              + (["search_solved.png"] if searches is not None else []), ["training.png"]]
    plots.combine_pngs(os.path.join(out_dir, "report.png"),
                       [[os.path.join(out_dir, n) for n in row if n != "training.png" or runs]
                        for row in layout],
                       title=f"vpo compare: {', '.join(cfg.arm_names)} on {cfg.task}")
    summary = {"config": dataclasses.asdict(cfg), "command": command, "wall_s": wall,
               "load": load, "headline": head, "claims": checked, "entropy_law": law,
               "eval": evals, "search": searches,
               "train": {arm: [{"seed": r.seed, "dir": os.path.relpath(r.out_dir, out_dir),
                                "metrics": r.metrics} for r in rs] for arm, rs in runs.items()}}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(_report_text(cfg, command, wall, head, checked, law, searches, load))
    return summary


def _report_text(cfg, command, wall, head, checked, law, searches, load) -> str:
    N = cfg.eval_budget
    metrics = ["best@1", f"best@{N}", f"pass@{N}", "diversity", "distinct", "entropy",
               "train entropy", "train diversity", "search solved"]
    metrics = [k for k in metrics if any(k in h["values"] for h in head.values())]
    seeds = max(len(h["seeds"]) for h in head.values())
    ms = sorted({h["m"] for h in head.values()})
    lines = [f"# vpo compare: {', '.join(cfg.arm_names)} on {cfg.task}", "",
             f"`{command}`", "",
             f"Policy `{cfg.model}`{' from ' + cfg.init if cfg.init else ''}; "
             f"{cfg.train.steps} RL steps x {cfg.train.batch_size} prompts x G = "
             f"{cfg.sampler.num_samples} samples, lr {cfg.train.learning_rate:g}, seeds "
             f"{cfg.seeds}. Arms: " + "; ".join(_arm_text(a, cfg) for a in cfg.arm_names) + ".",
             "",
             f"Evaluation: {cfg.eval_problems} held-out problems (seed {cfg.eval_seed}), N = {N} "
             f"candidates per problem for every policy (N/m generations of m answers). Search: "
             f"island search with the policy as mutation operator on the "
             f"{cfg.search_problems} eval problems hardest for all policies above (fewest "
             f"solved, then lowest best score), "
             f"{searches['budget'] if searches else 0} candidates per problem. Cells: mean "
             + ("± half-width of a 95% Student-t interval over seeds." if seeds > 1 else
                "(one seed)."), "",
             "| policy | m | seeds | " + " | ".join(metrics) + " |",
             "|---|---|---|" + "---|" * len(metrics)]
    for name, h in head.items():
        cells = [_fmt(h["values"][k]) if k in h["values"] else "" for k in metrics]
        lines.append(f"| {name} | {h['m']} | {len(h['seeds'])} | " + " | ".join(cells) + " |")
    lines += ["", "best@k: mean over problems of the best w*ᵀr among k candidates; pass@k: "
              "unbiased probability that k candidates contain a solution; diversity: mean "
              "pairwise L1 distance of valid candidates' reward vectors; distinct: distinct "
              "valid answers; train entropy / diversity: last 20% of training steps; search "
              f"solved: problems solved of {cfg.search_problems}. The warm-start rows "
              f"(sft, m in {ms}) are the common starting points.", "",
              "## What reproduced and what did not", "",
              "Computed from the numbers above (a claim holds if the means say so; with few "
              "seeds and overlapping intervals it is not significant).", ""]
    for c in checked:
        lines.append(f"- **{'reproduced' if c['holds'] else 'not reproduced'}**: {c['claim']}. "
                     f"{c['evidence']}.")
    against = [_against_warm_start(head, arm, N) for arm in head if not arm.startswith("sft")]
    against = [a for a in against if a]
    if against:
        lines += ["", "RL against its warm start (same m, mean over seeds; `warm -> RL`): "
                  + "; ".join(against) + "."]
    if law:
        lines += ["", "## Entropy law", "",
                  "R = -a·exp(H) + b fitted by least squares on [-exp(H), 1], H = mean token "
                  "entropy of training rollouts, R = training reward per answer slot (mean "
                  "w*ᵀr), both averaged over seeds and then into equal chunks of steps; the "
                  "early fit uses the first half of the chunks.", "",
                  "| arm | a | b | ceiling b-a | R² | held-out RMSE (early fit) | RMSE of a "
                  "constant | entropy first -> last chunk |", "|---|---|---|---|---|---|---|---|"]
        for arm, r in law.items():
            lines.append(f"| {arm} | {r['a']:.3f} | {r['b']:.3f} | {r['ceiling']:.3f} | "
                         f"{r['r2']:.2f} | {r['rmse_heldout']:.4f} | {r['rmse_constant']:.4f} | "
                         f"{r['entropy_first']:.3f} -> {r['entropy_last']:.3f} |")
    lines += ["", "## Figures", "", "![best@k](best_at_k.png) ![pass@k](pass_at_k.png)", "",
              "![training](training.png)", ""]
    if searches:
        lines += ["![search](search_solved.png)", ""]
    lines += ["## Wall time", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in wall.items()]
    if load:
        lines += ["", f"Machine: {load}"]
    lines += ["", "Per-run metrics: `arms/<arm>/seed<k>/metrics.jsonl` (and TensorBoard under "
              "`tb/`); warm starts: `sft_m<m>/`; all numbers: `summary.json`.", ""]
    return "\n".join(lines)


def _against_warm_start(head, arm: str, N: int) -> str:
    """One arm's headline metrics next to those of the warm start with its m ('' if absent)."""
    sft = f"sft (m={head[arm]['m']})"
    if sft not in head:
        return ""
    metrics = ["best@1", f"best@{N}", f"pass@{N}", "diversity", "search solved"]
    return f"{arm} " + ", ".join(f"{k} {_delta(head, arm, sft, k)}" for k in metrics
                                 if k in head[arm]["values"] and k in head[sft]["values"])


def _delta(head, arm: str, base: str, metric: str) -> str:
    a, b = _mean(head, arm, metric), _mean(head, base, metric)
    return f"{b:.3f} -> {a:.3f}"


def _arm_text(arm: str, cfg: CompareConfig) -> str:
    m = cfg.arm_answers(arm)
    return {"grpo": "**grpo** = GRPO, 1 answer per generation, scalar reward w*ᵀr (the paper's "
                    "GRPO baseline)",
            "multi_rlvr": f"**multi_rlvr** = GRPO on {m} answers per generation with the summed "
                          "scalar Σ_j w*ᵀr_j (Multi-RLVR)",
            "vpo": f"**vpo** = VPO, {m} answers per generation, E_w~Dir({cfg.objective.alpha:g})"
                   f"[max_j wᵀr_j] with K = {cfg.objective.num_weights}",
            "clip_cov": "**clip_cov** = GRPO (m=1) with Clip-Cov",
            "kl_cov": "**kl_cov** = GRPO (m=1) with KL-Cov",
            "entropy_mask": "**entropy_mask** = GRPO (m=1), gradient on the top-20% entropy "
                            "tokens only"}[arm]


def machine_load() -> str:
    """CPU count and 1-minute load average, for the report (timings depend on both)."""
    try:
        load = f", load average {os.getloadavg()[0]:.2f}"
    except OSError:
        load = ""
    return f"{os.cpu_count()} CPUs{load}, JAX backend {jax.default_backend()}"
