"""The temperature sweep in the `vpo compare` report: can inference buy back what training
removed? Island search and best-of-N of the warm start and the primary claims' arms at every
sampling temperature (the search stage's at `search.temperature`, the sweep's at the others;
`vpo.compare.search_leg.temperature_sweep`), with the search's mechanism probe at each. Pure
functions of summary.json's `temperature` and `search`, plus the figure. Exploratory: no claim
of the design rests on it, and no correction is applied.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from vpo.eval import claims
from vpo.search.ingraph import PROBE_FIELDS


def points(temps: dict[str, Any], searches: dict[str, Any]) -> dict[str, dict[float, dict]]:
    """{row: {temperature: {"seeds", "search", "best_of_n" (per seed, problems solved at the
    calibrated budget), "probe" (4 counts summed over seeds, or None)}}}, the main temperature
    read from the search stage's records (seed i of every temperature uses the same keys)."""
    out: dict[str, dict[float, dict]] = {}
    for name, recs in temps["rows"].items():
        rows = {temps["main"]: [
            {"seed": r["seed"], "search": float(np.sum(r["solved_SP"])) / searches["seeds"],
             "best_of_n": (float(np.sum(r["best_of_n_SP"])) / searches["seeds"]
                           if "best_of_n_SP" in r else math.nan), "probe": r.get("probe")}
            for r in searches["rows"][name]]}
        for r in recs:
            rows.setdefault(r["temperature"], []).append(r)
        out[name] = {}
        for T in sorted(rows):
            rs = sorted(rows[T], key=lambda r: r["seed"])
            probes = [r["probe"] for r in rs]
            out[name][T] = {"seeds": [r["seed"] for r in rs],
                            "search": [r["search"] for r in rs],
                            "best_of_n": [r["best_of_n"] for r in rs],
                            "probe": (np.sum(probes, 0).tolist()
                                      if all(p is not None for p in probes) else None)}
    return out


def _rates(probe) -> str:
    if probe is None:
        return "- | -"
    p = dict(zip(PROBE_FIELDS, probe, strict=True))
    return (f"{p['mutated_beat'] / max(p['mutated'], 1):.3f} | "
            f"{p['fresh_beat'] / max(p['fresh'], 1):.3f}")


def _mean(values) -> str:
    mean, half = claims.interval(values)
    return f"{mean:.2f}" if math.isnan(half) else f"{mean:.2f} ± {half:.2f}"


def _signed(diffs) -> str:
    d = np.asarray(diffs, float)
    mean, half = claims.interval(d)
    ci = "" if math.isnan(half) else f" ± {half:.2f}"
    return f"{mean:+.2f}{ci} ({int(np.sum(d > 0))}+/{int(np.sum(d < 0))}-)"


def lines(temps: dict[str, Any], searches: dict[str, Any]) -> list[str]:
    """The report's section: per row and temperature, problems solved by island search and
    best-of-N (mean ± 95% over training seeds), their paired difference, and the probe's rates
    (children beating their best parent, fresh samples beating theirs); then, per temperature,
    every swept arm's island search minus the first arm's (paired by seed) and each row's change
    from the main temperature."""
    pts = points(temps, searches)
    P = len(searches["problems"])
    out = ["", "## Search temperature (exploratory)", "",
           "Can inference buy back what training removed? The warm start (its calibrated mode) "
           "and the arms the primary claims name search the same problems again with the same "
           f"keys at each sampling temperature (the search stage's is {temps['main']:g}); "
           f"problems solved of {P} at the calibrated budget ({temps['budget']} candidates), "
           "mean ± 95% over training seeds; island − best-of-N paired by seed (seeds above / "
           "below zero); the mechanism probe pooled over seeds and generations. No claim rests "
           "on this section and no correction is applied.", "",
           "| policy | T | island search | best-of-N | island − best-of-N | children beat "
           "parents | fresh samples beat parents |", "|---|---|---|---|---|---|---|"]
    for name, by_t in pts.items():
        for T, p in by_t.items():
            out.append(f"| {name} | {T:g} | {_mean(p['search'])} | {_mean(p['best_of_n'])} | "
                       f"{_signed(np.subtract(p['search'], p['best_of_n']))} | "
                       f"{_rates(p['probe'])} |")
    arms = [n for n in pts if not n.startswith("sft")]
    if len(arms) > 1:
        base, main = arms[0], temps["main"]
        out += ["", f"Island search minus {base}'s at the same temperature, then {base}'s at "
                f"each other temperature minus the other arms' at {main:g} (does heat buy "
                f"{base} the other arm's search?), paired by seed:", ""]
        for a in arms[1:]:
            for T in pts[a]:
                _, x, y = claims.pair_by_seed(pts[a][T]["seeds"], pts[a][T]["search"],
                                              pts[base][T]["seeds"], pts[base][T]["search"])
                out.append(f"- {a} at {T:g} − {base} at {T:g}: {_signed(x - y)}")
        for T in pts[base]:
            if main != T:
                for a in arms[1:]:
                    _, x, y = claims.pair_by_seed(
                        pts[base][T]["seeds"], pts[base][T]["search"], pts[a][main]["seeds"],
                        pts[a][main]["search"])
                    out.append(f"- {base} at {T:g} − {a} at {main:g}: {_signed(x - y)}")
    return out


def plot(path: str, temps: dict[str, Any], searches: dict[str, Any]) -> None:
    """Problems solved against the sampling temperature: island search (solid) and best-of-N
    (dashed) per row, mean over training seeds with the 95% interval as bars."""
    pts = points(temps, searches)
    fig = Figure(figsize=(6.4, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for i, (name, by_t) in enumerate(pts.items()):
        Ts = list(by_t)
        for method, style in (("search", "-o"), ("best_of_n", "--s")):
            ci = [claims.interval(by_t[T][method]) for T in Ts]
            ax.errorbar(Ts, [c[0] for c in ci], yerr=[np.nan_to_num(c[1]) for c in ci],
                        fmt=style, color=f"C{i}", capsize=3,
                        label=f"{name} {'island' if method == 'search' else 'best-of-N'}")
    ax.set_xlabel("sampling temperature at search time")
    ax.set_ylabel(f"problems solved (of {len(searches['problems'])})")
    ax.set_title("island search (solid) and best-of-N (dashed) against temperature")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


FIGURE = "temperature.png"


def write_figure(out_dir: str, temps, searches) -> str:
    plot(os.path.join(out_dir, FIGURE), temps, searches)
    return FIGURE
