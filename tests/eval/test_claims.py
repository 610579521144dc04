"""The claim logic of `vpo compare` on synthetic summaries: claims that should not hold come out
inconclusive or refuted, claims that do hold come out reproduced (instant: no training). A verdict
other than inconclusive needs 6 or more paired seeds (the exact sign-flip test's 2^-n must fall
below the one-sided 2.5% level), so the synthetic comparisons use 6 seeds; fewer seeds are
tests/eval/test_claims_small_n.py's subject."""

import numpy as np
import pytest

from vpo.compare import verdicts
from vpo.eval import claims, entropy_law
from vpo.eval import metrics as eval_metrics

KS = [1, 2, 3, 5, 10, 20, 30]
NOT_REPRODUCED = {claims.INCONCLUSIVE, claims.REFUTED}


def _best_at_ks(scores_BN) -> dict[str, float]:
    s = np.sort(scores_BN, axis=-1)
    return {f"best@{k}": float(np.mean(s @ eval_metrics.best_at_k_weights(s.shape[1], k)))
            for k in KS}


def _row(m, pools, **extra):
    """A headline row from per-seed candidate pools [P, N] (and extra per-seed metrics)."""
    per = [_best_at_ks(p) for p in pools]
    values = {k: [d[k] for d in per] for k in per[0]}
    return {"m": m, "seeds": list(range(len(pools))), "values": {**values, **extra}}


def _by_claim(checked):
    return {c["claim"]: c["verdict"] for c in checked}


def test_verdict_is_three_way_on_paired_intervals():
    up = [0.10, 0.12, 0.11, 0.13, 0.09, 0.10]
    assert claims.verdict(up) == claims.REPRODUCED
    assert claims.verdict([-x for x in up]) == claims.REFUTED
    assert claims.verdict([-x for x in up], higher=False) == claims.REPRODUCED
    assert claims.verdict([0.2, -0.1, 0.05, 0.1, -0.05, 0.0]) == claims.INCONCLUSIVE  # 0 inside
    assert claims.verdict([0.3]) == claims.INCONCLUSIVE  # one seed: no interval
    assert claims.verdict([0.0, 0.0, 0.0]) == claims.INCONCLUSIVE  # 0.000 vs 0.000: a tie
    assert claims.verdict([1e-4, 2e-4, 1e-4]) == claims.INCONCLUSIVE  # below the precision
    mean, half = claims.t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.302653 / np.sqrt(3), rel=1e-5)


def test_saturated_scores_are_inconclusive_never_reproduced():
    ones = [np.ones((8, 30))] * 3
    zeros = [np.zeros((8, 30))] * 3
    for pools in (ones, zeros):
        head = {"vpo": _row(3, pools, diversity=[0.0] * 3),
                "grpo": _row(1, pools, diversity=[0.0] * 3)}
        found = set(_by_claim(verdicts.check(head, KS)).values())
        assert found == {claims.INCONCLUSIVE}


def test_a_third_of_the_slots_wasted_is_not_a_vpo_win():
    """Same per-candidate score distribution, but a third of VPO's slots score 0: VPO's gap to
    GRPO shrinks with k (towards 0 from below) without ever being positive."""
    rng = np.random.default_rng(0)
    grpo, vpo = [], []
    for _ in range(6):
        grpo.append(rng.beta(2, 3, (64, 30)))
        v = rng.beta(2, 3, (64, 30))
        v[:, ::3] = 0.0
        vpo.append(v)
    div = lambda: list(rng.normal(1.0, 0.05, 6))  # noqa: E731  same diversity distribution
    head = {"vpo": _row(3, vpo, diversity=div()), "grpo": _row(1, grpo, diversity=div())}
    got = _by_claim(verdicts.check(head, KS))
    assert got and set(got.values()) <= NOT_REPRODUCED, got
    gap = next(c for c in verdicts.check(head, KS) if "grows" in c["claim"])
    assert gap["diff"] > 0  # the gap does grow with k: only its sign at k = 30 stops the claim
    assert got[next(k for k in got if "best@30 >" in k)] == claims.REFUTED


