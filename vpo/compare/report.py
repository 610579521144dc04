"""The `vpo compare` report: headline table with Student-t intervals over seeds (solving, pass@k,
beside partial credit, best@k), the papers' claims with three-way verdicts on paired differences
(`vpo.eval.claims`), RL against its warm start, the search stage (per-problem solve matrix,
solved-vs-budget curves with intervals, search against best-of-N, the mutation-operator probe),
trends over training, the entropy law on held-out score, PNGs and report.md / summary.json.
Its first lines state the design: the pre-registered primary claims (the config's `primary`),
the unit, the test and what the seed count can decide (`design_text`, also printed before a run
starts); every other family is labelled exploratory. Every family of verdicts it prints is
Holm-corrected as a family in both directions (`verdict_families`) and says so.

report.md is a pure function of summary.json (`render`): `write_report` stores the summary and
renders the report from it, so a committed report can be re-rendered and compared
(tests/project/test_committed_reports.py). Reads what the stages in `vpo.compare.driver` produced;
computes nothing new about the policies.
"""

# size: one job, the report: each table and figure of report.md is one short function here.

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import jax
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from vpo.compare import data as compare_data
from vpo.compare import search_report, temperature_report, verdicts
from vpo.compare.config import ARMS, CompareConfig
from vpo.config import from_dict
from vpo.eval import claims, entropy_law, plots
from vpo.eval import policies as policy_eval

TAIL_FRAC = 0.2  # "late training" = the last 20% of steps
PROBE_KEYS = ("valid", "improve", "copy", "distinct", "solved", "child_fitness", "entropy")


def mean_ci(values) -> tuple[float, float]:
    """Mean and the half-width of a 95% Student-t interval over seeds, t_{0.975, n-1}·s/√n
    (s the unbiased std); half-width NaN for a single seed."""
    return claims.t_interval(values)


def design_text(cfg: CompareConfig) -> str:
    """What the design can decide, before it runs (the driver prints it first; the report's
    design lines say the same): the primary claims, unit, test, the smallest p the seed count
    allows and whether it can decide, else how many seeds it would need (`claims.design`)."""
    keys = verdicts.primary_keys(cfg.primary)
    per_problem = [k for k in keys if verdicts.parse_key(k).metric == "hits"]
    d = claims.design(cfg.num_seeds, len(keys) - len(per_problem))
    missing = sorted({arm for k in keys for arm in k.split(":")[0].split("-")
                      if arm != verdicts.WARM and arm not in cfg.arm_names})
    text = (f"Primary claims ({len(keys)}, Holm over them, exact one-sided sign-flip at "
            f"{claims.LEVEL:g}, unit the training seed"
            + (f"; {len(per_problem)} of them per problem within each seed, claimed for every "
               "seed (an intersection-union test: the problems decide each seed, so any seed "
               "count can decide it)" if per_problem else "") + "): "
            + "; ".join(verdicts.primary_text(k, cfg.eval_budget) for k in keys) + ". "
            + ("The seed-level claims (when the per-problem ones rank first under Holm): "
               if per_problem and len(per_problem) < len(keys) else "")
            + (claims.design_text(d)[0].upper() + claims.design_text(d)[1:] + "."
               if len(per_problem) < len(keys) else ""))
    if missing:
        text += (f" Arms {', '.join(missing)} are not in arms={cfg.arms}: the claims naming "
                 "them cannot be measured.")
    return text


def smooth(x, window: int) -> np.ndarray:
    """Trailing moving average over up to `window` steps (for plots of noisy per-step metrics)."""
    x = np.asarray(x, float)
    c = np.cumsum(np.concatenate([[0.0], x]))
    i = np.arange(1, x.size + 1)
    lo = np.maximum(i - window, 0)
    return (c[i] - c[lo]) / (i - lo)


def tail_mean(rows: list[dict[str, float]], key: str) -> float:
    n = max(1, round(TAIL_FRAC * len(rows)))
    return float(np.mean([r[key] for r in rows[-n:]]))


def fmt(values) -> str:
    """Mean ± 95% t half-width; the mean alone when fewer than `claims.MIN_UNITS` values back
    it (an interval from one degree of freedom says nothing)."""
    mean, hw = claims.interval(values)
    return f"{mean:.3f}" if math.isnan(hw) else f"{mean:.3f} ± {hw:.3f}"


def headline(cfg: CompareConfig, runs, evals, searches) -> dict[str, dict[str, Any]]:
    """Per row (warm starts, arms): m, seed ids and {metric: [value per seed]}, the values in the
    order of the row's seed ids (claims pair rows by those ids, `claims.pair_by_seed`); best@k
    and pass@k for every evaluated k."""
    ks = evals["ks"]
    out = {}
    for name, rows in evals["rows"].items():
        vals = {f"{what}@{k}": [r[f"{what}@{k}"] for r in rows] for k in ks
                for what in ("best", "pass", "cover") if f"{what}@{k}" in rows[0]}
        for key in ("diversity", "distinct", "valid_fraction", "entropy"):
            if key in rows[0]:  # host-scored tasks count no distinct symbol answers
                vals[key] = [r[key] for r in rows]
        seeds = [r["seed"] for r in rows]
        if name in runs:
            trained = [r.seed for r in runs[name]]
            for key, metric in (("train entropy", "entropy"), ("train diversity", "diversity")):
                vals[key] = claims.at_seeds(trained, [tail_mean(r.metrics, metric)
                                                      for r in runs[name]], seeds,
                                            name=f"{name}'s training runs").tolist()
        if searches is not None:
            srows = searches["rows"][name]
            vals["search solved"] = claims.at_seeds(
                [s["seed"] for s in srows], [float(np.mean(np.sum(s["solved_SP"], -1)))
                                             for s in srows], seeds, name=name).tolist()
        out[name] = {"m": rows[0]["m"], "seeds": seeds, "values": vals}
        if "hits_P" in rows[0]:  # per problem, for the claims paired over problems
            out[name]["hits_P"] = [r["hits_P"] for r in rows]
    return out


def law_trajectories(runs) -> dict[str, list[dict[str, list[float]]]]:
    """{arm: [per seed {"step", "entropy", "score"}]} for the runs that recorded one."""
    return {arm: [r.law for r in rs] for arm, rs in runs.items()
            if rs and all(len(r.law.get("step", ())) >= 3 for r in rs)}


