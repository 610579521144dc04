"""Verdicts that hold with few seeds: the exact sign-flip test floors every claim's p at 2^-n over
n paired seeds, rows pair by seed id (different seed lists are refused), and every family of
verdicts the `vpo compare` report prints is Holm-corrected and says so (instant: no training)."""

import itertools
import json
import os

import numpy as np
import pytest

from vpo.compare import config as compare_config
from vpo.compare import numbers as compare_numbers
from vpo.compare import render as compare_render
from vpo.compare import report as compare_report
from vpo.compare import search_leg, verdicts
from vpo.eval import claims


def _brute_force_p(d, higher=True) -> float:
    """#{ε ∈ {±1}^n : Σ ε_i d_i >= Σ d_i} / 2^n by listing every ε."""
    d = np.asarray(d, float) * (1 if higher else -1)
    sums = [float(np.dot(e, d)) for e in itertools.product((1.0, -1.0), repeat=d.size)]
    return float(np.mean([s >= d.sum() - 1e-9 for s in sums]))


def test_zero_spread_over_two_seeds_is_not_reproduced():
    c = claims.compare_values("x", [1.0, 1.0], [0.0, 0.0])
    assert c["verdict"] == claims.INCONCLUSIVE and c["p"] == 0.25
    assert c["note"] == "too few seeds: the smallest possible p with 2 paired seeds is 0.25"


def test_three_equal_differences_cannot_beat_one_in_eight():
    c = claims.compare_values("x", [0.2] * 3, [0.0] * 3)
    assert c["p"] >= 0.125 and c["verdict"] == claims.INCONCLUSIVE
    family = claims.holm([c] + [{"claim": f"other {i}", "verdict": claims.INCONCLUSIVE,
                                 "p": 0.5} for i in range(25)])
    assert family[0]["holm_p"] == 1.0 and not family[0]["survives_holm"]
    assert family[0]["family_size"] == 26


@pytest.mark.parametrize("n, p", [(1, 0.5), (3, 0.125), (5, 0.03125), (6, 0.015625)])
def test_the_exact_floor_and_the_seeds_it_takes(n, p):
    up = [0.2 + 0.01 * i for i in range(n)]
    assert claims.smallest_p(n) == p
    assert claims.sign_flip_p(up) == p  # every difference positive: only ε = 1 reaches it
    assert (claims.verdict(up) == claims.REPRODUCED) == (n >= 6) == (claims.too_few_seeds(n)
                                                                       == "")
    assert claims.min_seeds() == 6


def test_sign_flip_p_agrees_with_brute_force_enumeration():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 11))
        d = (rng.integers(-3, 4, n) if rng.random() < 0.4  # ties and zeros
             else rng.normal(rng.uniform(-1, 1), 1.0, n))
        for higher in (True, False):
            assert claims.sign_flip_p(d, higher=higher) == _brute_force_p(d, higher), (d, higher)


def test_sign_flip_monte_carlo_is_close_to_exact_and_seeded():
    d = np.random.default_rng(1).normal(0.3, 1.0, 18)
    exact = claims.sign_flip_p(d, max_exact=18)
    mc = claims.sign_flip_p(d, max_exact=10)
    assert mc == claims.sign_flip_p(d, max_exact=10)  # fixed seed: the same p every time
    assert abs(mc - exact) < 0.01 and mc > 0


def test_mismatched_seed_lists_are_refused_naming_both_arms():
    with pytest.raises(ValueError, match=r"vpo has seeds \[0, 1, 2\], grpo has seeds \[0, 1, 3\]"):
        claims.compare_values("x", [1, 2, 3], [1, 2, 3], names=("vpo", "grpo"),
                              seeds=([0, 1, 2], [0, 1, 3]))
    row = {"m": 1, "values": {"best@1": [0.5] * 3, "diversity": [1.0] * 3}}
    head = {"vpo": {**row, "m": 3, "seeds": [0, 1, 2]}, "grpo": {**row, "seeds": [0, 1, 3]}}
    with pytest.raises(ValueError, match=r"vpo has seeds \[0, 1, 2\], grpo has seeds \[0, 1, 3\]"):
        verdicts.check(head, [1])


def test_rows_pair_by_seed_id_not_by_position():
    ks = [1]
    a = [0.9, 0.1, 0.5, 0.7, 0.3, 0.8]
    b = [0.8, 0.0, 0.4, 0.6, 0.2, 0.7]  # a - b = 0.1 at every seed id
    div = [1.0] * 6
    order = [3, 0, 5, 1, 4, 2]  # the same rows, listed in another seed order
    head = {"vpo": {"m": 3, "seeds": list(range(6)), "values": {"best@1": a, "diversity": div}},
            "grpo": {"m": 1, "seeds": order, "values": {"best@1": [b[i] for i in order],
                                                        "diversity": div}}}
    got = verdicts.check(head, ks)[0]
    assert got["claim"].startswith("VPO best@1 >") and got["verdict"] == claims.REPRODUCED
    assert got["diff"] == pytest.approx(0.1) and got["p"] == 2.0 ** -6


