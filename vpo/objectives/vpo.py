"""VPO: Dirichlet preference weights, the expected-max set score and the VPO advantage; the
random-weight GRPO baseline (one Dirichlet weight per group, no max).

Private module; the public names are re-exported by `vpo.objectives`. Dimension key: B prompts,
G samples per prompt, M answers per sample, R reward components, K Dirichlet weight draws.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from vpo import prng as _prng
from vpo.config import GRPO_SCALES, STD_MODES, WEIGHT_SAMPLERS
from vpo.objectives.advantages import _grpo
from vpo.objectives.common import (
    _MISSING,
    as_float,
    check_choice,
    check_shape,
    check_simplex,
    group_stats,
    key_first_args,
    nan_groups,
    nonfinite_metric,
    rollout_mask,
    screen_rewards,
)

Array = jax.Array


def _kronecker_generator(dim: int) -> np.ndarray:
    """Direction of Roberts' R_d additive recurrence: z_i = phi^-(i+1), phi^(d+1) = phi + 1."""
    phi = 2.0
    for _ in range(64):
        phi = (1.0 + phi) ** (1.0 / (dim + 1))
    return np.mod(phi ** -np.arange(1, dim + 1, dtype=np.float64), 1.0)


# Optimal sorting networks (fewest compare-exchanges) for the sizes the paper setting uses; XLA
# fuses the network into the score loop over [B, G, K], so every comparator saved is saved G times.
_SORT_NETWORKS = {4: ((0, 1), (2, 3), (0, 2), (1, 3), (1, 2))}


def _sorted_rows(u: Array) -> list[Array]:
    """Axis 1 of u [B, n, K] sorted, as a list of n [B, K] slices: a min/max network for small n
    (XLA's comparator sort is slow on CPU), `jnp.sort` otherwise. Any network gives the same
    values."""
    n = u.shape[1]
    if n > 8:
        s = jnp.sort(u, axis=1)
        return [s[:, i] for i in range(n)]
    pairs = _SORT_NETWORKS.get(n) or [  # odd-even transposition sort
        (i, i + 1) for p in range(n) for i in range(p % 2, n - 1, 2)
    ]
    rows = [u[:, i] for i in range(n)]
    for i, j in pairs:
        rows[i], rows[j] = jnp.minimum(rows[i], rows[j]), jnp.maximum(rows[i], rows[j])
    return rows


def _spacings(u: Array) -> Array:
    """Uniform points on the R-simplex from R − 1 uniforms each (u [B, R − 1, K]): the gaps
    between the sorted uniforms and 0, 1 (Dir(1_R); a low-discrepancy input keeps its
    structure) → w_BRK."""
    rows = _sorted_rows(u)
    edges = [jnp.zeros_like(rows[0])] + rows + [jnp.ones_like(rows[0])]
    return jnp.stack([hi - lo for lo, hi in zip(edges[:-1], edges[1:], strict=True)], axis=1)


def _gamma_icdf(u: Array, alpha: float, iters: int = 12) -> Array:
    """Inverse CDF of Gamma(alpha, 1) by Newton steps on log x (used by the lattice sampler)."""
    u = jnp.clip(u, 1e-7, 1.0 - 1e-7)  # any layout; elementwise
    lg = math.lgamma(alpha)
    # Start: small-x tail x ~ (u Gamma(alpha+1))^(1/alpha), else Wilson-Hilferty.
    z = jax.scipy.special.ndtri(u)
    wh = alpha * jnp.maximum(1.0 - 1.0 / (9 * alpha) + z / (3 * math.sqrt(alpha)), 1e-3) ** 3
    small = jnp.exp((jnp.log(u) + math.lgamma(alpha + 1.0)) / alpha)
    logx = jnp.log(jnp.where(small < alpha / 2, small, wh))

    def step(logx, _):
        x = jnp.exp(logx)
        f = jax.scipy.special.gammainc(alpha, x) - u
        dlogx = f / jnp.exp(alpha * logx - x - lg)  # dF/dlog x = x * pdf(x)
        return logx - jnp.clip(dlogx, -2.0, 2.0), None

    logx, _ = jax.lax.scan(step, logx, None, length=iters)
    return jnp.exp(logx)


