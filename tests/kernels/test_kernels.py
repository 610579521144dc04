"""Kernels beside their references: vocabulary-tiled log-prob/entropy (chunked and Pallas
interpret) and decode attention over a shared prefix + per-sample suffix (Pallas interpret);
float32-accumulating products of bfloat16 operands on CPU."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from vpo.kernels.decode_attention import BlockSizes as DecodeBlockSizes
from vpo.kernels.decode_attention import decode_attention, decode_attention_reference
from vpo.kernels.logprob_entropy import (
    BlockSizes,
    logprob_entropy,
    logprob_entropy_chunked,
    logprob_entropy_reference,
)
from vpo.kernels.precision import dot_f32, einsum_f32

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


# -- decode attention: shared prefix + per-sample suffix ------------------------------------

DB, DG, DN, DH, DE, DP, DC = 2, 3, 2, 2, 8, 21, 40  # P, C not multiples of the key block


@pytest.fixture(scope="module")
def decode_inputs():
    rng = np.random.default_rng(1)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
    mask = np.ones((DB, DP), bool)
    mask[0, :6] = False  # prompt 0 left-padded
    return (normal(DB, DG, DN, DH, DE), normal(DB, DN, DP, DE), normal(DB, DN, DP, DE),
            jnp.asarray(mask), normal(DB, DG, DN, DC, DE), normal(DB, DG, DN, DC, DE))


def test_decode_attention_reference_is_attention_over_the_valid_keys(decode_inputs):
    """By hand for one row: softmax over its real prefix keys and suffix slots < length."""
    q, kp, vp, mask, kc, vc = decode_inputs
    length = 7
    out = jax.jit(decode_attention_reference)(q, kp, vp, mask, kc, vc, length)
    b, g, n, h = 0, 1, 1, 0
    keys = np.concatenate([np.asarray(kp[b, n])[np.asarray(mask[b])], kc[b, g, n, :length]])
    vals = np.concatenate([np.asarray(vp[b, n])[np.asarray(mask[b])], vc[b, g, n, :length]])
    s = keys @ np.asarray(q[b, g, n, h]) / np.sqrt(DE)
    p = np.exp(s - s.max())
    np.testing.assert_allclose(out[b, g, n, h], p @ vals / p.sum(), atol=1e-5)


def test_decode_attention_pallas_interpret_matches_reference(decode_inputs):
    q, kp, vp, mask, kc, vc = decode_inputs
    bs = DecodeBlockSizes(block_k=8, block_rows=8)  # several key blocks, padded rows
    run = jax.jit(lambda n: decode_attention(q, kp, vp, mask, kc, vc, n, block_sizes=bs,
                                             interpret=True))
    ref_fn = jax.jit(decode_attention_reference)
    for length in (1, 8, 9, DC):  # one slot, a whole block, one past it, the whole cache
        ref = ref_fn(q, kp, vp, mask, kc, vc, length)
        np.testing.assert_allclose(run(length), ref, atol=1e-5, rtol=0)


def test_decode_attention_shape_errors(decode_inputs):
    q, kp, vp, mask, kc, vc = decode_inputs
    with pytest.raises(ValueError, match="shape mismatch: suffix v"):
        decode_attention_reference(q, kp, vp, mask, kc, vc[:, :, :, 1:], 3)
    with pytest.raises(ValueError, match="expected q"):
        decode_attention(q[0], kp, vp, mask, kc, vc, 3, interpret=True)


def test_f32_products_of_bfloat16_operands_run_on_cpu():
    """XLA's CPU runtime has no bf16 x bf16 -> f32 dot: the attention value product below fails
    with plain `preferred_element_type` (UNIMPLEMENTED); the helpers upcast on CPU."""
    rng = np.random.default_rng(0)
    e = jnp.asarray(rng.standard_normal((2, 3, 4, 2, 4, 5)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((2, 4, 5, 32)), jnp.bfloat16)
    spec = "bgnhsp,bnpe->bgnhse"
    out = jax.jit(einsum_f32, static_argnums=0)(spec, e, v)
    exact = np.einsum(spec, np.asarray(e, np.float32), np.asarray(v, np.float32))
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, exact, rtol=1e-5, atol=1e-5)
    a, b = e.reshape(-1, 5), v[0, 0]
    np.testing.assert_allclose(jax.jit(dot_f32)(a, b),
                               np.asarray(a, np.float32) @ np.asarray(b, np.float32), atol=1e-5)


# -- per-target paths and block sizes ------------------------------------------------------

def test_gpu_logprob_kernel_interpret_matches_reference(inputs):
    """The GPU kernel (vocabulary ranges merged afterwards, D in steps) under interpret mode."""
    hidden, w, targets = inputs
    ref = logprob_entropy_reference(hidden, w, targets)
    for bs in (BlockSizes(block_n=16, block_v=64, block_d=16, num_splits=3), None):
        out = logprob_entropy(hidden, w, targets, block_sizes=bs, interpret=True,
                              platform="gpu")
        for a, b in zip(out, ref, strict=True):
            np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)


def test_gpu_decode_kernel_interpret_matches_reference(decode_inputs):
    q, kp, vp, mask, kc, vc = decode_inputs
    bs = DecodeBlockSizes(block_k=16, block_rows=16)  # P = 21, C = 40: ragged tails
    run = jax.jit(lambda n: decode_attention(q, kp, vp, mask, kc, vc, n, block_sizes=bs,
                                             interpret=True, platform="gpu"))
    for length in (1, 16, 17, DC):
        ref = decode_attention_reference(q, kp, vp, mask, kc, vc, length)
        np.testing.assert_allclose(run(length), ref, atol=1e-5, rtol=0)


def test_gpu_decode_kernel_interpret_with_several_prefix_row_blocks():
    """G = 5 samples (padded to 8) of 2 query heads (padded to 16): 128 query rows per KV head,
    read by the prefix pass in two blocks of 64; the suffix pass reads its samples' rows."""
    rng = np.random.default_rng(2)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
    B, G, Z, H, E, P, C = 2, 5, 2, 2, 8, 13, 24
    q, kp, vp = normal(B, G, Z, H, E), normal(B, Z, P, E), normal(B, Z, P, E)
    kc, vc = normal(B, G, Z, C, E), normal(B, G, Z, C, E)
    mask = jnp.asarray(np.arange(P)[None, :] >= np.array([[0], [4]]))
    bs = DecodeBlockSizes(block_k=16, block_rows=16)
    run = jax.jit(lambda n: decode_attention(q, kp, vp, mask, kc, vc, n, block_sizes=bs,
                                             interpret=True, platform="gpu"))
    for length in (1, 17, C):
        ref = decode_attention_reference(q, kp, vp, mask, kc, vc, length)
        np.testing.assert_allclose(run(length), ref, atol=1e-5, rtol=0)


