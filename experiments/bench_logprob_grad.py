"""The log-prob + entropy pass with its gradient, against the same pass from another revision.

Run:  git show REV:kernels/logprob_entropy.py > /tmp/old.py
      python experiments/bench_logprob_grad.py --baseline /tmp/old.py [--N 2048] [--D 576]
          [--V 49152] [--block-v 4096] [--dtype float32] [--rounds 7]

Times `jax.value_and_grad` of Σ w·logp + 0.1·Σ entropy through `logprob_entropy_chunked`
(hidden [N, D] and a tied [V, D] table, SmolLM2-135M's width and vocabulary by default) as this
tree has it and as the `--baseline` file has it (loaded as its own module, in the same process),
alternated over rounds: the median of per-round ratios (baseline time / this time) with the
range, each side's median, the largest gradient difference between the two, and the
materialised reference (`logprob_entropy_reference`) for scale.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from vpo.kernels import logprob_entropy as current


def load(path: str):
    spec = importlib.util.spec_from_file_location("logprob_entropy_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def gradient_fn(module, targets_N, weight_N, block_v: int | None):
    def loss(h, embed):
        w = embed.T
        if block_v is None:
            logp, ent = module.logprob_entropy_reference(h, w, targets_N)
        else:
            logp, ent = module.logprob_entropy_chunked(h, w, targets_N, block_v)
        return jnp.sum(weight_N * logp) + 0.1 * jnp.sum(ent)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="a logprob_entropy.py of another revision")
    ap.add_argument("--N", type=int, default=2048)
    ap.add_argument("--D", type=int, default=576)
    ap.add_argument("--V", type=int, default=49152)
    ap.add_argument("--block-v", type=int, default=4096)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    dtype = jnp.dtype(a.dtype)
    h = jax.random.normal(k1, (a.N, a.D)).astype(dtype)
    embed = (0.05 * jax.random.normal(k2, (a.V, a.D))).astype(dtype)
    targets = jax.random.randint(k3, (a.N,), 0, a.V)
    weight = jnp.linspace(-1.0, 1.0, a.N)
    fns = {"this tree": gradient_fn(current, targets, weight, a.block_v),
           "baseline": gradient_fn(load(a.baseline), targets, weight, a.block_v),
           "reference": gradient_fn(current, targets, weight, None)}
    out = {}
    for name, f in fns.items():
        t0 = time.perf_counter()
        out[name] = jax.block_until_ready(f(h, embed))
        print(f"{name}: compile + first call {time.perf_counter() - t0:.1f} s")
    diff = max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32))))
               for x, y in zip(jax.tree.leaves(out["this tree"]), jax.tree.leaves(out["baseline"]),
                               strict=True))
    times = {name: [] for name in fns}
    for r in range(a.rounds):
        order = list(fns) if r % 2 == 0 else list(reversed(fns))
        for name in order:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name](h, embed))
            times[name].append(time.perf_counter() - t0)
    ratios = [b / t for b, t in zip(times["baseline"], times["this tree"], strict=True)]
    print(f"N {a.N} D {a.D} V {a.V} block_v {a.block_v} {a.dtype}, {a.rounds} rounds, "
          f"jax {jax.__version__} on {jax.devices()[0].platform}")
    for name, ts in times.items():
        print(f"  {name:9s} median {statistics.median(ts) * 1e3:8.1f} ms "
              f"[{min(ts) * 1e3:.1f}, {max(ts) * 1e3:.1f}]")
    scale = float(np.max(np.abs(np.asarray(out["baseline"][1][1], np.float32))))
    print(f"  this tree is {statistics.median(ratios):.3f}x the baseline's speed "
          f"[{min(ratios):.3f}, {max(ratios):.3f}]; largest difference of the loss and "
          f"gradients: {diff:.2e} (largest table gradient {scale:.2e})")


if __name__ == "__main__":
    main()
