"""Sampler throughput: KV-cache sampler vs a no-cache reference, and prefix-sharing savings.

Run:  python experiments/bench_sampler.py            (add --quick for a 1-point smoke run)

Prints, for each (preset, B, G, P, T), generated tokens/s of `vpo.rollout.sampler` and of a naive
sampler that re-runs the full forward over the whole [B*G, P+T] buffer for every new token (same
model, same keys, measured in the same run; medians over repetitions, compile time separate), and
their ratio. Then the prefill saving of prefix sharing: one prompt with G=8 samples sharing its
prefill vs 8 copies of the prompt (XLA-counted FLOPs of the whole generate call, and prefill time).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vpo.config import SamplerConfig, model_preset
from vpo.model.decoder import Decoder
from vpo.rollout.sampler import generate_jit

STOP, PAD = (-1,), 0  # a stop id no token takes: every sample runs the full T tokens


def get_config():
    return dict(points=[("tiny", 8, 8, 32, 64), ("tiny", 8, 8, 32, 128),
                        ("small", 8, 8, 32, 64)], repeats=5)


@functools.partial(jax.jit, static_argnames=("graphdef", "T"))
def naive_generate(graphdef, state, prompts_BP, keys_BG, *, T):
    """No KV cache: every step runs the full causal forward over the whole buffer."""
    model = nnx.merge(graphdef, state)
    B, G = keys_BG.shape
    P = prompts_BP.shape[1]
    buf = jnp.concatenate([jnp.repeat(prompts_BP, G, 0), jnp.full((B * G, T), PAD, jnp.int32)], 1)
    mask = jnp.arange(P + T)[None, :] < jnp.full((B * G, 1), P)
    keys = keys_BG.reshape(B * G)

    def body(t, carry):
        buf, mask = carry
        logits = jax.lax.dynamic_index_in_dim(model(buf, mask), P - 1 + t, 1, keepdims=False)
        step_keys = jax.vmap(jax.random.fold_in, (0, None))(keys, t)
        tok = jax.vmap(jax.random.categorical)(step_keys, logits).astype(jnp.int32)
        return buf.at[:, P + t].set(tok), mask.at[:, P + t].set(True)

    return jax.lax.fori_loop(0, T, body, (buf, mask))[0][:, P:]


def time_calls(fn, repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def bench_point(preset, B, G, P, T, repeats):
    model = Decoder(model_preset(preset, max_seq_len=P + T), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    prompts = jnp.asarray(np.random.default_rng(0).integers(3, 64, (B, P)), jnp.int32)
    mask = jnp.ones((B, P), bool)
    keys = jax.random.split(jax.random.key(0), B * G).reshape(B, G)
    cfg = SamplerConfig(max_new_tokens=T, num_samples=G)
    cached = functools.partial(generate_jit, graphdef, state, prompts, mask, keys,
                               jnp.float32(cfg.temperature), jnp.float32(1.0), jnp.int32(0),
                               max_new_tokens=T, stop_ids=STOP, pad_id=PAD)
    naive = functools.partial(naive_generate, graphdef, state, prompts, keys, T=T)
    c_first, c_t = time_calls(cached, repeats)
    n_first, n_t = time_calls(naive, max(1, repeats // 2))
    toks = B * G * T
    print(f"{preset:6s} B={B:3d} G={G:2d} P={P:3d} T={T:4d} | cached {toks / c_t:10,.0f} tok/s "
          f"(compile+first {c_first:5.2f}s) | no-cache {toks / n_t:9,.0f} tok/s "
          f"(compile+first {n_first:5.2f}s) | ratio {n_t / c_t:6.1f}x", flush=True)


def bench_prefix_sharing(preset="small", G=8, P=128, T=8):
    model = Decoder(model_preset(preset, max_seq_len=P + T), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    prompt = jnp.asarray(np.random.default_rng(1).integers(3, 64, (1, P)), jnp.int32)
    args = (jnp.float32(1.0), jnp.float32(1.0), jnp.int32(0))

    def flops(prompts, keys):
        lowered = generate_jit.lower(graphdef, state, prompts, jnp.ones(prompts.shape, bool),
                                      keys, *args, max_new_tokens=T, stop_ids=STOP, pad_id=PAD)
        return lowered.compile().cost_analysis()["flops"]

    keys = jax.random.split(jax.random.key(0), G)
    shared = flops(prompt, keys.reshape(1, G))
    copies = flops(jnp.repeat(prompt, G, 0), keys.reshape(G, 1))
    prefill = jax.jit(lambda s, t: nnx.merge(graphdef, s).prefill(t)[0])
    _, t_one = time_calls(lambda: prefill(state, prompt), 20)
    _, t_many = time_calls(lambda: prefill(state, jnp.repeat(prompt, G, 0)), 20)
    print(f"prefix sharing ({preset}, P={P}, T={T}, G={G}): whole-call FLOPs shared/copies = "
          f"{shared / copies:.3f} ({shared:.3g} vs {copies:.3g}); prefill time 1 prompt vs {G} "
          f"copies: {t_one * 1e3:.2f} ms vs {t_many * 1e3:.2f} ms ({t_many / t_one:.1f}x)")
    for g in (1, 4, 16):
        f = flops(prompt, jax.random.split(jax.random.key(0), g).reshape(1, g))
        print(f"  G={g:2d}: whole-call FLOPs {f:.4g}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small point, fewer repeats")
    args = parser.parse_args(argv)
    cfg = get_config()
    points = cfg["points"][:1] if args.quick else cfg["points"]
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} x{jax.device_count()}")
    for p in points:
        bench_point(*p, repeats=2 if args.quick else cfg["repeats"])
    bench_prefix_sharing()


if __name__ == "__main__":
    main()