def test_logprob_block_sizes_fit_each_target():
    from vpo.kernels import hardware
    from vpo.kernels.logprob_entropy import block_sizes_for

    for N, D, V, dtype in [(72, 896, 151936, jnp.bfloat16), (4096, 4096, 151936, jnp.float32),
                           (2048, 1024, 151936, jnp.bfloat16), (40, 16, 300, jnp.float32)]:
        tpu = block_sizes_for("tpu", (N, D, V), dtype)
        size = jnp.dtype(dtype).itemsize
        assert tpu.block_v % 128 == 0 and tpu.block_n % (8 * max(1, 4 // size)) == 0
        assert (2 * size * D * (tpu.block_n + tpu.block_v) + 20 * tpu.block_n * tpu.block_v
                <= hardware.TPU_VMEM_BUDGET_BYTES)
        gpu = block_sizes_for("gpu", (N, D, V), dtype)
        for b in (gpu.block_n, gpu.block_v, gpu.block_d):
            assert b >= 16 and b & (b - 1) == 0
        assert D % gpu.block_d == 0 and gpu.block_n * gpu.block_v <= hardware.TRITON_MAX_ELEMENTS
        tiles = -(-V // gpu.block_v)
        per_split = -(-tiles // gpu.num_splits)
        assert (gpu.num_splits - 1) * per_split * gpu.block_v < V  # every range holds columns
    assert block_sizes_for("tpu", (72, 896, 151936)).block_v >= 512


def test_decode_block_sizes_fit_each_target():
    from vpo.kernels import hardware
    from vpo.kernels.decode_attention import block_sizes_for

    for shape in [(1, 8, 8, 2, 128, 512, 32768), (2, 8, 2, 7, 64, 333, 4096),
                  (DB, DG, DN, DH, DE, DP, DC)]:
        tpu = block_sizes_for("tpu", shape, jnp.bfloat16)
        assert tpu.block_k % 128 == 0 and tpu.block_rows == 16
        assert 4 * tpu.block_k * shape[4] * 2 <= hardware.TPU_VMEM_BUDGET_BYTES
        gpu = block_sizes_for("gpu", shape, jnp.bfloat16)
        assert gpu.block_k >= 16 and gpu.block_k & (gpu.block_k - 1) == 0
        assert 4 * gpu.block_k * shape[4] * 2 <= hardware.GPU_SMEM_BUDGET_BYTES


def test_platform_comes_from_the_argument_or_the_devices():
    from vpo.kernels import hardware

    assert hardware.resolve_platform(None) == jax.default_backend() == "cpu"
    assert hardware.resolve_platform("cuda") == "gpu" and hardware.resolve_platform("TPU") == "tpu"
    with pytest.raises(ValueError, match="unknown platform"):
        hardware.resolve_platform("metal")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
    assert hardware.platform_of(mesh) == hardware.platform_of(jax.devices()) == "cpu"
    assert hardware.pallas_supported("tpu") and not hardware.pallas_supported("cpu")
    # built for a TPU, bfloat16 operands stay bfloat16 (on CPU they are upcast: see below)
    a = jnp.ones((4, 8), jnp.bfloat16)
    dot = jax.make_jaxpr(lambda x: dot_f32(x, x.T, platform="tpu"))(a)
    assert "convert_element_type" not in str(dot)
    assert "convert_element_type" in str(jax.make_jaxpr(lambda x: dot_f32(x, x.T))(a))
    with pytest.raises(ValueError, match="interpret=True"):
        logprob_entropy(a.astype(jnp.float32), a.T.astype(jnp.float32), jnp.zeros(4, jnp.int32))


def test_chunked_backward_runs_bf16_products_for_a_bf16_policy(inputs):
    """For bf16 hidden states and weights, the chunked pass's gradient rounds each tile's logit
    gradient to bf16 before its two products: every product of the backward built for a GPU has
    bf16 operands (a float32 cotangent would promote them to float32 products), and the
    gradient stays within bf16 rounding of the float32 reference."""
    hidden, w, targets = inputs
    h16, w16 = hidden.astype(jnp.bfloat16), w.astype(jnp.bfloat16)

    def loss(h, w, platform=None):
        logp, ent = logprob_entropy_chunked(h, w, targets, 64, platform=platform)
        return jnp.sum(logp * jnp.linspace(0.5, 1.5, N)) + 0.3 * jnp.sum(ent)

    jaxpr = jax.make_jaxpr(jax.grad(lambda h, w: loss(h, w, "gpu"), (0, 1)))(h16, w16)

    def dots(jaxpr):
        yield from (e for e in jaxpr.eqns if e.primitive.name == "dot_general")
        for sub in jax.extend.core.subjaxprs(jaxpr):
            yield from dots(sub)

    found = [tuple(str(v.aval.dtype) for v in e.invars) for e in dots(jaxpr.jaxpr)]
    assert len(found) >= 3 and set(found) == {("bfloat16", "bfloat16")}, found
    ref = jax.grad(lambda h, w: loss(h, w), (0, 1))(h16.astype(jnp.float32),
                                                    w16.astype(jnp.float32))
    got = jax.grad(lambda h, w: loss(h, w), (0, 1))(h16, w16)
    for a, b in zip(got, ref, strict=True):
        assert a.dtype == jnp.bfloat16
        scale = float(jnp.max(jnp.abs(b)))
        np.testing.assert_allclose(np.asarray(a, np.float32), b, atol=0.03 * scale)


def test_low_grad_einsum_keeps_gradient_products_in_the_operand_dtype():
    """`einsum_f32_low_grad` for bf16 operands on a GPU target: the forward accumulates in
    float32 (as `einsum_f32`), every gradient product has bf16 operands, and the gradients stay
    within bf16 rounding of the float32 ones; float32 operands take `einsum_f32` unchanged."""
    from vpo.kernels.precision import einsum_f32_low_grad

    k1, k2 = jax.random.split(jax.random.key(3))
    a = jax.random.normal(k1, (2, 8, 16)).astype(jnp.bfloat16)
    b = jax.random.normal(k2, (2, 16, 12)).astype(jnp.bfloat16)

    def loss(fn, x, y, platform):
        out = fn("bik,bkj->bij", x, y, platform=platform)
        return jnp.sum(jnp.sin(out)), out

    jaxpr = jax.make_jaxpr(jax.grad(lambda x, y: loss(einsum_f32_low_grad, x, y, "gpu")[0],
                                    (0, 1)))(a, b)
    dots = [tuple(str(v.aval.dtype) for v in e.invars) for e in jaxpr.jaxpr.eqns
            if e.primitive.name == "dot_general"]
    for sub in jax.extend.core.subjaxprs(jaxpr.jaxpr):
        dots += [tuple(str(v.aval.dtype) for v in e.invars) for e in sub.eqns
                 if e.primitive.name == "dot_general"]
    assert len(dots) == 3 and set(dots) == {("bfloat16", "bfloat16")}, dots
    _, out = loss(einsum_f32_low_grad, a, b, None)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, loss(einsum_f32, a, b, None)[1], rtol=1e-6)
    grad = jax.grad(lambda x, y: loss(einsum_f32_low_grad, x, y, None)[0], (0, 1))
    ref = jax.grad(lambda x, y: loss(einsum_f32, x, y, None)[0], (0, 1))(
        a.astype(jnp.float32), b.astype(jnp.float32))
    for g, r in zip(grad(a, b), ref, strict=True):
        assert g.dtype == jnp.bfloat16
        scale = float(jnp.abs(r).max())
        np.testing.assert_allclose(np.asarray(g, np.float32), r, atol=0.05 * scale)