def law_table(law) -> dict[str, dict[str, Any]]:
    """Per arm, the per-seed `entropy_law.heldout_fits` and their means."""
    out = {}
    for arm, trajs in law.items():
        fits = [entropy_law.heldout_fits(t["step"], t["entropy"], t["score"]) for t in trajs]
        out[arm] = {"fits": fits, "a": [f["a"] for f in fits], "b": [f["b"] for f in fits],
                    "r2": [f["r2"] for f in fits],
                    "rmse": {k: [f["rmse"][k] for f in fits] for k in entropy_law.MODELS}}
    return out


def _per_search(searches, row: str) -> np.ndarray:
    """Solved count per search seed, averaged over the row's policy seeds ([search seed])."""
    return np.mean([np.sum(r["solved_SP"], -1) for r in searches["rows"][row]], axis=0)


def against_warm_start(head, N: int, searches=None, metric: str | None = None
                       ) -> list[dict[str, Any]]:
    """Every arm against its warm start on one metric (`metric`: pass@N by default, or "search
    solved"; one family per metric, so four arms can still decide at 8 seeds: 4 · 2^-8 <
    0.025): claim "RL improves on its warm start", paired by seed id against the warm start's
    stronger mode on that metric (`verdicts.stronger_warm_start`: the better of its
    single-answer and m-answer pools, named in the evidence). Summaries written before the
    warm start was searched with every seed's keys have no search claim here: one set of
    warm-start searches is not a unit per seed, and treating its mean as a constant would hide
    its variance.
    Not yet Holm-adjusted (`verdict_families`)."""
    out = []
    per_seed = searches is None or searches.get("per_seed_keys", False)
    metric = metric or f"pass@{N}"
    sft = verdicts.stronger_warm_start(head, metric)
    if sft is None or (metric == "search solved" and not per_seed):
        return []
    for arm, h in head.items():
        if arm.startswith("sft") or metric not in h["values"]:
            continue
        c = claims.compare_values(f"{arm} {metric} above its warm start's", h["values"][metric],
                                  head[sft]["values"][metric], names=(arm, sft),
                                  seeds=(h["seeds"], head[sft]["seeds"]))
        c["evidence"] += f"; {sft} is the warm start's stronger mode on {metric}"
        out.append(c)
    return out


def _in_units(c: dict[str, Any], unit: str) -> dict[str, Any]:
    """A claim whose pairs are `unit` (e.g. searches), not policy seeds, says so."""
    return {**c, **{k: c[k].replace("paired seeds", f"paired {unit}").replace(
        "too few seeds", f"too few {unit}") for k in ("evidence", "note")}}


def remedies(head, probes) -> list[dict[str, Any]]:
    """`*_mut` arms (mutation prompts in RL) against the same arm without them, paired by
    seed id: search solved and the probe's improve / valid fractions. Not yet Holm-adjusted
    (`verdict_families`)."""
    out = []
    for arm in head:
        base = arm.removesuffix("_mut")
        if base == arm or base not in head:
            continue
        seeds = (head[arm]["seeds"], head[base]["seeds"])
        pairs = [("search solved", head[arm]["values"].get("search solved"),
                  head[base]["values"].get("search solved"), seeds)]
        if probes and arm in probes and base in probes:
            probe_seeds = ([p["seed"] for p in probes[arm]], [p["seed"] for p in probes[base]])
            pairs += [(f"probe {k}", [p[k] for p in probes[arm]], [p[k] for p in probes[base]],
                       probe_seeds) for k in ("improve", "valid")]
        out += [claims.compare_values(f"train.mutation_fraction raises {base}'s {what}", a, b,
                                      names=(arm, base), seeds=ids)
                for what, a, b, ids in pairs if a is not None and b is not None]
    return out


def search_vs_best_of_n(searches, checkpoints: bool = False) -> list[dict[str, Any]]:
    """Per row that ran best-of-N: claim "island search solves more than best-of-N with the same
    policy, budget and keys", problems solved per unit, search and best-of-N from the same
    record (so paired by construction). The arms pair over their policy seeds (mean over
    searches); with `checkpoints`, the warm-start rows instead: one checkpoint each, paired
    over the shared search keys, so statements about that checkpoint (their own family). Not
    yet Holm-adjusted."""
    out = []
    per_seed = bool((searches or {}).get("per_seed_keys"))
    for name, rows in (searches or {"rows": {}})["rows"].items():
        # with every seed's own keys the warm start's rows pair over seeds like the arms'
        checkpoint = name.startswith("sft") and not per_seed
        if "best_of_n_SP" not in rows[0] or checkpoint != checkpoints:
            continue
        if checkpoint:
            a = np.sum(rows[0]["solved_SP"], -1).tolist()
            b = np.sum(rows[0]["best_of_n_SP"], -1).tolist()
            unit = "searches"
        else:
            a = [float(np.mean(np.sum(r["solved_SP"], -1))) for r in rows]
            b = [float(np.mean(np.sum(r["best_of_n_SP"], -1))) for r in rows]
            unit = "policy seeds"
        out.append(_in_units(claims.compare_values(
            f"{name}: island search solves more than best-of-N", a, b,
            names=("search", "best-of-N")), unit))
    return out


# Each printed family of verdicts: (summary key, section heading's words for its claims).
FAMILIES = (("claims", "exploratory claims of this section"),
            ("against_warm_start", "exploratory RL-against-warm-start claims on solving"),
            ("search_vs_best_of_n", "exploratory search-against-best-of-N claims"),
            ("remedies", "exploratory mutation-prompt claims"),
            ("budget", "exploratory budget-curve claims"),
            ("bridge", "exploratory training-to-search association claims"),
            ("warm_search", "exploratory RL-against-warm-start claims on search"))
PRIMARY = ("primary", "primary claims")
CHECKPOINTS = ("checkpoint_search_vs_best_of_n",
               "exploratory statements about the warm-start checkpoints")
TRENDS = ("trends", "exploratory trend statements")
TREND_METRICS = ("reward", "entropy", "diversity")  # per-step training metrics judged for trends


