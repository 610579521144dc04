"""Rewards to advantages for one RL step: task rewards in-graph (`jax.vmap(task.reward)`) or
on the host (the generations' text), the fixed scalarisation w*ᵀr, DAPO's soft overlong penalty
and dynamic sampling (Yu et al., arXiv 2503.14476), and the configured advantage estimator
through the one name-to-function table `vpo.objectives.estimators.ESTIMATORS` (GRPO family, Max@k,
pass@k training, random-weight GRPO or VPO, `vpo.objectives`). Pure functions; `vpo.rl.step` calls
them inside its jitted step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from vpo.config import ObjectiveConfig
from vpo.objectives.estimators import ESTIMATORS, Estimator
from vpo.tasks.bound import BoundTask
from vpo.types import Rollout


def scalarize(rewards_BGMR, solution_mask_BGM, weights_R):
    """sum over valid answers of w*ᵀ r (the single answer when M = 1) → reward_BG."""
    score_BGM = jnp.einsum("bgmr,r->bgm", rewards_BGMR, jnp.asarray(weights_R, jnp.float32))
    return jnp.sum(jnp.where(solution_mask_BGM, score_BGM, 0.0), axis=-1)


def overlong_penalty(length_BG, max_len: int, cache_len: int):
    """DAPO soft overlong punishment (Yu et al., 2025, arXiv 2503.14476) → penalty_BG ≤ 0.

        R_len(L) = 0                            L ≤ L_max − L_cache
                 = ((L_max − L_cache) − L) / L_cache   L_max − L_cache < L ≤ L_max
                 = −1                           L > L_max
    """
    L = length_BG.astype(jnp.float32)
    start = max_len - cache_len
    soft = (start - L) / max(cache_len, 1)
    return jnp.where(start >= L, 0.0, jnp.where(max_len >= L, soft, -1.0))


def solved(task: BoundTask, rewards_BGMR, solution_mask_BGM):
    """solved_BG: some valid answer of the generation satisfies `task.solved` (pass@k's
    "correct")."""
    solved_BGM = jax.vmap(jax.vmap(jax.vmap(task.solved)))(rewards_BGMR) & solution_mask_BGM
    return jnp.any(solved_BGM, axis=-1)


def estimator_of(cfg: ObjectiveConfig) -> Estimator:
    """The configured estimator's row of `ESTIMATORS` (what it sees, its function): the one
    place `objective.advantage` is read."""
    return ESTIMATORS[cfg.advantage]


def estimator_input(est: Estimator, rewards_BGMR, solution_mask_BGM, weights_R, penalty_BG,
                    solved_BG=None):
    """The reward estimator `est` (`estimator_of`) sees (`Estimator.sees`), with `penalty_BG`
    (overlong) added.

    vectors: penalty added to every component of every answer (Dirichlet weights sum to 1, so
    each valid answer's wᵀr moves by the penalty; an empty answer set still scores 0)
    → rewards_BGMR. components: per-component sums over valid answers, penalty on each (so a
    simplex weight moves wᵀr by the penalty once) → reward_BGR. correct: `solved_BG` (no
    penalty: `ObjectiveConfig` rejects one) → float 0/1. scalar: the scalarised reward plus the
    penalty → reward_BG.
    """
    sees = est.sees
    if sees == "vectors":
        return rewards_BGMR + penalty_BG[:, :, None, None]
    if sees == "components":
        per_comp_BGR = jnp.sum(jnp.where(solution_mask_BGM[..., None], rewards_BGMR, 0.0), 2)
        return per_comp_BGR + penalty_BG[..., None]
    if sees == "correct":
        if solved_BG is None:
            raise ValueError("an estimator that sees 'correct' (pass@k) needs solved_BG (the "
                             "task's solved predicate on the valid answers, `rewards.solved`)")
        return jnp.asarray(solved_BG, jnp.float32)
    return scalarize(rewards_BGMR, solution_mask_BGM, weights_R) + penalty_BG


def advantages(cfg: ObjectiveConfig, rewards_BGMR, solution_mask_BGM, weights_R, key,
               penalty_BG=None, solved_BG=None):
    """adv_BG and advantage metrics of the configured estimator (`ESTIMATORS`), with an optional
    reward penalty_BG; `solved_BG` (`solved`) is needed by estimators that see "correct"."""
    if penalty_BG is None:
        penalty_BG = jnp.zeros(rewards_BGMR.shape[:2], jnp.float32)
    est = estimator_of(cfg)
    x = estimator_input(est, rewards_BGMR, solution_mask_BGM, weights_R, penalty_BG, solved_BG)
    return est.fn(cfg, x, solution_mask_BGM, weights_R, key)


def group_varies(cfg: ObjectiveConfig, rewards_BGMR, solution_mask_BGM, weights_R, penalty_BG,
                 solved_BG=None):
    """keep_B: the estimator's input is not identical across the G samples of a group (for
    "vectors" the valid-answer pattern counts too; for rw_grpo the component sums, whose
    random scalarisation differs almost surely when they do). A group without variation has
    zero advantage."""
    est = estimator_of(cfg)
    x = estimator_input(est, rewards_BGMR, solution_mask_BGM, weights_R, penalty_BG, solved_BG)
    return input_varies(est, x, solution_mask_BGM)


def input_varies(est: Estimator, x, solution_mask_BGM):
    """keep_B of `group_varies` from the estimator's input x (`estimator_input`): some
    entry of x (and, for "vectors", of the valid-answer pattern) differs across the group."""
    B, G = solution_mask_BGM.shape[:2]
    if est.sees == "vectors":
        x = jnp.concatenate([jnp.where(solution_mask_BGM[..., None], x, 0.0).reshape(B, G, -1),
                             solution_mask_BGM.astype(jnp.float32)], axis=-1)
    x_BGN = x.reshape(B, G, -1)
    return jnp.any(jnp.max(x_BGN, axis=1) > jnp.min(x_BGN, axis=1), axis=-1)


def dynamic_selection(keep_N, batch_size: int):
    """DAPO dynamic sampling with static shapes: of N sampled groups, the first `batch_size`
    that vary, filled up in order with the others if too few → (idx_B, valid_B); valid_B is
    False on the fillers, which the loss masks out."""
    idx_B = jnp.argsort(~keep_N, stable=True)[:batch_size]
    return idx_B, keep_N[idx_B]


def in_graph_rewards(task: BoundTask, problems, tokens_BGT, mask_BGT, num_answers: int):
    """`task.reward` over B problems × G completions (problems: `BoundTask.problem_arrays`
    rows) → (rewards_BGMR, solution_mask_BGM)."""
    per_sample = jax.vmap(lambda p, t, m: task.reward(p, t, m, num_answers),
                          in_axes=(None, 0, 0))
    return jax.vmap(per_sample)(problems["task"], tokens_BGT, mask_BGT)


def host_rewards(task: BoundTask, records, problems, rollout: Rollout, num_answers: int):
    """`task.host_score_applies` on the generations' text (one batched call), the records looked
    up by `problems["index"]` → (rewards_BGMR, solution_mask_BGM, applies_BGMR) as numpy."""
    tokens_BGT = np.asarray(rollout.tokens_BGT)
    mask_BGT = np.asarray(rollout.mask_BGT)
    B, G, T = tokens_BGT.shape
    index_B = np.asarray(problems["index"])
    rows = [records[int(i)] for i in index_B for _ in range(G)]
    rewards, smask, applies = task.host_score_applies(rows, tokens_BGT.reshape(B * G, T),
                                                      mask_BGT.reshape(B * G, T), num_answers)
    return (rewards.reshape(B, G, num_answers, -1), smask.reshape(B, G, num_answers),
            applies.reshape(B, G, num_answers, -1))


def component_means(names, rewards_BGMR, applies_BGMR) -> dict[str, float]:
    """`reward/<name>`: each component's mean over the answer slots it applies to (a reward
    function's None is left out, as TRL's nanmean; invalid slots count 0); NaN where it applies
    to none."""
    r = np.asarray(rewards_BGMR, np.float64).reshape(-1, len(names))
    a = np.asarray(applies_BGMR, bool).reshape(-1, len(names))
    n = a.sum(0)
    mean = np.where(n > 0, (r * a).sum(0) / np.maximum(n, 1), np.nan)
    return {f"reward/{name}": float(v) for name, v in zip(names, mean, strict=True)}