def dirichlet_weights(
    key: Array,
    num_groups: int,
    num_weights: int,
    num_rewards: int,
    alpha: float = 1.0,
    sampler: str = "iid",
) -> Array:
    r"""Draws `K = num_weights` weight vectors on the simplex for each of `B = num_groups` groups.

    `sampler="iid"`: i.i.d. `w ~ Dir(alpha 1_R)`. For `alpha == 1` (uniform on the simplex) the
    exact draw used is the spacings of `R - 1` sorted uniforms (same law as normalised standard
    exponentials `e / sum(e)`, `e = -log(u)`, with one random number and no log fewer per
    weight); the uniforms come from an unrolled Threefry hash (`vpo.prng`), which on CPU is
    about 4x cheaper than `jax.random`'s rolled one, the cost that dominated `vpo_advantages`.

    `sampler="lattice"`: a randomly shifted Kronecker (rank-1 lattice type) low-discrepancy set
    `u_k = frac(s + k z)`, `k = 0..K-1`, with one uniform shift `s` per group (Cranley-Patterson
    rotation, so every point is still marginally uniform and estimates stay unbiased). For
    `alpha == 1` the `R-1` coordinates become simplex weights by sorted spacings; otherwise each of
    `R` coordinates is pushed through the Gamma(alpha) inverse CDF and normalised. Lower variance of
    `E_w[max]` than i.i.d. draws (the VPO authors' `VPO_SAMPLER=sobol` option plays the same role),
    and only `R - 1` random numbers per group (`iid` needs `K * R`).

    Args:
        key: PRNG key.
        num_groups: B. num_weights: K. num_rewards: R (all static ints).
        alpha: Dirichlet concentration (> 0): a Python number <= 0 raises ValueError; a traced
            one <= 0 gives NaN weights (and so NaN advantages downstream).
        sampler: "iid" | "lattice".

    Returns:
        weights_BKR, float32, each row on the simplex.

    References: Bahlous-Boldi et al., Vector Policy Optimization, arXiv 2605.22817 (K=100, alpha=1).
    """
    # Computed K-contiguous (it vectorises); under one jit with `expected_max` the two transposes
    # cancel.
    return jnp.swapaxes(
        _draw_weights(key, num_groups, num_weights, num_rewards, alpha, sampler), 1, 2
    )


def _draw_weights(key, num_groups, num_weights, num_rewards, alpha, sampler) -> Array:
    """`dirichlet_weights` in the [B, R, K] layout (K contiguous, so the math vectorises)."""
    check_choice("sampler", sampler, WEIGHT_SAMPLERS)
    B, K, R = int(num_groups), int(num_weights), int(num_rewards)
    if min(B, K, R) < 1:
        raise ValueError(f"num_groups, num_weights, num_rewards must be >= 1; got {(B, K, R)}")
    static_alpha = isinstance(alpha, int | float)
    if static_alpha and alpha <= 0:
        raise ValueError(f"alpha must be > 0; got {alpha}")
    is_one = static_alpha and float(alpha) == 1.0
    if sampler == "iid":
        if is_one:
            if R == 1:
                return jnp.ones((B, 1, K), jnp.float32)
            return _spacings(_prng.uniform(key, (B, R - 1, K)))
        alpha = jnp.asarray(alpha, jnp.float32)
        g_BRK = jax.random.gamma(key, alpha, (B, R, K))
        w_BRK = g_BRK / jnp.sum(g_BRK, 1, keepdims=True)
        return w_BRK if static_alpha else jnp.where(alpha > 0, w_BRK, jnp.nan)

    if not static_alpha:
        raise ValueError("sampler='lattice' needs a Python float alpha (it is used at trace time)")
    if R == 1:
        return jnp.ones((B, 1, K), jnp.float32)
    dims = R - 1 if is_one else R  # the lattice's coordinates: R − 1 spacings or R gammas
    base = np.mod(_kronecker_generator(dims)[:, None] * np.arange(K)[None, :], 1.0)  # [dims, K]
    shift = _prng.uniform(key, (B, dims, 1))  # the only random numbers: dims per group
    u = jnp.mod(shift + jnp.asarray(base, jnp.float32)[None], 1.0)  # [B, dims, K]
    if is_one:
        return _spacings(u)
    g_BRK = _gamma_icdf(u, float(alpha))
    return g_BRK / jnp.sum(g_BRK, 1, keepdims=True)