SEEDS = list(range(6))
KS = [1, 2, 6]  # the smoke preset's eval_budget is 6


def _eval_row(seed, m, level):
    r = np.random.default_rng(100 * m + seed)
    row = {"seed": seed, "m": m, "diversity": 1.0 + 0.01 * r.random(), "distinct": 3.0,
           "valid_fraction": 0.9, "entropy": 0.5}
    for i, k in enumerate(KS):
        row[f"best@{k}"] = level + 0.05 * i + 0.001 * r.random()
        row[f"pass@{k}"] = 0.1 * i
    return row


def _search_row(seed, m, rate):
    """A row seed's searches as `search_leg.search_arms` records them: 2 searches x 3 problems,
    budget points [4, 8], the calibrated point 1."""
    r = np.random.default_rng(7 * seed + m)
    first = {method: np.where(r.random((2, 3)) < rate * f, r.integers(0, 2, (2, 3)), -1)
             for method, f in (("search", 1.0), ("best_of_n", 0.5), ("revision", 0.7))}
    solved_SP = search_leg.solved_at(first["search"], 1)
    return {"seed": seed, "m": m, "first_SP": {k: v.tolist() for k, v in first.items()},
            "solved_SP": solved_SP.tolist(),
            "best_of_n_SP": search_leg.solved_at(first["best_of_n"], 1).tolist(),
            "solved_SG": [[int(search_leg.solved_at(first["search"], g)[s].sum())
                           for g in (0, 1)] for s in range(2)], "evaluated": [4, 8]}


def _arm_run(arm, seed, m, level):
    """A trained (arm, seed) as the driver returns it: 5 logged steps, no policy."""
    from vpo.compare.arms import ArmRun

    r = np.random.default_rng(11 * seed + m)
    metrics = [{"step": t, "entropy": level + 0.1 * r.random(), "diversity": r.random(),
                "reward": level * t, "grad_norm": 1.0} for t in range(1, 6)]
    return ArmRun(arm, seed, m, f"arms/{arm}/seed{seed}", None, metrics)


def _probe_row(seed, improve):
    return {"seed": seed, "valid": 0.8, "improve": improve + 0.01 * seed, "copy": 0.1,
            "distinct": 0.5, "solved": 0.0, "child_fitness": 0.4, "entropy": 0.6}


def test_every_family_in_the_report_is_holm_corrected(tmp_path):
    cfg = compare_config.make_config("smoke")
    rows = {"sft (m=1)": (1, 0.3), "sft (m=3)": (3, 0.3), "grpo": (1, 0.4),
            "multi_rlvr": (3, 0.45), "vpo": (3, 0.6), "vpo_mut": (3, 0.6)}
    evals = {"ks": KS, "rows": {n: [_eval_row(s, m, lv) for s in SEEDS]
                                for n, (m, lv) in rows.items()}}
    searches = {"problems": [0, 1, 2], "seeds": 2, "split_seed": 5, "pool": 10,
                "warm_start_solved": [0.1, 0.2, 0.1], "pool_solved_mean": 0.3, "budget": 8,
                "point": 1, "max_budget": 8, "per_seed_keys": True,
                "methods": ["search", "best_of_n", "revision"],
                "rows": {n: [_search_row(s, m, lv) for s in SEEDS] for n, (m, lv) in
                         rows.items()}}
    probes = {n: [_probe_row(s, 0.5 if n == "vpo_mut" else 0.1) for s in SEEDS]
              for n in rows}
    runs = {n: [_arm_run(n, s, m, lv) for s in SEEDS] for n, (m, lv) in rows.items()
            if not n.startswith("sft")}  # end-of-training entropy and diversity: the bridge
    summary = compare_report.write_report(str(tmp_path), cfg, command="vpo compare", wall={
        "total": 1.0}, runs=runs, evals=evals, searches=searches, probes=probes)
    with open(os.path.join(tmp_path, "report.md")) as f:
        text = f.read()
    with open(os.path.join(tmp_path, "summary.json")) as f:
        assert json.load(f)["corrections"] == summary["corrections"]
    for key, what in compare_numbers.FAMILIES:
        family = summary[key]
        assert family, key
        assert all(c["family_size"] == len(family) and "holm_p" in c for c in family), key
        assert f"Holm's step-down correction (Holm 1979) over the {len(family)} {what}" in text
        assert summary["corrections"][key].startswith(f"Holm 1979 over {len(family)} claims")
    # each probe-improve claim is reproduced alone (p = 2^-6) but not over its family of 3
    improve = next(c for c in summary["remedies"] if "probe improve" in c["claim"])
    assert improve["verdict"] == claims.REPRODUCED and improve["holm_p"] == 3 * 2.0 ** -6
    assert not improve["survives_holm"] and "does not survive" in text
    # solving beside partial credit in the headline
    assert "| policy | m | seeds | best@1 | pass@1 | best@6 | pass@6 |" in text


