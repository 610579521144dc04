"""Decoder: cached decode equals the full forward, causality via gradients, config validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vpo.config import ConfigError, ModelConfig, RopeScaling, model_preset
from vpo.model import Decoder, rope_cos_sin, rope_inv_freq

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
        cache = model.init_cache(B, 1, T)
        outs = []
        for t in range(T):
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