def expected_max(rewards_BGMR: Array, solution_mask_BGM: Array, weights_BKR: Array) -> Array:
    r"""Monte-Carlo set score `raw_bg = (1/K) sum_k max_{j valid} w_bk . r_bgj`.

    This is the VPO set objective `E_{w~Dir(alpha)}[max_{s in S} w^T r(s)]` evaluated with the given
    weights (arXiv 2605.22817, authors' `(R_g @ W.T).max(0).mean()`). An empty answer set scores 0.
    Call it with G = 1 and M = a pooled candidate count to score a whole pool.

    Args:
        rewards_BGMR: reward vectors of M answers of G samples of B prompts.
        solution_mask_BGM: bool, True where answer j of sample g is a valid (parsed) answer;
            None: every answer is valid.
        weights_BKR: K weight vectors per prompt group (leading dim B, or 1 to share across groups).

    Returns:
        raw_BG, float.
    """
    rewards_BGMR, mask_BGM = _check_answers(rewards_BGMR, solution_mask_BGM)
    weights_BRK = _check_weights(weights_BKR, *rewards_BGMR.shape[::3])
    best_BGK = _best_answer_scores(rewards_BGMR, mask_BGM, weights_BRK)
    return _mean_or_zero(best_BGK, jnp.any(mask_BGM, axis=-1))


def _check_answers(rewards_BGMR, solution_mask_BGM) -> tuple[Array, Array]:
    """(rewards_BGMR as float, the bool answer mask); a None mask means every answer is valid."""
    rewards_BGMR = jnp.asarray(rewards_BGMR)
    check_shape("rewards_BGMR", rewards_BGMR, (None, None, None, None))
    if solution_mask_BGM is None:
        return as_float(rewards_BGMR), jnp.ones(rewards_BGMR.shape[:3], bool)
    check_shape("solution_mask_BGM", solution_mask_BGM, rewards_BGMR.shape[:3])
    return as_float(rewards_BGMR), jnp.asarray(solution_mask_BGM, bool)


def _check_weights(weights_BKR, B: int, R: int) -> Array:
    """Validated weights as weights_BRK for all B groups (a leading dim of 1 is shared)."""
    check_shape("weights_BKR", weights_BKR, (None, None, R))
    if weights_BKR.shape[0] not in (1, B):
        raise ValueError(f"weights_BKR has leading dim {weights_BKR.shape[0]}; expected B={B} or 1")
    weights_BRK = jnp.swapaxes(as_float(weights_BKR), 1, 2)
    return jnp.broadcast_to(weights_BRK, (B,) + weights_BRK.shape[1:])


