"""Shared helpers of the objective modules: argument checks and masked group statistics."""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

STD_DDOF = {"population": 0, "unbiased": 1}


def check_choice(name: str, value, allowed) -> None:
    """Raises a ValueError naming the argument and its allowed values."""
    if value not in allowed:
        raise ValueError(
            f"{name}={value!r} is not supported; allowed values: {', '.join(map(repr, allowed))}"
        )


def check_shape(name: str, x, shape: tuple) -> None:
    """Raises a ValueError unless `x.shape == shape` (None in `shape` matches any size)."""
    if len(x.shape) != len(shape) or any(
        s is not None and s != t for s, t in zip(shape, x.shape, strict=True)
    ):
        want = "(" + ", ".join("?" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {want}")


def as_float(x) -> Array:
    """`x` as a jnp array, promoted to float32 if it is an integer or bool array."""
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


def rollout_mask(rewards_BG: Array, mask_BG) -> Array:
    if mask_BG is None:
        return jnp.ones(rewards_BG.shape, bool)
    check_shape("mask_BG", mask_BG, rewards_BG.shape)
    return jnp.asarray(mask_BG, bool)


def group_stats(x_BG: Array, mask_BG: Array, ddof: int) -> tuple[Array, Array, Array]:
    """Masked per-group (mean_B, std_B, count_B) over the G axis; `ddof` 0 or 1."""
    m_BG = mask_BG.astype(x_BG.dtype)
    n_B = m_BG.sum(-1)
    mean_B = (x_BG * m_BG).sum(-1) / jnp.maximum(n_B, 1.0)
    dev_BG = (x_BG - mean_B[:, None]) * m_BG
    var_B = (dev_BG**2).sum(-1) / jnp.maximum(n_B - ddof, 1.0)
    return mean_B, jnp.sqrt(var_B), n_B


def batch_stats(x_BG: Array, mask_BG: Array, ddof: int) -> tuple[Array, Array]:
    mean, std, _ = group_stats(x_BG.reshape(1, -1), mask_BG.reshape(1, -1), ddof)
    return mean[0], std[0]