def training_trends(train) -> list[dict[str, Any]]:
    """Per arm and metric in TREND_METRICS, the claim "it rose over training" over every logged
    step of every seed (`claims.trend`); [] when the summary kept no per-step metrics."""
    out = []
    for arm, runs in (train or {}).items():
        for metric in TREND_METRICS:
            if runs and all(metric in row for r in runs for row in r["metrics"]):
                out.append(claims.trend(
                    f"{arm}'s training {metric} rose over training",
                    [([row["step"] for row in r["metrics"]], [row[metric] for row in r["metrics"]])
                     for r in runs]))
    return out


def verdict_families(cfg: CompareConfig, head, ks, law, searches, probes, train=None
                     ) -> dict[str, list[dict[str, Any]]]:
    """Every family of verdicts the report prints, each Holm-adjusted on its own in both
    directions (`claims.holm`, Holm 1979: the family-wise error of each family at the one-sided
    `claims.LEVEL`): the pre-registered primary claims (`verdicts.primary_claims`), then the
    exploratory ones: the papers' claims, RL against its warm start, search against best-of-N
    (arms; the warm-start checkpoints apart), the mutation-prompt remedies and the trends over
    training (with `train`, the summary's per-step metrics). A primary claim is left out of the
    exploratory family that would repeat it. Keys as in `FAMILIES`, `PRIMARY`, `CHECKPOINTS`
    and `TRENDS`."""
    solved = None if searches is None else verdicts.search_claim_inputs(
        {name: [r["solved_SP"] for r in rows] for name, rows in searches["rows"].items()},
        {name: [r["seed"] for r in rows] for name, rows in searches["rows"].items()})
    primary = verdicts.primary_claims(head, verdicts.primary_keys(cfg.primary), cfg.eval_budget)
    texts = {c["claim"] for c in primary}

    def rest(family):
        return claims.holm([c for c in family if c["claim"] not in texts])

    curves = search_report.has_curves(searches)
    rl = [a for a in head if not a.startswith("sft")]
    return {PRIMARY[0]: primary,
            "budget": claims.holm(search_report.budget_claims(searches) if curves else []),
            "bridge": claims.holm(search_report.bridge_claims(head, rl) if curves else []),
            "claims": rest(verdicts.check(head, ks, law=law, search=solved)),
            "against_warm_start": rest(against_warm_start(head, cfg.eval_budget, searches)),
            "warm_search": rest(against_warm_start(head, cfg.eval_budget, searches,
                                                   "search solved")),
            "search_vs_best_of_n": claims.holm(search_vs_best_of_n(searches)),
            CHECKPOINTS[0]: claims.holm(search_vs_best_of_n(searches, checkpoints=True)),
            "remedies": claims.holm(remedies(head, probes)),
            TRENDS[0]: claims.holm(training_trends(train))}


def correction_text(family: list[dict[str, Any]], what: str) -> str:
    """The sentence a printed family states its correction in: Holm over its C claims at the
    one-sided level in both directions, which reproduced or refuted claims survive, and when
    the seeds cannot reach it at all (smallest adjusted p C·2^-n, n the most paired units of
    any claim in the family)."""
    C = len(family)
    won = [c for c in family if c["verdict"] in (claims.REPRODUCED, claims.REFUTED)]
    lost = [c["claim"] for c in won if not c["survives_holm"]]
    text = (f"Multiplicity: Holm's step-down correction (Holm 1979) over the {C} {what}, one "
            f"family, in both directions (each claim's p on the side its data lean to), at the "
            f"one-sided {100 * claims.LEVEL:g}% level of each verdict; the bold verdict is the "
            "corrected one: ")
    if not won:
        text += "no claim is reproduced or refuted."
    else:
        text += (f"{len(won) - len(lost)} of the {len(won)} reproduced or refuted claims survive "
                 "it" + (": all do." if not lost else
                         "; these do not: " + "; ".join(lost) + "."))
    return text


def floor_text(family: list[dict[str, Any]], what: str) -> str:
    """The sentence a family that cannot decide opens with ("" when it can): with C claims and
    at most n paired units per claim, the smallest Holm-adjusted p is C · 2^-n (C times the
    smallest p of its claims' tests)."""
    C = len(family)
    if not C:
        return ""
    floor = C * min(c.get("smallest_p", claims.smallest_p(c["n"])) for c in family)
    if floor < claims.LEVEL:
        return ""
    n = max(c["n"] for c in family)
    return (f"**Not testable as a family**: {C} {what} with at most {n} paired units each: the "
            f"smallest possible Holm-adjusted p is {C} × 2^-{n} = {min(1.0, floor):.3g} >= "
            f"{claims.LEVEL:g}, so no verdict below can survive the correction; each line is a "
            "description.")


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


def write_report(out_dir: str, cfg: CompareConfig, *, command: str, wall: dict[str, float],
                 runs, evals, searches=None, probes=None, temperatures=None, load: str = "",
                 gate: dict[str, Any] | None = None,
                 data: dict[str, Any] | None = None) -> dict[str, Any]:
    """summary.json, the PNGs (best@k, pass@k, training curves, search, entropy law, and all
    in report.png) and report.md, rendered from the summary as written (`render`), in out_dir;
    returns the summary. `data`: your data's record (`vpo.compare.data.describe`)."""
    head = headline(cfg, runs, evals, searches)
    ks, N = evals["ks"], cfg.eval_budget
    law = law_trajectories(runs)
    # what the report reads (the run folders hold all); set_reward marks the per-answer scale
    kept = ("step", "grad_norm", "set_reward", *TREND_METRICS)
    train = {arm: [{"seed": r.seed, "dir": os.path.relpath(r.out_dir, out_dir),
                    "metrics": [{k: row[k] for k in kept if k in row} for row in r.metrics]}
                   for r in rs] for arm, rs in runs.items()}
    families = verdict_families(cfg, head, ks, law, searches, probes, train)
    laws = law_table(law)
    means = {}
    for name, h in head.items():
        rows = evals["rows"][name]
        label = name if name.startswith("sft") else f"{name} (m={h['m']})"
        means[label] = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]
                        if isinstance(rows[0][k], float)}
    policy_eval.write_eval_table(out_dir, means, ks, title=f"{cfg.task}: {cfg.eval_problems} "
                                 f"problems, {N} candidates each, T = {cfg.eval_temperature:g} "
                                 "(mean over seeds)")
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
    summary = {"config": dataclasses.asdict(cfg), "command": command, "wall_s": wall,
               "load": load, **({"data": data} if data else {}), "headline": head,
               "gate": gate, **families,
               "corrections": {k: f"Holm 1979 over {len(families[k])} claims, both directions, "
                                  f"one-sided {claims.LEVEL:g}" for k in families},
               "design": claims.design(cfg.num_seeds, len(families[PRIMARY[0]])),
               "static": static_arms(runs),
               "entropy_law": {a: {k: v for k, v in t.items() if k != "fits"} | {
                   "trajectories": law[a]} for a, t in laws.items()},
               "eval": evals, "search": searches, "probe": probes, "train": train,
               **({"temperature": temperatures} if temperatures is not None else {})}
    text = json.dumps(summary, indent=1, default=float)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(render(json.loads(text)))  # the report is what summary.json renders to
    return summary


