"""Three-way verdicts on the claims `vpo compare` checks: paired differences over seeds.

Seeds are paired: seed i of every arm starts from the same warm start, trains on the same problem
order and is evaluated with the same keys, so a claim "arm A beats arm B on metric X" is judged
on the per-seed differences d_i = X_A,i - X_B,i, the rows matched by seed id (`pair_by_seed`;
different seed lists are an error, never a positional guess). Two tests, one level:

  * the paired Student-t test and its 95% interval

        mean(d) ± t_{0.975, n-1} · s_d / √n        (s_d the unbiased std, n seeds);

  * Fisher's randomization (sign-flip) test (Fisher 1935, The Design of Experiments, ch. III;
    Pitman 1937; Good 2005, Permutation, Parametric and Bootstrap Tests of Hypotheses, 3rd ed.):
    under "A and B are exchangeable within a seed" every sign pattern ε ∈ {±1}^n of the d_i is
    equally likely, so the one-sided p in the claimed direction is

        p_exact = #{ε : Σ ε_i d_i >= Σ d_i} / 2^n,

    enumerated for n <= MAX_EXACT and estimated from MC_DRAWS fixed-seed draws beyond that as
    (1 + #{draws >= observed}) / (MC_DRAWS + 1) (Phipson & Smyth 2010). It needs no normality,
    and it cannot go below 2^-n: 0.25 for 2 seeds, 0.125 for 3, 0.031 for 5, 0.016 for 6.

Sidedness. A claim is directional ("A beats B") and its verdict three-way, so each side is a
one-sided test at LEVEL = 2.5%, the level of each tail of the 95% two-sided interval:

    reproduced    p (claimed side) < LEVEL,
    refuted       p (other side)   < LEVEL,
    inconclusive  otherwise: neither side, fewer than 2 seeds, a tie (every |d_i| <= TIE, e.g.
                  0.000 vs 0.000 at saturation, or |mean d| <= TIE), or too few seeds for the
                  exact test to reach LEVEL at all (2^-n >= LEVEL, i.e. n <= 5: noted).

A claim's p is the larger of the t-test's and the exact test's (`p_value`): the verdict then
needs the interval to exclude 0 *and* the distribution-free test to agree, and it stays valid
under the randomization null alone, since P(max(p_t, p_exact) <= a) <= P(p_exact <= a) <= a.
With 3 to 5 seeds the t-test alone rests on normality nobody can check and gives p = 0 to a
difference with zero spread (`[1, 1]` vs `[0, 0]`); the exact floor keeps such a claim at 0.25.

`holm` adjusts a family of claims for multiplicity (Holm 1979, step-down) in both directions:
each claim enters with the one-sided p of the side its data lean to, min(p, p_other), so a
"refuted" verdict is corrected exactly as a "reproduced" one is; a verdict survives when that
adjusted p is below LEVEL and its family verdict ("family_verdict") is inconclusive otherwise.
Over C claims and n seeds the smallest adjusted p is C · 2^-n (26 claims need 11 seeds).

`design` states what a design can decide before it runs: with n paired training seeds and a
primary family of C claims, the smallest Holm-adjusted p is C · 2^-n, so it can decide at
LEVEL iff C · 2^-n < LEVEL: 6 seeds for one claim, 7 for two or three (3 · 2^-7 = 0.023), 8
for three with one seed allowed to point the other way (`seeds_needed`). `PRIMARY_CLAIMS` are
the claims a config may pre-register as its primary family (`primary_claims` judges them).

`in_every_seed` judges a claim about the checkpoints of every seed ("GRPO's policy hits more
held-out problems than its warm start in each training seed"): per seed, the same two tests over
the paired per-problem differences of that seed's checkpoint (a question about that checkpoint,
which the problems can decide with few seeds); across seeds an intersection-union test (Berger
1982, Statistical Science 3(3)): reproduced iff every seed's p < LEVEL, with p = max over seeds
and no correction; refuted iff some seed shows the other way, Bonferroni over the seeds.

`trend` judges a statement such as "training reward rose" over every logged step: per run,
Kendall's τ of the metric against the step and its one-sided p; across runs, the exact sign
test of the τ's signs (the runs are the units), so it never rests on two endpoints.

Everything here is pure (lists of floats in, dicts out) so the verdict logic is tested on
synthetic summaries (tests/eval/test_claims*.py) without training anything; the claims of a
`vpo compare` headline are built from them in `vpo.compare.verdicts`.
"""

