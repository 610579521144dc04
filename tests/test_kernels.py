"""Vocabulary-tiled log-prob/entropy: chunked and Pallas (interpret) paths equal the reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vpo.kernels.logprob_entropy import (
    BlockSizes,
    logprob_entropy,
    logprob_entropy_chunked,
    logprob_entropy_reference,
)

N, D, V = 40, 16, 300  # V not a multiple of the tile: exercises the ragged last tile


@pytest.fixture(scope="module")
def inputs():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    hidden = jax.random.normal(k1, (N, D))
    w = 0.7 * jax.random.normal(k2, (D, V))
    targets = jax.random.randint(k3, (N,), 0, V)
    return hidden, w, targets


def test_chunked_matches_reference(inputs):
    ref = logprob_entropy_reference(*inputs)
    out = jax.jit(logprob_entropy_chunked, static_argnums=3)(*inputs, 64)
    for a, b in zip(out, ref, strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
    # entropy is in [0, log V] and logp <= 0
    assert np.all(np.asarray(ref[1]) >= 0) and np.all(np.asarray(ref[1]) <= np.log(V) + 1e-5)
    assert np.all(np.asarray(ref[0]) <= 0)


def test_chunked_gradients_match_reference(inputs):
    hidden, w, targets = inputs

    def loss(fn, h, w):
        logp, ent = fn(h, w)
        return jnp.sum(logp * jnp.linspace(0.5, 1.5, N)) + 0.3 * jnp.sum(ent)

    ref = jax.grad(lambda h, w: loss(lambda a, b: logprob_entropy_reference(a, b, targets), h,
                                     w), (0, 1))(hidden, w)
    got = jax.grad(lambda h, w: loss(lambda a, b: logprob_entropy_chunked(a, b, targets, 64), h,
                                     w), (0, 1))(hidden, w)
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_pallas_interpret_matches_reference_and_grads(inputs):
    hidden, w, targets = inputs
    bs = BlockSizes(block_n=16, block_v=128)
    out = logprob_entropy(hidden, w, targets, block_sizes=bs, interpret=True)
    ref = logprob_entropy_reference(hidden, w, targets)
    for a, b in zip(out, ref, strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
    g = jax.grad(lambda h: logprob_entropy(h, w, targets, block_sizes=bs,
                                           interpret=True)[0].sum())(hidden)
    g_ref = jax.grad(lambda h: logprob_entropy_reference(h, w, targets)[0].sum())(hidden)
    np.testing.assert_allclose(g, g_ref, atol=1e-4, rtol=1e-4)


def test_shape_errors(inputs):
    hidden, w, targets = inputs
    with pytest.raises(ValueError, match="shape mismatch"):
        logprob_entropy_chunked(hidden, w[:-1], targets)
    with pytest.raises(ValueError, match="expected hidden_ND"):
        logprob_entropy_reference(hidden[None], w, targets)
