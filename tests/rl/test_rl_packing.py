"""The packed log-prob pass (`vpo.rl.packing`, `completion_logp(pack_rows=...)`): first-fit
placement, segment-isolated attention, and log-probs, entropies, loss and gradients equal to the
padded layout's (tiny model, float32), with a fallback that never drops a token."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vpo import objectives
from vpo.config import ConfigError, RunConfig, SamplerConfig, TrainConfig, model_preset
from vpo.model import lora as lora_lib
from vpo.model.decoder import Decoder
from vpo.rl import packing
from vpo.rl import step as step_lib

B, G, P, T, V = 3, 6, 5, 12, 50

# real lengths per (prompt, completion): each row needs the rows noted (W = T - 1 = 11 slots)
LENGTHS = {
    "long_tail": [[12, 2, 3, 1, 5, 4], [7, 12, 1, 1, 2, 3], [0, 4, 9, 2, 1, 6]],  # 2, 2, 2 rows
    "all_short": [[1, 1, 2, 1, 3, 2], [0, 0, 1, 2, 1, 1], [2, 2, 2, 2, 2, 2]],  # 1, 1, 1
    "empty": [[0] * 6, [0] * 6, [1] * 6],  # nothing to pack
    "one_full": [[12, 1, 1, 1, 1, 1], [12, 12, 1, 1, 1, 1], [1, 12, 1, 1, 1, 1]],  # 1, 2, 1
}


def real_mask(lengths) -> jax.Array:
    return jnp.arange(T)[None, None, :] < jnp.asarray(lengths)[..., None]


@pytest.fixture(scope="module")
def inputs():
    k1, k2 = jax.random.split(jax.random.key(1))
    prompt_BP = jax.random.randint(k1, (B, P), 3, V)
    mask_BP = jnp.arange(P)[None, :] >= jnp.array([[0], [2], [1]])  # left-padded prompts
    tokens_BGT = jax.random.randint(k2, (B, G, T), 3, V)
    return prompt_BP, mask_BP, tokens_BGT


def test_first_fit_decreasing_places_segments_without_overlap():
    real = real_mask(LENGTHS["long_tail"])
    plan = jax.device_get(packing.plan_rows(real))
    W = T - 1
    np.testing.assert_array_equal(plan.size_BG, np.maximum(np.array(LENGTHS["long_tail"]) - 1, 0))
    np.testing.assert_array_equal(plan.rows_needed_B, [2, 2, 2])
    for b in range(B):
        used = np.zeros((G, W), int)
        for g in range(G):
            r, o, n = plan.row_BG[b, g], plan.offset_BG[b, g], plan.size_BG[b, g]
            assert o + n <= W
            used[r, o:o + n] += 1
        assert used.max() <= 1  # no slot holds two segments
        assert used.sum() == plan.size_BG[b].sum()
    assert bool(packing.plan_rows(real).fits(2)) and not bool(packing.plan_rows(real).fits(1))


def test_segment_attention_matches_separate_continuations():
    """Two continuations end to end in one row (segment ids 0, 1) give the hidden states each
    gets alone: nothing is read across the boundary, positions restart at the prompt's end."""
    model = Decoder(model_preset("tiny", vocab_size=V, max_seq_len=32), rngs=nnx.Rngs(0))
    prompt_BP = jnp.array([[0, 7, 8, 9]])
    _, prefix = model.prefill(prompt_BP, jnp.array([[False, True, True, True]]))
    a, b = jnp.array([[[4, 5, 6]]]), jnp.array([[[11, 12]]])
    row = jnp.concatenate([a, b, jnp.zeros((1, 1, 1), jnp.int32)], -1)
    seg = jnp.array([[[0, 0, 0, 1, 1, packing.NO_SEGMENT]]])
    h_row, _ = model.extend(row, prefix, segment_ids_BGO=seg)
    h_a, _ = model.extend(a, prefix)
    h_b, _ = model.extend(b, prefix)
    np.testing.assert_allclose(h_row[:, :, :3], h_a, atol=1e-6)
    np.testing.assert_allclose(h_row[:, :, 3:5], h_b, atol=1e-6)


def _loss(model_of, params, inputs, real, pack_rows, c_BGT, remat=False):
    """policy_loss on the log-probs (token-mean over the real tokens, off-policy ratios and a
    KL and entropy term so every path carries a gradient) → (loss, (logp, entropy))."""
    prompt_BP, mask_BP, tokens_BGT = inputs
    if pack_rows:  # what the update differentiates (the fallback is chosen around the grad)
        logp, ent = step_lib.packed_completion_logp(
            model_of(params), prompt_BP, mask_BP, tokens_BGT, packing.plan_rows(real),
            pack_rows, vocab_block=16, remat=remat)
    else:
        logp, ent = step_lib.completion_logp(model_of(params), prompt_BP, mask_BP, tokens_BGT,
                                              vocab_block=16, remat=remat)
    adv_BG = jnp.linspace(-1.0, 1.0, B * G).reshape(B, G)
    loss, _ = objectives.policy_loss(
        logp, jax.lax.stop_gradient(logp) + 0.1 * c_BGT, adv_BG, real,
        ref_logp_BGT=jax.lax.stop_gradient(logp) - 0.05 * c_BGT, entropy_BGT=ent, kl_coef=0.1,
        entropy_coef=0.01)
    return loss, (logp, ent)


