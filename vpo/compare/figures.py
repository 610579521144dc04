"""The `vpo compare` report's figures: training curves, the entropy law, the search (budget
curves and the bridge, or solved against candidates) and the temperature sweep, as present,
each a PNG, and all of them beside best@k / pass@k in report.png (`write_figures`).
"""

from __future__ import annotations

import os

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from vpo.compare import search_report, temperature_report
from vpo.compare.config import CompareConfig
from vpo.compare.numbers import mean_ci, smooth
from vpo.eval import plots


def plot_bands(path: str, curves: dict[str, tuple], *, xlabel: str, ylabel: str, title: str,
                marker: str | None = None) -> str:
    """Lines with shaded 95% intervals: curves {name: (xs, mean, half-width or None)}."""
    fig = Figure(figsize=(5.4, 3.8))
    ax = fig.add_subplot()
    for i, (name, (xs, mean, half)) in enumerate(curves.items()):
        xs, mean = np.asarray(xs, float), np.asarray(mean, float)
        style = plots.series_style(i)
        ax.plot(xs, mean, marker=marker, label=name, **style)
        if half is not None and np.all(np.isfinite(half)):
            ax.fill_between(xs, mean - np.asarray(half), mean + np.asarray(half), alpha=0.15,
                            color=style["color"])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(curves) > 1:
        ax.legend(fontsize=7)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def _search_curves(searches) -> dict[str, tuple]:
    """Per row: evaluated candidates → solved count, mean over search seeds per policy seed,
    then mean ± t-interval over policy seeds (over search seeds for a single policy)."""
    out = {}
    for name, rows in searches["rows"].items():
        per = np.array([np.mean(r["solved_SG"], axis=0) for r in rows])  # [seed, point]
        if per.shape[0] < 2:
            per = np.asarray(rows[0]["solved_SG"], float)
        ci = [mean_ci(per[:, g]) for g in range(per.shape[1])]
        out[name] = (rows[0]["evaluated"], [c[0] for c in ci], [c[1] for c in ci])
    return out


def write_figures(out_dir: str, cfg: CompareConfig, runs, head, law, searches=None,
                  temperatures=None) -> None:
    """The report's PNGs in out_dir (training curves, entropy law, search, temperature sweep, as
    present) and report.png, which shows them beside best@k / pass@k (best_at_k.png and
    pass_at_k.png, written with the evaluation table by `policy_eval.write_eval_table`)."""
    window = max(1, cfg.train.steps // 15)
    panels: dict[str, dict] = {"entropy": {}, "diversity": {}, "reward per answer slot": {}}
    for arm, seed_runs in runs.items():
        steps = [r["step"] for r in seed_runs[0].metrics]
        for metric, key in (("entropy", "entropy"), ("diversity", "diversity"),
                            ("reward per answer slot", "reward")):
            ys = np.mean([[r[key] for r in s.metrics] for s in seed_runs], axis=0)
            if key == "reward" and "set_reward" not in seed_runs[0].metrics[0]:
                ys = ys / seed_runs[0].num_answers  # logged before the per-answer scale: Σ_j
            panels[metric][arm] = (steps, smooth(ys, window))
    pngs = [["best_at_k.png", "pass_at_k.png"]]
    if runs:
        plots.plot_metrics_over_steps(os.path.join(out_dir, "training.png"), panels,
                                      title=f"training (mean over seeds, {window}-step average)")
        pngs.append(["training.png"])
    if law:
        curves = {arm: (np.mean([t["entropy"] for t in ts], 0), np.mean([t["score"] for t in ts],
                                                                        0), None)
                  for arm, ts in law.items()}
        plot_bands(os.path.join(out_dir, "entropy_law.png"), curves, marker="o",
                    xlabel="training token entropy H", ylabel="held-out score R (best@1)",
                    title="held-out score against entropy over training (mean over seeds)")
        pngs[0].append("entropy_law.png")
    if searches is not None and search_report.has_curves(searches):
        names = search_report.write_figures(
            out_dir, searches, head, [a for a in head if not a.startswith("sft")])
        pngs.append(names[:1])  # the budget curves: a row of their own
        if law and len(names) > 1:  # the bridge beside the entropy law: training -> outcome
            pngs[0].remove("entropy_law.png")
            pngs.append([names[1], "entropy_law.png"])
        else:
            pngs.append(names[1:])
    elif searches is not None:
        plot_bands(os.path.join(out_dir, "search_solved.png"), _search_curves(searches),
                    xlabel="candidates evaluated per problem",
                    ylabel=f"solved (of {len(searches['problems'])})",
                    title="island search on the hard problems (mean, 95% interval)")
        pngs[-1].append("search_solved.png")
    if temperatures is not None and searches is not None:
        pngs.append([temperature_report.write_figure(out_dir, temperatures, searches)])
    plots.combine_pngs(os.path.join(out_dir, "report.png"),
                       [[os.path.join(out_dir, n) for n in row] for row in pngs],
                       title=f"vpo compare: {', '.join(cfg.arm_names)} on {cfg.task}")
