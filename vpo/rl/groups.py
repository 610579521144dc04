"""The step's prompt groups before the update: DAPO's soft overlong penalty and dynamic
sampling (Yu et al., arXiv 2503.14476) choose the B groups trained on out of N = oversample·B
sampled, the configured estimator gives their advantages, and the loss mask says which of their
tokens count.

The estimator's input x (`vpo.rollout.rewards.estimator_input`: the reward it sees, penalty
added) is computed once on the N sampled groups; dynamic sampling keeps groups whose x varies,
and the advantages are the estimator's on the kept rows of that same x.

Shapes: N sampled groups, B trained groups, G samples per group, M answers, R reward
components, P prompt tokens, T generated tokens.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from vpo.config import ObjectiveConfig
from vpo.objectives.estimators import Estimator
from vpo.rollout import rewards as rewards_lib
from vpo.tree_ops import masked_mean
from vpo.types import Rollout


class Groups(NamedTuple):
    """The B groups an update trains on, each a row of the N sampled (`select_groups`)."""

    prompt_BP: jax.Array
    prompt_mask_BP: jax.Array
    rollout: Rollout  # [B, G, ...]
    solution_mask_BGM: jax.Array
    x: jax.Array  # the estimator's input (`estimator_input`), [B, G, ...]
    behaviour_BGT: jax.Array  # the sampler's log-probs (the rollout's own unless stale)
    valid_B: jax.Array  # False on fillers: too few groups varied (dynamic sampling)


def overlong_penalty_NG(  # noqa: N802  (shape suffix)
        cfg: ObjectiveConfig, length_NG, max_new_tokens: int):
    """DAPO's soft overlong penalty of every sample (`vpo.rollout.rewards.overlong_penalty`,
    L_max = objective.overlong_max_len or the budget), 0 without `objective.overlong_cache_len`."""
    if not cfg.overlong_cache_len:
        return jnp.zeros(length_NG.shape, jnp.float32)
    return rewards_lib.overlong_penalty(length_NG, cfg.overlong_max_len or max_new_tokens,
                                        cfg.overlong_cache_len)


def select_groups(cfg: ObjectiveConfig, est: Estimator, weights_R, batch, rollout: Rollout,
                  rewards_NGMR, solution_mask_NGM, solved_NG, behaviour_NGT, *,
                  max_new_tokens: int) -> tuple[Groups, dict[str, Any]]:
    """The N sampled groups → the B trained (`Groups`) and the selection's metrics.

    x_N = estimator input with the overlong penalty added; keep_N = x_N varies within the
    group (`input_varies`); with `objective.dynamic_sampling` the first B kept groups in order,
    filled up with others marked invalid (`dynamic_selection`), else all N = B.
    Metrics: overlong_penalty (mean over N·G), zero_variance_frac (share of N not kept)."""
    N = rollout.tokens_BGT.shape[0]
    B = N // cfg.oversample
    penalty_NG = overlong_penalty_NG(cfg, rollout.length_BG, max_new_tokens)
    x_N = rewards_lib.estimator_input(est, rewards_NGMR, solution_mask_NGM, weights_R,
                                      penalty_NG, solved_NG)
    keep_N = rewards_lib.input_varies(est, x_N, solution_mask_NGM)
    chosen = (batch["prompt_BP"], batch["prompt_mask_BP"], rollout, solution_mask_NGM, x_N,
              behaviour_NGT)
    if cfg.dynamic_sampling:
        idx_B, valid_B = rewards_lib.dynamic_selection(keep_N, B)
        chosen = jax.tree.map(lambda x: x[idx_B], chosen)
    else:
        valid_B = jnp.ones((B,), bool)
    metrics = dict(overlong_penalty=jnp.mean(penalty_NG),
                   zero_variance_frac=jnp.mean((~keep_N).astype(jnp.float32)))
    return Groups(*chosen, valid_B), metrics


def loss_mask_BGT(  # noqa: N802  (shape suffix)
        cfg: ObjectiveConfig, groups: Groups):
    """The tokens the loss counts: real tokens of valid groups, and with
    `objective.overlong_mask` only those of samples that finished (not cut off)."""
    mask_BGT = groups.rollout.mask_BGT & groups.valid_B[:, None, None]
    if cfg.overlong_mask:
        mask_BGT = mask_BGT & groups.rollout.finished_BG[:, :, None]
    return mask_BGT


def update_batch(groups: Groups, adv_BG, mask_BGT) -> dict[str, jax.Array]:
    """The arrays the PPO epochs minibatch over (`vpo.rl.ppo.ppo_epochs`): prompts, tokens,
    old log-probs (the rollout's), the loss mask, the real-token mask and adv_BG."""
    r = groups.rollout
    return dict(prompt_BP=groups.prompt_BP, prompt_mask_BP=groups.prompt_mask_BP,
                tokens_BGT=r.tokens_BGT, old_logp_BGT=r.logp_BGT, mask_BGT=mask_BGT,
                real_BGT=r.mask_BGT, adv_BG=adv_BG)


def group_metrics(groups: Groups, adv_BG, mask_BGT, selection: dict[str, Any]
                  ) -> dict[str, Any]:
    """adv_mean and adv_std over the valid groups, the selection's metrics, kept_frac (share
    of valid groups) and loss_token_frac (loss tokens over real tokens)."""
    valid_BG = jnp.broadcast_to(groups.valid_B[:, None], adv_BG.shape)
    adv_mean = masked_mean(adv_BG, valid_BG)
    real_BGT = groups.rollout.mask_BGT
    return dict(
        adv_mean=adv_mean,
        adv_std=jnp.sqrt(masked_mean(jnp.square(adv_BG - adv_mean), valid_BG)),
        **selection,
        kept_frac=jnp.mean(groups.valid_B.astype(jnp.float32)),
        loss_token_frac=jnp.mean(mask_BGT) / jnp.maximum(jnp.mean(real_BGT), 1e-9),
    )
