"""The rollout/trainer mismatch logged by every RL step (`vpo.rl.mismatch.mismatch_metrics`): the
sampler's recorded log-probs against the training forward's on the same tokens, at the same
parameters. Shapes are those of test_rl_step.py (its compiles are reused)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.rl.test_rl_step import compact_bandit, run_config, run_steps
from vpo.model.decoder import Decoder
from vpo.rl import mismatch


@pytest.fixture(scope="module")
def task():
    return compact_bandit()


def test_mismatch_formula_on_known_log_probs():
    """k3 = e^Δ − 1 − Δ averaged over real tokens; the max |Δ| ignores padding."""
    logp = jnp.log(jnp.array([[[0.5, 0.25, 0.9]]]))
    sampler = jnp.log(jnp.array([[[0.4, 0.25, 0.1]]]))
    real = jnp.array([[[True, True, False]]])
    m = mismatch.mismatch_metrics(mismatch.combine_mismatch(
        {k: v[None] for k, v in mismatch.mismatch_sums(logp, sampler, real).items()}))
    d = np.log(0.5 / 0.4)
    np.testing.assert_allclose(m["rollout/mismatch_kl"], (np.exp(d) - 1 - d) / 2, rtol=1e-5)
    np.testing.assert_allclose(m["rollout/mismatch_max_abs_logp"], d, rtol=1e-5)
    assert float(m["rollout/mismatch_tokens"]) == 2


def test_f32_sampler_and_trainer_agree(task):
    """One program, one model code, float32: the decode loop's log-probs (KV cache, one token
    at a time) and the training forward's (all T tokens at once) differ by float rounding."""
    _, history = run_steps(task, run_config(task, steps=2), 2)
    for m in history:
        assert m["rollout/mismatch_tokens"] > 0
        assert 0 <= m["rollout/mismatch_kl"] < 1e-10
        assert m["rollout/mismatch_max_abs_logp"] < 1e-4
    print("f32 mismatch: kl", [float(m["rollout/mismatch_kl"]) for m in history],
          "max |Δ log p|", [float(m["rollout/mismatch_max_abs_logp"]) for m in history])


@pytest.mark.slow
def test_bf16_mismatch_is_recorded(task):
    """In bfloat16 the two programs may round differently; the step records by how much. The
    weights are scaled ×8 so the policy is not near-uniform (entropy ~2 nats of 2.48)."""
    run = run_config(task, steps=2)
    run = dataclasses.replace(run, model=dataclasses.replace(
        run.model, dtype="bfloat16", param_dtype="bfloat16"))
    model = Decoder(run.model, rngs=nnx.Rngs(0))
    nnx.update(model, jax.tree.map(lambda w: w * 8 if w.ndim > 1 else w,
                                   nnx.state(model, nnx.Param)))
    _, history = run_steps(task, run, 2, init=model)
    for m in history:
        assert np.isfinite(m["rollout/mismatch_kl"]) and m["rollout/mismatch_kl"] >= 0
        assert np.isfinite(m["rollout/mismatch_max_abs_logp"])
    print("bf16 mismatch: kl", [float(m["rollout/mismatch_kl"]) for m in history],
          "max |Δ log p|", [float(m["rollout/mismatch_max_abs_logp"]) for m in history])
