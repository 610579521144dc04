"""Three-way verdicts on the claims `vpo compare` checks: paired differences over seeds.

Seeds are paired: seed i of every arm starts from the same warm start, trains on the same problem
order and is evaluated with the same keys, so a claim "arm A beats arm B on metric X" is judged
on the per-seed differences d_i = X_A,i - X_B,i through a 95% Student-t interval

    mean(d) ± t_{0.975, n-1} · s_d / √n        (s_d the unbiased std, n seeds)

and comes out

    reproduced    the interval excludes 0 on the claimed side,
    refuted       it excludes 0 on the other side,
    inconclusive  otherwise: 0 inside the interval, fewer than 2 seeds, or a tie (every
                  |d_i| <= TIE, e.g. 0.000 vs 0.000 at saturation, or |mean d| <= TIE).

Each claim also carries its one-sided p-value in the claimed direction (reproduced iff
p < 0.025, the interval's own level), and `holm` adjusts a list of claims for multiplicity
(Holm 1979, step-down): a report that judges 26 claims at 95% each expects about one false
"reproduced" among true nulls, so it says which reproduced claims survive the family-wise
correction at the same 2.5% one-sided level.

Everything here is pure (lists of floats in, dicts out) so the verdict logic is tested on
synthetic summaries (tests/test_claims.py) without training anything. `check` turns a
`vpo compare` headline (per-row, per-seed values) into the claim list of the report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vpo.eval import entropy_law

TIE = 5e-4  # differences below the report's precision are ties
REPRODUCED, REFUTED, INCONCLUSIVE = "reproduced", "refuted", "inconclusive"
# single-answer scalar-reward baselines and Multi-RLVR, in report order
BASELINES = ("grpo", "maxk", "rw_grpo", "passk", "multi_rlvr")
ENTROPY_CONTROLS = ("clip_cov", "kl_cov", "entropy_mask")


def t_interval(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of a 95% Student-t interval, t_{0.975,n-1}·s/√n; NaN half-width for
    fewer than 2 values."""
    from scipy import stats

    x = np.asarray(values, float)
    if x.size < 2:
        return float(x.mean()) if x.size else float("nan"), float("nan")
    return float(x.mean()), float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1)
                                  / math.sqrt(x.size))


def verdict(diffs: Sequence[float], *, higher: bool = True, tie: float = TIE) -> str:
    """Three-way verdict on paired differences d_i (claimed: d > 0 if `higher`, else d < 0)."""
    d = np.asarray(diffs, float)
    if d.size < 2 or not np.all(np.isfinite(d)):
        return INCONCLUSIVE
    mean, half = t_interval(d)
    if np.all(np.abs(d) <= tie) or abs(mean) <= tie:
        return INCONCLUSIVE
    sign = 1.0 if higher else -1.0
    if sign * mean - half > 0:
        return REPRODUCED
    if sign * mean + half < 0:
        return REFUTED
    return INCONCLUSIVE


def p_value(diffs: Sequence[float], *, higher: bool = True, tie: float = TIE) -> float:
    """One-sided p-value of the paired t-test in the claimed direction: P(T_{n-1} >= t),
    t = ±mean(d) / (s_d/√n); 1 for fewer than 2 seeds, non-finite values or a tie; 0 or 1 when
    every d_i is equal (s_d = 0) on the claimed or the other side."""
    from scipy import stats

    d = np.asarray(diffs, float)
    if d.size < 2 or not np.all(np.isfinite(d)) or np.all(np.abs(d) <= tie) \
            or abs(d.mean()) <= tie:
        return 1.0
    sd = d.std(ddof=1)
    m = d.mean() if higher else -d.mean()
    if sd == 0:
        return 0.0 if m > 0 else 1.0
    return float(stats.t.sf(m / (sd / math.sqrt(d.size)), d.size - 1))


def holm(claims: Sequence[dict[str, Any]], *, level: float = 0.025) -> list[dict[str, Any]]:
    """The claims with "holm_p" (Holm's step-down adjusted p over the whole list: the i-th
    smallest p times (C - i), made monotone, capped at 1) and "survives_holm" (reproduced and
    holm_p < level; `level` = the one-sided level of each claim's 95% interval)."""
    order = sorted(range(len(claims)), key=lambda i: claims[i]["p"])
    adjusted, running = [0.0] * len(claims), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, claims[i]["p"] * (len(claims) - rank)))
        adjusted[i] = running
    return [{**c, "holm_p": q, "survives_holm": c["verdict"] == REPRODUCED and q < level}
            for c, q in zip(claims, adjusted, strict=True)]