def render(summary: dict[str, Any]) -> str:
    """report.md from a summary.json (as `write_report` stores it, or an older one): a pure
    function of the summary, every verdict recomputed with this code from the per-seed values it
    holds (headline, search, probe, entropy-law trajectories, per-step training metrics when
    kept). A summary without a `primary` in its config predates pre-registration: its primary
    claims are the current default's and the design lines say so."""
    cfg = from_dict(CompareConfig, summary["config"])
    head, searches, probes = summary["headline"], summary.get("search"), summary.get("probe")
    law = {a: t["trajectories"] for a, t in (summary.get("entropy_law") or {}).items()}
    train = summary.get("train")
    families = verdict_families(cfg, head, summary["eval"]["ks"], law, searches, probes, train)
    static = summary.get("static")
    if static is None:
        static = [arm for arm, rs in (train or {}).items()
                  if all(row.get("grad_norm", 1.0) == 0.0 for r in rs for row in r["metrics"])]
    return report_text(cfg, summary["command"], summary["wall_s"], head, families,
                       law_table(law), searches, probes, summary.get("load", ""), static=static,
                       preregistered="primary" in summary["config"], gate=summary.get("gate"),
                       data=summary.get("data"), per_answer_reward=_per_answer(train),
                       temperatures=summary.get("temperature"))


def static_arms(runs) -> list[str]:
    """RL arms whose every logged step of every seed had a zero gradient (every group's rewards
    equal: nothing to learn from), so the arm is its warm start."""
    return [arm for arm, rs in runs.items()
            if all(row.get("grad_norm", 1.0) == 0.0 for r in rs for row in r.metrics)]


def _verdict_line(c: dict[str, Any], label: str = "exploratory") -> str:
    """One claim: its family-wise verdict in bold (the per-claim verdict when it has no family),
    then the label, the note, the claim, its evidence and the Holm outcome."""
    shown = c.get("family_verdict", c["verdict"])
    note = "; ".join(x for x in (label, c.get("note", "")) if x)
    note = f" ({note})" if note else ""
    decided = c["verdict"] in (claims.REPRODUCED, claims.REFUTED)
    holm = "" if "holm_p" not in c else (
        f" Holm-adjusted p = {c['holm_p']:.3g} over {c['family_size']} claims"
        + ("; survives." if c["survives_holm"] else
           f"; {c['verdict']} alone, it does not survive." if decided else "."))
    return f"- **{shown}**{note}: {c['claim']}. {c['evidence']}.{holm}"


def _family_lines(family: list[dict[str, Any]], what: str, label: str = "exploratory"
                  ) -> list[str]:
    """A family's verdict lines and the paragraph stating its correction, after the sentence
    saying it cannot decide when its Holm floor is above the level (`floor_text`)."""
    first = floor_text(family, what)
    return (([first, ""] if first else []) + [_verdict_line(c, label) for c in family]
            + ["", correction_text(family, what)])


def _design_lines(cfg, primary: list[dict[str, Any]], preregistered: bool) -> list[str]:
    """The report's first lines: primary claims, unit, test, what the seeds can decide."""
    d = claims.design(cfg.num_seeds, len(primary))
    text = claims.design_text(d)
    lines = ["## Design", "",
             f"- **Primary claims** ({len(primary)}, from the config's `primary`"
             + ("" if preregistered else
                "; this run predates pre-registration, so they are the current default's, "
                "named after the run") + "): "
             + "; ".join(f"`{c['key']}`: {c['claim']}" for c in primary) + ".",
             f"- **Unit**: the training seed ({cfg.num_seeds} paired seeds, {cfg.seeds}; rows "
             "matched by seed id).",
             f"- **Test**: exact one-sided sign-flip randomization test at {claims.LEVEL:g} (p the "
             "larger of it and the paired t-test's), Holm over the primary family in both "
             "directions.",
             f"- **What the seeds can decide**: {text}.",
             "- Every other comparison in this report is **exploratory**: its own Holm family, "
             "labelled so, not a test of the design."]
    if cfg.design_notes:
        lines.append(f"- **Changes after a look at results** (pre-registration on the record): "
                     f"{cfg.design_notes}")
    return lines + [""]


