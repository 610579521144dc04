"""Decode cost against the budget T: a suffix cache grown by phases vs the whole-cache path.

Run:  python experiments/bench_decode.py             (add --quick for fewer lengths and repeats)

A decode step used to attend to every slot of a T-slot suffix cache, whatever the number of
tokens generated so far, so a step cost O(T). `vpo.rollout.sampler.generate` now decodes in phases
whose cache length doubles (`vpo.rollout.sampler.decode_windows`, `KVCache.grown`), so a step at
position t reads O(t) slots. Two tables on the same model, old and new alternated in one run
(medians over repeats, the min-max range in brackets):

  1. `steps`: the first 64 decode steps under a budget of T tokens (the RL case of a long
     budget and short answers): tokens/s of `Decoder.extend` steps (greedy), a T-slot cache
     from the start vs the cache grown by the sampler's phases. The goal: flat in T
     (T = 1024 within 25% of T = 64).
  2. `generate`: the whole sampler (`vpo.rollout.sampler.generate`) producing all T tokens, whole
     cache (`decode_block=T`) vs the default phases: the end-to-end gain when every step exists.
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

from vpo.config import model_preset
from vpo.model.decoder import Decoder
from vpo.rollout.sampler import DECODE_BLOCK, decode_windows, generate_jit

STOP, PAD = (-1,), 0  # a stop id no token takes: every sample runs the full T tokens


def get_config():
    return dict(preset="small", B=2, G=8, P=32, steps=64, lengths=(64, 128, 256, 512, 1024),
                repeats=7, generate_repeats=3)


@functools.partial(jax.jit, static_argnames=("graphdef", "G", "cache_len", "steps", "grown"))
def decode_steps(graphdef, state, prompts_BP, *, G, cache_len, steps, grown):
    """Prefill, then `steps` greedy decode steps with a `cache_len`-slot cache → tokens_BGT."""
    model = nnx.merge(graphdef, state)
    B = prompts_BP.shape[0]
    hidden_BPD, prefix = model.prefill(prompts_BP)
    tok_BG = jnp.broadcast_to(jnp.argmax(model.logits(hidden_BPD[:, -1]), -1)[:, None], (B, G))
    ends = decode_windows(cache_len) if grown else (cache_len,)
    cache = model.init_cache(B, G, ends[0])
    carry = (jnp.int32(0), tok_BG.astype(jnp.int32), cache, jnp.zeros((B, G, steps), jnp.int32))

    def body(c):
        t, tok, cache, out = c
        hidden, cache = model.extend(tok[:, :, None], prefix, cache, t)
        nxt = jnp.argmax(model.logits(hidden[:, :, 0]), -1).astype(jnp.int32)
        return t + 1, nxt, cache, out.at[:, :, t].set(nxt)

    for end in ends:  # as `vpo.rollout.sampler.generate`: grow the cache, decode while it has room
        carry = (*carry[:2], carry[2].grown(end), carry[3])
        carry = jax.lax.while_loop(lambda c, end=end: c[0] < min(end, steps), body, carry)
    return carry[3]


def _timed(fn):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def _alternate(fns, repeats):
    """Compile (first call) each fn, then time them alternately → list of (first, [times])."""
    firsts = [_timed(f) for f in fns]
    times = [[] for _ in fns]
    for _ in range(repeats):
        for i, f in enumerate(fns):
            times[i].append(_timed(f))
    return list(zip(firsts, times, strict=True))


def _fmt(n_tokens, ts):
    med = statistics.median(ts)
    return f"{n_tokens / med:9,.0f} [{n_tokens / max(ts):7,.0f}-{n_tokens / min(ts):7,.0f}]"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="T in (64, 1024), fewer repeats")
    parser.add_argument("--no-generate", action="store_true", help="only the steps table")
    args = parser.parse_args(argv)
    cfg = get_config()
    lengths = (64, 1024) if args.quick else cfg["lengths"]
    repeats = 3 if args.quick else cfg["repeats"]
    B, G, P, S = cfg["B"], cfg["G"], cfg["P"], cfg["steps"]
    mcfg = model_preset(cfg["preset"], max_seq_len=P + max(lengths))
    model = Decoder(mcfg, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    prompts = jnp.asarray(np.random.default_rng(0).integers(3, mcfg.vocab_size, (B, P)),
                          jnp.int32)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; preset {cfg['preset']} "
          f"({mcfg.num_params / 1e6:.1f}M params, L={mcfg.num_layers} D={mcfg.dim} "
          f"H={mcfg.num_heads} N={mcfg.num_kv_heads}), B={B} G={G} P={P}, first decode window "
          f"{DECODE_BLOCK}")

    print(f"\n1. first {S} decode steps with a T-slot cache: tokens/s, median [min-max] of "
          f"{repeats}")
    print(f"{'T':>5} | {'whole cache (old)':>27} | {'grown cache (new)':>27} | new/old | "
          f"new vs T={lengths[0]}")
    base = None
    for T in lengths:
        fns = [functools.partial(decode_steps, graphdef, state, prompts, G=G, cache_len=T,
                                 steps=S, grown=w) for w in (False, True)]
        (_, old), (_, new) = _alternate(fns, repeats)
        np.testing.assert_array_equal(fns[0](), fns[1]())  # same greedy tokens
        n = B * G * S
        base = base or statistics.median(new)
        print(f"{T:5d} | {_fmt(n, old):>27} | {_fmt(n, new):>27} | "
              f"{statistics.median(old) / statistics.median(new):6.2f}x | "
              f"{base / statistics.median(new) * 100:6.1f}%", flush=True)

    if args.no_generate:
        return
    g_repeats = 2 if args.quick else cfg["generate_repeats"]
    keys = jax.random.split(jax.random.key(0), B * G).reshape(B, G)
    mask = jnp.ones((B, P), bool)
    print(f"\n2. sampler generating all T tokens: tokens/s, median [min-max] of {g_repeats}")
    print(f"{'T':>5} | {'whole cache (old)':>27} | {'grown cache (new)':>27} | new/old")
    for T in lengths:
        fns = [functools.partial(generate_jit, graphdef, state, prompts, mask, keys,
                                 jnp.float32(1.0), jnp.float32(1.0), jnp.int32(0),
                                 max_new_tokens=T, stop_ids=STOP, pad_id=PAD, decode_block=blk)
               for blk in (T, DECODE_BLOCK)]
        (_, old), (_, new) = _alternate(fns, g_repeats)
        n = B * G * T
        print(f"{T:5d} | {_fmt(n, old):>27} | {_fmt(n, new):>27} | "
              f"{statistics.median(old) / statistics.median(new):6.2f}x", flush=True)


if __name__ == "__main__":
    main()