def _fmt(diffs: Sequence[float]) -> str:
    mean, half = t_interval(diffs)
    return f"{mean:+.3f}" if math.isnan(half) else f"{mean:+.3f} ± {half:.3f}"


def _claim(text: str, result: str, diffs: Sequence[float], evidence: str, p: float
           ) -> dict[str, Any]:
    mean, half = t_interval(diffs)
    return {"claim": text, "verdict": result, "holds": result == REPRODUCED,
            "diff": mean, "half_width": half, "n": len(diffs), "p": p, "evidence": evidence}


def compare_values(text: str, a: Sequence[float], b: Sequence[float], *, names=("A", "B"),
                   higher: bool = True) -> dict[str, Any]:
    """Claim "a > b" (or "a < b" with higher=False) on seed-paired values."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.shape != b.shape:
        raise ValueError(f"{text}: seeds are not paired ({a.size} vs {b.size} values)")
    d = a - b
    ev = (f"{names[0]} - {names[1]} = {_fmt(d)} over {d.size} paired seeds "
          f"({np.mean(a):.3f} vs {np.mean(b):.3f})")
    return _claim(text, verdict(d, higher=higher), d.tolist(), ev, p_value(d, higher=higher))


def gap_grows(text: str, a_SK, b_SK, ks: Sequence[int], *, names=("A", "B")
              ) -> dict[str, Any]:
    """Claim "the gap a - b grows with k and is positive at the largest k": reproduced iff the
    growth gap(k_max) - gap(k_1) and the gap at k_max are both reproduced (> 0); refuted iff
    either excludes 0 on the wrong side; inconclusive otherwise. a_SK, b_SK: [seed, k]. Its
    p-value is the larger of the two (an intersection-union test: both must hold)."""
    gap = np.asarray(a_SK, float) - np.asarray(b_SK, float)
    if gap.ndim != 2 or gap.shape[1] != len(ks):
        raise ValueError(f"{text}: want [seed, k] arrays with {len(ks)} k values; got "
                         f"{gap.shape}")
    growth, last = gap[:, -1] - gap[:, 0], gap[:, -1]
    both = (verdict(growth), verdict(last))
    result = (REPRODUCED if both == (REPRODUCED, REPRODUCED)
              else REFUTED if REFUTED in both else INCONCLUSIVE)
    curve = ", ".join(f"k={k}: {g:+.3f}" for k, g in zip(ks, gap.mean(0), strict=True))
    ev = (f"{names[0]} - {names[1]} by k: {curve}; growth k={ks[0]}->{ks[-1]} {_fmt(growth)} "
          f"({both[0]}), gap at k={ks[-1]} {_fmt(last)} ({both[1]})")
    return _claim(text, result, growth.tolist(), ev, max(p_value(growth), p_value(last)))


def entropy_law_claim(text: str, trajectories: Sequence[Mapping[str, Sequence[float]]],
                      *, fit_frac: float = 0.5) -> dict[str, Any]:
    """Claim "R = -a·exp(H) + b predicts held-out evaluation score better than the
    alternatives": per seed, every model is fitted on the first `fit_frac` of the trajectory's
    points {"step", "entropy", "score"} and scored by RMSE on the rest
    (`entropy_law.heldout_fits`); d_i = RMSE(law) - min(RMSE linear in H, RMSE trend in steps,
    RMSE constant). Reproduced iff d < 0 (interval), the law's a > 0 in every seed's full fit
    and its held-out residuals are unbiased (the interval of the per-seed mean residual holds
    0: a different concave curve, e.g. R = sqrt(1 - H), can beat the alternatives while
    missing the later points systematically); refuted iff d > 0."""
    fits = [entropy_law.heldout_fits(t["step"], t["entropy"], t["score"], fit_frac=fit_frac)
            for t in trajectories]
    d = [f["rmse"]["law"] - min(f["rmse"][k] for k in ("linear_h", "trend", "constant"))
         for f in fits]
    bias = [f["bias"]["law"] for f in fits]
    bias_mean, bias_half = t_interval(bias)
    unbiased = abs(bias_mean) <= TIE or not abs(bias_mean) > bias_half
    result, p = verdict(d, higher=False), p_value(d, higher=False)
    if result == REPRODUCED and not (unbiased and all(f["a"] > 0 for f in fits)):
        result, p = INCONCLUSIVE, 1.0  # the side conditions fail: not a finding at any level
    mean = {k: float(np.mean([f["rmse"][k] for f in fits])) for k in entropy_law.MODELS}
    ev = (f"held-out RMSE law {mean['law']:.4f}, linear in H {mean['linear_h']:.4f}, trend in "
          f"steps {mean['trend']:.4f}, constant {mean['constant']:.4f} (mean of {len(fits)} "
          f"seeds); law - best alternative {_fmt(d)}; law's held-out bias {_fmt(bias)}; a = "
          + ", ".join(f"{f['a']:.3f}" for f in fits))
    return _claim(text, result, d, ev, p)


def _values(head, row: str, metric: str) -> list[float] | None:
    v = head.get(row, {}).get("values", {}).get(metric)
    return None if v is None else list(v)


def check(head: Mapping[str, Any], ks: Sequence[int], *, law=None, search=None
          ) -> list[dict[str, Any]]:
    """The claims of the VPO and entropy papers on a `vpo compare` headline.

    head: {row: {"m": answers per generation, "values": {metric: [value per seed]}}} with
      metrics "best@k" for every k in `ks`, "diversity" (eval candidates), "train entropy",
      "train diversity" and optionally "search solved"; seeds in the same order in every row.
    law: {arm: [{"step", "entropy", "score"} per seed]} (held-out evaluation score over
      training); search: the output of `search_claim_inputs` (per-row solved counts per seed).
    Token-entropy and training-diversity claims compare arms with the same m only (token counts
    and group pool sizes differ with m). Claims whose arms did not run are left out. The list
    is Holm-adjusted as one family (`holm`).
    """
    N = ks[-1]
    out: list[dict[str, Any]] = []
    if "vpo" in head:
        mv = head["vpo"]["m"]
        for base in (b for b in BASELINES if b in head):
            names = ("vpo", base)
            out.append(compare_values(f"VPO best@{N} > {base} best@{N} (equal candidate "
                                      "budget)", _values(head, "vpo", f"best@{N}"),
                                      _values(head, base, f"best@{N}"), names=names))
            a = [_values(head, "vpo", f"best@{k}") for k in ks]
            b = [_values(head, base, f"best@{k}") for k in ks]
            out.append(gap_grows(f"the best@k gap VPO - {base} grows with k and is positive at "
                                 f"k={N}", np.transpose(a), np.transpose(b), ks, names=names))
            out.append(compare_values(f"VPO's eval candidates have higher reward-space "
                                      f"diversity than {base}'s",
                                      _values(head, "vpo", "diversity"),
                                      _values(head, base, "diversity"), names=names))
            if head[base]["m"] == mv:
                for metric, what in (("train entropy", "token entropy"),
                                     ("train diversity", "reward-space diversity")):
                    a, b = _values(head, "vpo", metric), _values(head, base, metric)
                    if a is not None and b is not None:
                        out.append(compare_values(
                            f"VPO keeps higher {what} of training rollouts (last 20% of steps) "
                            f"than {base} (both m={mv})", a, b, names=names))
            if search is not None and "vpo" in search and base in search:
                out.append(compare_values(
                    f"in search at equal budget, VPO's policy solves more of the hard problems "
                    f"than {base}'s", search["vpo"], search[base], names=names))
    for arm in (a for a in ENTROPY_CONTROLS if a in head):
        if "grpo" in head and head["grpo"]["m"] == head[arm]["m"]:
            a, b = _values(head, arm, "train entropy"), _values(head, "grpo", "train entropy")
            if a is not None and b is not None:
                out.append(compare_values(f"{arm} keeps token entropy of training rollouts "
                                          "above plain GRPO (last 20% of steps)", a, b,
                                          names=(arm, "grpo")))
    if law and "grpo" in law:
        out.append(entropy_law_claim(
            "the entropy law R = -a·exp(H) + b predicts GRPO's held-out evaluation score from "
            "training entropy better than a linear-in-H fit, a trend in steps and a constant "
            "(fit on the early half, judged on the later half)", law["grpo"]))
    return holm(out)


def search_claim_inputs(solved_RSX: Mapping[str, Any]) -> dict[str, list[float]]:
    """Per row, the number of hard problems solved per training seed, averaged over search
    seeds: solved_RSX[row] is bool [training seed, search seed, problem] → {row: [per seed]}."""
    return {row: np.asarray(x, float).sum(-1).mean(-1).tolist()
            for row, x in solved_RSX.items()}