def _gate_lines(cfg, gate: dict[str, Any] | None) -> list[str]:
    """The pilot gate's numbers (the warm start before RL) and what they say; [] for a summary
    written before the gate existed."""
    if not gate:
        return []
    N = cfg.eval_budget
    k = gate.get("k", {})  # the k the claims name (a gate recorded before them: N)
    kp, kc = k.get("pass", N), k.get("cover", N)
    failed = gate.get("failed") or []
    verdict = ("every check passed" if not failed else
               ("failed and enforced: " if gate.get("enforced") else "failed (not enforced): ")
               + "; ".join(failed))
    lines = [f"**Pilot gate** (the warm start before RL, {gate['problems']} held-out problems, "
             f"{N} candidates each): pass@1 {gate['pass@1']:.3f}, pass@{N} "
             f"{gate[f'pass@{N}']:.3f}, best@{N} {gate[f'best@{N}']:.3f}; "
             f"{gate['group_spread']:.0%} of step-0 groups (G = {gate['G']}) have unequal "
             f"rewards. Headroom band pass@{kp} in [{cfg.gate_pass_min:g}, "
             f"{cfg.gate_pass_max:g}], signal at least {cfg.spread_min:.0%}"
             + (f" (one learning group per step: 1/{cfg.train.batch_size})"
                if cfg.gate_spread_min is None else "") + f": {verdict}.", ""]
    if "hit_rates" in gate:
        rates = ", ".join(f"{k} {v:.3f}" for k, v in gate["hit_rates"].items())
        lines += [f"**The cover signal** (the same step-0 candidates): hit rates {rates} (each at "
                  f"least {cfg.gate_hit_min:g}); a hit in {gate['hit_groups']:.0%} of the groups "
                  f"(at least {cfg.gate_hit_groups_min:.0%}); warm-start cover@{kc} "
                  f"{gate[f'cover@{kc}']:.3f} (band [{cfg.gate_cover_min:g}, "
                  f"{cfg.gate_cover_max:g}]).", ""]
    cal = gate.get("search")
    if cal:
        lines += [f"**Search calibration** (before RL, the warm start's island search in its "
                  f"stronger mode m={cal['mode']}, {cal['searches']} searches on each of the "
                  f"{cal['problems']} search problems with calibration keys of their own): "
                  f"solves {cal['fraction']:.1%} at {cal['budget']} candidates, the largest "
                  f"budget at which it solves at most {cal['band'][1]:.0%}; band "
                  f"[{cal['band'][0]:.0%}, {cal['band'][1]:.0%}]: "
                  + ("in band." if cal["in_band"] else "OUT of band."), ""]
    pilot = gate.get("pilot")
    if pilot:  # the first seed of every arm, before the other seeds trained
        div = ", ".join(f"{a} {v:.3f}" for a, v in pilot["diversity"].items())
        above = "; ".join(f"{k}: {'above' if ok else 'NOT above'}"
                          for k, ok in pilot["above"].items())
        lines += [f"**Diversity pilot** (seed {pilot['seed']}, mean training diversity over the "
                  f"first {pilot['steps']} steps, one seed: a description, not a test): {div}"
                  + (f" ({above})" if above else "") + ".", ""]
    return lines


def report_text(cfg, command, wall, head, families, laws, searches, probes, load,
                static: list[str] | None = None, preregistered: bool = True,
                gate: dict[str, Any] | None = None,
                data: dict[str, Any] | None = None, per_answer_reward: bool = False,
                temperatures: dict[str, Any] | None = None) -> str:
    """report.md: `families` as from `verdict_families` (each printed with its correction),
    the design lines first; `data`: your data's record (`vpo.compare.data.describe`). Each
    section is one function below, in the report's order."""
    lines = [f"# vpo compare: {', '.join(cfg.arm_names)} on {cfg.task}", "",
             f"`{command}`", ""]
    lines += _design_lines(cfg, families[PRIMARY[0]], preregistered)
    lines += _gate_lines(cfg, gate)
    lines += _static_lines(static)
    lines += _setup_lines(cfg, head, data)
    lines += _headline_lines(cfg, head, families, searches)
    lines += _claims_lines(families)
    lines += _warm_start_lines(families, searches)
    if searches is not None:
        lines += _search_text(cfg, searches, head, families["search_vs_best_of_n"],
                              families.get(CHECKPOINTS[0], []))
    if families.get("budget") or families.get("bridge"):
        lines += _curves_text(cfg, searches, head, families)
    if temperatures is not None and searches is not None:
        lines += temperature_report.lines(temperatures, searches)
    if probes:
        lines += _probe_text(cfg, head, probes, families["remedies"])
    lines += _trend_lines(families, per_answer_reward)
    lines += _law_lines(cfg, laws)
    lines += _figure_lines(laws, searches, temperatures is not None)
    lines += _wall_lines(wall, load)
    return "\n".join(lines)


def _static_lines(static: list[str] | None) -> list[str]:
    """The warning that arms with a zero gradient at every step are their warm start."""
    if not static:
        return []
    return [f"**No learning signal in {', '.join(static)}**: the gradient was zero at "
            "every step of every seed (each group's rewards were equal), so "
            + ("these arms are" if len(static) > 1 else "this arm is") + " the warm start "
            "itself and every verdict involving them compares a policy with its own "
            "starting point; train longer or on a task where the warm start earns some "
            "reward (a larger preset).", ""]


def _setup_lines(cfg, head, data: dict[str, Any] | None) -> list[str]:
    """The policy, warm start, RL settings and arms, your data, and how evaluation is done."""
    N = cfg.eval_budget
    seeds = max(len(h["seeds"]) for h in head.values())
    sft = f"SFT, {cfg.sft_steps} steps on a mixture of m in {cfg.all_answers} prompts"
    start = (f"{cfg.init}, with {sft} when fewer than {cfg.parse_floor:.0%} of its answers "
             "parsed" if cfg.init else sft)
    lora = f", LoRA rank {cfg.lora_rank}" if cfg.lora_rank else ""
    return [f"Policy `{cfg.init or cfg.model}`{lora}; one warm start "
            f"for every arm ({start}); "
            f"{cfg.train.steps} RL steps x {cfg.train.batch_size} prompts x G = "
            f"{cfg.sampler.num_samples} samples, lr {cfg.train.learning_rate:g}, seeds "
            f"{cfg.seeds}. Arms: " + "; ".join(_arm_text(a, cfg) for a in cfg.arm_names) + ".",
            "", *compare_data.report_lines(data, cfg),
            f"Evaluation: {cfg.eval_problems} held-out problems (seed {cfg.eval_seed}), N = {N} "
            f"candidates per problem for every policy (N/m generations of m answers) at "
            f"temperature {cfg.eval_temperature:g}; every parsed answer is a scored candidate "
            "for every policy (repeats inside a generation are not zeroed). Seed i of every "
            "row (the warm-start rows too) is evaluated with the same key, so rows pair by "
            "seed. Cells: mean "
            + ("± half-width of a 95% Student-t interval over seeds" if seeds > 1 else
               "(one seed)")
            + f"; a cell backed by fewer than {claims.MIN_UNITS} independent units shows the "
            "mean alone.", ""]