def _best_answer_scores(rewards_BGMR: Array, mask_BGM: Array, weights_BRK: Array) -> Array:
    """best_BGK = max over valid answers j of w_bk . r_bgj; -inf for a rollout with no valid answer.

    Small M * R (the usual case) is unrolled into K-contiguous multiply-adds that XLA fuses into
    one vectorised loop (about 2x faster on CPU than a batched dot followed by a masked max over
    M); a large pool uses the batched dot.
    """
    M, R = rewards_BGMR.shape[2:]
    if M * R > _UNROLL_MAX:
        s_BGMK = jnp.einsum(
            "bgmr,brk->bgmk", rewards_BGMR, weights_BRK, precision=jax.lax.Precision.HIGHEST
        )
        return jnp.max(jnp.where(mask_BGM[..., None], s_BGMK, -jnp.inf), axis=2)
    best_BGK = None
    for j in range(M):
        s_BGK = sum(rewards_BGMR[:, :, j, i, None] * weights_BRK[:, None, i, :] for i in range(R))
        s_BGK = jnp.where(mask_BGM[:, :, j, None], s_BGK, -jnp.inf)
        best_BGK = s_BGK if best_BGK is None else jnp.maximum(best_BGK, s_BGK)
    return best_BGK


_UNROLL_MAX = 64


def _mean_or_zero(best_NK: Array, nonempty_N: Array) -> Array:
    """Mean over k; an empty answer set (a row of -inf) scores 0. The mask is applied after the
    mean, on [N] rather than [N, K] (one pass fewer over the scores)."""
    return jnp.where(nonempty_N, jnp.mean(best_NK, axis=-1), 0.0)


