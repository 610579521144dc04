"""The scalar group-baseline family: GRPO / Dr. GRPO, RLOO, MaxRL, Max@k, pass@k training,
best-of-group, GDPO.

Private module; the public names are re-exported by `vpo.objectives`. Dimension key: B prompts,
G samples per prompt, R reward components.

Every estimator returns `(adv_BG, metrics)`; metrics always hold "adv/nonfinite_rewards" (the
number of valid rollouts with a non-finite reward). Non-finite rewards: an eager call raises
`vpo.errors.RewardError`; a traced call (jit, vmap, grad) returns NaN advantages for the valid
rollouts of every group that holds one, so a training step that skips non-finite updates skips
it. Padded rollouts (mask False) may hold anything, NaN included: they are ignored.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from vpo.config import GRPO_SCALES, STD_MODES
from vpo.objectives.common import (
    STD_DDOF,
    as_float,
    batch_stats,
    check_choice,
    check_not_key,
    check_shape,
    group_stats,
    nan_groups,
    nonfinite_metric,
    rollout_mask,
    screen_rewards,
)

Array = jax.Array
Metrics = dict[str, Array]


def grpo_advantages(
    rewards_BG: Array,
    mask_BG: Array | None = None,
    *,
    scale: str = "group",
    std: str = "unbiased",
    eps: float = 1e-6,
) -> tuple[Array, Metrics]:
    r"""GRPO / Dr. GRPO group-relative advantage of scalar rewards.

    ```
    scale="group": A_bg = (r_bg - mean_g r_b) / (std_g r_b + eps)     GRPO (arXiv 2402.03300)
    scale="batch": A_bg = (r_bg - mean_g r_b) / (std_batch r + eps)   TRL scale_rewards="batch"
    scale="none":  A_bg =  r_bg - mean_g r_b                          Dr. GRPO (arXiv 2503.20783)
    ```
    `std="unbiased"` (ddof 1, verl/TRL `torch.std`, the VPO paper's GRPO baseline) or "population"
    (ddof 0, what VPO uses). Groups with fewer than two valid rollouts get 0 (verl instead uses
    mean 0, std 1 there, which hands the raw reward to a lone sample).

    Args:
        rewards_BG: scalar rewards. mask_BG: optional bool rollout mask (False = padding, gets 0).

    Returns:
        (adv_BG, metrics).
    """
    check_choice("scale", scale, GRPO_SCALES)
    check_choice("std", std, STD_MODES)
    rewards_BG, m_BG, bad_BG = _scalar_input("grpo_advantages", rewards_BG, mask_BG)
    return _grpo(rewards_BG, m_BG, bad_BG, scale, std, eps), nonfinite_metric(bad_BG)


def _grpo(rewards_BG, m_BG, bad_BG, scale, std, eps) -> Array:
    """`grpo_advantages` on screened rewards (`screen_rewards`), NaN for the flagged groups."""
    ddof = STD_DDOF[std]
    mean_B, std_B, n_B = group_stats(rewards_BG, m_BG, ddof)
    adv_BG = rewards_BG - mean_B[:, None]
    if scale == "group":
        adv_BG = adv_BG / (std_B[:, None] + eps)
    elif scale == "batch":
        # a non-finite reward poisons the batch std, hence every group
        batch_std = batch_stats(rewards_BG, m_BG, ddof)[1]
        adv_BG = adv_BG / (jnp.where(jnp.any(bad_BG), jnp.nan, batch_std) + eps)
    adv_BG = jnp.where(m_BG & (n_B >= 2)[:, None], adv_BG, 0.0)
    return nan_groups(adv_BG, jnp.any(bad_BG, -1), m_BG)


def rloo_advantages(rewards_BG: Array, mask_BG: Array | None = None) -> tuple[Array, Metrics]:
    r"""REINFORCE leave-one-out: `A_bg = r_bg - mean_{j != g} r_bj = n/(n-1) (r_bg - mean_g r_b)`.

    No std division. Groups with fewer than two valid rollouts get 0.
    References: Ahmadian et al., arXiv 2402.14740; Kool et al. 2019.
    Returns (adv_BG, metrics).
    """
    rewards_BG, m_BG, bad_BG = _scalar_input("rloo_advantages", rewards_BG, mask_BG)
    mean_B, _, n_B = group_stats(rewards_BG, m_BG, 0)
    adv_BG = (n_B / jnp.maximum(n_B - 1.0, 1.0))[:, None] * (rewards_BG - mean_B[:, None])
    adv_BG = jnp.where(m_BG & (n_B >= 2)[:, None], adv_BG, 0.0)
    return nan_groups(adv_BG, jnp.any(bad_BG, -1), m_BG), nonfinite_metric(bad_BG)


def _scalar_input(fn: str, rewards_BG, mask_BG, name: str = "rewards_BG"):
    """(screened rewards_BG, m_BG, bad_BG) of scalar estimator `fn`'s input."""
    check_not_key(fn, name, rewards_BG)
    check_not_key(fn, "mask_BG", mask_BG)
    rewards_BG = as_float(rewards_BG)
    check_shape(name, rewards_BG, (None, None))
    m_BG = rollout_mask(rewards_BG, mask_BG)
    rewards_BG, bad_BG = screen_rewards(name, rewards_BG, m_BG)
    return rewards_BG, m_BG, bad_BG


def maxrl_advantages(
    rewards_BG: Array, mask_BG: Array | None = None, *, eps: float = 1e-6
) -> tuple[Array, Metrics]:
    r"""MaxRL: `A_bg = (r_bg - mu_b) / (mu_b + eps)`, `mu_b` the group mean.

    Meant for rewards >= 0 (success probabilities): a group with mean 0 (all failures) gets zero
    update; rewards of mixed sign are not checked and can make `mu_b` ~ 0 and the advantages
    huge. References: Tajwar & Zeng, arXiv 2602.02710. Returns (adv_BG, metrics).
    """
    rewards_BG, m_BG, bad_BG = _scalar_input("maxrl_advantages", rewards_BG, mask_BG)
    mean_B, _, n_B = group_stats(rewards_BG, m_BG, 0)
    adv_BG = (rewards_BG - mean_B[:, None]) / (mean_B[:, None] + eps)
    adv_BG = jnp.where(m_BG & (n_B >= 2)[:, None], adv_BG, 0.0)
    return nan_groups(adv_BG, jnp.any(bad_BG, -1), m_BG), nonfinite_metric(bad_BG)


@functools.cache
def _max_at_k_weights(G: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact binomial weights as [n, rank] tables (n = 0..G valid rollouts, rank 1-based; rank 0
    and ranks above n are padding): own = C(rank-1, k-1) / C(n, k), other = C(rank-2, k-2) /
    C(n, k) (0 for k < 2), both 0 for n < k. Integer binomials, one rounding to float32."""
    own = np.zeros((G + 1, G + 1))
    other = np.zeros((G + 1, G + 1))
    for n in range(k, G + 1):
        total = math.comb(n, k)
        for i in range(1, n + 1):
            own[n, i] = math.comb(i - 1, k - 1) / total
            if k >= 2 and i >= 2:
                other[n, i] = math.comb(i - 2, k - 2) / total
    return own.astype(np.float32), other.astype(np.float32)


def max_at_k_advantages(
    rewards_BG: Array,
    k: int | None = None,
    mask_BG: Array | None = None,
    *,
    std_normalize: bool = True,
    std: str = "unbiased",
    eps: float = 1e-6,
) -> tuple[Array, Metrics]:
    r"""Max@k: unbiased credit for the expected max of a random k-subset of the group.

    Sort the n valid rewards of a group ascending, `r_(1) <= ... <= r_(n)`. Rank i gets its total
    credit over the k-subsets that contain it, each subset paying its max:
    ```
    Ahat_(i) = [ C(i-1, k-1) r_(i) + sum_{j>i} C(j-2, k-2) r_(j) ] / C(n, k)
    A = Ahat - mean_g Ahat            (then / (std_g Ahat + eps) if std_normalize, the default)
    ```
    `k` defaults to max(2, G // 2). Groups with fewer than k valid rollouts get 0. The std is
    unbiased (ddof 1) by default, as verl's `norm_adv_by_std_in_grpo` (on by default there);
    `std="population"` for ddof 0. k = n is degenerate (every credit is the group max: A = 0).

    References: "The Best of N Worlds", arXiv 2510.23393 (verl
    `compute_max_at_k_outcome_advantage`). Returns (adv_BG, metrics).
    """
    check_choice("std", std, STD_MODES)
    rewards_BG, m_BG, bad_BG = _scalar_input("max_at_k_advantages", rewards_BG, mask_BG)
    G = rewards_BG.shape[1]
    k = max(2, G // 2) if k is None else int(k)
    if not 1 <= k <= G:
        raise ValueError(f"k={k} must satisfy 1 <= k <= G={G}")
    n_int_B = m_BG.sum(-1)
    n_B = n_int_B.astype(rewards_BG.dtype)
    order_BG = jnp.argsort(jnp.where(m_BG, rewards_BG, -jnp.inf), axis=-1)  # padding sorts first
    sorted_BG = jnp.take_along_axis(rewards_BG, order_BG, axis=-1)
    rank_BG = jnp.arange(1, G + 1)[None, :] - (G - n_int_B)[:, None]  # 1-based; <= 0: padding
    rank_BG = jnp.maximum(rank_BG, 0)
    # Credits shift with the rewards (credit(r + c) = credit(r) + c k/n) and the mean removes
    # the shift: computing them from r - min_g r makes a constant group's credits exactly 0, so
    # the rounding of the binomial weights is never divided by a ~0 std.
    low_B = jnp.min(jnp.where(m_BG, rewards_BG, jnp.inf), axis=-1)
    low_B = jnp.where(n_B > 0, low_B, 0.0)
    r_BG = jnp.where(rank_BG >= 1, sorted_BG - low_B[:, None], 0.0)
    own_NR, other_NR = map(jnp.asarray, _max_at_k_weights(G, k))
    c_own_BG = own_NR[n_int_B[:, None], rank_BG]
    if k >= 2:
        paid_BG = other_NR[n_int_B[:, None], rank_BG] * r_BG
        above_BG = jnp.cumsum(paid_BG[:, ::-1], axis=-1)[:, ::-1] - paid_BG  # sum over j > i
    else:
        above_BG = jnp.zeros_like(r_BG)
    credit_sorted_BG = c_own_BG * r_BG + above_BG
    inverse_BG = jnp.argsort(order_BG, axis=-1)
    credit_BG = jnp.take_along_axis(credit_sorted_BG, inverse_BG, axis=-1)
    mean_B, std_B, _ = group_stats(credit_BG, m_BG, STD_DDOF[std])
    adv_BG = credit_BG - mean_B[:, None]
    if std_normalize:
        adv_BG = adv_BG / (std_B[:, None] + eps)
    adv_BG = jnp.where(m_BG & (n_B >= k)[:, None], adv_BG, 0.0)
    return nan_groups(adv_BG, jnp.any(bad_BG, -1), m_BG), nonfinite_metric(bad_BG)


def _falling_ratio(top_B: Array, bottom_B: Array, j: int) -> Array:
    """C(top, j) / C(bottom, j) = prod_{i<j} (top - i) / (bottom - i), for integer-valued
    top <= bottom (0 when top < j: one factor is exactly 0); bottom >= j expected."""
    out_B = jnp.ones_like(top_B)
    for i in range(j):
        out_B = out_B * (top_B - i) / jnp.maximum(bottom_B - i, 1.0)
    return out_B


def pass_at_k_advantages(
    correct_BG: Array,
    k: int | None = None,
    mask_BG: Array | None = None,
    *,
    eps: float = 1e-6,
) -> tuple[Array, Metrics]:
    r"""Pass@k training: the analytic group advantage of the pass@k reward (binary outcomes).

    With n valid rollouts of a group, c of them correct, every k-subset is rewarded with its
    pass@k (1 if it holds a correct rollout) and z-scored over all C(n, k) subsets; a rollout's
    advantage is the mean over the subsets that contain it. In closed form:
    ```
    rho   = 1 - C(n-c, k) / C(n, k)                    mean subset reward (pass@k)
    sigma = sqrt(rho (1 - rho))                        its (population) std over subsets
    A_pos = (1 - rho) / (sigma + eps)                  every correct rollout
    A_neg = (1 - rho - C(n-c-1, k-1) / C(n-1, k-1)) / (sigma + eps)     every incorrect one
    ```
    `k` defaults to max(2, G // 2). Groups with fewer than k valid rollouts, no correct
    rollout (c = 0) or fewer than k incorrect ones (rho = 1) get 0: every subset scores the same.

    References: Chen et al., "Pass@k Training for Adaptively Balancing Exploration and
    Exploitation of Large Reasoning Models", arXiv 2508.10751 (analytical derivation, §3).

    Args:
        correct_BG: bool (or 0/1) outcome of each rollout; any value > 0 counts as correct.
        mask_BG: optional rollout mask.

    Returns:
        (adv_BG, metrics).
    """
    check_not_key("pass_at_k_advantages", "correct_BG", correct_BG)
    check_not_key("pass_at_k_advantages", "mask_BG", mask_BG)
    correct_BG = jnp.asarray(correct_BG)
    check_shape("correct_BG", correct_BG, (None, None))
    G = correct_BG.shape[1]
    k = max(2, G // 2) if k is None else int(k)
    if not 1 <= k <= G:
        raise ValueError(f"k={k} must satisfy 1 <= k <= G={G}")
    m_BG = rollout_mask(correct_BG, mask_BG)
    correct_BG, bad_BG = screen_rewards("correct_BG", as_float(correct_BG), m_BG)
    pos_BG = m_BG & (correct_BG > 0)
    n_B = m_BG.sum(-1).astype(jnp.float32)
    c_B = pos_BG.sum(-1).astype(jnp.float32)
    rho_B = 1.0 - _falling_ratio(n_B - c_B, n_B, k)
    sigma_B = jnp.sqrt(jnp.maximum(rho_B * (1.0 - rho_B), 0.0))
    a_pos_B = (1.0 - rho_B) / (sigma_B + eps)
    a_neg_B = (1.0 - rho_B - _falling_ratio(n_B - c_B - 1.0, n_B - 1.0, k - 1)) / (sigma_B + eps)
    live_B = (n_B >= k) & (c_B > 0) & (n_B - c_B >= k)
    adv_BG = jnp.where(pos_BG, a_pos_B[:, None], a_neg_B[:, None])
    adv_BG = jnp.where(m_BG & live_B[:, None], adv_BG, 0.0)
    return nan_groups(adv_BG, jnp.any(bad_BG, -1), m_BG), nonfinite_metric(bad_BG)


def best_of_group_advantages(
    rewards_BG: Array,
    mask_BG: Array | None = None,
    *,
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> tuple[Array, Metrics]:
    r"""Pass@k-style best-of-group: only the group's best rollout learns, with `r_max - r_second`.

    ```
    A_bg = (r_(n) - r_(n-1)) [/ (std_g r_b + eps)]   for g = argmax_g r_bg (first on ties), else 0
    ```
    std is unbiased (ddof 1) as in verl `grpo_passk` (`norm_adv_by_std_in_grpo=True` by default).
    Groups with fewer than two valid rollouts get 0. References: arXiv 2503.19595.
    Returns (adv_BG, metrics).
    """
    rewards_BG, m_BG, bad_BG = _scalar_input("best_of_group_advantages", rewards_BG, mask_BG)
    G = rewards_BG.shape[1]
    if G < 2:
        return nan_groups(jnp.zeros_like(rewards_BG), bad_BG[:, 0], m_BG), nonfinite_metric(bad_BG)
    masked_BG = jnp.where(m_BG, rewards_BG, -jnp.inf)
    top2_B2 = jax.lax.top_k(masked_BG, 2)[0]
    _, std_B, n_B = group_stats(rewards_BG, m_BG, 1)
    gap_B = jnp.where(n_B >= 2, top2_B2[:, 0] - top2_B2[:, 1], 0.0)
    if std_normalize:
        gap_B = gap_B / (std_B + eps)
    best_BG = jnp.arange(G)[None, :] == jnp.argmax(masked_BG, axis=-1)[:, None]
    adv_BG = jnp.where(best_BG & m_BG, gap_B[:, None], 0.0)
    return nan_groups(adv_BG, jnp.any(bad_BG, -1), m_BG), nonfinite_metric(bad_BG)


def gdpo_advantages(
    rewards_BGR: Array,
    mask_BG: Array | None = None,
    *,
    weights_R: Array | None = None,
    std: str = "unbiased",
    eps: float = 1e-6,
) -> tuple[Array, Metrics]:
    r"""GDPO: per-component group z-score, weighted sum, then batch whitening.

    ```
    z_bgr = (r_bgr - mean_g r_b.r) / (std_g r_b.r + eps)       (0 for groups of < 2 rollouts)
    s_bg  = sum_r weights_r z_bgr                              (weights default to 1)
    A_bg  = (s_bg - mean_batch s) / (std_batch s + eps)        over valid rollouts
    ```
    Whitening is over rollouts (verl whitens over response tokens, weighting long responses more);
    a non-finite reward therefore makes every group NaN (under jit). `weights_R` are any reals
    (not a simplex). References: GDPO, NVlabs, arXiv 2601.05242. Returns (adv_BG, metrics).
    """
    check_choice("std", std, STD_MODES)
    check_not_key("gdpo_advantages", "rewards_BGR", rewards_BGR)
    check_not_key("gdpo_advantages", "mask_BG", mask_BG)
    rewards_BGR = as_float(rewards_BGR)
    check_shape("rewards_BGR", rewards_BGR, (None, None, None))
    B, G, R = rewards_BGR.shape
    ddof = STD_DDOF[std]
    w_R = jnp.ones((R,), rewards_BGR.dtype) if weights_R is None else as_float(weights_R)
    check_shape("weights_R", w_R, (R,))
    m_BG = rollout_mask(rewards_BGR[..., 0], mask_BG)
    rewards_BGR, bad_BG = screen_rewards("rewards_BGR", rewards_BGR, m_BG)
    no_bad_BG = jnp.zeros_like(bad_BG)

    def zscore(r_BG):
        return _grpo(r_BG, m_BG, no_bad_BG, "group", std, eps)

    z_RBG = jax.vmap(zscore)(jnp.moveaxis(rewards_BGR, -1, 0))
    s_BG = jnp.einsum("rbg,r->bg", z_RBG, w_R)
    mean, sd = batch_stats(s_BG, m_BG, ddof)
    adv_BG = jnp.where(m_BG, (s_BG - mean) / (sd + eps), 0.0)
    return nan_groups(adv_BG, jnp.broadcast_to(jnp.any(bad_BG), (B,)), m_BG), \
        nonfinite_metric(bad_BG)