def test_a_real_spread_advantage_is_reproduced():
    """VPO's candidates are more spread (lower mean, much higher best@30): VPO loses at k = 1,
    wins at k = 30, the gap grows, and its diversity is higher."""
    rng = np.random.default_rng(1)
    grpo = [np.clip(rng.normal(0.5, 0.03, (64, 30)), 0, 1) for _ in range(6)]
    vpo = [rng.uniform(0.0, 0.95, (64, 30)) for _ in range(6)]
    head = {"vpo": _row(3, vpo, diversity=[1.3, 1.25, 1.35, 1.3, 1.28, 1.33]),
            "grpo": _row(1, grpo, diversity=[0.2, 0.3, 0.25, 0.2, 0.22, 0.27])}
    checked = verdicts.check(head, KS)
    assert {c["verdict"] for c in checked} == {claims.REPRODUCED}, _by_claim(checked)
    assert np.mean(head["vpo"]["values"]["best@1"]) < np.mean(head["grpo"]["values"]["best@1"])


def test_token_entropy_claims_only_compare_arms_with_the_same_m():
    pools = [np.full((4, 30), 0.5)] * 6
    extra = {"diversity": [1.0] * 6, "train diversity": [1.0] * 6}
    head = {"vpo": _row(3, pools, **extra, **{"train entropy": [0.5, 0.6, 0.55] * 2}),
            "grpo": _row(1, pools, **extra, **{"train entropy": [0.1, 0.1, 0.12] * 2}),
            "multi_rlvr": _row(3, pools, **extra, **{"train entropy": [0.2, 0.25, 0.2] * 2})}
    entropy = [c for c in verdicts.check(head, KS) if "token entropy" in c["claim"]]
    assert [c["claim"] for c in entropy] == [
        "VPO keeps higher token entropy of training rollouts (last 20% of steps) than "
        "multi_rlvr (both m=3)"]
    assert entropy[0]["verdict"] == claims.REPRODUCED


def _trajectories(f, seeds=6, noise=0.01):
    steps = np.arange(0, 301, 50.0)
    out = []
    for s in range(seeds):
        r = np.random.default_rng(100 + s)
        H = np.linspace(0.95, 0.05, steps.size) + r.normal(0, 0.01, steps.size)
        out.append({"step": steps, "entropy": H, "score": f(H) + r.normal(0, noise, steps.size)})
    return out


@pytest.mark.parametrize("name, f, want", [
    ("law", lambda H: 1.0 - 0.3 * np.exp(H), {claims.REPRODUCED}),
    ("linear in H", lambda H: 0.9 - 0.4 * H, NOT_REPRODUCED),
    ("sqrt(1 - H)", lambda H: np.sqrt(np.clip(1 - H, 0, None)), NOT_REPRODUCED),
    ("constant", lambda H: np.full_like(H, 0.6), NOT_REPRODUCED),
])
def test_entropy_law_must_beat_linear_trend_and_constant_on_held_out_points(name, f, want):
    c = claims.entropy_law_claim(name, _trajectories(f))
    assert c["verdict"] in want, c["evidence"]


def test_entropy_law_trend_in_steps_alone_does_not_reproduce():
    """Score rises with steps while entropy wanders (no relation to H): the trend model wins."""
    steps = np.arange(0, 301, 50.0)
    trajs = [{"step": steps, "entropy": 0.5 + 0.3 * np.random.default_rng(s).random(steps.size),
              "score": 0.3 + steps / 1000 + np.random.default_rng(9 + s).normal(0, 0.005, 7)}
             for s in range(6)]
    assert claims.entropy_law_claim("trend", trajs)["verdict"] in NOT_REPRODUCED


def test_heldout_fits_recover_the_law_and_score_the_alternatives():
    steps = np.arange(8.0)
    H = np.linspace(1.5, 0.1, 8)
    fits = entropy_law.heldout_fits(steps, H, 1.2 - 0.3 * np.exp(H))
    assert (fits["a"], fits["b"]) == pytest.approx((0.3, 1.2), abs=1e-9)
    assert fits["rmse"]["law"] < 1e-9 < min(fits["rmse"][k] for k in ("linear_h", "trend",
                                                                      "constant"))
    assert fits["fit_points"] == 4 and fits["r2"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match=">= 3 paired"):
        entropy_law.heldout_fits(steps[:2], H[:2], H[:2])


