"""Counter-based uniforms from an unrolled Threefry-2x32 hash (cheap on CPU, same hash as JAX's).

JAX's own threefry lowering on CPU is a rolled 5-iteration `while` loop (for compile time), and
`jax.random.bits` in its partitionable mode spends one whole hash per 32-bit word (it XORs the two
output words). For the many-small-draws hot paths (one uniform per sampled token, K·R numbers per
VPO group) this module emits the 20 rounds unrolled, so XLA fuses the hash and the float
conversion into one elementwise loop, and keeps both output words of every hash.

Threefry-2x32 with 20 rounds: Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as
1, 2, 3" (SC 2011). Bit-identical to `jax.extend.random.threefry_2x32` (tested).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32 (20 rounds) of the counter pair (x0, x1) under key (k0, k1), elementwise
    with broadcasting over uint32 arrays → (y0, y1)."""
    k0, k1, x0, x1 = (jnp.asarray(a, jnp.uint32) for a in (k0, k1, x0, x1))
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))) ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def key_words(key):
    """(k0, k1) uint32 arrays of shape key.shape: the key data of threefry keys (typed or raw
    uint32[..., 2]); other PRNG implementations are first hashed to two words per key."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        data = jax.random.key_data(key)
        if data.shape[-1] != 2:  # e.g. rbg keys (4 words): derive a threefry key from each
            data = jax.vmap(lambda k: jax.random.bits(k, (2,), jnp.uint32))(key.reshape(-1))
            data = data.reshape(key.shape + (2,))
    else:
        data = jnp.asarray(key, jnp.uint32)
    return data[..., 0], data[..., 1]


def to_unit_float(bits):
    """uint32 → float32 uniform on [0, 1) from the top 23 bits (the mantissa trick)."""
    one_to_two = jax.lax.bitcast_convert_type((bits >> np.uint32(9)) | np.uint32(0x3F800000),
                                              jnp.float32)
    return one_to_two - 1.0


def uniform(key, shape: tuple[int, ...]):
    """float32 uniforms on [0, 1) of `shape` from one key: counter i of the hash gives words
    i and n/2 + i (both output words are used)."""
    n = math.prod(shape)
    half = (n + 1) // 2
    k0, k1 = key_words(key)
    y0, y1 = threefry2x32(k0, k1, jnp.uint32(0), jnp.arange(half, dtype=jnp.uint32))
    bits = jnp.concatenate([y0, y1])[:n]
    return to_unit_float(bits).reshape(shape)


def uniform_per_key(keys, counter):
    """One float32 uniform on [0, 1) per key (any key array shape) for the integer `counter`
    (e.g. a decode step): hash(key, counter), so every (key, counter) pair is an independent
    draw."""
    k0, k1 = key_words(keys)
    y0, _ = threefry2x32(k0, k1, jnp.uint32(0), jnp.asarray(counter).astype(jnp.uint32))
    return to_unit_float(y0)
