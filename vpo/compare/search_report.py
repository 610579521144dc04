"""The search leg in the `vpo compare` report: budget curves (solved fraction against candidate
budget for every search method and policy), whether the VPO - GRPO gap grows with budget, and
the bridge from training to search (does a run's search solve rate track its end-of-training
entropy and reward-space diversity?). Pure functions of summary.json's `search` and `headline`
(records written by `vpo.compare.search_leg.search_arms`), plus their figures.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from vpo.compare.search_leg import solved_at
from vpo.eval import association, claims, plots

METHOD_NAMES = {"search": "island search", "best_of_n": "best-of-N",
                "revision": "sequential revision"}
BRIDGE_METRICS = (("train entropy", "end-of-training token entropy"),
                  ("train diversity", "end-of-training reward-space diversity"))


def has_curves(searches) -> bool:
    """Whether a summary's search records hold per-budget first-solve points (older ones
    hold the island search's end state only)."""
    rows = (searches or {}).get("rows") or {}
    return bool(rows) and all("first_SP" in r for rs in rows.values() for r in rs)


def solved_fractions(rec: dict[str, Any], method: str) -> np.ndarray:
    """[search, point] solved fraction of one row seed's searches with `method`."""
    first = np.asarray(rec["first_SP"][method])
    return np.stack([solved_at(first, g).mean(-1) for g in range(len(rec["evaluated"]))], -1)


def seed_curves(rows: list[dict[str, Any]], method: str) -> tuple[list[int], np.ndarray]:
    """(seed ids, [seed, point] solved fraction, mean over the seed's searches)."""
    return ([r["seed"] for r in rows],
            np.array([solved_fractions(r, method).mean(0) for r in rows]))


def budget_curves(searches) -> dict[str, dict[str, tuple]]:
    """{method: {row: (budgets, mean, 95% half-width)}} over training seeds."""
    out: dict[str, dict[str, tuple]] = {}
    for method in searches.get("methods", ["search"]):
        for name, rows in searches["rows"].items():
            _, per = seed_curves(rows, method)
            ci = [claims.interval(per[:, g]) for g in range(per.shape[1])]
            out.setdefault(method, {})[name] = (rows[0]["evaluated"], [c[0] for c in ci],
                                                [c[1] for c in ci])
    return out


def budget_claims(searches, a: str = "vpo", b: str = "grpo") -> list[dict[str, Any]]:
    """Per method, claim "the a - b solved-fraction gap grows with the candidate budget and is
    positive at the largest" (`claims.gap_grows` over the budget points, paired by seed id);
    [] when either row is absent. Not yet Holm-adjusted."""
    rows = searches["rows"]
    if a not in rows or b not in rows:
        return []
    out = []
    for method in searches.get("methods", ["search"]):
        seeds_a, a_seed_point = seed_curves(rows[a], method)
        seeds_b, b_seed_point = seed_curves(rows[b], method)
        seeds = claims.matched_seeds(seeds_a, seeds_b, names=(a, b))
        order_b = [seeds_b.index(s) for s in seeds]
        budgets = rows[a][0]["evaluated"]
        out.append(claims.gap_grows(
            f"with {METHOD_NAMES[method]}, the solved-fraction gap {a} - {b} grows with the "
            f"candidate budget and is positive at {budgets[-1]}", a_seed_point,
            b_seed_point[order_b], budgets, names=(a, b), label="budget"))
    return out


def _competence_key(head, arms: list[str]) -> str | None:
    """The held-out pass@k with the largest k that every arm's values hold (None: none)."""
    keys = [set(k for k in head[a]["values"] if k.startswith("pass@")) for a in arms]
    common = set.intersection(*keys) if keys else set()
    return max(common, key=lambda k: int(k.split("@")[1])) if common else None


def bridge_claims(head, arms: list[str]) -> list[dict[str, Any]]:
    """Claim "the search solve rate rises with the run's end-of-training entropy / reward-space
    diversity", per metric: across every RL run (arm x seed; descriptive, as it pools the arms'
    objectives), within each arm (`association.association`: Spearman's ρ, 8 runs enumerated
    exactly), within arms with the arms as blocks (`association.stratified_association`, the
    direct test: runs exchanged only inside their arm, so arms of different m or objective are
    never compared with each other), and the same given the run's held-out pass@k (rank
    residuals within each arm: diversity told apart from competence). Not yet Holm-adjusted."""
    out = []
    given = _competence_key(head, arms)
    for metric, words in BRIDGE_METRICS:
        blocks = []
        for arm in arms:
            v = head[arm]["values"]
            if metric in v and "search solved" in v:
                blocks.append((arm, v[metric], v["search solved"], v.get(given)))
        if not blocks:
            continue
        n = sum(len(b[1]) for b in blocks)
        out.append(association.association(
            f"across all {n} RL runs (descriptive: the arms' objectives pooled), the search "
            f"solve rate rises with the {words}", np.concatenate([b[1] for b in blocks]),
            np.concatenate([b[2] for b in blocks]), names=(metric, "solved")))
        for arm, x, y, _ in blocks:
            out.append(association.association(
                f"within {arm}'s {len(x)} runs, the search solve rate rises with the {words}",
                x, y, names=(metric, "solved")))
        out.append(association.stratified_association(
            f"within arms ({len(blocks)} arms as blocks), the search solve rate rises with the "
            f"{words}", [(x, y) for _, x, y, _ in blocks], names=(metric, "solved")))
        if given and all(z is not None for *_, z in blocks):
            out.append(association.stratified_association(
                f"within arms ({len(blocks)} arms as blocks), the search solve rate rises with "
                f"the {words} given held-out {given}", [(x, y, z) for _, x, y, z in blocks],
                names=(metric, "solved"), given=given))
    return out


