"""Small array and pytree helpers that several training modules share (the RL step, SFT)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def masked_mean(x, mask) -> jax.Array:
    """Σ x·mask / max(Σ mask, 1) over all elements: the mean of the entries `mask` keeps."""
    return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(jnp.sum(mask), 1)


def select_tree(pred, new, old):
    """`new` where the scalar `pred` holds, else `old`, leaf by leaf (a skipped update keeps
    the old parameters and optimiser state)."""
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)


def all_finite(tree) -> jax.Array:
    """True when every element of every leaf is finite (gradients before an update)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))
