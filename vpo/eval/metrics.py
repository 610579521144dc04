"""Search-aware evaluation: pass@k, best@k, E_w[max], reward-space diversity, entropy statistics.

Shapes: B problems (the prompts of a batch), N candidates per problem, R reward components,
A answer tokens, G generations per problem, M answers per generation. All metric functions are
pure jnp (jittable; `k`, quantiles and other Python ints are static) and return one value per
problem unless noted.

Budget-fair accounting (the VPO paper's evaluation, Bahlous-Boldi et al., arXiv 2605.22817): k
counts CANDIDATE SOLUTIONS, not generations. `pool_candidates` turns per-generation results
[B, G, M, ...] into per-candidate pools [B, G*M, ...], so one m-answer generation is m candidates
and is compared with m single-answer samples (an M = 1 arm with G*M generations has the same pool
size). Invalid slots (missing, truncated, malformed or duplicate answers) stay in the pool as
candidates that score 0 and are never correct: they consumed budget. Pool-shape metrics (diversity,
Pareto fraction, distinct solutions, E_w[max]) use only the valid candidates.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vpo import objectives
from vpo.tasks import answers as answers_lib


def _check_k(k: int, n: int) -> None:
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise ValueError(f"k={k!r} must be an int in 1..N = {n} (the candidates per problem); "
                         "evaluate larger k with a larger pool")


@functools.partial(jax.jit, static_argnames="k")
def pass_at_k(correct_BN: jax.Array, k: int) -> jax.Array:
    """Unbiased pass@k per problem (Chen et al. 2021, Codex, arXiv 2107.03374).

    With n = N candidates of which c are correct:
        pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1..n} (1 - k/i),   and 1 if n - c < k.

    Args:
      correct_BN: bool (or 0/1), whether each candidate solves its problem.
      k: candidates drawn, 1 <= k <= N (static).

    Returns:
      pass_B, float32.
    """
    correct_BN = jnp.asarray(correct_BN)
    if correct_BN.ndim != 2:
        raise ValueError(f"correct_BN: expected [B problems, N candidates]; got shape "
                         f"{correct_BN.shape}")
    if jnp.issubdtype(correct_BN.dtype, jnp.floating):
        raise TypeError(f"correct_BN: bool (or 0/1 integers) per candidate; got "
                        f"{correct_BN.dtype} (threshold scores first, e.g. scores_BN >= 1.0)")
    B, N = correct_BN.shape
    _check_k(k, N)
    c_B = jnp.sum(correct_BN.astype(jnp.int32), axis=-1)
    i_N = jnp.arange(1, N + 1, dtype=jnp.int32)
    in_prod_BN = i_N[None, :] > (N - c_B)[:, None]
    factor_N = 1.0 - k / jnp.maximum(i_N, 1).astype(jnp.float32)
    prod_B = jnp.prod(jnp.where(in_prod_BN, factor_N[None, :], 1.0), axis=-1)
    return jnp.where(N - c_B < k, 1.0, 1.0 - prod_B).astype(jnp.float32)


def best_at_k_weights(n: int, k: int) -> np.ndarray:
    """Weights of the sorted scores in best@k: w_i = C(i-1, k-1) / C(n, k), i = 1..n (float64).

    The probability that the i-th smallest of n scores is the maximum of a uniformly random
    k-subset. Computed in log space with lgamma, so large n neither overflows nor underflows.
    """
    _check_k(k, n)

    def log_comb(a, b):
        return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)

    total = log_comb(n, k)
    return np.array([math.exp(log_comb(i - 1, k - 1) - total) if i >= k else 0.0
                     for i in range(1, n + 1)])


@functools.partial(jax.jit, static_argnames="k")
def cover_at_k(rewards_BNR: jax.Array, valid_BN: jax.Array, k: int,
               components: tuple[int, ...]) -> jax.Array:
    """Unbiased probability, per problem, that k of the N candidates drawn without replacement
    hold, for EVERY reward component c in `components`, a valid candidate with r_c = 1 (a set
    covering modes no single answer joins). By inclusion-exclusion over the components missed,

        cover@k = Σ_{S ⊆ C} (-1)^|S| · C(n - n_S, k) / C(n, k),

    n_S the candidates hitting some component of S (n_∅ = 0), each term the pass@k estimator of
    Chen et al. 2021 (arXiv 2107.03374) in its complement form. With one component it is
    pass@k of that component. Returns float32 [B]."""
    import itertools

    r = jnp.asarray(rewards_BNR, jnp.float32)
    hit_BNR = jnp.asarray(valid_BN, bool)[..., None] & (r[..., list(components)] >= 1.0 - 1e-6)
    total = jnp.zeros(r.shape[0], jnp.float32)
    for size in range(len(components) + 1):
        for subset in itertools.combinations(range(len(components)), size):
            hit_BN = jnp.any(hit_BNR[..., list(subset)], axis=-1) if subset else jnp.zeros(
                hit_BNR.shape[:2], bool)
            miss = 1.0 - pass_at_k(hit_BN, k)  # C(n - n_S, k) / C(n, k)
            total = total + (-1.0) ** size * miss
    return total


def best_at_k(scores_BN: jax.Array, k: int) -> jax.Array:
    """Exact expected max of a uniformly random k-subset of the N scores, per problem.

        best@k = sum_{i=k..n} C(i-1, k-1) / C(n, k) * s_(i),   s_(1) <= ... <= s_(n)

    (the combinatorics of Max@k, arXiv 2510.23393, as verl computes it). Ties need no special
    handling. Use scores = w*ᵀ r with 0 for invalid candidates (`pool_candidates`).

    Returns:
      best_B, float32.
    """
    B, N = scores_BN.shape
    w_N = jnp.asarray(best_at_k_weights(N, k), jnp.float32)
    sorted_BN = jnp.sort(jnp.asarray(scores_BN, jnp.float32), axis=-1)
    return jnp.einsum("bn,n->b", sorted_BN, w_N, precision=jax.lax.Precision.HIGHEST)


@functools.partial(jax.jit, static_argnames=("num_weights", "alpha", "sampler"))
def expected_max_pool(rewards_BNR: jax.Array, valid_BN: jax.Array, key: jax.Array, *,
                      num_weights: int = 100, alpha: float = 1.0, sampler: str = "iid"
                      ) -> jax.Array:
    """E_{w~Dir(alpha)}[max_{valid j} wᵀ r_j] of each problem's whole pool (VPO's objective,
    arXiv 2605.22817).

    Monte Carlo with K = num_weights draws per problem: `objectives.dirichlet_weights` and
    `objectives.expected_max` with G = 1 and M = N. A pool with no valid candidate scores 0.

    Returns:
      emax_B, float32.
    """
    B, N, R = rewards_BNR.shape
    weights_BKR = objectives.dirichlet_weights(key, B, num_weights, R, alpha=alpha,
                                               sampler=sampler)
    raw_B1 = objectives.expected_max(rewards_BNR[:, None], valid_BN[:, None], weights_BKR)
    return raw_B1[:, 0]


def _pair_mask(valid_BN: jax.Array) -> jax.Array:
    """[B, N, N] True for pairs i < j of valid candidates."""
    N = valid_BN.shape[-1]
    upper_NN = jnp.arange(N)[:, None] < jnp.arange(N)[None, :]
    return valid_BN[:, :, None] & valid_BN[:, None, :] & upper_NN[None]


@jax.jit
def reward_diversity(rewards_BNR: jax.Array, valid_BN: jax.Array) -> jax.Array:
    """Mean pairwise L1 distance sum_r |r_ir - r_jr| over pairs of valid candidates (VPO,
    arXiv 2605.22817; the authors' `eval_metrics.diversity`). 0 when fewer than two candidates
    are valid.

    Returns:
      diversity_B, float32.
    """
    r_BNR = jnp.asarray(rewards_BNR, jnp.float32)
    l1_BNN = jnp.sum(jnp.abs(r_BNR[:, :, None, :] - r_BNR[:, None, :, :]), axis=-1)
    pairs_BNN = _pair_mask(jnp.asarray(valid_BN, bool))
    count_B = jnp.sum(pairs_BNN.astype(jnp.float32), axis=(1, 2))
    total_B = jnp.sum(jnp.where(pairs_BNN, l1_BNN, 0.0), axis=(1, 2))
    return total_B / jnp.maximum(count_B, 1.0)


@jax.jit
def pareto_fraction(rewards_BNR: jax.Array, valid_BN: jax.Array) -> jax.Array:
    """Fraction of valid candidates that no valid candidate Pareto-dominates (>= in every
    component, > in one). Equal vectors do not dominate each other. 0 for an empty pool.

    Returns:
      fraction_B, float32.
    """
    r_BNR = jnp.asarray(rewards_BNR, jnp.float32)
    valid_BN = jnp.asarray(valid_BN, bool)
    ge_BNN = jnp.all(r_BNR[:, :, None, :] >= r_BNR[:, None, :, :], axis=-1)  # [b, i, j]: r_i>=r_j
    gt_BNN = jnp.any(r_BNR[:, :, None, :] > r_BNR[:, None, :, :], axis=-1)
    dominated_BN = jnp.any(ge_BNN & gt_BNN & valid_BN[:, :, None], axis=1)
    front_B = jnp.sum((valid_BN & ~dominated_BN).astype(jnp.float32), axis=-1)
    return front_B / jnp.maximum(jnp.sum(valid_BN.astype(jnp.float32), axis=-1), 1.0)


@jax.jit
def distinct_solutions(answers_BNA: jax.Array, answer_mask_BNA: jax.Array,
                       valid_BN: jax.Array) -> jax.Array:
    """Number of distinct token sequences among the valid candidates (int32 [B]).

    Pass `valid_BN & correct_BN` to count distinct correct solutions.
    """
    first_BN = jax.vmap(answers_lib.first_occurrence)(answers_BNA, answer_mask_BNA, valid_BN)
    return jnp.sum(first_BN.astype(jnp.int32), axis=-1)


def entropy_stats(entropy: jax.Array, mask: jax.Array,
                  quantiles: Sequence[float] = (0.1, 0.5, 0.9)) -> dict[str, jax.Array]:
    """Mean, std and quantiles of per-token entropies over the masked-in tokens (any shape).

    Quantiles interpolate linearly between order statistics (numpy's default). Returns scalars
    keyed "mean", "std", "q10", "q50", ... (q = round(100 * quantile)); NaN-free: all 0 when the
    mask is empty.
    """
    for q in quantiles:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantiles: {q} is outside [0, 1]")
    return _entropy_stats(entropy, mask, tuple(float(q) for q in quantiles))


@functools.partial(jax.jit, static_argnames="quantiles")
def _entropy_stats(entropy: jax.Array, mask: jax.Array, quantiles: tuple[float, ...]
                   ) -> dict[str, jax.Array]:
    e_N = jnp.asarray(entropy, jnp.float32).reshape(-1)
    m_N = jnp.broadcast_to(jnp.asarray(mask, bool), jnp.shape(entropy)).reshape(-1)
    n = jnp.sum(m_N.astype(jnp.float32))
    mean = jnp.sum(jnp.where(m_N, e_N, 0.0)) / jnp.maximum(n, 1.0)
    var = jnp.sum(jnp.where(m_N, (e_N - mean) ** 2, 0.0)) / jnp.maximum(n, 1.0)
    sorted_N = jnp.sort(jnp.where(m_N, e_N, jnp.inf))
    out = {"mean": mean, "std": jnp.sqrt(var)}
    last = jnp.maximum(n - 1.0, 0.0)
    for q in quantiles:
        pos = q * last
        lo, hi = jnp.floor(pos).astype(jnp.int32), jnp.ceil(pos).astype(jnp.int32)
        frac = pos - jnp.floor(pos)
        value = sorted_N[lo] * (1.0 - frac) + sorted_N[hi] * frac
        out[f"q{round(100 * q)}"] = jnp.where(n > 0, value, 0.0)
    return out


class CandidatePool(NamedTuple):
    """Per-candidate pool of each problem (N = G*M candidates; see the module docstring).

    rewards_BNR: float32, zero rows for invalid slots.  valid_BN: bool, a scored answer.
    scores_BN: float32 w*ᵀr (0 for invalid).  correct_BN: bool, valid and `task.solved`.
    """

    rewards_BNR: jax.Array
    valid_BN: jax.Array
    scores_BN: jax.Array
    correct_BN: jax.Array


def flatten_generations(x_BGM: jax.Array) -> jax.Array:
    """[B, G, M, ...] -> [B, G*M, ...]: generation g's answer m becomes candidate g*M + m."""
    B, G, M = x_BGM.shape[:3]
    return jnp.reshape(x_BGM, (B, G * M) + tuple(x_BGM.shape[3:]))


def pool_candidates(rewards_BGMR: jax.Array, solution_mask_BGM: jax.Array,
                    eval_weights_R: jax.Array | np.ndarray,
                    solved: Callable[[jax.Array], jax.Array]) -> CandidatePool:
    """Budget-fair candidate pool from per-generation rewards (`task.eval_weights_R`,
    `task.solved`). Every slot is a candidate; invalid ones score 0 and are never correct."""
    valid_BN = flatten_generations(jnp.asarray(solution_mask_BGM, bool))
    rewards_BNR = jnp.where(valid_BN[..., None],
                            flatten_generations(jnp.asarray(rewards_BGMR, jnp.float32)), 0.0)
    scores_BN = jnp.einsum("bnr,r->bn", rewards_BNR, jnp.asarray(eval_weights_R, jnp.float32),
                           precision=jax.lax.Precision.HIGHEST)
    correct_BN = jax.vmap(jax.vmap(solved))(rewards_BNR) & valid_BN
    return CandidatePool(rewards_BNR, valid_BN, scores_BN, correct_BN)


def summarize_pool(pool: CandidatePool, ks: Sequence[int], *, key: jax.Array | None = None,
                   num_weights: int = 100, answers_BNA: jax.Array | None = None,
                   answer_mask_BNA: jax.Array | None = None) -> dict[str, float]:
    """Problem-averaged metrics of a pool, as Python floats (host-side convenience).

    Keys: `best@k`, `pass@k` for each k in `ks` (k <= N), `diversity`, `pareto_fraction`,
    `valid_fraction`, `emax` (when `key` is given) and `distinct` (when answers are given).
    """
    out: dict[str, float] = {}
    for k in ks:
        out[f"best@{k}"] = float(jnp.mean(best_at_k(pool.scores_BN, k)))
        out[f"pass@{k}"] = float(jnp.mean(pass_at_k(pool.correct_BN, k)))
    out["diversity"] = float(jnp.mean(reward_diversity(pool.rewards_BNR, pool.valid_BN)))
    out["pareto_fraction"] = float(jnp.mean(pareto_fraction(pool.rewards_BNR, pool.valid_BN)))
    out["valid_fraction"] = float(jnp.mean(pool.valid_BN.astype(jnp.float32)))
    if key is not None:
        out["emax"] = float(jnp.mean(expected_max_pool(pool.rewards_BNR, pool.valid_BN, key,
                                                       num_weights=num_weights)))
    if answers_BNA is not None:
        out["distinct"] = float(jnp.mean(distinct_solutions(
            answers_BNA, answer_mask_BNA, pool.valid_BN).astype(jnp.float32)))
    return out