@pytest.mark.parametrize("variant", [
    dict(), pytest.param(dict(lora_rank=2), marks=pytest.mark.slow),
    pytest.param(dict(scan_layers=True, remat=True), marks=pytest.mark.slow)],
    ids=["full", "lora", "scanned-remat"])
def test_packed_loss_and_gradients_equal_padded(inputs, variant):
    variant = dict(variant)
    remat = variant.pop("remat", False)
    model = Decoder(model_preset("tiny", vocab_size=V, max_seq_len=32, **variant),
                    rngs=nnx.Rngs(2))
    graphdef, params, frozen = lora_lib.split(model)
    model_of = functools.partial(lora_lib.merge, graphdef, frozen=frozen)
    c_BGT = jnp.sin(jnp.arange(B * G * T, dtype=jnp.float32)).reshape(B, G, T)

    @functools.partial(jax.jit, static_argnums=2)
    def run(params, real, pack_rows):
        fn = functools.partial(_loss, lambda p: model_of(p), inputs=inputs, real=real,
                               pack_rows=pack_rows, c_BGT=c_BGT, remat=remat)
        return jax.value_and_grad(lambda p: fn(params=p), has_aux=True)(params)

    for name, lengths in LENGTHS.items():
        real = real_mask(lengths)
        needed = int(jnp.max(packing.plan_rows(real).rows_needed_B))
        (l_pad, (lp_pad, ent_pad)), g_pad = run(params, real, 0)
        (l_pack, (lp_pack, ent_pack)), g_pack = run(params, real, max(needed, 1))
        np.testing.assert_allclose(l_pack, l_pad, rtol=1e-5, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(jnp.where(real, lp_pack, 0), jnp.where(real, lp_pad, 0),
                                   atol=2e-6, err_msg=name)
        np.testing.assert_allclose(jnp.where(real, ent_pack, 0), jnp.where(real, ent_pad, 0),
                                   atol=2e-6, err_msg=name)
        for a, b in zip(jax.tree.leaves(g_pack), jax.tree.leaves(g_pad), strict=True):
            np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-4, err_msg=name)


def test_batch_that_does_not_fit_runs_padded(inputs):
    """Long completions need 2 rows where 1 is allowed: the call takes the padded path and every
    real token keeps its log-prob (none is dropped)."""
    model = Decoder(model_preset("tiny", vocab_size=V, max_seq_len=32), rngs=nnx.Rngs(2))
    real = real_mask(LENGTHS["one_full"])
    plan = packing.plan_rows(real)
    assert not bool(plan.fits(1))
    pad = step_lib.completion_logp(model, *inputs)
    fall = jax.jit(functools.partial(step_lib.completion_logp, pack_rows=1))(
        model, *inputs, real_BGT=real)
    for a, b in zip(fall, pad, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)  # padded: every position, not only real ones
    # and what packing with too few rows would have lost: the second row's segments
    lost = ~(plan.row_BG < 1) & (plan.size_BG > 0)
    assert bool(jnp.any(lost))
    # with enough rows the same call packs, and agrees on the real tokens
    packed = jax.jit(functools.partial(step_lib.completion_logp, pack_rows=2))(
        model, *inputs, real_BGT=real)
    for a, b in zip(packed, pad, strict=True):
        np.testing.assert_allclose(jnp.where(real, a, 0), jnp.where(real, b, 0), atol=1e-6)


@pytest.mark.slow
def test_bench_packed_runs(load_experiment, capsys):
    """experiments/bench_packed.py at a toy size: both arms, their loss and speed-up lines."""
    load_experiment("bench_packed").main(["--batch", "2", "--G", "4", "--T", "16",
                                          "--prompt", "4", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "packed/padded speed-up" in out and "(|Δ| " in out


def test_pack_rows_must_be_below_num_samples():
    with pytest.raises(ConfigError, match="train.pack_rows"):
        RunConfig(sampler=SamplerConfig(num_samples=4), train=TrainConfig(pack_rows=4))
    RunConfig(sampler=SamplerConfig(num_samples=4), train=TrainConfig(pack_rows=3))


@pytest.mark.slow  # ~45 s cold (two RL step compiles), ~9 s from the compile cache
def test_rl_step_with_packing_matches_padded():
    """Whole RL steps (bandit, test_rl_step.py's shapes) with train.pack_rows: the same updates
    as the padded step to float tolerance, whichever path each micro-batch took."""
    from tests.rl.test_rl_step import compact_bandit, run_config, run_steps

    task = compact_bandit()
    state_pad, hist_pad = run_steps(task, run_config(task, steps=2), 2)
    state_pack, hist_pack = run_steps(task, run_config(task, steps=2, pack_rows=7), 2)
    for m_pad, m_pack in zip(hist_pad, hist_pack, strict=True):
        np.testing.assert_allclose(m_pack["loss"], m_pad["loss"], rtol=1e-4, atol=1e-6)
        assert m_pack["rollout/mismatch_max_abs_logp"] < 1e-4
    print("pack/packed", [float(m["pack/packed"]) for m in hist_pack],
          "pack/rows_needed", [float(m["pack/rows_needed"]) for m in hist_pack])
    assert any(m["pack/packed"] > 0 for m in hist_pack)
    for a, b in zip(jax.tree.leaves(state_pack.params), jax.tree.leaves(state_pad.params),
                    strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