def test_holm_corrects_a_refuted_verdict_as_it_corrects_a_reproduced_one():
    # six seeds all the other way: refuted alone (p = 2^-6 on the other side), not over 3 claims
    c = claims.compare_values("x", [0.0] * 6, np.linspace(0.2, 0.3, 6))
    assert c["verdict"] == claims.REFUTED and c["p_other"] == 2.0 ** -6
    family = claims.holm([c] + [{"claim": f"other {i}", "verdict": claims.INCONCLUSIVE,
                                 "p": 0.5} for i in range(2)])
    assert family[0]["holm_p"] == 3 * 2.0 ** -6
    assert not family[0]["survives_holm"] and family[0]["family_verdict"] == claims.INCONCLUSIVE
    alone = claims.holm([c])[0]
    assert alone["survives_holm"] and alone["family_verdict"] == claims.REFUTED
    # seven seeds: 3 · 2^-7 < 0.025, so the refutation survives a family of three
    c7 = claims.compare_values("x", [0.0] * 7, np.linspace(0.2, 0.3, 7))
    family = claims.holm([c7] + [{"claim": f"o{i}", "verdict": claims.INCONCLUSIVE, "p": 0.5}
                                 for i in range(2)])
    assert family[0]["family_verdict"] == claims.REFUTED


@pytest.mark.parametrize("n, C, can", [(3, 3, False), (5, 1, False), (6, 1, True), (6, 3, False),
                                       (7, 3, True), (8, 3, True), (6, 2, False), (7, 2, True)])
def test_the_design_states_the_smallest_holm_p_its_seeds_allow(n, C, can):
    d = claims.design(n, C)
    assert d["smallest_p"] == 2.0 ** -n
    assert d["smallest_holm_p"] == min(1.0, C * 2.0 ** -n)
    assert d["can_decide"] is can
    assert claims.design(d["seeds_needed"], C)["can_decide"]
    assert not claims.design(d["seeds_needed"] - 1, C)["can_decide"]
    text = claims.design_text(d)
    assert ("cannot decide" in text) is (not can) and f"{C} × 2^-{n}" in text


def test_seeds_needed_for_one_and_three_primary_claims():
    assert claims.seeds_needed(1) == 6 and claims.seeds_needed(3) == 7
    # one seed the other way (the smallest difference): p at best 2^(1-n)
    assert claims.seeds_needed(3, discordant=1) == 8
    d = [0.3, 0.25, 0.2, 0.22, 0.28, 0.26, 0.24, -0.01]  # 8 seeds, one small one the other way
    assert claims.sign_flip_p(d) == 2 / 2 ** 8 and 3 * claims.sign_flip_p(d) < claims.LEVEL


def test_a_value_from_fewer_than_three_units_has_no_interval():
    assert compare_render.fmt([2.0, 2.0]) == "2.000"
    assert compare_render.fmt([0.0, 4.0]) == "2.000"  # not "2.000 ± 25.412"
    assert compare_render.fmt([1.0, 2.0, 3.0]).startswith("2.000 ± ")
    c = claims.compare_values("x", [2.0, 0.0], [0.0, 0.0])
    assert "±" not in c["evidence"] and np.isnan(c["half_width"])


def test_primary_keys_are_checked_and_the_config_names_them():
    assert verdicts.primary_keys("vpo-grpo:best, vpo-warm:pass") == ["vpo-grpo:best",
                                                                    "vpo-warm:pass"]
    for bad in ("vpo-vpo:best", "vpo-grpo:mean", "vpo-grpo:best,vpo-grpo:best",
                "vpo-grpo:best,vpo-grpo:pass,vpo-warm:pass,vpo-multi_rlvr:best"):
        with pytest.raises(ValueError):
            verdicts.primary_keys(bad)
    for preset in compare_config.PRESETS:
        cfg = compare_config.make_config(preset)
        assert 1 <= len(verdicts.primary_keys(cfg.primary)) <= verdicts.MAX_PRIMARY
    with pytest.raises(compare_config.ConfigError, match="primary"):
        compare_config.make_config("default", ["primary=vpo-foo:best"])
    text = compare_render.design_text(compare_config.make_config("default", ["num_seeds=3"]))
    assert "cannot decide" in text and "at least 7 paired seeds" in text
    text = compare_render.design_text(compare_config.make_config("default"))
    assert "can decide its primary claims" in text


