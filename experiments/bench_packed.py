"""The update's log-prob + loss + gradient pass, packed against padded, on long-tail lengths.

Run:  python experiments/bench_packed.py                  (tiny model, a few minutes on CPU)
      python experiments/bench_packed.py --model smollm2-135m --batch 1 --T 128

One batch of B prompts × G completions with real lengths drawn log-uniformly from
[--min-len, T] (most completions short, a few near the budget, as RL rollouts are), random
tokens. Both arms compute `value_and_grad` of `objectives.policy_loss` (token-mean, PPO clip,
k3 KL and entropy terms) on `vpo.rl.step.completion_logp`'s log-probs: padded over B·G·T
positions, packed (`pack_rows` = the most rows any prompt's completions need, first-fit
decreasing, `vpo.rl.packing`) over B·(G + R·(T − 1)). The arms alternate over the repeats (a
loaded machine slows both alike); medians. tokens/s counts real completion tokens. The loss
and gradient differences of the two arms are printed with the times.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vpo import objectives
from vpo.config import model_preset
from vpo.model.decoder import Decoder
from vpo.rl import packing
from vpo.rl import step as step_lib


def long_tail_lengths_BG(rng: np.random.Generator, B: int, G: int, lo: int, T: int):  # noqa: N802
    """Real lengths log-uniform on [lo, T]: L = round(exp(U(log lo, log T)))."""
    return np.rint(np.exp(rng.uniform(np.log(lo), np.log(T), (B, G)))).astype(np.int32)


def make_pass(model_cfg, inputs, pack_rows: int, vocab_block: int):
    """jit: params → ((loss, logp_BGT), grads) of the update's pass with `pack_rows` (0:
    padded); packed, the choice is made as in `update_from_rollout`: a `lax.cond` around the
    gradient, packed when the batch fits, padded otherwise."""
    graphdef, _ = nnx.split(Decoder(model_cfg, rngs=nnx.Rngs(0)), nnx.Param)
    prompt_BP, mask_BP, tokens_BGT, real_BGT, old_logp_BGT, adv_BG = inputs

    def loss(params, plan=None):
        args = (nnx.merge(graphdef, params), prompt_BP, mask_BP, tokens_BGT)
        if plan is None:
            logp, ent = step_lib.completion_logp(*args, vocab_block=vocab_block)
        else:
            logp, ent = step_lib.packed_completion_logp(*args, plan, pack_rows,
                                                         vocab_block=vocab_block)
        value, _ = objectives.policy_loss(
            logp, old_logp_BGT, adv_BG, real_BGT, ref_logp_BGT=old_logp_BGT, entropy_BGT=ent,
            kl_coef=1e-3, entropy_coef=1e-3)
        return value, logp

    grad = jax.value_and_grad(loss, has_aux=True)
    if not pack_rows:
        return jax.jit(grad)

    def chosen(params):
        plan = packing.plan_rows(real_BGT)
        return jax.lax.cond(plan.fits(pack_rows), lambda: grad(params, plan),
                            lambda: grad(params))

    return jax.jit(chosen)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="a model preset (vpo.config.model)")
    parser.add_argument("--batch", type=int, default=8, help="B prompts")
    parser.add_argument("--G", type=int, default=8, help="completions per prompt")
    parser.add_argument("--T", type=int, default=256, help="completion budget")
    parser.add_argument("--prompt", type=int, default=32, help="prompt length P")
    parser.add_argument("--min-len", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vocab-block", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    B, G, T, P = args.batch, args.G, args.T, args.prompt
    cfg = model_preset(args.model, max_seq_len=P + T, param_dtype="float32", dtype="float32")
    rng = np.random.default_rng(args.seed)
    length_BG = long_tail_lengths_BG(rng, B, G, args.min_len, T)
    real_BGT = jnp.arange(T)[None, None, :] < jnp.asarray(length_BG)[..., None]
    V = cfg.vocab_size
    inputs = (jnp.asarray(rng.integers(3, V, (B, P)), jnp.int32), jnp.ones((B, P), bool),
              jnp.asarray(rng.integers(3, V, (B, G, T)), jnp.int32), real_BGT,
              jnp.asarray(rng.normal(-np.log(V), 0.1, (B, G, T)), jnp.float32),
              jnp.asarray(rng.normal(0.0, 1.0, (B, G)), jnp.float32))
    plan = packing.plan_rows(real_BGT)
    R = int(jnp.max(plan.rows_needed_B))
    real_tokens = int(length_BG.sum())
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; model {args.model} "
          f"({cfg.num_params:,} params, V={V}), f32; B={B} G={G} T={T} P={P}; lengths "
          f"log-uniform [{args.min_len}, {T}]: mean {length_BG.mean():.1f}, median "
          f"{np.median(length_BG):.0f}, max {length_BG.max()}; {real_tokens} real tokens")
    print(f"padded: {B * G * T} positions; packed: R={R} rows of {T - 1} per prompt, "
          f"{B * (G + R * (T - 1))} positions ({real_tokens / (B * R * (T - 1) + B * G):.0%} "
          f"real; padded {real_tokens / (B * G * T):.0%})")
    params = nnx.state(Decoder(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    arms = {"padded": make_pass(cfg, inputs, 0, args.vocab_block),
            "packed": make_pass(cfg, inputs, R, args.vocab_block)}
    out, times = {}, {name: [] for name in arms}
    for name, fn in arms.items():
        t0 = time.perf_counter()
        out[name] = jax.block_until_ready(fn(params))
        print(f"{name}: compile + first call {time.perf_counter() - t0:.1f} s", flush=True)
    for _ in range(args.repeats):
        for name, fn in arms.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(params))
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(t) for name, t in times.items()}
    for name in arms:
        q = np.percentile(times[name], [25, 75])
        print(f"{name:7s} {med[name] * 1e3:9.1f} ms [{q[0] * 1e3:.1f}, {q[1] * 1e3:.1f}]  "
              f"{real_tokens / med[name]:12,.0f} real tokens/s")
    (l_pad, lp_pad), g_pad = out["padded"]
    (l_pack, lp_pack), g_pack = out["packed"]
    d_logp = float(jnp.max(jnp.where(real_BGT, jnp.abs(lp_pack - lp_pad), 0.0)))
    d_grad = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                 zip(jax.tree.leaves(g_pack), jax.tree.leaves(g_pad), strict=True))
    g_scale = max(float(jnp.max(jnp.abs(b))) for b in jax.tree.leaves(g_pad))
    print(f"packed/padded speed-up {med['padded'] / med['packed']:.2f}x; loss padded "
          f"{float(l_pad):.7f} packed {float(l_pack):.7f} (|Δ| {abs(float(l_pack - l_pad)):.2e}); "
          f"max |Δ logp| {d_logp:.2e}; max |Δ grad| {d_grad:.2e} (max |grad| {g_scale:.2e})")


if __name__ == "__main__":
    main()
