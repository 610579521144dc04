"""The numbers of the `vpo compare` report: the headline (per row, each metric's value per
seed), the entropy law's held-out fits, the trends over training, and every family of verdicts
the report prints (the pre-registered primary claims, then the exploratory ones), each
Holm-corrected as a family in both directions (`verdict_families`). Pure functions of what the
stages produced, or of the summary.json that holds it; no text, no figures.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vpo.compare import search_report, verdicts
from vpo.compare.config import CompareConfig
from vpo.eval import claims, entropy_law

TAIL_FRAC = 0.2  # "late training" = the last 20% of steps


def mean_ci(values) -> tuple[float, float]:
    """Mean and the half-width of a 95% Student-t interval over seeds, t_{0.975, n-1}·s/√n
    (s the unbiased std); half-width NaN for a single seed."""
    return claims.t_interval(values)


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
        per = {key.removesuffix("_P"): [r[key] for r in rows] for key in rows[0]
               if key.endswith("_P") and key.removesuffix("_P") in vals}
        if per:  # [seed][problem], for the claims paired over problems (`verdicts.PER_PROBLEM`)
            out[name]["per_problem"] = per
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


def static_arms(runs) -> list[str]:
    """RL arms whose every logged step of every seed had a zero gradient (every group's rewards
    equal: nothing to learn from), so the arm is its warm start."""
    return [arm for arm, rs in runs.items()
            if all(row.get("grad_norm", 1.0) == 0.0 for r in rs for row in r.metrics)]
