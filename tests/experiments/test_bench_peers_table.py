"""experiments/bench_peers.py's table: medians over rounds, the per-round paired ratio with its
sign-test interval, and the goal verdict, on hand-made measurements."""

import pytest


@pytest.fixture(scope="module")
def bench(load_experiment):
    return load_experiment("bench_peers")


def _res(vpo_tok_s, hf_tok_s, vpo_step_s, trl_step_s):
    return {"vpo": {("sampling", "smollm2"): vpo_tok_s, ("grpo_step", "smollm2"): vpo_step_s},
            "peer": {("hf_generate", "smollm2"): hf_tok_s, ("trl_grpo", "smollm2"): trl_step_s},
            "memory": {}}


def _cells(rows, work, peer):
    row = next(r for r in rows if r.startswith(f"| {work} |") and f"| {peer} |" in r)
    return [c.strip() for c in row.strip("|").split("|")]


def test_six_paired_rounds_give_an_interval_and_a_verdict(bench):
    # round ratios 3.1 ... 3.6 for sampling (a peer that drifts; vpo drifts with it)
    hf = [50.0, 60.0, 70.0, 55.0, 65.0, 75.0]
    ratios = [3.1, 3.2, 3.3, 3.4, 3.5, 3.6]
    res = _res([h * r for h, r in zip(hf, ratios, strict=True)], hf, [10.0] * 6,
               [25.0, 19.0, 30.0, 21.0, 22.0, 18.0])
    rows = bench.table(res)
    s = _cells(rows, "sampling", "hf_generate")
    assert s[6] == "3.35x [3.10, 3.60]"  # 6 rounds: the extremes are the 96.9% sign interval
    assert s[-1] == "yes"
    g = _cells(rows, "grpo step", "faster (trl_grpo)")
    assert g[5] == "2.15x" and g[-1] == "yes"  # median 21.5 s / 10 s
    assert g[6] == "2.15x [1.80, 3.00]"


def test_few_rounds_say_so_and_a_short_ratio_fails_the_goal(bench):
    res = _res([200.0, 210.0], [70.0, 71.0], [17.0, 18.0], [30.0, 34.0])
    rows = bench.table(res)
    s = _cells(rows, "sampling", "hf_generate")
    assert s[6].endswith("(< 6 rounds)")
    assert s[-1] == "NO"  # 205 / 70.5 = 2.91x < 3x


def test_memory_breakdown_sets_the_adamw_floor_against_the_budget(bench):
    res = _res([1.0], [1.0], [1.0], [1.0])
    assert bench.memory_breakdown_line(res | {"breakdown": {}}) is None
    res["memory"] = {("vpo_grpo_step", "smollm2"): [4600.0, 4500.0],
                     ("trl_grpo", "smollm2"): [4400.0, 4200.0]}
    res["breakdown"] = {"smollm2": dict(params=500.0, opt_state=1000.0, temp=2000.0,
                                        rss_before_step=2400.0)}
    line = bench.memory_breakdown_line(res)
    assert "peak 4,550" in line and "XLA temporaries 2,000" in line
    # floor 2 x 500 + 1000 = 2000 MB against TRL's median peak 4300 / 2 = 2150 MB
    assert "is 2,000 = 93% of the goal's budget (TRL's peak / 2 = 2,150)" in line