def vpo_advantages(
    key: Array | None,
    rewards_BGMR: Array = _MISSING,
    solution_mask_BGM: Array = _MISSING,
    /,
    *,
    weights_BKR: Array | None = None,
    num_weights: int = 100,
    alpha: float = 1.0,
    eps: float = 1e-6,
    sampler: str = "iid",
    mask_BG: Array | None = None,
    **deprecated,
) -> tuple[Array, dict[str, Array]]:
    r"""VPO advantage: group z-score of the expected best answer under random preferences.

    For prompt b, K weights `w_bk ~ Dir(alpha 1_R)` are drawn once and shared by its G rollouts:
    ```
    raw_bg = (1/K) sum_k max_{j valid} w_bk . r_bgj      (0 if rollout g has no valid answer)
    A_bg   = (raw_bg - mean_g raw_b) / (std_g raw_b + eps),   std with ddof = 0 (population)
    A_bg   = 0 for every g of a group whose std < eps
    ```
    Empty answer sets still count in the group mean and std. Broadcast `A_bg` to every response
    token. With M = 1, `raw -> mean(r)` as K grows: GRPO on the component mean.

    Call it as `vpo_advantages(key, rewards_BGMR, solution_mask_BGM)` (the mask is optional:
    left out or None, every answer is valid), or with explicit weights as
    `vpo_advantages(None, rewards_BGMR, solution_mask_BGM, weights_BKR=w)` (the key may then be
    left out: `vpo_advantages(rewards_BGMR, solution_mask_BGM, weights_BKR=w)`). The earlier
    form `vpo_advantages(rewards_BGMR, solution_mask_BGM, key=key)` still works and warns
    (DeprecationWarning).

    Bad values (the same policy as every estimator of `vpo.objectives`): a non-finite component
    of a valid answer raises `vpo.errors.RewardError` when called eagerly; traced, that group's
    advantages are NaN and metrics["adv/nonfinite_rewards"] counts the answers. Rewards outside
    [0, 1] are accepted: `A` is unchanged by `r -> a r + c` (a > 0, any c), so [0, 1] is the
    paper's convention, not a requirement. Explicit weights off the simplex (negative, non-finite
    or not summing to 1) raise ValueError eagerly; traced, they are used as given and counted in
    metrics["adv/bad_weights"]; a group with non-finite weights (a traced alpha <= 0) gets NaN.

    Args:
        key: PRNG key for the weights (exactly one of `key`, `weights_BKR`).
        rewards_BGMR: reward vectors, components in [0, 1] by convention, higher is better.
        solution_mask_BGM: bool mask of valid answers; left out or None: every answer is valid.
        weights_BKR: explicit weights (rows on the simplex; leading dim B or 1).
        num_weights: K when drawing (static). alpha: Dirichlet concentration.
        eps: z-score epsilon and zero-std threshold (authors: 1e-6).
        sampler: "iid" (paper) | "lattice" (randomly shifted low-discrepancy set, much cheaper to
            draw and lower-variance), see `dirichlet_weights`.
        mask_BG: optional rollout mask; padded rollouts (False) get 0 and stay out of the group
            statistics.

    Returns:
        (adv_BG, metrics) with scalar metrics "vpo/own_pool_expected_max" (mean raw over rollouts),
        "vpo/pool_expected_best" (mean over groups of E_w[max] over the group's pooled answers),
        "vpo/group_std_mean", "vpo/pool_size_mean" (valid answers per rollout),
        "vpo/zero_std_frac" (fraction of groups with zero advantage), "adv/nonfinite_rewards"
        and "adv/bad_weights" (see above).

    References: Bahlous-Boldi et al., Vector Policy Optimization, arXiv 2605.22817.
    """
    key, rewards_BGMR, solution_mask_BGM = key_first_args(
        "vpo_advantages", (key, rewards_BGMR, solution_mask_BGM), deprecated, 2,
        key_optional=weights_BKR is not None, n_required=1)
    rewards_BGMR, smask_BGM = _check_answers(rewards_BGMR, solution_mask_BGM)
    B, G, M, R = rewards_BGMR.shape
    if (key is None) == (weights_BKR is None):
        raise ValueError("vpo_advantages needs exactly one of a key (draw weights) or weights_BKR=")
    if weights_BKR is None:
        weights_BRK = _draw_weights(key, B, num_weights, R, alpha, sampler)
        bad_w = jnp.zeros((), jnp.int32)
    else:
        weights_BRK = _check_weights(weights_BKR, B, R)
        bad_w = jnp.sum(check_simplex("weights_BKR", jnp.asarray(weights_BKR)), dtype=jnp.int32)
    rmask_BG = rollout_mask(rewards_BGMR[..., 0, 0], mask_BG)
    smask_BGM = smask_BGM & rmask_BG[..., None]
    rewards_BGMR, bad_BGM = screen_rewards("rewards_BGMR", rewards_BGMR, smask_BGM)
    bad_B = jnp.any(bad_BGM, axis=(1, 2)) | ~jnp.all(jnp.isfinite(weights_BRK), axis=(1, 2))
    best_BGK = _best_answer_scores(rewards_BGMR, smask_BGM, weights_BRK)
    raw_BG = _mean_or_zero(best_BGK, jnp.any(smask_BGM, axis=-1))
    mean_B, std_B, n_B = group_stats(raw_BG, rmask_BG, ddof=0)
    live_B = (std_B >= eps) & (n_B >= 2)
    adv_BG = (raw_BG - mean_B[:, None]) / (std_B[:, None] + eps)
    adv_BG = nan_groups(jnp.where(live_B[:, None] & rmask_BG, adv_BG, 0.0), bad_B, rmask_BG)

    pooled_B = _mean_or_zero(jnp.max(best_BGK, axis=1), jnp.any(smask_BGM, axis=(1, 2)))
    has_B = n_B > 0
    n_groups = jnp.maximum(has_B.sum(), 1)
    n_rollouts = jnp.maximum(rmask_BG.sum(), 1)
    metrics = {
        "vpo/own_pool_expected_max": jnp.sum(jnp.where(rmask_BG, raw_BG, 0.0)) / n_rollouts,
        "vpo/pool_expected_best": jnp.sum(jnp.where(has_B, pooled_B, 0.0)) / n_groups,
        "vpo/group_std_mean": jnp.sum(jnp.where(has_B, std_B, 0.0)) / n_groups,
        "vpo/pool_size_mean": smask_BGM.sum() / n_rollouts,
        "vpo/zero_std_frac": jnp.sum(has_B & ~live_B) / n_groups,
        **nonfinite_metric(bad_BGM),
        "adv/bad_weights": bad_w,
    }
    return adv_BG, metrics