# size: one job, the verdict rules: each test is a short pure function over lists of floats.

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vpo.eval import entropy_law

TIE = 5e-4  # differences below the report's precision are ties
MIN_UNITS = 3  # fewer independent units: a value is shown without an interval (1 df is no interval)
LEVEL = 0.025  # one-sided level of each side of a verdict (a tail of the 95% interval)
MAX_EXACT = 16  # sign flips enumerated up to 2^16 patterns; Monte Carlo beyond
MC_DRAWS = 20_000
MC_SEED = 0
REPRODUCED, REFUTED, INCONCLUSIVE = "reproduced", "refuted", "inconclusive"
ROSE, FELL, NO_TREND = "rose", "fell", "no trend shown"
# single-answer scalar-reward baselines and Multi-RLVR, in report order


def t_interval(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of a 95% Student-t interval, t_{0.975,n-1}·s/√n; NaN half-width for
    fewer than 2 values."""
    from scipy import stats

    x = np.asarray(values, float)
    if x.size < 2:
        return float(x.mean()) if x.size else float("nan"), float("nan")
    return float(x.mean()), float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1)
                                  / math.sqrt(x.size))


def smallest_p(n: int) -> float:
    """The smallest one-sided p the sign-flip test can give over n paired seeds: 2^-n (only the
    observed signs reach the observed sum); 1 for no seeds."""
    return 0.5 ** n if n > 0 else 1.0


def min_seeds(level: float = LEVEL) -> int:
    """The fewest paired seeds whose sign-flip test can reach `level`: min n with 2^-n < level."""
    return math.floor(math.log2(1.0 / level)) + 1


def seeds_needed(family_size: int = 1, level: float = LEVEL, discordant: int = 0) -> int:
    """The fewest paired seeds n at which a family of `family_size` claims can be decided under
    Holm at `level`: min n with C · 2^(discordant - n) < level, where `discordant` seeds may
    point the other way (the smallest |d_i|: the exact p is then at best 2^discordant / 2^n).
    6 for one claim, 7 for three, 8 for three with one discordant seed."""
    C = max(1, family_size)
    return max(1, math.floor(math.log2(C / level)) + 1 + discordant)


def design(num_seeds: int, family_size: int, level: float = LEVEL) -> dict[str, Any]:
    """What a design of `num_seeds` paired training seeds can decide about a primary family of
    `family_size` claims judged by the exact one-sided sign-flip test at `level` under Holm:
    {"seeds", "family_size", "level", "smallest_p" (2^-n), "smallest_holm_p" (C · 2^-n, the
    most significant claim's adjusted p when every seed agrees; capped at 1), "can_decide"
    (smallest_holm_p < level), "seeds_needed" (`seeds_needed`), "seeds_needed_one_discordant"
    (the same with one seed pointing the other way)}."""
    C = max(1, family_size)
    floor = min(1.0, C * smallest_p(num_seeds))
    return {"seeds": num_seeds, "family_size": family_size, "level": level,
            "smallest_p": smallest_p(num_seeds), "smallest_holm_p": floor,
            "can_decide": floor < level, "seeds_needed": seeds_needed(C, level),
            "seeds_needed_one_discordant": seeds_needed(C, level, discordant=1)}


def design_text(d: Mapping[str, Any]) -> str:
    """One sentence on a `design`: the smallest p and Holm-adjusted p its seeds allow and whether
    it can decide, or how many seeds it would need."""
    n, C = d["seeds"], d["family_size"]
    text = (f"with {n} paired seeds the smallest exact one-sided p is 2^-{n} = "
            f"{d['smallest_p']:.3g} and the smallest Holm-adjusted p over the {C} primary "
            f"claim{'s' if C != 1 else ''} is {C} × 2^-{n} = {d['smallest_holm_p']:.3g}")
    if d["can_decide"]:
        return (text + f" < {d['level']:g}: the design can decide its primary claims (if every "
                "seed agrees in direction: "
                f"{d['seeds_needed_one_discordant']} seeds allow one seed the other way)")
    return (text + f" >= {d['level']:g}: the design cannot decide its primary claims whatever "
            f"the effect; it needs at least {d['seeds_needed']} paired seeds "
            f"({d['seeds_needed_one_discordant']} to allow one seed the other way)")


def too_few_seeds(n: int, level: float = LEVEL) -> str:
    """Why no verdict but "inconclusive" is possible with n paired seeds ("" when one is)."""
    if smallest_p(n) < level:
        return ""
    return f"too few seeds: the smallest possible p with {n} paired seeds is {smallest_p(n):.3g}"


def _sign_patterns(n: int) -> np.ndarray:
    """All 2^n sign vectors ε ∈ {±1}^n as a float [2^n, n] array (row 0 all +1)."""
    bits = (np.arange(2 ** n)[:, None] >> np.arange(n)) & 1
    return 1.0 - 2.0 * bits


def sign_flip_p(diffs: Sequence[float], *, higher: bool = True, max_exact: int = MAX_EXACT,
                draws: int = MC_DRAWS, seed: int = MC_SEED) -> float:
    """One-sided p of Fisher's paired randomization test in the claimed direction (d > 0 if
    `higher`): p = #{ε ∈ {±1}^n : Σ ε_i d_i >= Σ d_i} / 2^n, exact for n <= max_exact, else
    (1 + #{b : Σ ε_bi d_i >= Σ d_i}) / (draws + 1) over `draws` sign vectors from a fixed
    `seed`. The mean and the t statistic give the same p: Σ d_i² is the same under every flip
    and t is increasing in Σ d_i at fixed Σ d_i². A d_i = 0 flips to itself, so with k nonzero
    d_i the smallest p is 2^-k. 1 for no values."""
    d_N = np.asarray(diffs, float) * (1.0 if higher else -1.0)
    n = d_N.size
    if n == 0:
        return 1.0
    observed = float(np.sum(d_N))
    tol = 1e-9 * max(1.0, float(np.sum(np.abs(d_N))))  # summation-order rounding
    if n <= max_exact:
        return float(np.mean(_sign_patterns(n) @ d_N >= observed - tol))
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(draws, n))
    return float((1 + np.sum(signs @ d_N >= observed - tol)) / (draws + 1))


def t_test_p(diffs: Sequence[float], *, higher: bool = True) -> float:
    """One-sided p of the paired t-test in the claimed direction: P(T_{n-1} >= t), t = ±mean(d)
    / (s_d/√n); 1 for fewer than 2 values; 0 or 1 when every d_i is equal (s_d = 0) on the
    claimed or the other side."""
    from scipy import stats

    d = np.asarray(diffs, float)
    if d.size < 2:
        return 1.0
    sd = d.std(ddof=1)
    m = d.mean() if higher else -d.mean()
    if sd == 0:
        return 0.0 if m > 0 else 1.0
    return float(stats.t.sf(m / (sd / math.sqrt(d.size)), d.size - 1))


def _is_tie(d: np.ndarray, tie: float) -> bool:
    return bool(np.all(np.abs(d) <= tie) or abs(d.mean()) <= tie)


def p_value(diffs: Sequence[float], *, higher: bool = True, tie: float = TIE) -> float:
    """A claim's one-sided p in the claimed direction: max(t-test p, sign-flip p), so never
    below 2^-n over n seeds (`sign_flip_p`, `t_test_p`; the module's docstring says why the
    larger); 1 for fewer than 2 seeds, non-finite values or a tie."""
    d = np.asarray(diffs, float)
    if d.size < 2 or not np.all(np.isfinite(d)) or _is_tie(d, tie):
        return 1.0
    return max(t_test_p(d, higher=higher), sign_flip_p(d, higher=higher))


def verdict(diffs: Sequence[float], *, higher: bool = True, tie: float = TIE,
            level: float = LEVEL) -> str:
    """Three-way verdict on paired differences d_i (claimed: d > 0 if `higher`, else d < 0):
    reproduced iff `p_value` on the claimed side < level, refuted iff it is < level on the other
    side. On the t side this is the 95% interval excluding 0; with n seeds and 2^-n >= level
    (`too_few_seeds`) it is always inconclusive."""
    if p_value(diffs, higher=higher, tie=tie) < level:
        return REPRODUCED
    if p_value(diffs, higher=not higher, tie=tie) < level:
        return REFUTED
    return INCONCLUSIVE


def _leaning_p(c: Mapping[str, Any]) -> float:
    """The one-sided p of the side a claim's data lean to: min(p, p_other) (p_other 1 when the
    claim has none)."""
    return min(c["p"], c.get("p_other", 1.0))


def holm(claims: Sequence[dict[str, Any]], *, level: float = LEVEL) -> list[dict[str, Any]]:
    """The claims with "holm_p" (Holm 1979, step-down adjusted p over the whole list, one
    family, in both directions: each claim's p is that of the side its data lean to,
    min(p, p_other); the i-th smallest times (C - i), made monotone, capped at 1),
    "survives_holm" (reproduced or refuted, and holm_p < level, `level` the one-sided level of
    each verdict), "family_verdict" (the verdict when it survives, else inconclusive) and
    "family_size" C. Each claim is one directional decision at one-sided `level`, so this is
    Holm's procedure on two-sided p = 2·min(p, p_other) at 2·level with the sign deciding the
    direction."""
    order = sorted(range(len(claims)), key=lambda i: _leaning_p(claims[i]))
    adjusted, running = [0.0] * len(claims), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, _leaning_p(claims[i]) * (len(claims) - rank)))
        adjusted[i] = running
    out = []
    for c, q in zip(claims, adjusted, strict=True):
        survives = c["verdict"] in (REPRODUCED, REFUTED) and q < level
        out.append({**c, "holm_p": q, "survives_holm": survives,
                    "family_verdict": c["verdict"] if survives else INCONCLUSIVE,
                    "family_size": len(claims)})
    return out


def matched_seeds(seeds_a: Sequence[int], seeds_b: Sequence[int], *, names=("A", "B"),
                  text: str = "") -> list[int]:
    """a's seed ids, once checked to be b's: a ValueError naming both arms and their seed lists
    when the lists differ as sets or a seed repeats."""
    sa, sb = [int(s) for s in seeds_a], [int(s) for s in seeds_b]
    if set(sa) != set(sb) or len(set(sa)) != len(sa) or len(set(sb)) != len(sb):
        raise ValueError(f"{text + ': ' if text else ''}seeds are not paired: {names[0]} has "
                         f"seeds {sa}, {names[1]} has seeds {sb}")
    return sa


def at_seeds(row_seeds: Sequence[int], values: Sequence[float], seeds: Sequence[int], *,
             name: str = "the row") -> np.ndarray:
    """A row's values ([one per id in row_seeds]) in the order of `seeds`, ids the row holds."""
    if len(row_seeds) != len(values):
        raise ValueError(f"seeds are not paired: {name} has {len(values)} values for seeds "
                         f"{list(row_seeds)}")
    at = {int(s): i for i, s in enumerate(row_seeds)}
    missing = [int(s) for s in seeds if int(s) not in at]
    if missing:
        raise ValueError(f"seeds are not paired: {name} has seeds {list(row_seeds)}, not "
                         f"{missing}")
    return np.asarray(values, float)[[at[int(s)] for s in seeds]]


def pair_by_seed(seeds_a: Sequence[int], a: Sequence[float], seeds_b: Sequence[int],
                 b: Sequence[float], *, names=("A", "B"), text: str = ""
                 ) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(seeds, a_S, b_S): two rows' values matched by seed id, in a's seed order
    (`matched_seeds`: different seed lists are a ValueError naming both arms)."""
    seeds = matched_seeds(seeds_a, seeds_b, names=names, text=text)
    return (seeds, at_seeds(seeds_a, a, seeds, name=names[0]),
            at_seeds(seeds_b, b, seeds, name=names[1]))


def interval(values: Sequence[float]) -> tuple[float, float]:
    """`t_interval`, with a NaN half-width when fewer than MIN_UNITS values back it (an interval
    from one or no degree of freedom, e.g. 2.000 ± 12.706, is not shown)."""
    mean, half = t_interval(values)
    return mean, (half if len(values) >= MIN_UNITS else float("nan"))


def _fmt(diffs: Sequence[float]) -> str:
    mean, half = interval(diffs)
    return f"{mean:+.3f}" if math.isnan(half) else f"{mean:+.3f} ± {half:.3f}"


def p_text(p: float, p_other: float) -> str:
    """"p = x" in the claimed direction, and the other side's p when the data lean that way."""
    return f"p = {p:.3g}" + (f" (the other way: p = {p_other:.3g})" if p_other < p else "")


def make_claim(text: str, result: str, diffs: Sequence[float], evidence: str, p: float,
           p_other: float = 1.0) -> dict[str, Any]:
    mean, half = interval(diffs)
    n = len(diffs)
    return {"claim": text, "verdict": result, "holds": result == REPRODUCED,
            "diff": mean, "half_width": half, "n": n, "p": p, "p_other": p_other,
            "evidence": evidence, "note": too_few_seeds(n)}


def compare_values(text: str, a: Sequence[float], b: Sequence[float], *, names=("A", "B"),
                   higher: bool = True, seeds: tuple[Sequence[int], Sequence[int]] | None = None
                   ) -> dict[str, Any]:
    """Claim "a > b" (or "a < b" with higher=False) on seed-paired values: with
    `seeds` = (a's seed ids, b's seed ids) the values are matched by id (`pair_by_seed`);
    without, a and b are one unit per position (e.g. search seed s of two rows) and must be
    as long."""
    if seeds is not None:
        _, a, b = pair_by_seed(seeds[0], a, seeds[1], b, names=names, text=text)
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.shape != b.shape:
        raise ValueError(f"{text}: seeds are not paired ({a.size} vs {b.size} values)")
    d, p = a - b, p_value(a - b, higher=higher)
    p_other = p_value(d, higher=not higher)
    ev = (f"{names[0]} - {names[1]} = {_fmt(d)} over {d.size} paired seeds "
          f"({np.mean(a):.3f} vs {np.mean(b):.3f}), {p_text(p, p_other)}")
    return make_claim(text, verdict(d, higher=higher), d.tolist(), ev, p, p_other)


def in_every_seed(text: str, a_seed_P, b_seed_P, seeds: Sequence[int], *,
                  names=("A", "B"), higher: bool = True) -> dict[str, Any]:
    """Claim "a > b on the problems, in every seed" (the module's docstring): a_seed_P,
    b_seed_P are [seed, problem] values already paired by seed and problem (the same problems
    and evaluation key in each seed). Per seed s, p_s = `p_value` of the P paired differences;
    p = max_s p_s (reproduced iff < LEVEL), p_other = min(1, S · min_s p_other_s) (refuted iff
    < LEVEL). The claim's diffs are the per-seed mean differences."""
    d_SP = np.asarray(a_seed_P, float) - np.asarray(b_seed_P, float)
    if d_SP.ndim != 2 or d_SP.shape[0] != len(seeds) or d_SP.shape[1] < 2:
        raise ValueError(f"{text}: want [seed, problem] arrays with {len(seeds)} seeds and at "
                         f"least 2 problems; got {d_SP.shape}")
    ps = [p_value(d, higher=higher) for d in d_SP]
    others = [p_value(d, higher=not higher) for d in d_SP]
    p, p_other = max(ps), min(1.0, len(ps) * min(others))
    result = REPRODUCED if p < LEVEL else REFUTED if p_other < LEVEL else INCONCLUSIVE
    per = ", ".join(f"seed {s}: {d.mean():+.3f} (p {q:.2g})"
                    for s, d, q in zip(seeds, d_SP, ps, strict=True))
    ev = (f"{names[0]} - {names[1]} per seed over {d_SP.shape[1]} paired problems: {per}; "
          f"mean {np.mean(a_seed_P):.3f} vs {np.mean(b_seed_P):.3f}; in every seed (the "
          f"largest seed's p): {p_text(p, p_other)}")
    claim = make_claim(text, result, d_SP.mean(axis=1).tolist(), ev, p, p_other)
    claim["note"] = ""  # the problems decide each seed: the seed floor 2^-n does not apply
    return claim


def gap_grows(text: str, a_seed_k, b_seed_k, ks: Sequence[int], *, names=("A", "B"),
              label: str = "k") -> dict[str, Any]:
    """Claim "the gap a - b grows with k and is positive at the largest k": reproduced iff the
    growth gap(k_max) - gap(k_1) and the gap at k_max are both reproduced (> 0): its p is the
    larger of the two (an intersection-union test: both must hold); refuted iff either is
    shown < 0 with Bonferroni over the two: p_other = 2 · min of their other-side p's (one
    failing part suffices, so the two chances are corrected); inconclusive otherwise. a_seed_k,
    b_seed_k: [seed, k], rows already paired by seed; `label` names k in the evidence (e.g.
    "budget")."""
    gap = np.asarray(a_seed_k, float) - np.asarray(b_seed_k, float)
    if gap.ndim != 2 or gap.shape[1] != len(ks):
        raise ValueError(f"{text}: want [seed, k] arrays with {len(ks)} k values; got "
                         f"{gap.shape}")
    growth, last = gap[:, -1] - gap[:, 0], gap[:, -1]
    both = (verdict(growth), verdict(last))
    p = max(p_value(growth), p_value(last))
    p_other = min(1.0, 2 * min(p_value(growth, higher=False), p_value(last, higher=False)))
    result = REPRODUCED if p < LEVEL else REFUTED if p_other < LEVEL else INCONCLUSIVE
    k = label
    curve = ", ".join(f"{k}={x}: {g:+.3f}" for x, g in zip(ks, gap.mean(0), strict=True))
    ev = (f"{names[0]} - {names[1]} by {k}: {curve}; growth {k}={ks[0]}->{ks[-1]} "
          f"{_fmt(growth)} ({both[0]}), gap at {k}={ks[-1]} {_fmt(last)} ({both[1]}), "
          f"{p_text(p, p_other)}")
    return make_claim(text, result, growth.tolist(), ev, p, p_other)


def entropy_law_claim(text: str, trajectories: Sequence[Mapping[str, Sequence[float]]],
                      *, fit_frac: float = 0.5) -> dict[str, Any]:
    """Claim "R = -a·exp(H) + b predicts held-out evaluation score better than the
    alternatives": per seed, every model is fitted on the first `fit_frac` of the trajectory's
    points {"step", "entropy", "score"} and scored by RMSE on the rest
    (`entropy_law.heldout_fits`); d_i = RMSE(law) - min(RMSE linear in H, RMSE trend in steps,
    RMSE constant). Reproduced iff d < 0 (`verdict`), the law's a > 0 in every seed's full fit
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
    p_other = p_value(d, higher=True)
    if result == REPRODUCED and not (unbiased and all(f["a"] > 0 for f in fits)):
        result, p = INCONCLUSIVE, 1.0  # the side conditions fail: not a finding at any level
    mean = {k: float(np.mean([f["rmse"][k] for f in fits])) for k in entropy_law.MODELS}
    ev = (f"held-out RMSE law {mean['law']:.4f}, linear in H {mean['linear_h']:.4f}, trend in "
          f"steps {mean['trend']:.4f}, constant {mean['constant']:.4f} (mean of {len(fits)} "
          f"seeds); law - best alternative {_fmt(d)}, {p_text(p, p_other)}; law's held-out "
          f"bias {_fmt(bias)}; a = " + ", ".join(f"{f['a']:.3f}" for f in fits))
    return make_claim(text, result, d, ev, p, p_other)


# -- trends over training ------------------------------------------------------------------------

def kendall(steps: Sequence[float], values: Sequence[float]) -> tuple[float, float, float]:
    """(τ, p rising, p falling): Kendall's τ of values against steps over every point and its
    one-sided p's (scipy's exact or normal-approximation test); τ 0 and p's 1 when the values
    are constant or fewer than 3."""
    from scipy import stats

    x, y = np.asarray(steps, float), np.asarray(values, float)
    ok = np.isfinite(y)
    x, y = x[ok], y[ok]
    if y.size < 3 or np.all(y == y[0]):
        return 0.0, 1.0, 1.0
    up = stats.kendalltau(x, y, alternative="greater")
    down = stats.kendalltau(x, y, alternative="less")
    return float(up.statistic), float(up.pvalue), float(down.pvalue)


def sign_test_p(positive: int, negative: int) -> float:
    """One-sided exact sign test: P(Bin(n, 1/2) >= positive), n = positive + negative (ties
    dropped); 1 for n = 0."""
    n = positive + negative
    if n == 0:
        return 1.0
    return float(sum(math.comb(n, k) for k in range(positive, n + 1)) / 2 ** n)


def trend(text: str, runs: Sequence[tuple[Sequence[float], Sequence[float]]]
          ) -> dict[str, Any]:
    """Claim "the metric rose over training" on runs [(steps, values)] (one per seed, every
    logged step): per run Kendall's τ against the step (`kendall`); across runs the exact sign
    test of the τ's signs (`sign_test_p`): reproduced ("rose") iff p < LEVEL, refuted ("fell")
    iff the falling side's p < LEVEL. Never two endpoints: every step enters τ."""
    fits = [kendall(s, v) for s, v in runs]
    taus = [f[0] for f in fits]
    pos, neg = sum(t > 0 for t in taus), sum(t < 0 for t in taus)
    p, p_other = sign_test_p(pos, neg), sign_test_p(neg, pos)
    result = REPRODUCED if p < LEVEL else REFUTED if p_other < LEVEL else INCONCLUSIVE
    up = sum(f[1] < LEVEL for f in fits)
    down = sum(f[2] < LEVEL for f in fits)
    per = ", ".join(f"{t:+.2f}" for t in taus)
    ev = (f"Kendall τ against the step over all {len(runs[0][0]) if runs else 0} logged steps "
          f"per run: {per}; τ > 0 in {pos} of {len(runs)} runs; a rise significant within the "
          f"run (one-sided p < {LEVEL:g}) in {up}, a fall in {down}; sign test across runs "
          f"{p_text(p, p_other)}")
    c = make_claim(text, result, taus, ev, p, p_other)
    return {**c, "trend": ROSE if result == REPRODUCED else FELL if result == REFUTED
            else NO_TREND}

