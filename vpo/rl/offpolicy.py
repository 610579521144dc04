"""Importance weights that correct a stale rollout (`train.off_policy_steps` = 1), as pure
functions of log-probs.

With the overlapped step (`vpo.rl.overlap.overlapped_rl_step`) the rollout a step trains on was
sampled by the previous parameters: π_behav, whose log-probs the sampler recorded. The update
recomputes the log-probs at the parameters it starts from, π_prox (the PPO ratio's old_logp:
the proximal policy of decoupled PPO, Hilton et al. 2022, arXiv 2110.00641), and weighs each
token's policy-gradient term by how much more likely π_prox made it than the sampler did,
with Δ = log π_prox(y_t) − log π_behav(y_t):

    token_tis:  w_t = min(e^Δ_t, C)                                      truncated IS per token
    seq_mis:    w_t = 1[ |mean_t Δ_t| ≤ log C ]   per sequence: its geometric-mean ratio
                                                  in [1/C, C] keeps it, outside drops it

Truncated IS of the rollout/trainer gap: Yao et al. 2025, "Your efficient RL framework secretly
brings you off-policy RL training" (fengyao.notion.site/off-policy-rl); the masked
sequence-level variant as verl's rollout correction (`rollout_is: sequence`, mask mode) applies
it. The weights are constants to the gradient (stop-gradient) and exactly 1 where π_prox is
π_behav (Δ = 0): on-policy they change nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vpo.config import ConfigError, ObjectiveConfig, TrainConfig
from vpo.tree_ops import masked_mean

STALENESS = "offpolicy/staleness"


def rollout_is_mode(objective: ObjectiveConfig, train: TrainConfig) -> str:
    """The correction a run applies: `objective.rollout_is`, or when None "token_tis" for an
    overlapped run (`train.off_policy_steps` = 1) and "none" for a synchronous one."""
    if objective.rollout_is is not None:
        return objective.rollout_is
    return "token_tis" if train.off_policy_steps else "none"


def log_ratio_BGT(proximal_logp_BGT, behaviour_logp_BGT, real_BGT) -> jax.Array:  # noqa: N802
    """Δ = log π_prox − log π_behav on real tokens, 0 on padding."""
    return jnp.where(real_BGT, proximal_logp_BGT - behaviour_logp_BGT, 0.0)


def token_tis_weights_BGT(proximal_logp_BGT, behaviour_logp_BGT, real_BGT,  # noqa: N802
                          cap: float) -> tuple[jax.Array, jax.Array]:
    """Truncated IS per token → (w_BGT = min(e^Δ, C), clipped_BGT: real tokens with e^Δ > C)."""
    ratio_BGT = jnp.exp(jnp.minimum(log_ratio_BGT(proximal_logp_BGT, behaviour_logp_BGT,
                                                  real_BGT), 20.0))
    clipped_BGT = real_BGT & (ratio_BGT > cap)
    return jnp.minimum(ratio_BGT, cap), clipped_BGT


def seq_mis_weights_BGT(proximal_logp_BGT, behaviour_logp_BGT, real_BGT,  # noqa: N802
                        cap: float) -> tuple[jax.Array, jax.Array]:
    """Masked IS per sequence → (w_BGT ∈ {0, 1}, dropped_BGT: the real tokens of sequences
    whose geometric-mean ratio exp(mean_t Δ) leaves [1/C, C])."""
    delta_BGT = log_ratio_BGT(proximal_logp_BGT, behaviour_logp_BGT, real_BGT)
    length_BG = jnp.maximum(jnp.sum(real_BGT, axis=-1, dtype=jnp.float32), 1.0)
    mean_BG = jnp.sum(delta_BGT, axis=-1) / length_BG
    keep_BG = jnp.abs(mean_BG) <= jnp.log(jnp.float32(cap))
    w_BGT = jnp.broadcast_to(keep_BG[..., None], real_BGT.shape).astype(jnp.float32)
    return w_BGT, real_BGT & ~keep_BG[..., None]


def rollout_is_weights_BGT(mode: str, proximal_logp_BGT, behaviour_logp_BGT,  # noqa: N802
                           real_BGT, cap: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The weights of `mode` ("token_tis" or "seq_mis") → (w_BGT, stop-gradient, with
    metrics over the `real_BGT` tokens: offpolicy/is_weight_mean and offpolicy/is_clipped_frac,
    the share of tokens the cap changed (truncated, or dropped with their sequence))."""
    if mode == "token_tis":
        w_BGT, changed_BGT = token_tis_weights_BGT(proximal_logp_BGT, behaviour_logp_BGT,
                                                   real_BGT, cap)
    elif mode == "seq_mis":
        w_BGT, changed_BGT = seq_mis_weights_BGT(proximal_logp_BGT, behaviour_logp_BGT,
                                                 real_BGT, cap)
    else:
        raise ConfigError(f"objective.rollout_is: {mode!r} has no weights; one of token_tis, "
                          "seq_mis")
    w_BGT = jax.lax.stop_gradient(w_BGT)
    return w_BGT, {"offpolicy/is_weight_mean": masked_mean(w_BGT, real_BGT),
                   "offpolicy/is_clipped_frac": masked_mean(changed_BGT.astype(jnp.float32),
                                                            real_BGT)}