def _headline_metrics(cfg, head, families) -> list[str]:
    """The headline table's columns: the usual metrics, a primary claim's own k, those present."""
    N = cfg.eval_budget
    metrics = ["best@1", "pass@1", f"best@{N}", f"pass@{N}", f"cover@{N}", "diversity", "distinct",
               "valid_fraction", "entropy", "train entropy", "train diversity", "search solved"]
    claimed = [verdicts.metric_key(c["key"], N) for c in families[PRIMARY[0]] if "key" in c]
    metrics[2:2] = [k for k in dict.fromkeys(claimed) if k not in metrics]  # a claim's own k
    return [k for k in metrics if any(k in h["values"] for h in head.values())]


def _headline_lines(cfg, head, families, searches) -> list[str]:
    """The headline table, a row per policy, and what each of its columns means."""
    metrics = _headline_metrics(cfg, head, families)
    lines = ["| policy | m | seeds | " + " | ".join(metrics) + " |",
             "|---|---|---|" + "---|" * len(metrics)]
    for name, h in head.items():
        cells = [fmt(h["values"][k]) if k in h["values"] else "" for k in metrics]
        if (name.startswith("sft") and searches is not None and "search solved" in metrics
                and not searches.get("per_seed_keys")):
            # one policy searched with the shared keys: its interval is over the searches
            cells[metrics.index("search solved")] = fmt(_per_search(searches, name))
        lines.append(f"| {name} | {h['m']} | {len(h['seeds'])} | " + " | ".join(cells) + " |")
    return lines + ["", "best@k: mean over problems of the best w*ᵀr among k candidates (partial "
                    "credit); pass@k, beside it: unbiased probability that k candidates contain a "
                    "solution (solving), so a best@k gain without a pass@k gain is closer "
                    "answers, not more problems solved; diversity: mean "
                    "pairwise L1 distance of valid candidates' reward vectors; distinct: distinct "
                    "valid answers; valid_fraction: candidates that parse; train entropy / "
                    "diversity: last 20% of training steps; search solved: hard problems solved, "
                    f"mean over {cfg.search_seeds} searches (warm-start rows: interval over those "
                    "searches, one policy). The warm-start rows are the one SFT policy answering "
                    "in each m.", ""]


def _claims_lines(families) -> list[str]:
    """How a claim is judged, then the primary claims and the papers' claims."""
    level = f"{100 * claims.LEVEL:g}%"
    lines = ["## Claims", "",
             "Each claim is a paired difference over seeds, rows matched by seed id (same warm "
             "start, same problems, same evaluation keys), judged one-sided in the claimed "
             f"direction at {level} (each tail of a 95% interval) with p the larger of the "
             "paired Student-t test's and the exact sign-flip randomization test's over the "
             "seeds (Fisher 1935), so p is never below 2^-n with n seeds: **reproduced** "
             f"when p < {level} in the claimed direction, **refuted** when p < {level} the "
             "other way, **inconclusive** otherwise (ties, saturated values, and fewer than "
             f"{claims.min_seeds()} seeds, where even 2^-n is not below {level}). Each family "
             "is then Holm-corrected in both directions and the bold verdict is the corrected "
             "one. Token-entropy and training-diversity claims compare arms with the same m "
             "only.", "",
             "### Primary claims", ""]
    lines += _family_lines(families[PRIMARY[0]], PRIMARY[1], label="primary")
    lines += ["", "### The papers' claims (exploratory)", ""]
    if families["claims"]:
        return lines + _family_lines(families["claims"], FAMILIES[0][1])
    return lines + ["(no claim applies to these arms)"]


def _warm_start_lines(families, searches) -> list[str]:
    """Each RL arm against its warm start (and the warm start's search), when compared."""
    warm = families["against_warm_start"]
    if not warm:
        return []
    lines = ["", "## RL against its warm start (exploratory)", "",
             "Each arm against the warm start's stronger mode on the metric (the better of "
             "its single-answer and m-answer pools, named in each line), paired by seed id "
             "(the warm start evaluated, and searched, with each seed's keys)."
             + ("" if searches is None or searches.get("per_seed_keys") else
                " This run searched the warm start with one set of keys for every seed, "
                "so its search is not compared here."), ""]
    lines += _family_lines(warm, FAMILIES[1][1])
    if families.get("warm_search"):
        lines += [""] + _family_lines(families["warm_search"], FAMILIES[6][1])
    return lines


def _trend_lines(families, per_answer_reward: bool) -> list[str]:
    """Whether each per-step training metric rose over training, when trends were kept."""
    if not families.get(TRENDS[0]):
        return []
    lines = ["", "## Trends over training (exploratory)", "",
             "Does a per-step training metric (reward: w*ᵀr "
             + ("per answer slot, the mean over the m answers" if per_answer_reward else
                "summed over the m answers") + "; "
             "token entropy; reward-space diversity of the group) rise over training? Per "
             "run, Kendall's τ against the step over every logged step; across the seeds, "
             "the exact sign test of the τ's signs (the runs are the units, so it cannot "
             "go below 2^-n with n seeds). **reproduced**: rose; **refuted**: fell.", ""]
    return lines + _family_lines(families[TRENDS[0]], TRENDS[1])


def _law_lines(cfg, laws) -> list[str]:
    """The entropy law's fits on held-out score against the three simpler models, per arm."""
    if not laws:
        return []
    lines = ["", "## Entropy law on held-out score (exploratory)", "",
             f"Per run, R = held-out score (best@1 on {cfg.law_problems} problems of seed "
             f"{cfg.eval_seed + 1}, {cfg.law_budget} candidates each, T = "
             f"{cfg.eval_temperature:g}, same key at every point) at step 0 and at "
             f"{cfg.law_points} checkpoints, H = training token entropy of the 10 steps "
             "before each. Four models are fitted on the early half of each seed's points "
             "and scored by RMSE on the later half; a, b and R² are the law's fit on all "
             "points. Mean ± 95% interval over seeds.", "",
             "| arm | a | b | R² | RMSE law | RMSE linear in H | RMSE trend in steps | "
             "RMSE constant |", "|---|---|---|---|---|---|---|---|"]
    for arm, t in laws.items():
        lines.append(f"| {arm} | {fmt(t['a'])} | {fmt(t['b'])} | {fmt(t['r2'])} | "
                     + " | ".join(fmt(t["rmse"][k]) for k in entropy_law.MODELS) + " |")
    return lines


