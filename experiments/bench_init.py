"""Start-up of a fresh random state: one program holding every weight's draw (how
`vpo.rl.step.init_state` worked before) against a small program per distinct weight (how it
works now, `vpo.model.draw`), in one process on one device.

    python experiments/bench_init.py [--model qwen2.5-0.5b] [--dtype bfloat16]

Prints the one program's compile and run times, then `init_state` twice (the second reuses the
per-weight programs), and whether both ways give the same weights.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from vpo.config import model_preset
from vpo.model import lora as lora_lib
from vpo.model.decoder import Decoder
from vpo.model.sharding import make_mesh
from vpo.rl import step as step_lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--dtype", default="bfloat16", help="compute dtype (weights stay float32)")
    a = ap.parse_args()
    cfg = model_preset(a.model, dtype=a.dtype, param_dtype="float32")
    mesh = make_mesh(devices=jax.devices()[:1])
    tx = optax.adamw(1e-4)

    def create():  # every draw and the optimiser's zeros in one program
        _, params, frozen = lora_lib.split(Decoder(cfg, rngs=nnx.Rngs(0)))
        return params, frozen, tx.init(params)

    t0 = time.perf_counter()
    program = jax.jit(create).lower().compile()
    t1 = time.perf_counter()
    one = jax.block_until_ready(program())
    t2 = time.perf_counter()
    print(f"one program: compile {t1 - t0:.1f} s, run {t2 - t1:.1f} s, total {t2 - t0:.1f} s")
    for label, seed in (("first", 0), ("second (programs reused)", 1)):
        t0 = time.perf_counter()
        _, state, _ = step_lib.init_state(cfg, tx, mesh, seed=seed)
        jax.block_until_ready(state)
        print(f"init_state, {label}: {time.perf_counter() - t0:.1f} s")
        if seed == 0:
            same = all(bool(jnp.array_equal(x, y)) for x, y in
                       zip(jax.tree.leaves(one[0]), jax.tree.leaves(state.params),
                           strict=True))
            print(f"  the same weights as the one program: {same}")
        del state


if __name__ == "__main__":
    main()
