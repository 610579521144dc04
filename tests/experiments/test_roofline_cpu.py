"""experiments/roofline_cpu.py (the SmolLM2 race's GEMM lower bound): its product list and FLOP
count match a hand count, and the bound is the sum of the timed products."""

import pytest

# three layers of two products and a head, so every product the bound times can be listed by hand
SHAPES = {"layers": 3, "layer": {"up": (4, 6), "down": (6, 4)}, "head": (4, 10)}


@pytest.fixture(scope="module")
def roof(load_experiment):
    return load_experiment("roofline_cpu")


def test_flops_match_a_hand_count(roof):
    # per row: 3 layers x (2*4*6 + 2*6*4) + head 2*4*10 on head rows only
    assert roof.flops(SHAPES, 5, 2) == 5 * 3 * (48 + 48) + 2 * 80


def test_bound_is_the_sum_of_the_timed_products(roof):
    calls = []

    def seconds(M, K, N):  # a product "takes" M*K*N microseconds
        calls.append((M, K, N))
        return M * K * N * 1e-6

    b = roof.bounds(SHAPES, seconds)
    B, G, P, T = roof.B, roof.G, roof.P, roof.T

    def fwd(M, head_rows):
        return 3 * (M * 24 + M * 24) * 1e-6 + head_rows * 40 * 1e-6

    def bwd(M, head):  # dX = dY Wᵀ and dW = Xᵀ dY: the same M*K*N each
        return 2 * fwd(M, M if head else 0)

    sampling = fwd(B * P, B) + T * fwd(B * G, B * G)
    update = fwd(B * P, 0) + fwd(B * G * T, B * G * T) + bwd(B * P, False) + bwd(B * G * T, True)
    assert b["sampling_s"] == pytest.approx(sampling)
    assert b["update_s"] == pytest.approx(update)
    assert b["step_s"] == pytest.approx(sampling + update)
    assert b["sampling_tok_s"] == pytest.approx(B * G * T / sampling)
    # the backward products are the transposed shapes, not the forward ones again
    assert (B * G * T, 4, 6) in calls and (B * G * T, 6, 4) in calls and (4, B * G * T, 6) in calls


def test_measured_bounds_take_the_faster_library_per_product(roof, monkeypatch):
    def fake(M, K, N, reps):  # XLA wins where N > K, BLAS elsewhere
        return {"xla": 1e-6 * M * K * N * (1 if N > K else 3), "blas": 2e-6 * M * K * N}

    monkeypatch.setattr(roof, "time_product", fake)
    got = roof.measured_bounds(SHAPES, reps=1)
    best = roof.bounds(SHAPES, lambda *mkn: min(fake(*mkn, 1).values()))
    xla = roof.bounds(SHAPES, lambda *mkn: fake(*mkn, 1)["xla"])
    assert got["step_s"] == pytest.approx(best["step_s"])
    assert got["xla_only"]["step_s"] == pytest.approx(xla["step_s"])
    assert xla["step_s"] > best["step_s"] > 0
    assert set(got["products"]["2x4x10"]) == {"xla", "blas"}


def test_time_product_is_positive_for_both_libraries(roof):
    t = roof.time_product(8, 8, 8, 2)
    assert set(t) == {"xla", "blas"} and all(v > 0 for v in t.values())


def test_decode_chain_runs_every_product_of_every_layer_and_step(roof):
    np = pytest.importorskip("numpy")
    fn, (layers, head), x0 = roof.decode_chain(SHAPES, M=2, steps=3)
    out = np.asarray(fn((layers, head), x0))
    x = np.asarray(x0, np.float64)
    for _ in range(3):  # the same chain in NumPy: a skipped product would change the result
        for layer in layers:
            latest = {4: x}
            for w in layer:
                w = np.asarray(w, np.float64)
                latest[w.shape[1]] = latest[w.shape[0]] @ w
                if w.shape[1] == 4:
                    x = x + latest[4]
        x = x + 1e-3 * (x @ np.asarray(head, np.float64))[:, :4]
    np.testing.assert_allclose(out, x, rtol=1e-5)
    assert roof.decode_loop_seconds(SHAPES, 2, 3, reps=2) > 0