def test_a_primary_key_may_name_its_k_and_claim_diversity():
    assert verdicts.parse_key("grpo-warm:pass@1") == ("grpo", "warm", "pass", 1)
    assert verdicts.metric_key("grpo-warm:pass@1", 12) == "pass@1"
    assert verdicts.metric_key("vpo-grpo:cover", 12) == "cover@12"
    assert verdicts.metric_key("vpo-grpo:diversity", 12) == "diversity"
    assert verdicts.primary_ks("vpo-grpo:cover@4,grpo-warm:pass@1,vpo-grpo:best") == [1, 4]
    assert "pass@1 above its warm start" in verdicts.primary_text("grpo-warm:pass@1", 12)
    for bad in ("vpo-grpo:diversity@4", "vpo-grpo:search@2", "vpo-grpo:pass@0",
                "vpo-grpo:pass@", "vpo-grpo:cover@x"):
        with pytest.raises(ValueError, match="primary claim"):
            verdicts.parse_key(bad)
    with pytest.raises(compare_config.ConfigError, match="eval_budget"):
        compare_config.make_config("smoke", ["primary=vpo-grpo:cover@7"])  # budget 6
    cfg = compare_config.make_config("smoke", ["primary=grpo-warm:pass@1,vpo-grpo:cover@4"])
    assert cfg.claim_k("pass") == 1 and cfg.claim_k("cover") == 4 and cfg.claim_k("best") == 6
    assert 4 in cfg.eval_ks and cfg.eval_ks[-1] == 6
    with pytest.raises(compare_config.ConfigError, match="search_leg"):
        compare_config.make_config("smoke", ["search_leg=false", "primary=vpo-grpo:search"])
    # the claims read the headline at their own k; grpo against its stronger warm start
    seeds = list(range(8))
    head = {"sft (m=1)": {"m": 1, "seeds": seeds, "values": {"pass@1": [0.5] * 8,
                                                             "diversity": [0.2] * 8}},
            "sft (m=3)": {"m": 3, "seeds": seeds, "values": {"pass@1": [0.4] * 8,
                                                             "diversity": [0.3] * 8}},
            "grpo": {"m": 1, "seeds": seeds, "values": {"pass@1": [0.6 + 0.01 * s for s in seeds],
                                                        "diversity": [0.1] * 8}},
            "vpo": {"m": 3, "seeds": seeds, "values": {"diversity": [0.3 + 0.01 * s
                                                                     for s in seeds]}}}
    a, b = verdicts.primary_claims(head, ["grpo-warm:pass@1", "vpo-grpo:diversity"], 6)
    assert a["verdict"] == b["verdict"] == "reproduced"
    assert "sft (m=1) is the warm start's stronger mode on pass@1" in a["evidence"]
    assert b["diff"] == pytest.approx(0.235)


