"""Decoder: cached decode (whole or grown cache, XLA or the Pallas kernel) equals the full forward,
causality via gradients, bf16 on CPU, config validation; the scanned layer stack (and per-block
remat) equals the unrolled one in logits, prefix, decode and gradients."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vpo.config import ConfigError, ModelConfig, RopeScaling, model_preset
from vpo.model.decoder import Decoder, KVCache, Prefix, rope_cos_sin, rope_inv_freq

VARIANTS = {
    "llama_tied": dict(),
    "qwen2_bias_untied": dict(qkv_bias=True, tie_embeddings=False),
    "qwen3_qknorm": dict(qk_norm=True, head_dim=16),
    "llama3_rope_scaling": dict(rope_scaling=RopeScaling(8.0, 1.0, 4.0, 64)),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def model(request):
    cfg = model_preset("tiny", **VARIANTS[request.param])
    m = Decoder(cfg, rngs=nnx.Rngs(0))
    # random (not zero) biases and norm scales, so those code paths are exercised
    state = nnx.state(m, nnx.Param)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    leaves = [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    nnx.update(m, jax.tree.unflatten(treedef, leaves))
    return m


def test_cached_decode_matches_full_forward(model):
    B, P, T = 3, 6, 7
    tokens = jax.random.randint(jax.random.key(2), (B, P + T), 3, model.cfg.vocab_size)
    mask = jnp.ones((B, P + T), bool).at[0, :3].set(False).at[2, :1].set(False)
    full = jax.jit(lambda t, m: model(t, m))(tokens, mask)

    @jax.jit
    def decode(tokens, mask):
        hidden, prefix = model.prefill(tokens[:, :P], mask[:, :P])
        cache = model.init_cache(B, 1, 2)
        outs = []
        for t in range(T):  # the cache grown as the sampler does: 2, 4, 8 slots
            cache = cache.grown(max(2, 2 ** t.bit_length()))
            h, cache = model.extend(tokens[:, None, P + t:P + t + 1], prefix, cache, t)
            outs.append(model.logits(h[:, 0, 0]))
        teacher, _ = model.extend(tokens[:, None, P:], prefix)  # no cache: all T at once
        return model.logits(hidden), jnp.stack(outs, 1), model.logits(teacher[:, 0])

    pre, dec, teacher = decode(tokens, mask)
    np.testing.assert_allclose(dec, full[:, P:], atol=1e-5, rtol=0)
    np.testing.assert_allclose(teacher, full[:, P:], atol=1e-5, rtol=0)
    valid = np.asarray(mask[:, :P])
    np.testing.assert_allclose(np.asarray(pre)[valid], np.asarray(full[:, :P])[valid], atol=1e-5)


def test_left_padding_does_not_change_logits(model):
    tokens = jnp.array([[5, 6, 7, 8]])
    padded = jnp.array([[0, 0, 5, 6, 7, 8]])
    mask = jnp.array([[False, False, True, True, True, True]])
    a = model(tokens)
    b = model(padded, mask)[:, 2:]
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_causality_by_gradients(model):
    """The output at position t has zero gradient w.r.t. embeddings at positions > t."""
    S, t = 8, 4
    tokens = jax.random.randint(jax.random.key(3), (1, S), 3, model.cfg.vocab_size)
    graphdef, state = nnx.split(model)

    def out_at_t(x_1SD):
        m = nnx.merge(graphdef, state)
        # run the blocks on given input embeddings: swap in an embedding table made of x
        hidden = x_1SD[:, None]
        pos = jnp.arange(S)[None, None]
        cos, sin = rope_cos_sin(pos, rope_inv_freq(m.cfg))
        mask = jnp.tril(jnp.ones((S, S), bool))[None, None]
        for layer in m.layers:
            hidden, _ = layer(hidden, cos, sin, mask, None, 0, None, None)
        return m.logits(m.final_norm(hidden))[0, 0, t].sum()

    x = model.embed[...][tokens]
    g = jax.grad(out_at_t)(x)
    per_position = np.abs(np.asarray(g)).sum(-1)[0]
    assert np.all(per_position[t + 1:] == 0)
    assert np.all(per_position[: t + 1] > 0)


def test_param_count_matches_config():
    for name in VARIANTS:
        cfg = model_preset("tiny", **VARIANTS[name])
        m = nnx.eval_shape(lambda cfg=cfg: Decoder(cfg, rngs=nnx.Rngs(0)))
        n = sum(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
        assert n == cfg.num_params, name


def test_small_preset_is_cpu_sized():
    assert 1e6 <= model_preset("small").num_params <= 5e6


def test_published_shapes():
    # Qwen2.5-0.5B has ~494M parameters, Qwen3-0.6B ~596M, Llama-3.2-1B ~1.24B
    assert abs(model_preset("qwen2.5-0.5b").num_params / 494e6 - 1) < 0.02
    assert abs(model_preset("qwen3-0.6b").num_params / 596e6 - 1) < 0.02
    assert abs(model_preset("llama3.2-1b").num_params / 1.236e9 - 1) < 0.02


@pytest.mark.parametrize("kwargs, field", [
    (dict(dim=30, num_heads=4), "model.num_heads"),
    (dict(num_heads=4, num_kv_heads=3), "model.num_kv_heads"),
    (dict(head_dim=7), "model.head_dim"),
    (dict(vocab_size=0), "model.vocab_size"),
    (dict(dtype="float64"), "model.dtype"),
    (dict(scan_layers="yes"), "model.scan_layers"),
])
def test_bad_config_names_field(kwargs, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        ModelConfig(**kwargs)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset"):
        model_preset("gpt-5")


def test_llama3_rope_scaling_bands():
    """Long wavelengths are divided by factor, short ones untouched (Llama-3 scaling)."""
    cfg = model_preset("tiny", head_dim=64, rope_theta=500_000.0,
                       rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192))
    base = model_preset("tiny", head_dim=64, rope_theta=500_000.0)
    scaled, plain = np.asarray(rope_inv_freq(cfg)), np.asarray(rope_inv_freq(base))
    wavelen = 2 * np.pi / plain
    np.testing.assert_allclose(scaled[wavelen < 8192 / 4], plain[wavelen < 8192 / 4])
    np.testing.assert_allclose(scaled[wavelen > 8192], plain[wavelen > 8192] / 32, rtol=1e-6)


def test_grown_cache_keeps_its_slots():
    cache = KVCache((jnp.ones((1, 2, 1, 3, 4)),), (2 * jnp.ones((1, 2, 1, 3, 4)),))
    g = cache.grown(5)
    assert g.k_BGZCE[0].shape == (1, 2, 1, 5, 4)
    np.testing.assert_array_equal(g.v_BGZCE[0][:, :, :, :3], cache.v_BGZCE[0])
    assert not np.asarray(g.k_BGZCE[0][:, :, :, 3:]).any()
    assert cache.grown(3) is cache and cache.grown(2) is cache


def test_decode_kernel_interpret_matches_xla():
    """A decode step through the Pallas kernel (interpret mode) equals the XLA path, at a
    position inside the first key block and one past it, with a left-padded prompt."""
    m = Decoder(model_preset("tiny", qkv_bias=True), rngs=nnx.Rngs(0))
    B, G, P, C = 2, 3, 5, 10
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(3, 64, (B, P)), jnp.int32)
    mask = jnp.ones((B, P), bool).at[1, :2].set(False)
    cache_tokens = jnp.asarray(rng.integers(3, 64, (B, G, C)), jnp.int32)

    @jax.jit
    def step(t):
        _, prefix = m.prefill(prompts, mask)
        _, cache = m.extend(cache_tokens, prefix)  # C earlier tokens: slots [0, C) filled
        tok = cache_tokens[:, :, :1]
        xla, _ = m.extend(tok, prefix, cache, t)
        pallas, _ = m.extend(tok, prefix, cache, t, attention="interpret")
        return m.logits(xla), m.logits(pallas)

    for t in (0, 7):
        xla, pallas = step(t)
        np.testing.assert_allclose(pallas, xla, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="one new token"):
        m.extend(cache_tokens, Prefix((), (), mask, mask.sum(1)), None, 0, attention="pallas")


def test_bfloat16_parameters_run_on_cpu():
    """A bf16 model runs its forward, the training forward (`extend` over the completion: the
    bf16 x bf16 -> f32 dot that crashed CPU) and a decode step, each close to the f32 forward
    of the same weights."""
    f32 = Decoder(model_preset("tiny"), rngs=nnx.Rngs(0))
    cfg = model_preset("tiny", dtype="bfloat16", param_dtype="bfloat16")
    bf16 = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))  # no eager init: f32's weights
    nnx.update(bf16, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(f32, nnx.Param)))
    tokens = jnp.asarray(np.random.default_rng(1).integers(3, 64, (2, 9)), jnp.int32)

    @jax.jit
    def run(model):
        logits = model(tokens)
        _, prefix = model.prefill(tokens[:, :5])
        teacher, _ = model.extend(tokens[:, None, 5:], prefix)
        h, _ = model.extend(tokens[:, None, 5:6], prefix, model.init_cache(2, 1, 4), 0)
        return logits, model.logits(teacher[:, 0]), model.logits(h[:, 0])

    ref = np.asarray(jax.jit(lambda m: m(tokens))(f32))
    for got, want in zip(run(bf16), (ref, ref[:, 5:], ref[:, 5:6]), strict=True):
        assert got.dtype == jnp.float32 and np.isfinite(np.asarray(got)).all()
        np.testing.assert_allclose(got, want, atol=0.02)  # logits up to ~0.8; bf16 rounding


def test_scan_layers_is_opt_in():
    assert not model_preset("tiny").scan and not ModelConfig(num_layers=30).scan
    assert ModelConfig(num_layers=2, scan_layers=True).scan


def _scanned_pair(**kw):
    """(unrolled, scanned) tiny decoders with the same random weights (norm scales and biases
    perturbed), 3 layers. The parameter layout is the same, so one state serves both."""
    cfg = model_preset("tiny", num_layers=3, scan_layers=False, **kw)
    a = Decoder(cfg, rngs=nnx.Rngs(0))
    state = nnx.state(a, nnx.Param)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    leaves = [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    nnx.update(a, jax.tree.unflatten(treedef, leaves))
    b = nnx.merge(nnx.graphdef(Decoder(dataclasses.replace(cfg, scan_layers=True),
                                       rngs=nnx.Rngs(0))), nnx.state(a))
    assert not a.scanned and b.scanned
    return a, b


@pytest.mark.parametrize("kw", [dict(qkv_bias=True, tie_embeddings=False),
                                pytest.param(dict(qk_norm=True, head_dim=16),
                                             marks=pytest.mark.slow)])
def test_scanned_matches_unrolled(kw):
    """Scanned vs unrolled stack on the same weights: full-forward logits, the prefix (stacked
    vs a tuple), cached decode through a growing cache, and the training forward (prefill +
    extend) with its gradients, with and without per-block remat: equal up to float rounding."""
    a, b = _scanned_pair(**kw)
    B, G, P, T = 2, 3, 5, 6
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(3, 64, (B, P)), jnp.int32)
    mask = jnp.ones((B, P), bool).at[1, :2].set(False)
    tokens = jnp.asarray(rng.integers(3, 64, (B, G, T)), jnp.int32)

    @jax.jit
    def run(model):
        full = model(prompts, mask)
        _, prefix = model.prefill(prompts, mask)
        cache, outs = model.init_cache(B, G, 2), []
        for t in range(T):
            cache = cache.grown(max(2, 2 ** t.bit_length()))
            h, cache = model.extend(tokens[:, :, t:t + 1], prefix, cache, t)
            outs.append(model.logits(h))
        return full, prefix, jnp.concatenate(outs, 2), cache

    (fa, pa, da, ca), (fb, pb, db, cb) = run(a), run(b)
    assert isinstance(pa.k_BZPE, tuple) and pb.k_BZPE.shape[0] == 3
    assert isinstance(ca.k_BGZCE, tuple) and cb.k_BGZCE.shape == (3, *ca.k_BGZCE[0].shape)
    np.testing.assert_allclose(fb, fa, atol=1e-5, rtol=0)
    np.testing.assert_allclose(db, da, atol=1e-5, rtol=0)
    for i in range(3):
        np.testing.assert_allclose(pb.k_BZPE[i], pa.k_BZPE[i], atol=1e-5, rtol=0)
        np.testing.assert_allclose(cb.v_BGZCE[i], ca.v_BGZCE[i], atol=1e-5, rtol=0)

    def loss(params, graphdef, remat):
        m = nnx.merge(graphdef, params)
        h, prefix = m.prefill(prompts, mask, remat=remat)
        hs, _ = m.extend(tokens, prefix, remat=remat)
        return jnp.sum(jax.nn.log_softmax(m.logits(hs))[..., 7]) + jnp.sum(h[:, -1] ** 2)

    grad = jax.jit(jax.value_and_grad(loss), static_argnums=(1, 2))
    want_loss, want = grad(nnx.state(a, nnx.Param), nnx.graphdef(a), False)
    for model, remat in ((a, True), (b, False), (b, True)):
        got_loss, got = grad(nnx.state(model, nnx.Param), nnx.graphdef(model), remat)
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5 * np.abs(y).max())


@pytest.mark.slow
def test_scanned_decode_kernel_interpret_matches_xla():
    """The Pallas decode kernel (interpret mode) inside the layer scan equals the XLA path."""
    _, m = _scanned_pair(qkv_bias=True)
    B, G, P, C = 2, 3, 5, 10
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(3, 64, (B, P)), jnp.int32)
    mask = jnp.ones((B, P), bool).at[1, :2].set(False)
    cache_tokens = jnp.asarray(rng.integers(3, 64, (B, G, C)), jnp.int32)

    @jax.jit
    def step(t):
        _, prefix = m.prefill(prompts, mask)
        _, cache = m.extend(cache_tokens, prefix)
        tok = cache_tokens[:, :, :1]
        xla, _ = m.extend(tok, prefix, cache, t)
        pallas, _ = m.extend(tok, prefix, cache, t, attention="interpret")
        return m.logits(xla), m.logits(pallas)

    xla, pallas = step(7)
    np.testing.assert_allclose(pallas, xla, atol=1e-5, rtol=0)


def test_grown_stacked_cache_keeps_its_slots():
    cache = KVCache(jnp.ones((2, 1, 2, 1, 3, 4)), 2 * jnp.ones((2, 1, 2, 1, 3, 4)))
    g = cache.grown(5)
    assert g.k_BGZCE.shape == (2, 1, 2, 1, 5, 4) and g.k_BGZCE[1].shape == (1, 2, 1, 5, 4)
    np.testing.assert_array_equal(g.v_BGZCE[:, :, :, :, :3], cache.v_BGZCE)
    assert not np.asarray(g.k_BGZCE[:, :, :, :, 3:]).any()
    assert cache.grown(3) is cache


def _randomised(cfg):
    """A decoder with every parameter (LoRA B included) moved off its initial value."""
    m = Decoder(cfg, rngs=nnx.Rngs(0))
    leaves, treedef = jax.tree.flatten(nnx.state(m, nnx.Param))
    keys = jax.random.split(jax.random.key(5), len(leaves))
    nnx.update(m, jax.tree.unflatten(treedef, [
        x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]))
    return m


@pytest.mark.parametrize("kw", [dict(qkv_bias=True, qk_norm=True, head_dim=16),
                                dict(lora_rank=4, qkv_bias=True),
                                dict(scan_layers=True, qkv_bias=True)])
def test_merged_weights_match_separate_products(kw):
    """A decode loop's merged products ([wq ‖ wk ‖ wv], [w_gate ‖ w_up], made once before it;
    biases, q/k norms and LoRA adapters applied per projection after the split) give the
    separate products' hidden states and caches, through `extend` and `extend_rows`."""
    model = _randomised(model_preset("tiny", **kw))
    L, B, G, P, T = model.cfg.num_layers, 2, 3, 5, 4
    merged = model.merged_weights()
    D, H, Z, E, F = (model.cfg.dim, model.cfg.num_heads, model.cfg.num_kv_heads,
                     model.cfg.head_dim, model.cfg.mlp_dim)
    qkv, gate_up = ((D, (H + 2 * Z) * E), (D, 2 * F))
    if model.scanned:
        assert merged[0].shape == (L, *qkv) and merged[1].shape == (L, *gate_up)
    else:
        assert len(merged) == L and merged[0][0].shape == qkv and merged[0][1].shape == gate_up
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(3, 64, (B, P)), jnp.int32)
    tokens = jnp.asarray(rng.integers(3, 64, (B, G, T)), jnp.int32)

    @functools.partial(jax.jit, static_argnums=0)
    def run(use):
        _, prefix = model.prefill(prompts)
        w = model.merged_weights() if use else None
        cache, hs = model.init_cache(B, G, T), []
        for t in range(T):
            h, cache = model.extend(tokens[:, :, t:t + 1], prefix, cache, t, merged=w)
            hs.append(h)
        ax = 1 if model.scanned else 0
        kv = [jax.tree.map(lambda x: jnp.repeat(x, G, axis=ax), k)
              for k in (prefix.k_BZPE, prefix.v_BZPE)]
        rows = Prefix(*kv, jnp.repeat(prefix.mask_BP, G, 0), jnp.repeat(prefix.length_B, G, 0))
        flat = jax.tree.map(lambda x: x.reshape(
            (L, B * G, 1, *x.shape[3:]) if model.scanned else (B * G, 1, *x.shape[2:])), cache)
        h_rows, _ = model.extend_rows(tokens[:, :, 0].reshape(-1), rows, flat,
                                      jnp.full((B * G,), T - 1), merged=w)
        return jnp.concatenate(hs, 2), cache, h_rows

    (h_m, c_m, r_m), (h_s, c_s, r_s) = run(True), run(False)
    np.testing.assert_allclose(h_m, h_s, atol=1e-5, rtol=0)
    np.testing.assert_allclose(r_m, r_s, atol=1e-5, rtol=0)
    for x, y in zip(jax.tree.leaves(c_m), jax.tree.leaves(c_s), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=0)
