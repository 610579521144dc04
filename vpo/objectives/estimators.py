"""The one estimator table: `objective.advantage` name → `Estimator` (the reward it sees, the
function that turns it into adv_BG, the objective fields it reads). The RL step looks the
configured name up here; `vpo.config.ADVANTAGES` lists the same names so configs validate
without jax (checked at import).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp

from vpo.config import ADVANTAGES
from vpo.objectives.advantages import (
    gdpo_advantages,
    grpo_advantages,
    max_at_k_advantages,
    maxrl_advantages,
    pass_at_k_advantages,
    rloo_advantages,
)
from vpo.objectives.vpo import random_weight_grpo_advantages, vpo_advantages


class Estimator(NamedTuple):
    """One advantage estimator: the reward it sees and the function that turns it into adv_BG.

    sees: "scalar" (w*ᵀr summed over valid answers, + penalty → reward_BG), "components"
    (per-component sums over valid answers, + penalty on each → reward_BGR), "vectors" (every
    answer's vector, + penalty on each component → rewards_BGMR) or "correct" (solved_BG).
    fn(cfg, x, solution_mask_BGM, weights_R, key) -> (adv_BG, metrics).
    reads: the estimator-specific `ObjectiveConfig` fields fn uses (of `ESTIMATOR_FIELDS`).
    """

    sees: str
    fn: Callable
    reads: frozenset[str] = frozenset()


def _grpo(cfg, x_BG, smask, weights_R, key):
    return grpo_advantages(x_BG, scale=cfg.grpo_scale, std=cfg.grpo_std), {}


def _dr_grpo(cfg, x_BG, smask, weights_R, key):
    return grpo_advantages(x_BG, scale="none", std=cfg.grpo_std), {}


def _rloo(cfg, x_BG, smask, weights_R, key):
    return rloo_advantages(x_BG), {}


def _maxrl(cfg, x_BG, smask, weights_R, key):
    return maxrl_advantages(x_BG), {}


def _gdpo(cfg, x_BGR, smask, weights_R, key):
    return gdpo_advantages(x_BGR, weights_R=jnp.asarray(weights_R),
                                      std=cfg.grpo_std), {}


def _vpo(cfg, x_BGMR, smask, weights_R, key):
    return vpo_advantages(x_BGMR, smask, key=key, num_weights=cfg.num_weights,
                                     alpha=cfg.alpha, sampler=cfg.weight_sampler)


def _maxk(cfg, x_BG, smask, weights_R, key):
    k = cfg.subset_size(x_BG.shape[1])
    return max_at_k_advantages(x_BG, k, std_normalize=True, std=cfg.grpo_std), {}


def _passk(cfg, correct_BG, smask, weights_R, key):
    k = cfg.subset_size(correct_BG.shape[1])
    return pass_at_k_advantages(correct_BG, k), {}


def _rw_grpo(cfg, x_BGR, smask, weights_R, key):
    adv_BG, _ = random_weight_grpo_advantages(
        x_BGR, key=key, alpha=cfg.alpha, scale=cfg.grpo_scale, std=cfg.grpo_std)
    return adv_BG, {}


# The estimator table: `objective.advantage` → Estimator (names: `vpo.config.ADVANTAGES`).
ESTIMATORS: dict[str, Estimator] = {
    "grpo": Estimator("scalar", _grpo, frozenset({"grpo_scale", "grpo_std"})),  # arXiv 2402.03300
    "dr_grpo": Estimator("scalar", _dr_grpo),  # Dr. GRPO, arXiv 2503.20783 (no std: unscaled)
    "rloo": Estimator("scalar", _rloo),  # RLOO, arXiv 2402.14740
    "maxrl": Estimator("scalar", _maxrl),  # MaxRL, arXiv 2602.02710
    "gdpo": Estimator("components", _gdpo, frozenset({"grpo_std"})),  # GDPO, arXiv 2601.05242
    "vpo": Estimator("vectors", _vpo,  # VPO, arXiv 2605.22817
                     frozenset({"num_weights", "alpha", "weight_sampler"})),
    "maxk": Estimator("scalar", _maxk,  # Max@k, arXiv 2510.23393 (verl, std-normalised)
                      frozenset({"subset_k", "grpo_std"})),
    "passk": Estimator("correct", _passk, frozenset({"subset_k"})),  # pass@k, 2508.10751
    "rw_grpo": Estimator("components", _rw_grpo,  # random-weight GRPO (VPO's baseline)
                         frozenset({"alpha", "grpo_scale", "grpo_std"})),
}


# The objective fields that belong to some estimators only (the rest serve every estimator).
ESTIMATOR_FIELDS = frozenset().union(*(e.reads for e in ESTIMATORS.values()))
if tuple(ESTIMATORS) != ADVANTAGES:  # one list of names: the config validates against it
    raise ImportError(f"vpo.objectives.estimators.ESTIMATORS {tuple(ESTIMATORS)} != "
                      f"vpo.config.ADVANTAGES "
                      f"{ADVANTAGES}")
