"""Token selections of the policy-gradient loss, taken globally over the whole batch passed in
(under `jit`, over a batch sharded across devices): Clip-Cov / KL-Cov (Cui et al., arXiv
2505.22617) on cov = (A − mean A)(log π − mean log π), and the high-entropy minority (arXiv
2506.01939). `vpo.objectives.policy_loss` calls them; the formulas are in its docstring.

Dimension key: B prompts, G samples per prompt, T generated tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vpo.objectives.common import masked_mean

Array = jax.Array


def _select_count(fraction: float, n_valid: Array, min_count: int) -> Array:
    """n = max(floor(fraction * n_valid), min_count), robust to float32 rounding just below an
    integer (never more than there are eligible tokens: `_select_top` takes only those)."""
    return jnp.maximum(jnp.floor(n_valid * fraction * (1.0 + 1e-6)), min_count).astype(jnp.int32)


def _abs_torch_grad(x: Array) -> Array:
    """|x| with the subgradient sign(x), 0 at x = 0 (torch's `abs` convention; `jnp.abs` has
    gradient 1 at 0). On-policy every log-ratio is exactly 0, so KL-Cov's |log ratio| penalty
    must not push the selected tokens there."""
    return jax.lax.stop_gradient(jnp.sign(x)) * x


def _spec(x: Array):
    """x's PartitionSpec under an explicit-sharding mesh (all None otherwise)."""
    return getattr(jax.typeof(x).sharding, "spec", ())


def _resharded(x: Array, spec) -> Array:
    """`x` laid out as `spec` when explicit sharding is in use; a no-op otherwise.

    Explicit mode wants the gather for a global sort/top-k and the scatter back spelled out;
    under automatic sharding XLA inserts them itself.
    """
    if any(axis is not None for axis in tuple(_spec(x)) + tuple(spec)):
        return jax.sharding.reshard(x, spec)
    return x


def _gathered(x: Array) -> Array:
    return _resharded(x, jax.sharding.PartitionSpec()).reshape(-1)


def _select_top(score_BGT: Array, eligible_BGT: Array, n: Array, fraction: float,
                min_count: int) -> Array:
    """Marks the (at most) n eligible tokens with the largest score, globally over the batch.

    `lax.top_k` runs with the static bound `max(floor(fraction * size) + 1, min_count) >= n`:
    no full sort.
    """
    flat = _gathered(jnp.where(eligible_BGT, score_BGT, -jnp.inf))
    k_max = min(flat.shape[0],
                max(int(fraction * flat.shape[0] * (1.0 + 1e-6)) + 1, int(min_count)))
    vals, idx = jax.lax.top_k(flat, k_max)
    take = (jnp.arange(k_max) < n) & jnp.isfinite(vals)
    sel = jnp.zeros(flat.shape, bool).at[idx].set(take).reshape(score_BGT.shape)
    return _resharded(sel, _spec(score_BGT))


def covariance_control(pg1, pg2, pg, clipped, adv_BGT, logp_BGT, tok_log_ratio, mask, m_BGT,
                       key, cov_control: str, *, clip_cov_ratio, clip_cov_lb, clip_cov_ub,
                       kl_cov_ratio, kl_cov_coef, cov_min_tokens):
    """Clip-Cov / KL-Cov on cov = (A - mean A)(logp - mean logp) (stop-grad, valid tokens):
    "clip_cov" zeroes the pg term of n random unclipped tokens with lb < cov < ub; "kl_cov"
    uses pg = L1 plus kl_cov_coef |log ratio| on the top-n tokens by cov, and clips nothing
    → (pg, clipped masks, (clip-cov, kl-cov) selections, cov)."""
    shape = pg.shape
    n_valid = jnp.sum(m_BGT)
    clip_cov_sel = kl_cov_sel = jnp.zeros(shape, bool)
    lp = jax.lax.stop_gradient(logp_BGT)
    cov = (adv_BGT - masked_mean(adv_BGT, mask)) * (lp - masked_mean(lp, mask))
    if cov_control == "clip_cov":
        eligible = mask & ~(pg2 > pg1) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        n = _select_count(clip_cov_ratio, n_valid, cov_min_tokens)
        u = _resharded(jax.random.uniform(key, shape), _spec(eligible))
        clip_cov_sel = _select_top(u, eligible, n, clip_cov_ratio, cov_min_tokens)
        pg = jnp.where(clip_cov_sel, 0.0, pg)
    elif cov_control == "kl_cov":
        n = _select_count(kl_cov_ratio, n_valid, cov_min_tokens)
        kl_cov_sel = _select_top(cov, mask, n, kl_cov_ratio, cov_min_tokens)
        pg = jnp.where(kl_cov_sel, pg1 + kl_cov_coef * _abs_torch_grad(tok_log_ratio), pg1)
        clipped = (jnp.zeros(shape, bool),) * 3
    return pg, clipped, (clip_cov_sel, kl_cov_sel), cov


def keep_high_entropy(pg, entropy_BGT, mask, entropy_top_frac):
    """The pg term kept only on tokens whose entropy is >= the (1 - rho) quantile over the
    valid tokens (rho = entropy_top_frac < 1) → (pg, the kept tokens' mask)."""
    high_ent = mask
    if entropy_top_frac is not None and entropy_top_frac < 1.0:
        h = jax.lax.stop_gradient(entropy_BGT)
        tau = jnp.nanquantile(_gathered(jnp.where(mask, h, jnp.nan)), 1.0 - entropy_top_frac)
        high_ent = mask & (h >= tau)  # tau is a replicated scalar
        pg = jnp.where(high_ent, pg, 0.0)
    return pg, high_ent
