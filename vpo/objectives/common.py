"""Shared helpers of the objective modules: argument checks and masked group statistics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

STD_DDOF = {"population": 0, "unbiased": 1}


def check_choice(name: str, value, allowed) -> None:
    """Raises a ValueError naming the argument and its allowed values."""
    if value not in allowed:
        raise ValueError(
            f"{name}={value!r} is not supported; allowed values: {', '.join(map(repr, allowed))}"
        )


def check_shape(name: str, x, shape: tuple) -> None:
    """Raises a ValueError unless `x.shape == shape` (None in `shape` matches any size); for a
    grouped name (`..._BG...`) given one dim too few, the error names `to_groups`."""
    if len(x.shape) != len(shape) or any(
        s is not None and s != t for s, t in zip(shape, x.shape, strict=True)
    ):
        want = "(" + ", ".join("?" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {want}"
                         + flat_hint(name, len(x.shape), len(shape), shape[1:2]))


def flat_hint(name: str, ndim: int, want_ndim: int, g: tuple = ()) -> str:
    """The fix for a flat `[B·G, ...]` array (TRL's rows) where `[B, G, ...]` is expected, or ""."""
    letters = name.rsplit("_", 1)[-1]
    if ndim != want_ndim - 1 or not letters.startswith("BG"):
        return ""
    G = str(g[0]) if g and g[0] is not None else "G"
    return (f"; a flat [B*G, ...] array (one row per completion, as TRL's) is reshaped per "
            f"prompt with vpo.objectives.to_groups(x, {G}) (G = samples per prompt)")


def describe(x) -> str:
    """`x`'s dtype and shape, or its type, for an error message."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"a {x.dtype} array of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"


def is_prng_key(x) -> bool:
    """True for a typed key (`jax.random.key`) or a raw uint32[2] key (`jax.random.PRNGKey`)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return False
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return True
    return dtype == jnp.uint32 and tuple(getattr(x, "shape", ())) == (2,)


def check_not_key(fn: str, name: str, x) -> None:
    """A TypeError when a PRNG key is passed where `name` (an array of values) goes."""
    if is_prng_key(x):
        raise TypeError(
            f"{fn}() got a PRNG key as {name}: it takes no key ({fn}({name}, mask_BG=None, ...)). "
            "Only vpo_advantages and random_weight_grpo_advantages draw random numbers and take "
            "the key first; get_estimator(name) functions take (key, rewards) for every name")


def as_float(x) -> Array:
    """`x` as a jnp array, promoted to float32 if it is an integer or bool array."""
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


def rollout_mask(rewards_BG: Array, mask_BG) -> Array:
    """mask_BG as bool, all True when None."""
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


def masked_mean(x, mask) -> Array:
    """Σ x·mask / max(Σ mask, 1) over all elements: the mean of the entries `mask` keeps."""
    return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(jnp.sum(mask), 1)


def is_concrete(*xs) -> bool:
    """True when none of `xs` is a tracer (eager call: values can be checked and errors raised)."""
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def screen_rewards(name: str, x: Array, valid: Array) -> tuple[Array, Array]:
    """The one policy for non-finite rewards, shared by every estimator.

    `valid` covers the leading dims of `x` (True = a real rollout / answer); trailing dims of `x`
    (reward components) are reduced with `any`. Called eagerly, a non-finite value at a valid
    position raises `RewardError`; traced (inside jit / vmap / grad), it is returned as
    `bad` (same shape as `valid`) and the caller sets the group's advantages to NaN. Values at
    invalid positions (padding) are ignored whatever they hold. Returns (x with every non-finite
    or invalid entry set to 0, bad).
    """
    finite = jnp.isfinite(x)
    extra = tuple(range(valid.ndim, x.ndim))
    bad = valid & ~(jnp.all(finite, axis=extra) if extra else finite)
    if is_concrete(x, valid) and bool(jnp.any(bad)):
        from vpo.errors import RewardError

        where = tuple(int(i) for i in np.argwhere(np.asarray(bad))[0])
        raise RewardError(
            f"{name} holds {int(jnp.sum(bad))} non-finite value(s) at valid positions (first at "
            f"index {where}: {np.asarray(x)[where]}). Fix or mask them (mask_BG=False); under "
            "jit the estimator instead returns NaN advantages for the affected groups and counts "
            "them in metrics['adv/nonfinite_rewards']")
    keep = finite & valid.reshape(valid.shape + (1,) * len(extra))
    return jnp.where(keep, x, 0.0), bad


def nan_groups(adv_BG: Array, bad_B: Array, mask_BG: Array) -> Array:
    """adv_BG with NaN on the valid rollouts of the groups flagged in bad_B."""
    return jnp.where(bad_B[:, None] & mask_BG, jnp.nan, adv_BG)


def off_simplex(weights_NR: Array, tol: float = 1e-3) -> Array:
    """off_X: rows that are non-finite, have a negative entry or do not sum to 1 (within tol)."""
    ok = (jnp.all(jnp.isfinite(weights_NR), -1) & jnp.all(weights_NR >= 0.0, -1)
          & (jnp.abs(jnp.sum(weights_NR, -1) - 1.0) <= tol))
    return ~ok


def check_simplex(name: str, weights_NR: Array) -> Array:
    """Eagerly: a ValueError naming the first row off the simplex. Traced: the per-row flags
    (the caller counts them in metrics['adv/bad_weights'])."""
    off = off_simplex(weights_NR)
    if is_concrete(weights_NR) and bool(jnp.any(off)):
        row = tuple(int(i) for i in np.argwhere(np.asarray(off))[0])
        raise ValueError(
            f"{name} row {row} is {np.asarray(weights_NR)[row]}: weights must be finite, >= 0 and "
            "sum to 1 (the Dirichlet simplex); under jit such rows are only counted in "
            "metrics['adv/bad_weights']")
    return off


def nonfinite_metric(bad) -> dict[str, Array]:
    return {"adv/nonfinite_rewards": jnp.sum(bad, dtype=jnp.int32)}


_MISSING = object()


def key_first_args(fn: str, args: tuple, legacy: dict, n_data: int, key_optional: bool,
                   n_required: int | None = None) -> tuple:
    """(key, *data) from a key-first call `fn(key, *data)`, or from the earlier form
    `fn(*data, key=key)` (a DeprecationWarning; removed in the next release). The first argument
    is the key when it is None or a PRNG key array. `legacy` holds the keyword arguments the
    signature did not name (only `key` is accepted there). Data past `n_required` are optional
    (None when left out)."""
    import warnings

    n_required = n_data if n_required is None else n_required
    unknown = set(legacy) - {"key"}
    if unknown:
        raise TypeError(f"{fn}() got unexpected keyword argument(s) {sorted(unknown)}")
    args = tuple(a for a in args if a is not _MISSING)
    usage = f"{fn}(key, ...) with key = jax.random.key(seed)"
    if args and (args[0] is None or is_prng_key(args[0])):
        if "key" in legacy:
            raise TypeError(f"{fn}() got key= and a positional key together: pass the key "
                            f"positionally only, {usage}")
        key, data = args[0], args[1:]
    else:
        key, data = legacy.get("key"), args
        if "key" in legacy:
            warnings.warn(
                f"{fn}(..., key=key) is deprecated: pass the key first, {fn}(key, ...) (as "
                "jax.random and vpo.objectives.dirichlet_weights do)", DeprecationWarning,
                stacklevel=3)
        elif not key_optional:
            got = describe(args[0]) if args else "nothing"
            raise TypeError(f"{fn}() needs a PRNG key as its first argument; got {got}. Call "
                            f"{usage}")
    if not n_required <= len(data) <= n_data:
        count = str(n_data) if n_required == n_data else f"{n_required} to {n_data}"
        raise TypeError(f"{fn}() takes the key and {count} array(s) positionally; got "
                        f"{len(data)} after the key: {usage}")
    return (key,) + data + (None,) * (n_data - len(data))