def test_search_claim_is_paired_over_policy_seeds():
    rng = np.random.default_rng(3)
    same = rng.random((6, 5, 8)) < 0.3  # [policy seed, search seed, problem]
    seeds = {row: list(range(6)) for row in ("vpo", "grpo", "multi_rlvr")}
    solved = verdicts.search_claim_inputs({"vpo": same, "grpo": same,
                                         "multi_rlvr": rng.random((6, 5, 8)) < 0.05}, seeds)
    assert solved["vpo"]["values"] == pytest.approx(same.sum(-1).mean(-1))
    assert solved["vpo"]["seeds"] == list(range(6))
    pools = [np.full((4, 30), 0.5)] * 6
    head = {a: _row(m, pools, diversity=[1.0] * 6) for a, m in
            (("vpo", 3), ("grpo", 1), ("multi_rlvr", 3))}
    got = {c["claim"]: c["verdict"] for c in verdicts.check(head, KS, search=solved)
           if "search" in c["claim"]}
    assert got == {
        "in search at equal budget, VPO's policy solves more of the hard problems than grpo's":
            claims.INCONCLUSIVE,
        "in search at equal budget, VPO's policy solves more of the hard problems than "
        "multi_rlvr's": claims.REPRODUCED}


def test_unpaired_values_are_an_error():
    with pytest.raises(ValueError, match="not paired"):
        claims.compare_values("x", [1, 2, 3], [1, 2])


def test_p_value_agrees_with_the_interval_and_the_exact_test():
    # reproduced iff the one-sided p is below 0.025 (the 95% two-sided interval's level), and
    # that p is below 0.025 iff the interval excludes 0 and the sign-flip test's p is below it
    rng = np.random.default_rng(3)
    for _ in range(200):
        d = rng.normal(rng.uniform(-1, 1), 1.0, size=int(rng.integers(2, 11)))
        p = claims.p_value(d)
        assert (claims.verdict(d) == claims.REPRODUCED) == (p < 0.025), (d, p)
        assert (claims.verdict(d) == claims.REFUTED) == (claims.p_value(d, higher=False) < 0.025)
        mean, half = claims.t_interval(d)
        assert (p < 0.025) == (mean - half > 0 and claims.sign_flip_p(d) < 0.025), (d, p)
        assert p >= claims.smallest_p(d.size)
    assert claims.p_value([0.0, 0.0, 0.0]) == 1.0  # a tie is never evidence
    assert claims.p_value([0.3]) == 1.0  # one seed


def test_holm_adjusts_by_rank_and_keeps_order():
    # p = 0.01, 0.004, 0.03 over 3 claims: sorted 0.004*3, 0.01*2, 0.03*1 -> monotone 0.012,
    # 0.02, 0.03; only the first two are below 0.025
    cs = [{"claim": c, "verdict": claims.REPRODUCED, "p": p}
          for c, p in (("a", 0.01), ("b", 0.004), ("c", 0.03))]
    out = claims.holm(cs)
    assert [c["claim"] for c in out] == ["a", "b", "c"]
    assert [round(c["holm_p"], 6) for c in out] == [0.02, 0.012, 0.03]
    assert [c["survives_holm"] for c in out] == [True, True, False]
    # an inconclusive claim never "survives", whatever its p
    out = claims.holm([{"claim": "x", "verdict": claims.INCONCLUSIVE, "p": 0.001}])
    assert out[0]["survives_holm"] is False


def test_many_weak_wins_do_not_all_survive_holm():
    # 20 claims, each reproduced on its own over 6 seeds (p = 2^-6, all differences
    # positive): the family-wise correction keeps none of them (20 · 2^-6 > 0.025)
    d = [0.10, 0.02, 0.06, 0.03, 0.09, 0.05]
    p = claims.p_value(d)
    assert claims.verdict(d) == claims.REPRODUCED and p == 2.0 ** -6
    checked = claims.holm([claims.compare_values(f"claim {i}", np.array(d) + 1.0, [1.0] * 6)
                           for i in range(20)])
    assert all(c["verdict"] == claims.REPRODUCED for c in checked)
    assert not any(c["survives_holm"] for c in checked)


def test_a_trend_is_judged_over_every_step_not_two_endpoints():
    steps = list(range(30))
    rng = np.random.default_rng(0)
    rising = [(steps, 0.02 * np.arange(30) + 0.05 * rng.standard_normal(30)) for _ in range(6)]
    c = claims.trend("reward rose", rising)
    assert c["verdict"] == claims.REPRODUCED and c["trend"] == claims.ROSE
    assert c["p"] == 2.0 ** -6 and "over all 30 logged steps" in c["evidence"]
    falling = [(s, -v) for s, v in rising]
    assert claims.trend("reward rose", falling)["trend"] == claims.FELL
    # last step above the first in every run, yet flat in between: no trend shown
    flat = []
    for _ in range(6):
        v = 0.3 * rng.standard_normal(30)
        v[0], v[-1] = -1.0, 1.0
        flat.append((steps, v))
    c = claims.trend("reward rose", flat)
    assert c["trend"] == claims.NO_TREND, c["evidence"]
    # three runs: the sign test cannot go below 1/8
    assert claims.trend("x", rising[:3])["p"] == 0.125


