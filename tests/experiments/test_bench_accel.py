"""experiments/bench_accel.py (the accelerator benchmark) at a tiny shape on CPU: it runs end to
end, and its FLOP and roofline-byte formulas match hand counts."""

import json
import math
from types import SimpleNamespace

import pytest

from vpo.config import model_preset


@pytest.fixture(scope="module")
def bench(load_experiment):
    return load_experiment("bench_accel")


@pytest.fixture(scope="module")
def result(bench, tmp_path_factory):
    path = tmp_path_factory.mktemp("accel") / "accel.json"
    res = bench.main(["--preset", "tiny", "--dtype", "float32", "--B", "2", "--G", "2",
                      "--P", "4", "--T", "4", "--reps", "1", "--grad-accum", "1",
                      "--json", str(path)])
    return res, json.loads(path.read_text())


@pytest.mark.slow
def test_tiny_run_reports_finite_positive_speeds(result):
    res, written = result
    assert written == json.loads(json.dumps(res))
    for key in ("sample_tok_s", "decode_tok_s", "rl_step_tok_s", "update_tok_s",
                "update_seq_tok_s", "update_flops", "peak_mem_bytes"):
        assert math.isfinite(written[key]) and written[key] > 0, (key, written[key])
    assert written["platform"] == "cpu" and written["preset"] == "tiny"
    assert written["grad_accum_used"] == 1
    assert "--preset tiny" in written["command"]


@pytest.mark.slow
def test_mfu_and_roofline_are_na_on_cpu(result, bench):
    _, written = result
    assert written["update_mfu"] is None and written["peak_flops"] is None
    assert written["decode_roofline_frac"] is None and written["hbm_bw"] is None
    rows = bench.table(written)
    assert any(r.startswith("| update MFU | n/a |") for r in rows)
    assert any(r.startswith("| decode HBM roofline | n/a |") for r in rows)


def test_update_flops_by_hand(bench):
    # tiny: V=64, D=32, L=2, H=4, E=8, tied; N = 20,640, so N_body = 20,640 - 64*32 = 18,592
    cfg = model_preset("tiny")
    assert cfg.num_params == 20_640
    B, G, P, T = 2, 2, 8, 8
    f = bench.update_flops(cfg, B, G, P, T)
    matmul = 6 * 18_592 * (2 * 8 + 2 * 2 * 8) + 6 * 2048 * (2 * 2 * 8)  # 5,354,496 + 393,216
    # causal contexts: prompts 2 * (1+...+8) = 72; completions 4 * (8*8 + (1+...+8)) = 400
    attention = 12 * 2 * 4 * 8 * (72 + 400)
    assert f["matmul"] == matmul == 5_747_712
    assert f["attention"] == attention == 362_496
    assert f["total"] == matmul + attention
    # untied: the table is not compute, the LM head is (6·V·D per completion token)
    untied = model_preset("tiny", tie_embeddings=False)
    assert bench.update_flops(untied, B, G, P, T)["matmul"] == matmul


def test_update_flops_reproduces_the_prime_rl_anchor(bench):
    """Qwen3-0.6B at 11.9k tokens/s on one H100 is 11.1% MFU by the same convention (a packed
    16K sequence: 6 N + 6 L H E S per token)."""
    cfg = model_preset("qwen3-0.6b")
    S = 16384
    per_token = bench.update_flops(cfg, 1, 1, 0, S)["total"] / S  # one sequence, no prompt
    assert per_token == pytest.approx(6 * cfg.num_params + 6 * 28 * 16 * 128 * (S + 1),
                                      rel=1e-12)
    assert per_token * 11.9e3 / 989e12 == pytest.approx(0.111, abs=0.001)


def test_decode_bytes_by_hand(bench):
    cfg = model_preset("tiny")  # float32: 4 bytes a parameter and a cache entry
    B, G, P, T = 2, 2, 8, 8
    d = bench.decode_bytes(cfg, B, G, P, T)
    kv_per_token = 2 * 2 * 2 * 8 * 4  # L * (k, v) * N * E * bytes = 256
    assert d["params"] == 20_640 * 4
    assert d["kv"] == kv_per_token * (2 * 8 + 2 * 2 * (8 + 1) / 2) == 8704
    assert d["total"] == 82_560 + 8704
    q = model_preset("qwen2.5-0.5b")  # bf16: the 0.99 GB of weights every step reads
    assert bench.decode_bytes(q, 16, 8, 256, 512)["params"] == q.num_params * 2


def test_device_tables(bench):
    h100 = SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
    pcie = SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 PCIe")
    h200 = SimpleNamespace(platform="gpu", device_kind="NVIDIA H200")
    cpu = SimpleNamespace(platform="cpu", device_kind="cpu")
    assert bench.hbm_bandwidth(h100) == 3.35e12 and bench.peak_flops(h100) == 989e12
    assert bench.hbm_bandwidth(pcie) == 2.0e12
    assert bench.hbm_bandwidth(h200) == 4.8e12
    assert bench.hbm_bandwidth(cpu) is None and bench.peak_flops(cpu) is None
