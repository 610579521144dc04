"""How fast this CPU could run the SmolLM2 race at best: a GEMM roofline (issue 17, item 5).

Run:  python experiments/roofline_cpu.py            (about a minute; prints a table)
      python experiments/roofline_cpu.py --race-json race.json   (figures of a bench_peers run)

The race's workload (`bench_peers.py --sizes smollm2`: B=2 prompts x G=8 samples, a 64-token
prompt, 64 new tokens, one GRPO update) is, apart from attention, norms and sampling, a list of
f32 matrix products of known shapes. This script times each distinct product on its own with
XLA and with NumPy's BLAS (the faster of the two, best of `--reps` warm calls) and adds
them up:

  sampling  = prefill (M = B·P rows through every layer, the LM head on the last position)
              + T decode steps (M = B·G rows through every layer and the LM head)
  update    = forward and backward of the training pass: prefill (M = B·P) and completion
              (M = B·G·T, LM head included); each product X[M,K] @ W[K,N] costs itself,
              dX = dY @ Wᵀ and dW = Xᵀ @ dY.

Everything left out (attention over the cache, norms, rotary, softmax/sampling over V, the
embedding gradient, AdamW) only adds time, so the sums are lower bounds on what a program doing
this workload in f32 with these GEMMs can take on this machine (a faster GEMM library would
lower them). Against a goal "vpo >= r x peer" the script prints the time the goal
allows, the bound, and the fraction of the bound's speed the goal needs (> 1: out of reach on
this hardware in f32). The peers' and vpo's measured figures are flags (defaults: an earlier
`bench_peers.py --sizes smollm2` run) or read from a bench_peers JSON; run both on the same quiet
machine, one after the other: the bound itself is measured here, now.
No assertions: the script prints what it measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

B, G, P, T = 2, 8, 64, 64  # bench_peers.py's smollm2 workload


def smollm2_shapes() -> dict:
    """Layer count and the (K, N) of each weight of SmolLM2-135M (from the GGUF's metadata)."""
    from vpo.io import gguf, hf

    cfg = hf.model_config(gguf.hf_config(gguf.smollm2_path()))
    D, F, hd = cfg.dim, cfg.mlp_dim, cfg.head_dim
    layer = {"q": (D, cfg.num_heads * hd), "k": (D, cfg.num_kv_heads * hd),
             "v": (D, cfg.num_kv_heads * hd), "o": (cfg.num_heads * hd, D),
             "gate": (D, F), "up": (D, F), "down": (F, D)}
    return {"layers": cfg.num_layers, "layer": layer, "head": (D, cfg.vocab_size)}


def _best_time(fn, reps: int) -> float:
    jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best


def time_product(M: int, K: int, N: int, reps: int) -> dict:
    """Best-of-`reps` warm seconds of one f32 [M,K] @ [K,N] product under XLA and under NumPy's
    BLAS (OpenBLAS here) → {"xla": s, "blas": s}."""
    a, b = jnp.ones((M, K), jnp.float32), jnp.ones((K, N), jnp.float32)
    f = jax.jit(jnp.matmul)
    a_np, b_np = np.ones((M, K), np.float32), np.ones((K, N), np.float32)
    return {"xla": _best_time(lambda: f(a, b), reps), "blas": _best_time(lambda: a_np @ b_np, reps)}


def forward_seconds(shapes: dict, M: int, head_rows: int, seconds: Callable) -> float:
    """Every layer's products at M rows, plus the LM head at `head_rows` rows (0: none);
    `seconds(M, K, N)` is the time of one product."""
    per_layer = sum(seconds(M, K, N) for K, N in shapes["layer"].values())
    head = seconds(head_rows, *shapes["head"]) if head_rows else 0.0
    return shapes["layers"] * per_layer + head


def backward_seconds(shapes: dict, M: int, with_head: bool, seconds: Callable) -> float:
    """dX = dY @ Wᵀ and dW = Xᵀ @ dY for every product of the forward at M rows."""
    def both(K, N):
        return seconds(M, N, K) + seconds(K, M, N)
    per_layer = sum(both(K, N) for K, N in shapes["layer"].values())
    return shapes["layers"] * per_layer + (both(*shapes["head"]) if with_head else 0.0)


def flops(shapes: dict, M: int, head_rows: int) -> float:
    layer = sum(2 * M * K * N for K, N in shapes["layer"].values())
    K, N = shapes["head"]
    return shapes["layers"] * layer + 2 * head_rows * K * N


def bounds(shapes: dict, seconds: Callable) -> dict:
    """The sampling, update and step lower bounds (module docstring) from `seconds(M, K, N)`."""
    prefill = forward_seconds(shapes, B * P, B, seconds)
    decode_step = forward_seconds(shapes, B * G, B * G, seconds)
    sampling = prefill + T * decode_step
    update = (forward_seconds(shapes, B * P, 0, seconds)
              + forward_seconds(shapes, B * G * T, B * G * T, seconds)
              + backward_seconds(shapes, B * P, False, seconds)
              + backward_seconds(shapes, B * G * T, True, seconds))
    update_flops = 3 * (flops(shapes, B * P, 0) + flops(shapes, B * G * T, B * G * T))
    return {"sampling_s": sampling, "sampling_tok_s": B * G * T / sampling,
            "decode_step_s": decode_step,
            "decode_gflop_s": flops(shapes, B * G, B * G) / decode_step / 1e9,
            "update_s": update, "update_gflop_s": update_flops / update / 1e9,
            "step_s": sampling + update}


def measured_bounds(shapes: dict, reps: int) -> dict:
    """Bounds with the faster library per product ("best") and with XLA's products only
    ("xla"), and every product's timings."""
    times: dict = {}

    def timed(M, K, N):
        if (M, K, N) not in times:
            times[(M, K, N)] = time_product(M, K, N, reps)
        return times[(M, K, N)]

    best = bounds(shapes, lambda *mkn: min(timed(*mkn).values()))
    xla = bounds(shapes, lambda *mkn: timed(*mkn)["xla"])
    products = {f"{m}x{k}x{n}": {lib: {"s": t, "gflop_s": 2 * m * k * n / t / 1e9}
                                 for lib, t in libs.items()}
                for (m, k, n), libs in times.items()}
    return {**best, "xla_only": xla, "products": products,
            "best_gflop_s": max(v["gflop_s"] for p in products.values() for v in p.values())}


def decode_chain(shapes: dict, M: int, steps: int, seed: int = 0):
    """The decode's products as one jitted loop of `steps` steps over all layers, each layer with
    its own weights (as in a real decode step every weight is read from memory, not from cache)
    → (fn, weights, x0); `fn(weights, x0)` returns the chained activations. Each product takes
    the latest output of its input width (the residual [M, D] first) and the layer's D-wide
    outputs are added to the residual, so no product can be skipped; 1e-3-scaled head logits
    feed back into the next step."""
    rng = np.random.default_rng(seed)
    D = shapes["head"][0]
    weights = [[jnp.asarray(rng.normal(0, 0.02, kn), jnp.float32)  # a list: the layer's order
                for kn in shapes["layer"].values()] for _ in range(shapes["layers"])]
    head = jnp.asarray(rng.normal(0, 0.02, shapes["head"]), jnp.float32)

    def fn(ws, x0):
        layers, head_w = ws

        def step(_, x):
            for layer in layers:
                latest = {D: x}
                for w in layer:
                    latest[w.shape[1]] = latest[w.shape[0]] @ w
                    if w.shape[1] == D:
                        x = x + latest[D]
            return x + 1e-3 * (x @ head_w)[:, :D]

        return jax.lax.fori_loop(0, steps, step, x0)

    return jax.jit(fn), (weights, head), jnp.full((M, D), 0.1, jnp.float32)


def decode_loop_seconds(shapes: dict, M: int, steps: int, reps: int) -> float:
    """Best-of-`reps` seconds per decode step of `decode_chain` (products only, weights
    streamed): a tighter sampling bound than the sum of products timed with warm weights."""
    fn, ws, x0 = decode_chain(shapes, M, steps)
    return _best_time(lambda: fn(ws, x0), reps) / steps


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--hf-tok-s", type=float, default=55.0, help="HF generate's tokens/s")
    ap.add_argument("--trl-step-s", type=float, default=48.4, help="TRL's seconds per step")
    ap.add_argument("--vpo-tok-s", type=float, default=155.0, help="vpo's sampling tokens/s")
    ap.add_argument("--vpo-step-s", type=float, default=19.7, help="vpo's seconds per step")
    ap.add_argument("--race-json", help="take the four figures from a `bench_peers.py --sizes "
                    "smollm2 --json` file (medians over its rounds) instead")
    ap.add_argument("--json", help="also write the numbers here")
    a = ap.parse_args(argv)
    if a.race_json:
        with open(a.race_json) as f:
            race = json.load(f)
        a.vpo_tok_s = statistics.median(race["vpo"]["sampling|smollm2"])
        a.vpo_step_s = statistics.median(race["vpo"]["grpo_step|smollm2"])
        a.hf_tok_s = statistics.median(race["peer"]["hf_generate|smollm2"])
        a.trl_step_s = statistics.median(race["peer"]["trl_grpo|smollm2"])
    shapes = smollm2_shapes()
    b = measured_bounds(shapes, a.reps)
    loop_step_s = decode_loop_seconds(shapes, B * G, T, max(2, a.reps // 3))
    sampling_goal = 3.0 * a.hf_tok_s  # tokens/s
    step_goal = a.trl_step_s / 2.0  # seconds
    out = {**b, "sampling_goal_tok_s": sampling_goal, "step_goal_s": step_goal,
           "sampling_goal_needs": sampling_goal / b["sampling_tok_s"],
           "step_goal_needs": b["step_s"] / step_goal,
           "vpo_sampling_of_bound": a.vpo_tok_s / b["sampling_tok_s"],
           "vpo_step_of_bound": b["step_s"] / a.vpo_step_s,
           "decode_loop_step_s": loop_step_s,
           "decode_loop_tok_s": B * G / loop_step_s}
    print(f"f32 GEMM roofline of the SmolLM2 race on this machine (best product "
          f"{b['best_gflop_s']:.1f} GFLOP/s; decode products {b['decode_gflop_s']:.1f}, update "
          f"products {b['update_gflop_s']:.1f} GFLOP/s)")
    print("| workload | bound (GEMMs only) | goal | goal needs, of the bound's speed | vpo now, "
          "of the bound's speed |")
    print("|---|---|---|---|---|")
    print(f"| sampling | {b['sampling_tok_s']:.0f} tok/s | >= {sampling_goal:.0f} tok/s (3 x HF "
          f"{a.hf_tok_s:g}) | {out['sampling_goal_needs']:.0%} | {out['vpo_sampling_of_bound']:.0%}"
          f" ({a.vpo_tok_s:g} tok/s) |")
    print(f"| GRPO step | {b['step_s']:.1f} s (sampling {b['sampling_s']:.1f} + update "
          f"{b['update_s']:.1f}) | <= {step_goal:.1f} s (TRL {a.trl_step_s:g} / 2) | "
          f"{out['step_goal_needs']:.0%} | {out['vpo_step_of_bound']:.0%} ({a.vpo_step_s:g} s) |")
    x = b["xla_only"]
    print(f"With XLA's own products only: sampling {x['sampling_tok_s']:.0f} tok/s (decode "
          f"products {x['decode_gflop_s']:.1f} GFLOP/s), step {x['step_s']:.1f} s (sampling "
          f"{x['sampling_s']:.1f} + update {x['update_s']:.1f}; update products "
          f"{x['update_gflop_s']:.1f} GFLOP/s)")
    print(f"The decode products alone in one jitted loop, every layer's weights streamed from "
          f"memory: {loop_step_s * 1e3:.1f} ms per step, {out['decode_loop_tok_s']:.0f} tok/s "
          f"without the prefill (3 x HF needs {sampling_goal:.0f}; vpo {a.vpo_tok_s:g})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