def test_a_gap_that_fails_one_part_is_refuted_only_after_both_chances_are_corrected():
    # growth negative in every seed (p = 2^-n on that side), gap at k_max positive: either
    # failing part refutes, so the two chances are Bonferroni-corrected (2 · 2^-n)
    def gap(n):
        a = np.array([[0.5, 0.55]] * n) + np.linspace(0, 0.01, n)[:, None]
        return claims.gap_grows("g", a, np.array([[0.3, 0.45]] * n), [1, 30])

    six, seven = gap(6), gap(7)
    assert claims.verdict(-0.1 * np.ones(6)) == claims.REFUTED  # the growth alone, 6 seeds
    assert six["p_other"] == 2 * 2.0 ** -6 and six["verdict"] == claims.INCONCLUSIVE
    assert seven["p_other"] == 2 * 2.0 ** -7 and seven["verdict"] == claims.REFUTED


def test_the_stratified_association_sees_only_within_block_order_and_can_hold_a_covariate():
    from vpo.eval import association

    rng = np.random.default_rng(1)
    # Between blocks y rises with x (block means), within every block it does not: the pooled
    # test passes, the stratified one must not.
    blocks = [(b + rng.random(8), 10 * b + rng.permutation(8) * 0.0 + rng.random(8))
              for b in range(4)]
    pooled = association.association("y rises with x", np.concatenate([x for x, _ in blocks]),
                                     np.concatenate([y for _, y in blocks]))
    strat = association.stratified_association("y rises with x within blocks", blocks,
                                               draws=20_000)
    assert pooled["verdict"] == claims.REPRODUCED
    assert strat["verdict"] == claims.INCONCLUSIVE and strat["blocks"] == 4
    # Within every block y rises with x: reproduced, and the same p from the same seed.
    rising = [(x, x + 0.1 * rng.random(8)) for x in (rng.random(8) for _ in range(4))]
    up = association.stratified_association("y rises", rising, draws=20_000)
    assert up["verdict"] == claims.REPRODUCED and up["rho"] > 0.9
    assert up["p"] == association.stratified_association("y rises", rising, draws=20_000)["p"]
    # x and y both follow a covariate z (competence) and nothing else: given z, no evidence.
    conf = []
    for _ in range(4):
        z = rng.random(8)
        conf.append((z + 0.01 * rng.random(8), z + 0.01 * rng.random(8), z))
    plain = association.stratified_association("y rises", [c[:2] for c in conf], draws=20_000)
    given = association.stratified_association("y rises given z", conf, given="z",
                                               draws=20_000)
    assert plain["verdict"] == claims.REPRODUCED
    assert given["verdict"] != claims.REPRODUCED and "| z" in given["evidence"]


def test_association_is_an_exact_permutation_test_up_to_8_runs():
    from vpo.eval import association

    x = np.arange(8.0)
    c = association.association("y rises with x", x, x ** 2)  # ρ = 1: only the identity order
    assert c["rho"] == pytest.approx(1.0) and c["verdict"] == claims.REPRODUCED
    assert c["p"] == pytest.approx(1 / 40320) and "exact over all 40320 orders" in c["evidence"]
    down = association.association("y rises with x", x, -x)
    assert down["verdict"] == claims.REFUTED and down["p_other"] == pytest.approx(1 / 40320)
    flat = association.association("y rises with x", x, np.zeros(8))  # constant: no evidence
    assert flat["verdict"] == claims.INCONCLUSIVE and flat["p"] == 1.0
    # ties take average ranks; beyond 8 runs a fixed-seed Monte Carlo over random orders
    rng = np.random.default_rng(0)
    a = rng.random(24)
    big = association.association("y rises with x", a, np.round(a * 3))
    assert big["verdict"] == claims.REPRODUCED and "100000 random orders" in big["evidence"]
    assert big["p"] == association.association("y rises with x", a, np.round(a * 3))["p"]
    noise = association.association("y rises with x", a, rng.random(24))
    assert noise["verdict"] == claims.INCONCLUSIVE
