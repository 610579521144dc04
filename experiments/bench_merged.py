"""Decode with each block's shared-input products merged against the separate products.

Run:  python experiments/bench_merged.py [--model smollm2-135m] [--B 4] [--G 8] [--P 32]
          [--T 64] [--rounds 5]

`Decoder.merged_weights` concatenates [wq ‖ wk ‖ wv] and [w_gate ‖ w_up] once before a decode
loop, so a step runs one product where it ran three and two. On an H100 build it removes the
concatenation XLA:GPU otherwise redoes at every token (`experiments/decode_anatomy.py`
--separate), so `Decoder.loop_weights` merges on a GPU. This script measures what merging would
do to the CPU sampler (where it is off): tokens/s of the whole
`vpo.rollout.sampler.generate` (random weights, float32, every sample runs all T tokens), the
merged and the separate model alternated over rounds, the median of per-round ratios with the
range, and the share of equal tokens (the same keys: the products differ only by float
rounding, which can flip a draw among near-equal random-weight logits).
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
from vpo.rollout.sampler import generate

STOP, PAD = (-1,), 0  # a stop id no token takes: every sample runs the full T tokens


class Variant:
    """The decoder with its decode loop's merged products forced on (`merged`) or off,
    whatever the platform (`Decoder.loop_weights` merges on a GPU only)."""

    def __init__(self, model: Decoder, merged: bool):
        self._model, self._merged = model, merged
        self.platform, self.cfg = model.platform, model.cfg

    def loop_weights(self) -> dict:
        return {"merged": self._model.merged_weights()} if self._merged else {}

    def __getattr__(self, name):
        return getattr(self._model, name)


@functools.partial(jax.jit, static_argnames=("graphdef", "T", "merged"))
def sample(graphdef, state, prompts_BP, keys_BG, *, T, merged):
    model = Variant(nnx.merge(graphdef, state), merged)
    mask = jnp.ones(prompts_BP.shape, bool)
    return generate(model, prompts_BP, mask, keys_BG, 1.0, 1.0, 0, max_new_tokens=T,
                    stop_ids=STOP, pad_id=PAD).tokens_BGT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--P", type=int, default=32)
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    cfg = model_preset(a.model)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(1, cfg.vocab_size, (a.B, a.P)), jnp.int32)
    keys = jax.random.split(jax.random.key(1), a.B * a.G).reshape(a.B, a.G)
    run = {m: functools.partial(sample, graphdef, state, prompts, keys, T=a.T, merged=m)
           for m in (True, False)}
    out = {}
    for m, f in run.items():  # compile and check
        t0 = time.perf_counter()
        out[m] = np.asarray(f())
        name = "merged" if m else "separate"
        print(f"{name}: compile + first call {time.perf_counter() - t0:.1f} s")
    same = float((out[True] == out[False]).mean())
    times = {True: [], False: []}
    for r in range(a.rounds):
        for m in ((True, False) if r % 2 == 0 else (False, True)):
            t0 = time.perf_counter()
            jax.block_until_ready(run[m]())
            times[m].append(time.perf_counter() - t0)
    tokens = a.B * a.G * a.T
    ratios = [s / m for m, s in zip(times[True], times[False], strict=True)]
    print(f"{a.model} B {a.B} G {a.G} P {a.P} T {a.T}, {a.rounds} rounds, "
          f"jax {jax.__version__} on {jax.devices()[0].platform}")
    for m in (True, False):
        med = statistics.median(times[m])
        name = "merged  " if m else "separate"
        print(f"  {name} {tokens / med:8.1f} tok/s  (median {med:.3f} s)")
    print(f"  merged / separate speed: {statistics.median(ratios):.3f}x "
          f"[{min(ratios):.3f}, {max(ratios):.3f}]; same tokens: {same:.1%}")


if __name__ == "__main__":
    main()