def test_learning_is_claimed_per_problem_in_every_seed():
    """grpo-warm:hits: the paired test over problems within each seed, intersection-union over
    seeds: 3 seeds decide it when each seed's checkpoint is ahead on its problems; one seed at a
    tie keeps it inconclusive, one seed clearly behind refutes it."""
    rng = np.random.default_rng(0)
    warm = rng.uniform(0.2, 0.6, size=(3, 64))
    ahead = warm + 0.1 + rng.normal(0, 0.05, size=(3, 64))
    c = claims.in_every_seed("learns", ahead, warm, [0, 1, 2], names=("grpo", "sft"))
    assert c["verdict"] == "reproduced" and c["p"] < 1e-3 and c["n"] == 3 and c["note"] == ""
    mixed = ahead.copy()
    mixed[1] = warm[1] + rng.normal(0, 0.05, size=64)  # seed 1 learned nothing
    assert claims.in_every_seed("learns", mixed, warm, [0, 1, 2])["verdict"] == "inconclusive"
    mixed[1] = warm[1] - 0.1
    c = claims.in_every_seed("learns", mixed, warm, [0, 1, 2])
    assert c["verdict"] == "refuted" and "seed 1: -0.100" in c["evidence"]
    with pytest.raises(ValueError, match="seed, problem"):
        claims.in_every_seed("learns", ahead[0], warm[0], [0])
    # through a headline: rows paired by seed id (listed in another order), against the warm
    # start's stronger mode on pass@1
    head = {"sft (m=1)": {"m": 1, "seeds": [0, 1, 2], "values": {"pass@1": [0.4] * 3},
                          "per_problem": {"pass@1": warm.tolist()}},
            "sft (m=2)": {"m": 2, "seeds": [0, 1, 2], "values": {"pass@1": [0.3] * 3}},
            "grpo": {"m": 1, "seeds": [2, 0, 1], "values": {"pass@1": [0.5] * 3},
                     "per_problem": {"pass@1": ahead[[2, 0, 1]].tolist()}}}
    key = "grpo-warm:pass@1/problem"
    assert verdicts.parse_key(key) == ("grpo", "warm", "pass", 1) and verdicts.per_problem(key)
    assert verdicts.metric_key(key, 12) == "pass@1"
    assert verdicts.primary_text(key, 12).startswith("grpo pass@1 above its warm start's, on the")
    with pytest.raises(ValueError, match="primary claim"):
        verdicts.parse_key("vpo-grpo:search/problem")
    (c,) = verdicts.primary_claims(head, [key], 12)
    assert c["verdict"] == "reproduced" and c["diff"] == pytest.approx((ahead - warm).mean())
    assert "sft (m=1) is the warm start's stronger mode" in c["evidence"]
    del head["grpo"]["per_problem"]
    (c,) = verdicts.primary_claims(head, [key], 12)
    assert c["verdict"] == "inconclusive" and "not measured" in c["evidence"]
    text = compare_render.design_text(compare_config.make_config(
        "smollm", ["num_seeds=3", f"primary={key}"]))
    assert "intersection-union" in text and "cannot decide" not in text
    # the SmolLM2 designs: every claim per problem on 3 seeds; on the GPU, 8 seeds decide the
    # seed-level ones beside the per-problem one
    text = compare_render.design_text(compare_config.make_config("smollm_learn"))
    assert "unit the held-out problem within each seed" in text and "cannot decide" not in text
    text = compare_render.design_text(compare_config.make_config("smollm_gpu"))
    assert "1 of them per problem" in text and "can decide its primary claims" in text


def test_search_against_the_warm_start_is_at_the_unit_of_training_seeds():
    head = {"sft (m=1)": {"m": 1, "seeds": [0, 1, 2], "values": {}},
            "grpo": {"m": 1, "seeds": [0, 1, 2], "values": {"search solved": [0.0, 1.0, 0.5]}}}
    head["sft (m=1)"]["values"]["search solved"] = [1.5, 1.0, 2.0]  # each seed its own keys
    searches = {"seeds": 2, "per_seed_keys": True, "rows": {}}
    (c,) = compare_numbers.against_warm_start(head, 6, searches, "search solved")
    assert c["n"] == 3 and "over 3 paired seeds" in c["evidence"]
    assert c["diff"] == pytest.approx(np.mean([0.0 - 1.5, 1.0 - 1.0, 0.5 - 2.0]))
    # one set of warm-start searches for every seed is not a unit per seed: no claim
    assert compare_numbers.against_warm_start(head, 6, {"seeds": 2, "rows": {}},
                                             "search solved") == []


def test_the_report_is_what_its_summary_json_renders_to(tmp_path):
    cfg = compare_config.make_config("smoke")
    rows = {"sft (m=1)": (1, 0.3), "sft (m=3)": (3, 0.3), "grpo": (1, 0.4), "vpo": (3, 0.6)}
    evals = {"ks": KS, "rows": {n: [_eval_row(s, m, lv) for s in SEEDS]
                                for n, (m, lv) in rows.items()}}
    compare_report.write_report(str(tmp_path), cfg, command="vpo compare", wall={"total": 1.0},
                                runs={}, evals=evals)
    with open(os.path.join(tmp_path, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(tmp_path, "report.md")) as f:
        text = f.read()
    assert compare_render.render(summary) == text
    assert text.splitlines()[4] == "## Design" and "**Primary claims** (3" in text
    assert "pre-registration" not in text  # its config names its primary claims
    primary = {c["key"] for c in summary["primary"]}
    assert primary == set(verdicts.primary_keys(cfg.primary))
    # a primary claim is not repeated among the exploratory ones
    assert not {c["claim"] for c in summary["primary"]} & {c["claim"] for c in summary["claims"]}
    lines = [line for line in text.splitlines()
             if line.startswith(("- **reproduced**", "- **refuted**", "- **inconclusive**"))]
    assert sum("(primary" in line for line in lines) == 3
    assert all("(exploratory" in line for line in lines if "(primary" not in line)
