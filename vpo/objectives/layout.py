"""Between TRL's flat layout and the grouped one of `vpo.objectives`.

TRL's `GRPOTrainer` holds one row per completion, `[B·G, ...]`, the G = `num_generations`
completions of a prompt in consecutive rows (its sampler repeats each prompt G times in a row).
`vpo.objectives` takes `[B, G, ...]`. Both helpers are reshapes: jittable, free, exact inverses.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def to_groups(x_N, num_generations: int) -> Array:
    """`[B·G, ...]` (TRL's rows, a prompt's G completions consecutive) → `[B, G, ...]`.

    Raises ValueError when the leading dim is not a multiple of `num_generations`.
    """
    x_N = jnp.asarray(x_N)
    G = int(num_generations)
    if G < 1:
        raise ValueError(f"num_generations={num_generations} must be >= 1")
    if x_N.ndim < 1 or x_N.shape[0] % G:
        raise ValueError(f"leading dim of shape {tuple(x_N.shape)} is not a multiple of "
                         f"num_generations={G} (TRL's layout is [B*G, ...])")
    return x_N.reshape((x_N.shape[0] // G, G) + x_N.shape[1:])


def from_groups(x_BG) -> Array:
    """`[B, G, ...]` → `[B·G, ...]` (TRL's rows), the inverse of `to_groups`."""
    x_BG = jnp.asarray(x_BG)
    if x_BG.ndim < 2:
        raise ValueError(f"expected [B, G, ...]; got shape {tuple(x_BG.shape)}")
    return x_BG.reshape((-1,) + x_BG.shape[2:])