def random_weight_grpo_advantages(
    key: Array | None,
    rewards_BGR: Array = _MISSING,
    /,
    *,
    weights_BR: Array | None = None,
    alpha: float = 1.0,
    scale: str = "group",
    std: str = "unbiased",
    eps: float = 1e-6,
    mask_BG: Array | None = None,
    **deprecated,
) -> tuple[Array, dict[str, Array]]:
    r"""Random-weight GRPO: scalar GRPO on a random scalarisation of the reward vectors.

    For prompt b one weight `w_b ~ Dir(alpha 1_R)` is drawn (fresh per call, i.e. per step) and
    shared by its G rollouts, which are compared on `s_bg = w_b . r_bg`:
    ```
    A_bg = (s_bg - mean_g s_b) / (std_g s_b + eps)          (`grpo_advantages` on s)
    ```
    For multi-answer generations pass `r_bg` = the sum of the valid answers' reward vectors (as
    the fixed scalarisation sums w*^T r over them). The VPO paper's "Random-Weighting GRPO"
    baseline: the stochastic scalarisation of VPO without its max over a set of answers, and
    without the weight in the prompt (the authors' code bakes one weight into each prompt row;
    its G rollouts share it).

    Call it as `random_weight_grpo_advantages(key, rewards_BGR)` (or `(None, rewards_BGR,
    weights_BR=w)`); the earlier `(rewards_BGR, key=key)` warns (DeprecationWarning). Bad values
    as `vpo_advantages`.

    Args:
        key: PRNG key for the weights (exactly one of `key`, `weights_BR`).
        rewards_BGR: reward vectors per rollout.
        weights_BR: explicit weights, rows on the simplex.
        alpha: Dirichlet concentration. scale, std, eps: as `grpo_advantages`.
        mask_BG: optional rollout mask.

    Returns:
        (adv_BG, metrics): "adv/nonfinite_rewards", "adv/bad_weights" and "rw_grpo/weights_BR"
        (the [B, R] weights used; the one non-scalar metric).

    References: Bahlous-Boldi et al., Vector Policy Optimization, arXiv 2605.22817 (baselines).
    """
    key, rewards_BGR = key_first_args("random_weight_grpo_advantages", (key, rewards_BGR),
                                      deprecated, 1, key_optional=weights_BR is not None)
    check_choice("scale", scale, GRPO_SCALES)
    check_choice("std", std, STD_MODES)
    rewards_BGR = as_float(rewards_BGR)
    check_shape("rewards_BGR", rewards_BGR, (None, None, None))
    B, _, R = rewards_BGR.shape
    if (key is None) == (weights_BR is None):
        raise ValueError("random_weight_grpo_advantages needs exactly one of a key or weights_BR=")
    if weights_BR is None:
        weights_BR = _draw_weights(key, B, 1, R, alpha, "iid")[:, :, 0]
        bad_w = jnp.zeros((), jnp.int32)
    else:
        check_shape("weights_BR", weights_BR, (B, R))
        weights_BR = as_float(weights_BR)
        bad_w = jnp.sum(check_simplex("weights_BR", weights_BR), dtype=jnp.int32)
    m_BG = rollout_mask(rewards_BGR[..., 0], mask_BG)
    rewards_BGR, bad_r_BG = screen_rewards("rewards_BGR", rewards_BGR, m_BG)
    bad_BG = bad_r_BG | (m_BG & ~jnp.all(jnp.isfinite(weights_BR), -1)[:, None])
    s_BG = jnp.einsum("bgr,br->bg", rewards_BGR, jnp.nan_to_num(weights_BR),
                      precision=jax.lax.Precision.HIGHEST)
    adv_BG = _grpo(s_BG, m_BG, bad_BG, scale, std, eps)
    return adv_BG, {**nonfinite_metric(bad_r_BG),
                    "adv/bad_weights": bad_w, "rw_grpo/weights_BR": weights_BR}