def _figure_lines(laws, searches, temperatures: bool = False) -> list[str]:
    """The report's PNGs: evaluation, training, the entropy law, the search and the temperature
    sweep, as present."""
    lines = ["", "## Figures", "", "![best@k](best_at_k.png) ![pass@k](pass_at_k.png)", "",
             "![training](training.png)", ""]
    if laws:
        lines += ["![entropy law](entropy_law.png)", ""]
    if searches and search_report.has_curves(searches):
        lines += ["![budget curves](budget_curves.png)", "", "![bridge](bridge.png)", ""]
    elif searches:
        lines += ["![search](search_solved.png)", ""]
    if searches and temperatures:
        lines += [f"![temperature]({temperature_report.FIGURE})", ""]
    return lines


def _wall_lines(wall: dict[str, float], load: str) -> list[str]:
    """Seconds per stage, the machine's load, and where the per-run files are."""
    lines = ["## Wall time", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in wall.items()]
    if load:
        lines += ["", f"Machine: {load}"]
    return lines + ["", "Per-run metrics: `arms/<arm>/seed<k>/metrics.jsonl` (and TensorBoard "
                    "under `tb/`); the warm start: `sft/`; all numbers: `summary.json`.", ""]


def _search_text(cfg, searches, head, bon: list[dict[str, Any]],
                 checkpoints: list[dict[str, Any]] = ()) -> list[str]:
    P, S = len(searches["problems"]), searches["seeds"]
    chosen = (f"The {P} problems of split {searches['split_seed']} (of {searches['pool']}, "
              "which no arm is trained, evaluated or chosen on) that the warm start found "
              f"hardest (solved fraction {np.mean(searches['warm_start_solved']):.2f} at "
              f"pass@{cfg.eval_budget} over its m modes, pool mean "
              f"{searches['pool_solved_mean']:.2f}). ")
    if searches.get("per_seed_keys"):
        how = (f"Each policy is the mutation operator of {S} island search"
               f"{'es' if S > 1 else ''} per problem and training seed, up to "
               f"{searches['max_budget']} candidates each; seed i of "
               "every row searches with the same keys (the warm start's rows too, so its "
               "searches vary as the arms' do). Problems and budget were fixed before RL; the "
               f"claims read the solved count at the calibrated budget, {searches['budget']} "
               "candidates. Because the problems are chosen as hard for the warm start, warm "
               "start vs RL comparisons on them lean against the warm start; arm vs arm "
               "comparisons do not.")
    else:
        how = (f"Each policy is the mutation operator of {S} island searches per problem, "
               f"{searches['budget']} candidates each, the same search keys for every policy. "
               "Because the problems are chosen as hard for the warm start, warm start vs RL "
               "comparisons on them lean against the warm start; arm vs arm comparisons do "
               "not.")
    lines = ["", "## Search", "", chosen + how, "",
             "Solve matrix: the fraction of (policy seed, search) runs that solve each problem"
             + (" at the calibrated budget." if searches.get("per_seed_keys") else "."),
             "", "| policy | " + " | ".join(f"p{i}" for i in searches["problems"]) + " | solved "
             "(mean ± 95%) |", "|---|" + "---|" * (P + 1)]
    for name, rows in searches["rows"].items():
        rate = np.mean([np.mean(r["solved_SP"], axis=0) for r in rows], axis=0)
        one_key_set = name.startswith("sft") and not searches.get("per_seed_keys")
        per = (_per_search(searches, name) if one_key_set
               else head[name]["values"]["search solved"])
        lines.append(f"| {name} | " + " | ".join(f"{x:.2f}" for x in rate) + f" | {fmt(per)} |")
    arms = [a for a in searches["rows"] if not a.startswith("sft")]
    only = []
    for a in arms:
        for b in arms:
            if a < b:
                sa = np.any([np.any(r["solved_SP"], axis=0) for r in searches["rows"][a]], 0)
                sb = np.any([np.any(r["solved_SP"], axis=0) for r in searches["rows"][b]], 0)
                only.append(f"{a} {int(np.sum(sa & ~sb))} vs {b} {int(np.sum(sb & ~sa))}")
    if only:
        lines += ["", "Problems solved in some run of one arm and in none of the other's: "
                  + "; ".join(only) + "."]
    if bon:
        lines += ["", "Island search against best-of-N (independent samples from the plain "
                  "prompt) with the same policy, budget and keys: problems solved, mean over "
                  "searches, paired by training seed (does the search add anything to "
                  "sampling?).", ""]
        lines += _family_lines(bon, FAMILIES[2][1])
    if checkpoints:
        lines += ["", "The same for the warm start: one checkpoint per m, so these pair over its "
                  "searches (the shared search keys) and are statements about that checkpoint, "
                  "not about training; a family of their own.", ""]
        lines += _family_lines(checkpoints, CHECKPOINTS[1])
    return lines


def _curves_text(cfg, searches, head, families) -> list[str]:
    """Budget curves (table, gap claims) and the bridge from training to search, opened by the
    paragraph that answers the comparison's question with its numbers."""
    P = len(searches["problems"])
    lines = ["", "## Does search track what training keeps? (the question)", "",
             _answer(cfg, searches, head, families), "",
             "### Budget curves", "",
             f"Solved fraction of the {P} search problems against the candidate budget, for "
             "every search method and policy (mean over training seeds and their searches); "
             "every method spends the same candidates at each point, with the same keys.", ""]
    lines += search_report.budget_table(searches)
    lines += ["", "### Solve sets", "", "The problems each policy's island search solved at "
              "the calibrated budget in any of its training seeds, compared both ways (a "
              "count of solved problems can rise by a higher rate on shared problems or by "
              "problems the other never solves):", ""]
    lines += search_report.solve_sets(searches)
    if families.get("budget"):
        lines += ["", "Does the VPO - GRPO gap grow with the budget? Per seed, the gap at the "
                  "largest budget minus the gap at the smallest, and the gap at the largest "
                  "(both must hold):", ""]
        lines += _family_lines(families["budget"], FAMILIES[4][1])
    if families.get("bridge"):
        lines += ["", "### The bridge: search against what training kept", "",
                  "Each RL run (arm x seed) is a unit: its end-of-training token entropy and "
                  "reward-space diversity (mean of the last 20% of steps) against its search "
                  "solve count at the calibrated budget. Across arms the runs differ in "
                  "objective (and m) too, so the pooled line is descriptive; the within-arm "
                  "lines hold the objective fixed, the stratified line (arms as blocks, runs "
                  "exchanged only inside their arm) is the direct test, and its version given "
                  "held-out pass@k tells diversity apart from competence.", ""]
        lines += _family_lines(families["bridge"], FAMILIES[5][1])
    return lines


