"""Benchmark: jitted `vpo_advantages` against a straightforward per-group NumPy loop.

Both compute the VPO advantage for B=128 prompts x G=8 rollouts x M=3 answers x R=5 components with
K=100 Dirichlet(1) weights per group. The NumPy baseline follows the authors' reference semantics
literally: a Python loop over groups, `rng.dirichlet` per group, one `(R_g @ W.T).max(0).mean()`
per rollout, population-std z-score. The jitted versions draw the weights i.i.d. (the paper's
sampler: normalised exponentials, K * R random numbers per group) or as a randomly shifted lattice
(R - 1 random numbers per group). Repetitions of all variants are interleaved so that they share
the machine's load; times are medians, the jit compile time is reported separately, and the script
prints ratios only (no assertions).

Also printed, for the profile of the jitted call (same inputs, same interleaving): `floor
dispatch`, a jitted function with the same arguments and outputs that does no work (the fixed
cost of one jitted call on this backend); `given weights`, `vpo_advantages` on weights drawn
outside the timed call (the cost without the Dirichlet draw); `draw only`, the i.i.d. Dirichlet
weights alone (the weights are drawn inside the timed call, as the NumPy loop draws
`rng.dirichlet` inside its loop).

Run:  .venv/bin/python experiments/bench_advantages.py
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from vpo import objectives


def get_config() -> dict:
    return dict(B=128, G=8, M=3, R=5, K=100, reps=30, jax_calls_per_rep=10, seed=0)


def numpy_loop(rewards_BGMR: np.ndarray, mask_BGM: np.ndarray, K: int, rng, eps=1e-6) -> np.ndarray:
    """Per-group Python loop with NumPy inside (the baseline; VPO's advantages,
    arXiv 2605.22817)."""
    B, G, _, R = rewards_BGMR.shape
    adv_BG = np.zeros((B, G))
    for b in range(B):
        W_KR = rng.dirichlet(np.ones(R), size=K)  # shared by the group's rollouts
        raw_G = np.zeros(G)
        for g in range(G):
            answers = rewards_BGMR[b, g][mask_BGM[b, g]]
            if len(answers):
                raw_G[g] = (answers @ W_KR.T).max(0).mean()
        sd = raw_G.std()
        adv_BG[b] = 0.0 if sd < eps else (raw_G - raw_G.mean()) / (sd + eps)
    return adv_BG


def main(cfg: dict | None = None) -> dict:
    cfg = get_config() if cfg is None else cfg
    B, G, M, R, K = (cfg[k] for k in "BGMRK")
    rng = np.random.default_rng(cfg["seed"])
    rewards = rng.uniform(size=(B, G, M, R)).astype(np.float32)
    mask = np.ones((B, G, M), bool)
    r_dev, m_dev = jnp.asarray(rewards), jnp.asarray(mask)
    key = jax.random.key(cfg["seed"])
    n_calls = cfg["jax_calls_per_rep"]
    keys = [jax.random.fold_in(key, i) for i in range(n_calls)]  # made outside the timed region

    compiled, compile_s = {}, {}
    for sampler in ("iid", "lattice"):
        fn = jax.jit(
            lambda r, m, k, s=sampler: objectives.vpo_advantages(
                k, r, m, num_weights=K, sampler=s
            )
        )
        t0 = time.perf_counter()
        compiled[sampler] = fn.lower(r_dev, m_dev, key).compile()
        compile_s[sampler] = time.perf_counter() - t0
        jax.block_until_ready(compiled[sampler](r_dev, m_dev, key))  # warm-up
    # The profile rows: fixed cost of a call, the advantage on given weights, the draw alone.
    w_dev = objectives.dirichlet_weights(key, B, K, R)

    def empty(r, m, k):
        return r[:, :, 0, 0], {n: r[0, 0, 0, 0] for n in ("a", "b", "c", "d", "e")}

    profile = {
        "floor_dispatch": (jax.jit(empty), None),
        "given_weights": (
            jax.jit(lambda r, m, w: objectives.vpo_advantages(r, m, weights_BKR=w)),
            w_dev,
        ),
        "draw_only": (
            jax.jit(lambda r, m, k: objectives.dirichlet_weights(k, B, K, R)),
            None,
        ),
    }
    for name, (fn, w) in profile.items():
        compiled[name] = fn.lower(r_dev, m_dev, key if w is None else w).compile()
        jax.block_until_ready(compiled[name](r_dev, m_dev, key if w is None else w))
    numpy_loop(rewards, mask, K, rng)

    times = {"numpy": [], "iid": [], "lattice": [], **{n: [] for n in profile}}
    for _ in range(cfg["reps"]):
        t0 = time.perf_counter()
        numpy_loop(rewards, mask, K, rng)
        times["numpy"].append(time.perf_counter() - t0)
        for sampler, fn in compiled.items():
            w = profile[sampler][1] if sampler in profile else None
            t0 = time.perf_counter()
            for k in keys:
                jax.block_until_ready(fn(r_dev, m_dev, k if w is None else w))
            times[sampler].append((time.perf_counter() - t0) / n_calls)
    med = {name: float(np.median(ts)) for name, ts in times.items()}

    print(f"B={B} G={G} M={M} R={R} K={K}; backend={jax.default_backend()}")
    print(f"numpy per-group loop:        median {med['numpy'] * 1e3:8.3f} ms")
    out = {"numpy_ms": med["numpy"] * 1e3}
    for sampler in ("iid", "lattice"):
        speedup = med["numpy"] / med[sampler]
        out[sampler] = dict(ms=med[sampler] * 1e3, compile_s=compile_s[sampler], speedup=speedup)
        print(
            f"jit vpo_advantages {sampler:>8}: median {med[sampler] * 1e3:8.3f} ms "
            f"(compile {compile_s[sampler]:.2f} s, once)  ->  {speedup:6.1f}x faster"
        )
    out["profile_ms"] = {n: med[n] * 1e3 for n in profile}
    print(
        "profile (ms): "
        + ", ".join(f"{n.replace('_', ' ')} {med[n] * 1e3:.3f}" for n in profile)
        + f"; 50x needs <= {med['numpy'] / 50 * 1e3:.3f}"
    )
    return out


if __name__ == "__main__":
    main()