def plot_budget_curves(path: str, curves: dict[str, dict[str, tuple]], problems: int,
                       calibrated: int | None = None) -> str:
    """One panel per method: solved fraction against candidates (log x), a line per policy with
    its 95% band over training seeds; the calibrated budget dotted."""
    fig = Figure(figsize=(4.4 * len(curves), 3.6))
    axes = fig.subplots(1, len(curves), squeeze=False)[0]
    for ax, (method, rows) in zip(axes, curves.items(), strict=True):
        for i, (name, (xs, mean, half)) in enumerate(rows.items()):
            style = plots.series_style(i)
            xs, mean, half = (np.asarray(v, float) for v in (xs, mean, half))
            ax.plot(xs, mean, marker="o", markersize=3, label=name, **style)
            if np.all(np.isfinite(half)):
                ax.fill_between(xs, mean - half, mean + half, alpha=0.12, color=style["color"])
        if calibrated is not None:
            ax.axvline(calibrated, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        budgets = np.asarray(next(iter(rows.values()))[0])
        ticks = budgets[np.unique(np.round(np.geomspace(1, budgets.size, 5)).astype(int)) - 1]
        ax.set_xticks(ticks, [str(int(t)) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("candidates per problem")
        ax.set_ylabel(f"solved fraction (of {problems})")
        ax.set_title(METHOD_NAMES[method])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def plot_bridge(path: str, head, arms: list[str]) -> str:
    """Scatter of each RL run's search solve count against its end-of-training entropy and
    diversity, coloured by arm."""
    fig = Figure(figsize=(8.4, 3.6))
    axes = fig.subplots(1, len(BRIDGE_METRICS), squeeze=False)[0]
    order = list(head)  # each arm in its colour of the budget curves
    for ax, (metric, words) in zip(axes, BRIDGE_METRICS, strict=True):
        for arm in arms:
            v = head[arm]["values"]
            if metric in v and "search solved" in v:
                ax.scatter(v[metric], v["search solved"], s=18, label=arm,
                           color=plots.series_style(order.index(arm))["color"])
        ax.set_xlabel(words)
        ax.set_ylabel("search problems solved (mean over searches)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def budget_table(searches) -> list[str]:
    """Markdown: solved fraction (mean over training seeds) per method, policy and budget."""
    curves = budget_curves(searches)
    budgets = next(iter(next(iter(curves.values())).values()))[0]
    lines = ["| method | policy | " + " | ".join(str(b) for b in budgets) + " |",
             "|---|---|" + "---|" * len(budgets)]
    for method, rows in curves.items():
        for name, (_, mean, _) in rows.items():
            lines.append(f"| {METHOD_NAMES[method]} | {name} | "
                         + " | ".join(f"{x:.3f}" for x in mean) + " |")
    return lines


def solve_sets(searches, method: str = "search") -> list[str]:
    """Markdown: which problems each policy's `method` solves at the calibrated budget in any
    of its training seeds' searches, compared both ways: the warm start's stronger row against
    each arm, and VPO against each other arm (problems only the first solves, only the second,
    both, neither): rate against reach."""
    rows, point = searches["rows"], searches["point"]
    P = len(searches["problems"])
    sets = {name: np.any([solved_at(r["first_SP"][method], point).any(0) for r in recs], 0)
            for name, recs in rows.items()}
    warm = [n for n in sets if n.startswith("sft")]
    arms = [n for n in sets if not n.startswith("sft")]
    pairs = ([(max(warm, key=lambda n: sets[n].sum()), a) for a in arms] if warm else [])
    pairs += [("vpo", a) for a in arms if a != "vpo" and "vpo" in sets]
    lines = [f"| {METHOD_NAMES[method]}: A | B | solved by A (of {P}) | by B | A only | B only "
             "| both | neither |", "|---|---|---|---|---|---|---|---|"]
    for a, b in pairs:
        x, y = sets[a], sets[b]
        lines.append(f"| {a} | {b} | {int(x.sum())} | {int(y.sum())} | {int((x & ~y).sum())} | "
                     f"{int((~x & y).sum())} | {int((x & y).sum())} | {int((~x & ~y).sum())} |")
    return lines


def write_figures(out_dir: str, searches, head, arms: list[str]) -> list[str]:
    """budget_curves.png and bridge.png in out_dir (when the summary has what they need);
    returns their file names."""
    if not has_curves(searches):
        return []
    names = ["budget_curves.png"]
    plot_budget_curves(os.path.join(out_dir, names[0]), budget_curves(searches),
                       len(searches["problems"]), searches.get("budget"))
    if any("search solved" in head[a]["values"] for a in arms):
        names.append("bridge.png")
        plot_bridge(os.path.join(out_dir, names[1]), head, arms)
    return names
