"""The sampler/trainer mismatch on the same sampled tokens: Δ = log π_train(y) − log π_sample(y)
per real token, k3 = e^Δ − 1 − Δ, summed per micro-batch inside the update's scan and combined
into `rollout/mismatch_*` metrics (docs/on_policy.md says what they bound).

Shapes: B prompts, G samples, T tokens; X micro-batches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

MISMATCH_SUMS = ("mismatch_k3_sum", "mismatch_tokens", "mismatch_max_abs_logp")


def mismatch_sums(logp_BGT, sampler_logp_BGT, real_BGT) -> dict[str, jax.Array]:
    """Sums behind the rollout/trainer mismatch of one micro-batch (`mismatch_metrics`):
    Σ k3, the token count and max |Δ log p| over the real tokens (`real_BGT`), with
    Δ = log π_train(y) − log π_sample(y) and k3 = e^Δ − 1 − Δ, evaluated as Δ²/2·(1 + Δ/3)
    for |Δ| < 1e-3 (where the float32 difference would cancel to 0)."""
    delta_BGT = jnp.where(real_BGT, logp_BGT - sampler_logp_BGT, 0.0)
    small = jnp.abs(delta_BGT) < 1e-3
    k3_BGT = jnp.where(small, 0.5 * delta_BGT**2 * (1.0 + delta_BGT / 3.0),
                       jnp.expm1(jnp.where(small, 0.0, delta_BGT)) - delta_BGT)
    return {"mismatch_k3_sum": jnp.sum(jnp.where(real_BGT, k3_BGT, 0.0)),
            "mismatch_tokens": jnp.sum(real_BGT, dtype=jnp.float32),
            "mismatch_max_abs_logp": jnp.max(jnp.abs(delta_BGT))}


def combine_mismatch(sums: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """`mismatch_sums` of X micro-batches → those of their union (sums add, the max is max)."""
    return {"mismatch_k3_sum": jnp.sum(sums["mismatch_k3_sum"]),
            "mismatch_tokens": jnp.sum(sums["mismatch_tokens"]),
            "mismatch_max_abs_logp": jnp.max(sums["mismatch_max_abs_logp"])}


def mismatch_metrics(sums: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """The sampler/trainer mismatch on the same tokens, logged every step.

    With y drawn by the sampler, Δ = log π_train(y) − log π_sample(y), where π_sample is the
    sampler's temperature-1 log-prob recorded while decoding (`Rollout.logp_BGT`, the PPO
    old_logp) and π_train the training forward's at the same parameters:

        rollout/mismatch_kl            = mean_y k3,  k3 = e^Δ − 1 − Δ ≥ 0
        rollout/mismatch_max_abs_logp  = max_y |Δ|
        rollout/mismatch_tokens        = the number of tokens y averaged over

    k3 (Schulman 2020, "Approximating KL divergence") is an unbiased, low-variance estimate of
    KL(π_sample ‖ π_train) when y ~ π_sample at temperature 1 without top-k / top-p; under
    other sampler settings it is a mismatch measure on the sampled tokens, not a KL.

    Tokens covered: every real completion token (`Rollout.mask_BGT`, padding excluded; groups
    dropped by dynamic sampling or masked as overlong included) of the first minibatch of the
    first PPO epoch: the only forward that runs at the sampling parameters, so it costs nothing
    extra. The minibatch is a uniformly random 1/num_minibatches of the step's prompt groups
    (all of them when num_minibatches = 1): the mean is an unbiased estimate of the batch's,
    the max a lower bound on it.
    """
    n = sums["mismatch_tokens"]
    return {"rollout/mismatch_kl": sums["mismatch_k3_sum"] / jnp.maximum(n, 1.0),
            "rollout/mismatch_max_abs_logp": sums["mismatch_max_abs_logp"],
            "rollout/mismatch_tokens": n}
