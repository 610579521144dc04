"""TTT-Discover's entropic advantage (Yuksekgonul et al., Learning to Discover at Test Time,
arXiv 2601.16175): a leave-one-out exponential weighting of a group's rewards whose temperature
is set per group by a fixed KL budget.

For a group of G rewards r_1..r_G, with q_beta(i) = exp(beta r_i) / sum_j exp(beta r_j):

    beta   >= 0 solves KL(q_beta || uniform) = log G + sum_i q_beta(i) log q_beta(i) = ln 2
           (bisection; KL grows with beta from 0 at beta = 0)
    w_i    = exp(beta (r_i - r_max)) / mean_{j != i} exp(beta (r_j - r_max))
    A_i    = w_i - 1

A group whose rewards are all equal has beta = 0 and A = 0. The bisection runs on the
range-normalised beta·(r_max - r_min) in [0, `BETA_RANGE_MAX`]; a group that does not reach the
budget there (its best reward shared by more than half of it: the KL tends to log(G / ties) <
ln 2) takes the upper end, where the shared best get w -> (G - 1) / (ties - 1) and the rest 0.
With G = 2 and distinct rewards the budget is reached only as beta -> inf (w of the best
unbounded), so callers ask for G >= 3 (`MIN_GROUP`).

Private module; the public name is re-exported by `vpo.objectives`. Dimension key: B groups,
G rewards per group.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from vpo.objectives.common import as_float, check_shape

Array = jax.Array

KL_TARGET = math.log(2.0)  # the paper's KL(q_beta || uniform) budget
BETA_RANGE_MAX = 1e4  # upper end of beta·(r_max - r_min) for the bisection
MIN_GROUP = 3  # smallest group where a unique best reaches the budget at a finite beta


def kl_to_uniform_B(logits_BG: Array) -> Array:  # noqa: N802  (shape suffix)
    """KL(softmax(logits) || uniform) per group = log G + sum_i q_i log q_i."""
    logq_BG = jax.nn.log_softmax(logits_BG, axis=-1)
    return math.log(logits_BG.shape[-1]) + jnp.sum(jnp.exp(logq_BG) * logq_BG, axis=-1)


def entropic_beta(rewards_BG: Array, *, kl_target: float = KL_TARGET, iters: int = 64
                  ) -> Array:
    """beta_B >= 0 with KL(q_beta || uniform) = `kl_target` per group, by `iters` bisection
    steps on b = beta·(r_max - r_min) in [0, BETA_RANGE_MAX] (0 for a constant group)."""
    rewards_BG = as_float(rewards_BG)
    check_shape("rewards_BG", rewards_BG, (None, None))
    r_max_B, r_min_B = jnp.max(rewards_BG, -1), jnp.min(rewards_BG, -1)
    span_B = r_max_B - r_min_B
    live_B = span_B > 0
    unit_BG = (rewards_BG - r_max_B[:, None]) / jnp.where(live_B, span_B, 1.0)[:, None]

    def halve(bounds, _):
        lo_B, hi_B = bounds
        mid_B = 0.5 * (lo_B + hi_B)
        over_B = kl_to_uniform_B(mid_B[:, None] * unit_BG) > kl_target
        return (jnp.where(over_B, lo_B, mid_B), jnp.where(over_B, mid_B, hi_B)), None

    B = rewards_BG.shape[0]
    (lo_B, hi_B), _ = jax.lax.scan(
        halve, (jnp.zeros((B,), jnp.float32), jnp.full((B,), BETA_RANGE_MAX, jnp.float32)),
        None, length=iters)
    b_B = 0.5 * (lo_B + hi_B)
    return jnp.where(live_B, b_B / jnp.where(live_B, span_B, 1.0), 0.0)


def entropic_advantages(rewards_BG: Array, *, kl_target: float = KL_TARGET, iters: int = 64
                        ) -> tuple[Array, dict[str, Array]]:
    """TTT-Discover's entropic advantage A_BG = w - 1 (module docstring), beta chosen per group
    by `entropic_beta` → (adv_BG, metrics: "entropic/beta_mean", "entropic/kl_mean" (the KL
    reached), "entropic/adv_max"). Needs G >= 2 rewards per group (the leave-one-out mean);
    G >= `MIN_GROUP` keeps w bounded."""
    rewards_BG = as_float(rewards_BG)
    check_shape("rewards_BG", rewards_BG, (None, None))
    G = rewards_BG.shape[1]
    if G < 2:
        raise ValueError(f"entropic_advantages needs G >= 2 rewards per group (a leave-one-out "
                         f"mean); got G = {G}")
    beta_B = entropic_beta(rewards_BG, kl_target=kl_target, iters=iters)
    logits_BG = beta_B[:, None] * (rewards_BG - jnp.max(rewards_BG, -1, keepdims=True))
    e_BG = jnp.exp(logits_BG)
    others_BG = (jnp.sum(e_BG, -1, keepdims=True) - e_BG) / (G - 1)
    adv_BG = e_BG / others_BG - 1.0
    metrics = {"entropic/beta_mean": jnp.mean(beta_B),
               "entropic/kl_mean": jnp.mean(kl_to_uniform_B(logits_BG)),
               "entropic/adv_max": jnp.max(adv_BG)}
    return adv_BG, metrics