def _answer(cfg, searches, head, families) -> str:
    """One paragraph with numbers: search success against training entropy / diversity across
    runs, and VPO's search against GRPO's and the warm start's."""
    P, B = len(searches["problems"]), searches["budget"]
    parts = []
    pooled = [c for c in families.get("bridge", []) if c["claim"].startswith("across")]
    for c in pooled:
        what = "entropy" if "entropy" in c["claim"] else "diversity"
        parts.append(f"with end-of-training {what} ρ = {c['rho']:+.2f} "
                     f"(p {c['p']:.2g}, {c['family_verdict']} after Holm)")
    text = ""
    if pooled:
        text += (f"Across the {pooled[0]['n']} RL runs, the search solve rate's rank "
                 "correlation " + " and ".join(parts) + ". ")
    means = {r: float(np.mean(head[r]["values"]["search solved"])) for r in head
             if "search solved" in head[r]["values"]}
    if means:
        text += (f"At the calibrated budget ({B} candidates per problem), the island search "
                 "solves on average " + ", ".join(f"{v:.1f} of {P} with {r}"
                                                  for r, v in means.items()) + ". ")
    curves = search_report.budget_curves(searches).get("search", {})
    if curves:
        rise = {r: c[1][-1] - c[1][0] for r, c in curves.items()}
        budgets = next(iter(curves.values()))[0]
        text += (f"From {budgets[0]} to {budgets[-1]} candidates its solved fraction rises by "
                 + ", ".join(f"{v:+.3f} ({r})" for r, v in rise.items()) + ". ")
    prim = [c for c in families.get(PRIMARY[0], []) if c.get("key", "").endswith(":search")]
    for c in prim:
        text += (f"Primary claim `{c['key']}`: **{c['family_verdict']}** ({c['evidence']}).")
    return text.strip()


def _per_answer(train) -> bool:
    """Whether the runs logged `reward` per answer slot (with `set_reward` beside it for m > 1)
    rather than as the set's sum, as runs before that scale did: told by any run's first row
    holding `set_reward`."""
    return any("set_reward" in row for rs in (train or {}).values() for r in rs
               for row in r["metrics"][:1])


def _probe_text(cfg, head, probes, fixes) -> list[str]:
    lines = ["", "## The policy as mutation operator", "",
             "`policy_eval.mutation_probe` on the search's hard problems: the task's weaker "
             "parents of good answers in the search's mutation prompt, "
             f"{cfg.probe_samples} generations per problem, the children scored as the search "
             "scores them. Fractions of "
             "child slots: valid (well-formed, new in its generation), improve (beats the best "
             "parent), copy (repeats a parent), distinct (distinct valid children / slots), solved "
             "(solves the problem); "
             "child fitness: mean w*ᵀr per slot. The plain-prompt valid fraction from the "
             "evaluation, for comparison. Mean ± 95% interval over seeds (the warm start: "
             "one policy, one measurement).",
             "", "| policy | " + " | ".join(PROBE_KEYS) + " | valid (plain prompt) |",
             "|---|" + "---|" * (len(PROBE_KEYS) + 1)]
    for name, rows in probes.items():
        v = head[name]["values"]
        one = name.startswith("sft")  # one policy, one key: a single measurement
        lines.append(f"| {name} | " + " | ".join(f"{rows[0][k]:.3f}" if one else
                                                 fmt([r[k] for r in rows]) for k in PROBE_KEYS)
                     + f" | {fmt(v['valid_fraction'])} |")
    if fixes:
        lines += ["", "Mutation prompts in RL (`train.mutation_fraction`), paired by seed id:",
                  ""]
        lines += _family_lines(fixes, FAMILIES[3][1])
    return lines


def _arm_text(arm: str, cfg: CompareConfig) -> str:
    m = cfg.arm_answers(arm)
    text = {"grpo": "**grpo** = GRPO, 1 answer per generation, scalar reward w*ᵀr (the paper's "
                    "GRPO baseline)",
            "maxk": "**maxk** = Max@K (m=1; k = max(2, G/2), std-normalised)",
            "rw_grpo": "**rw_grpo** = random-weight GRPO (m=1; a fresh Dirichlet weight, GRPO "
                       "on wᵀr)",
            "passk": "**passk** = pass@k training (m=1; analytic advantages)",
            "multi_rlvr": f"**multi_rlvr** = GRPO on {m} answers per generation with the summed "
                          "scalar Σ_j w*ᵀr_j (Multi-RLVR)",
            "vpo": f"**vpo** = VPO, {m} answers per generation, E_w~Dir({cfg.objective.alpha:g})"
                   f"[max_j wᵀr_j] with K = {cfg.objective.num_weights}",
            "clip_cov": "**clip_cov** = GRPO (m=1) with Clip-Cov",
            "kl_cov": "**kl_cov** = GRPO (m=1) with KL-Cov",
            "gppo": "**gppo** = GRPO (m=1) with GPPO's gradient-preserving clipping",
            "entropy_mask": "**entropy_mask** = GRPO (m=1), gradient on the top-20% entropy "
                            "tokens only"}
    if arm.endswith("_mut"):
        base = arm.removesuffix("_mut")
        return (f"**{arm}** = {base} with mutation prompts in RL (train.mutation_fraction = "
                f"{_mut_fraction(arm):g})")
    return text[arm]


def _mut_fraction(arm: str) -> float:

    return ARMS[arm].train.get("mutation_fraction", 0.0)


def machine_load() -> str:
    """CPU count and 1-minute load average, for the report (timings depend on both)."""
    try:
        load = f", load average {os.getloadavg()[0]:.2f}"
    except OSError:
        load = ""
    return f"{os.cpu_count()} CPUs{load}, JAX backend {jax.default_backend()}"
