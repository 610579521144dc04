"""Verdicts that hold with few seeds: the exact sign-flip test floors every claim's p at 2^-n over
n paired seeds, rows pair by seed id (different seed lists are refused), and every family of
verdicts the `vpo compare` report prints is Holm-corrected and says so (instant: no training)."""

import itertools
import json
import os

import numpy as np
import pytest

from vpo.compare import config as compare_config
from vpo.compare import report as compare_report
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
        claims.check(head, [1])


def test_rows_pair_by_seed_id_not_by_position():
    ks = [1]
    a = [0.9, 0.1, 0.5, 0.7, 0.3, 0.8]
    b = [0.8, 0.0, 0.4, 0.6, 0.2, 0.7]  # a - b = 0.1 at every seed id
    div = [1.0] * 6
    order = [3, 0, 5, 1, 4, 2]  # the same rows, listed in another seed order
    head = {"vpo": {"m": 3, "seeds": list(range(6)), "values": {"best@1": a, "diversity": div}},
            "grpo": {"m": 1, "seeds": order, "values": {"best@1": [b[i] for i in order],
                                                        "diversity": div}}}
    got = claims.check(head, ks)[0]
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
    r = np.random.default_rng(7 * seed + m)
    solved_SP = r.random((2, 3)) < rate
    return {"seed": seed, "m": m, "solved_SP": solved_SP.tolist(),
            "best_of_n_SP": (r.random((2, 3)) < rate / 2).tolist(),
            "solved_SG": [[0.0, float(s.sum())] for s in solved_SP], "evaluated": [4, 8]}


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
                "rows": {n: [_search_row(s, m, lv) for s in SEEDS] for n, (m, lv) in
                         rows.items()}}
    probes = {n: [_probe_row(s, 0.5 if n == "vpo_mut" else 0.1) for s in SEEDS]
              for n in rows}
    summary = compare_report.write_report(str(tmp_path), cfg, command="vpo compare", wall={
        "total": 1.0}, runs={}, evals=evals, searches=searches, probes=probes)
    with open(os.path.join(tmp_path, "report.md")) as f:
        text = f.read()
    with open(os.path.join(tmp_path, "summary.json")) as f:
        assert json.load(f)["corrections"] == summary["corrections"]
    for key, what in compare_report.FAMILIES:
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
