"""Clipped policy-gradient loss with the GRPO-family controls (private; see `vpo.objectives`).

Dimension key: B prompts, G samples per prompt, T generated tokens.
"""

from __future__ import annotations

import functools
import inspect
import math

import jax
import jax.numpy as jnp

from vpo.config import AGG_MODES, COV_CONTROLS, KL_ESTIMATORS, RATIO_LEVELS
from vpo.objectives.common import as_float, check_choice, check_shape, masked_mean
from vpo.objectives.token_selection import covariance_control, keep_high_entropy

Array = jax.Array


def _frozen(**kwargs):
    from types import MappingProxyType

    return MappingProxyType(kwargs)


# Published loss settings as `policy_loss` keyword arguments: `policy_loss(..., **LOSS_SETTINGS[
# "vpo"])`. Read-only mappings; `dict(LOSS_SETTINGS["vpo"], kl_coef=0.0)` to change one.
# The advantage estimator is chosen separately (`get_estimator`).
LOSS_SETTINGS = _frozen(
    # GRPO (Shao et al., arXiv 2402.03300): PPO clip 0.2, KL to the reference with the k3
    # estimator at beta = 0.04, each sequence's token mean (1/|o_i|) averaged over sequences.
    grpo=_frozen(clip_eps_low=0.2, clip_eps_high=0.2, kl_coef=0.04, kl_estimator="k3",
                 agg="seq-mean-token-mean"),
    # Dr. GRPO (Liu et al., arXiv 2503.20783): no per-sequence length normalisation (token sums
    # over a constant N_seq * horizon), no KL term; pair it with get_estimator("dr_grpo").
    dr_grpo=_frozen(clip_eps_low=0.2, clip_eps_high=0.2, kl_coef=0.0,
                    agg="seq-mean-token-sum-norm"),
    # DAPO (Yu et al., arXiv 2503.14476): clip-higher 0.2 / 0.28, token-level mean, no KL.
    dapo=_frozen(clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=0.0, agg="token-mean"),
    # VPO (Bahlous-Boldi et al., arXiv 2605.22817): PPO clip 0.2 / 0.2, dual clip 3,
    # token-level mean, k3 KL at 1e-3, no entropy bonus.
    vpo=_frozen(clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=3.0, kl_coef=1e-3,
                kl_estimator="k3", agg="token-mean", entropy_coef=0.0),
)
VPO_PAPER_LOSS = LOSS_SETTINGS["vpo"]

# The `policy_loss` keyword arguments a run's objective sets: `vpo.config.ObjectiveConfig` has a
# field of each name (tests/objectives/test_objective_api.py), read by `loss_options`.
LOSS_FIELDS = ("clip_eps_low", "clip_eps_high", "dual_clip", "ratio_level", "agg", "kl_coef",
               "kl_estimator", "entropy_coef", "entropy_top_frac", "cov_control",
               "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "kl_cov_coef",
               "cov_min_tokens", "gppo")


def loss_options(cfg) -> dict:
    """The loss settings of an objective config (any object with the `LOSS_FIELDS`
    attributes, e.g. `vpo.config.ObjectiveConfig`) as `policy_loss` keyword arguments."""
    return {name: getattr(cfg, name) for name in LOSS_FIELDS}


def loss_denominator(
    mask_BGT: Array, agg: str = "token-mean", *, horizon: int | None = None
) -> Array:
    r"""The normaliser `policy_loss` divides by, computed from a (full-batch) mask.

    ```
    token-mean:               N_tok = sum_bgt mask
    seq-mean-token-mean:      N_seq = #{(b, g): sum_t mask_bgt > 0}
    seq-mean-token-sum:       N_seq
    seq-mean-token-sum-norm:  N_seq * horizon          (horizon defaults to T)
    ```
    For gradient accumulation, compute it once on the full batch's mask and pass it to every
    micro-batch call as `policy_loss(..., loss_denominator=d)`: the micro-batch losses then sum to
    the full-batch loss exactly (value and gradient), for every mode.

    Returns:
      a float32 scalar.
    """
    check_choice("agg", agg, AGG_MODES)
    check_shape("mask_BGT", mask_BGT, (None, None, None))
    m_BGT = jnp.asarray(mask_BGT, bool)
    if agg == "token-mean":
        return jnp.sum(m_BGT, dtype=jnp.float32)
    n_seq = jnp.sum(jnp.any(m_BGT, axis=-1), dtype=jnp.float32)
    if agg == "seq-mean-token-sum-norm":
        return n_seq * float(m_BGT.shape[-1] if horizon is None else horizon)
    return n_seq


def kl_estimate(logp_BGT: Array, ref_logp_BGT: Array, estimator: str = "k3") -> Array:
    r"""Per-token estimate of KL(pi_theta || pi_ref) from the sampled token (Schulman 2020).

    With `delta = clip(log pi_ref - log pi_theta, -20, 20)`:
    `k1 = -delta`, `k2 = delta^2 / 2`, `k3 = clip(exp(delta) - 1 - delta, -10, 10)` (verl
    `low_var_kl`, the estimator of the GRPO paper, arXiv 2402.03300).
    """
    check_choice("kl_estimator", estimator, KL_ESTIMATORS)
    delta = jnp.clip(ref_logp_BGT - logp_BGT, -20.0, 20.0)
    if estimator == "k1":
        return -delta
    if estimator == "k2":
        return 0.5 * delta**2
    return jnp.clip(jnp.exp(delta) - 1.0 - delta, -10.0, 10.0)


def _maybe_nonzero(coef) -> bool:
    """False only for a Python number equal to 0 (a traced coefficient, e.g. a schedule, counts)."""
    return not isinstance(coef, int | float) or coef != 0.0


def _checked_advantages(advantages, shape: tuple) -> Array:
    """adv_BG (as [B, G, 1]) or adv_BGT checked against the log-probs' [B, G, T] `shape`; a flat
    [B·G] or [B·G, T] array (TRL's rows) is refused with the reshape that fixes it."""
    advantages = jnp.asarray(advantages)
    B, G, T = shape
    if advantages.shape == (B, G):
        return advantages[..., None]
    if advantages.shape == (B, G, T):
        return advantages
    flat = advantages.shape in ((B * G,), (B * G, T))
    raise ValueError(
        f"advantages has shape {tuple(advantages.shape)}; expected adv_BG ({B}, {G}) or adv_BGT "
        f"({B}, {G}, {T}) (the log-probs' [B, G, T])"
        + (f"; a flat [B*G, ...] array (one row per completion, as TRL's) is reshaped per prompt "
           f"with vpo.objectives.to_groups(x, {G})" if flat else ""))


def policy_loss(
    logp_BGT: Array,
    old_logp_BGT: Array,
    advantages: Array,
    mask_BGT: Array,
    *,
    ref_logp_BGT: Array | None = None,
    entropy_BGT: Array | None = None,
    key: Array | None = None,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip: float | None = None,
    ratio_level: str = "token",
    agg: str = "token-mean",
    loss_denominator: Array | float | None = None,
    horizon: int | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy_coef: float = 0.0,
    entropy_top_frac: float | None = None,
    cov_control: str = "none",
    clip_cov_ratio: float = 2e-3,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    kl_cov_ratio: float = 2e-3,
    kl_cov_coef: float = 1.0,
    cov_min_tokens: int = 1,
    gppo: bool = False,
    log_ratio_clamp: float = 20.0,
    is_weight_BGT: Array | None = None,
) -> tuple[Array, dict[str, Array]]:
    r"""PPO-clip policy-gradient loss (to minimise) with the GRPO-family controls.

    Per valid token, with `rho = exp(clip(logp - old_logp, +-20))` and advantage `A` (stop-grad):
    ```
    L1 = -A rho,  L2 = -A clip(rho, 1 - eps_low, 1 + eps_high),  pg = max(L1, L2)
    dual clip (A < 0):  pg = min(pg, -A c)                                    (arXiv 1912.09729)
    L  = pg * 1[H >= tau_rho] + kl_coef * KL_k(logp, ref) - entropy_coef * H
    loss = agg(L, mask) = numerator / denominator
    ```
    - Clip-higher: `eps_high > eps_low` (DAPO, arXiv 2503.14476: 0.2 / 0.28).
    - GPPO (gradient-preserving clipping, Klear-Reasoner, arXiv 2508.07629): `gppo=True` writes
      the clipped branch as `L2 = -A rho sg(clip(rho, 1 - eps_low, 1 + eps_high) / rho)`: the
      same values as PPO-clip, but a clipped token's gradient is `-(1 -+ eps) A grad log pi`
      instead of 0 (bounded, not dropped); the dual clip's branch keeps no gradient.
    - `ratio_level="sequence"`: GSPO-token ratio `s_gt = sg[s_g] pi(y_t) / sg[pi(y_t)]`,
      `log s_g = mean_t log rho_gt` clamped at 10 (GSPO, arXiv 2507.18071; the paper uses
      eps = 3e-4 / 4e-4 and agg="seq-mean-token-mean").
    - `agg` (see `loss_denominator`): "token-mean" (DAPO/VPO default), "seq-mean-token-mean"
      (GRPO's 1/|o_i|), "seq-mean-token-sum", "seq-mean-token-sum-norm" (Dr. GRPO, arXiv
      2503.20783: token sums over N_seq * horizon). Empty (all-padding) sequences are ignored.
    - High-entropy minority (arXiv 2506.01939): `entropy_top_frac = rho` keeps the pg term only on
      tokens whose entropy is >= the (1 - rho) quantile over all valid tokens of the batch; the KL
      and entropy terms and the denominator are unchanged.
    - Clip-Cov / KL-Cov (Cui et al., arXiv 2505.22617), with
      `cov = (A - mean A)(logp - mean logp)` over valid tokens (stop-grad):
      "clip_cov": among valid tokens not clipped by PPO with `lb < cov < ub`, pick
      `n = max(floor(clip_cov_ratio * N_valid), cov_min_tokens)` uniformly at random (needs
      `key`) and zero their pg term (value and gradient). "kl_cov": no ratio clipping, `pg = L1`,
      and the top `max(floor(kl_cov_ratio * N_valid), cov_min_tokens)` tokens by cov get
      `+ kl_cov_coef |logp - old_logp|`, whose gradient is `sign(logp - old_logp)`, 0 at 0 (as
      torch's; on-policy every log-ratio is 0). Ratios are fractions (the original repo's
      `k_percent` is 100x these; the 7B recipe's 2e-3 is the default); `cov_min_tokens = 1` is
      the original rule. `Cov(logp, A) = mean_valid cov` is returned as "cov_logp_adv" (the
      quantity whose sign drives the entropy change, arXiv 2505.22617 §2.2).
    - Rollout correction: `is_weight_BGT` w (stop-grad) multiplies each token's pg term,
      `pg_t -> w_t pg_t`, before the aggregation (truncated or masked importance weights of a
      stale rollout, `vpo.rl.offpolicy`; Yao et al. 2025 "Your efficient RL framework secretly
      brings you off-policy RL training"); the KL and entropy terms are not weighted.
    Token selections (quantile, top fraction, random pick) are taken over the whole arrays passed
    in, so under `jit` they are global over a batch sharded across devices.

    Args:
      logp_BGT: current policy log-probs of the sampled tokens (differentiated).
      old_logp_BGT: behaviour-policy log-probs (stop-grad).
      advantages: adv_BG (broadcast over tokens) or adv_BGT (stop-grad).
      mask_BGT: bool, True on real response tokens.
      ref_logp_BGT: reference log-probs, needed when kl_coef != 0 (else only logged if given).
      entropy_BGT: token entropies of the current policy (needed for entropy_coef and
        entropy_top_frac; differentiated by the entropy bonus).
      key: PRNG key, needed for cov_control="clip_cov".
      is_weight_BGT: per-token weights of the pg term (stop-grad), or None (no weighting).
      loss_denominator: explicit normaliser (e.g. `loss_denominator(full_mask, agg)`) for exact
        micro-batch accumulation; default: computed from this call's mask.
      horizon: constant length for "seq-mean-token-sum-norm" (default T).
      Coefficients and clip ranges may be traced values; `clip_cov_ratio`, `kl_cov_ratio`,
      `cov_min_tokens` and `entropy_top_frac` are static (they size the token selections).

    Returns:
      (loss, metrics): metrics are scalars: "loss", "pg_loss", "loss_numerator", "loss_denominator",
      "clip_frac_low", "clip_frac_high", "clip_frac_dual", "ratio_mean", "ratio_min", "ratio_max",
      "ppo_kl", "kl" (if ref given), "entropy" (if given), "clip_cov_frac", "kl_cov_frac",
      "high_entropy_frac", "cov_logp_adv"; fractions are over valid tokens.
    """
    check_choice("ratio_level", ratio_level, RATIO_LEVELS)
    check_choice("agg", agg, AGG_MODES)
    check_choice("kl_estimator", kl_estimator, KL_ESTIMATORS)
    check_choice("cov_control", cov_control, COV_CONTROLS)
    logp_BGT, advantages = _checked_arrays(logp_BGT, old_logp_BGT, advantages, mask_BGT, (
        ("ref_logp_BGT", ref_logp_BGT), ("entropy_BGT", entropy_BGT),
        ("is_weight_BGT", is_weight_BGT)))
    _check_settings(ref_logp_BGT, entropy_BGT, key, clip_eps_low=clip_eps_low,
                    clip_eps_high=clip_eps_high, dual_clip=dual_clip, kl_coef=kl_coef,
                    entropy_coef=entropy_coef, entropy_top_frac=entropy_top_frac,
                    cov_control=cov_control, clip_cov_ratio=clip_cov_ratio,
                    kl_cov_ratio=kl_cov_ratio, cov_min_tokens=cov_min_tokens, gppo=gppo)

    mask = jnp.asarray(mask_BGT, bool)
    m_BGT = mask.astype(logp_BGT.dtype)
    clean = functools.partial(_clean, mask, logp_BGT.shape)
    logp_BGT, old_logp_BGT, ref_logp_BGT, entropy_BGT = map(
        clean, (logp_BGT, old_logp_BGT, ref_logp_BGT, entropy_BGT))
    adv_BGT = jax.lax.stop_gradient(clean(advantages))
    tok_log_ratio, ratio = _ratios(logp_BGT, old_logp_BGT, m_BGT, ratio_level, log_ratio_clamp)
    pg1, pg2, pg, clipped = _clipped_pg(adv_BGT, ratio, mask, clip_eps_low, clip_eps_high,
                                        dual_clip, gppo)
    pg, clipped, selected, cov = covariance_control(
        pg1, pg2, pg, clipped, adv_BGT, logp_BGT, tok_log_ratio, mask, m_BGT, key, cov_control,
        clip_cov_ratio=clip_cov_ratio, clip_cov_lb=clip_cov_lb, clip_cov_ub=clip_cov_ub,
        kl_cov_ratio=kl_cov_ratio, kl_cov_coef=kl_cov_coef, cov_min_tokens=cov_min_tokens)
    pg, high_ent = keep_high_entropy(pg, entropy_BGT, mask, entropy_top_frac)
    if is_weight_BGT is not None:
        pg = pg * jax.lax.stop_gradient(clean(is_weight_BGT))
    per_token, metrics = _penalties(pg, logp_BGT, ref_logp_BGT, entropy_BGT, mask, kl_coef,
                                    kl_estimator, entropy_coef)
    loss, agg_metrics = _aggregate(per_token, pg, mask, m_BGT, agg, loss_denominator, horizon)
    metrics.update(agg_metrics)
    metrics.update(
        clip_frac_low=masked_mean(clipped[0], mask),
        clip_frac_high=masked_mean(clipped[1], mask),
        clip_frac_dual=masked_mean(clipped[2], mask),
        ratio_mean=masked_mean(ratio, mask),
        ratio_min=jnp.min(jnp.where(mask, ratio, jnp.inf)),
        ratio_max=jnp.max(jnp.where(mask, ratio, -jnp.inf)),
        ppo_kl=masked_mean(-tok_log_ratio, mask),
        clip_cov_frac=masked_mean(selected[0], mask),
        kl_cov_frac=masked_mean(selected[1], mask),
        high_entropy_frac=masked_mean(high_ent, mask),
        cov_logp_adv=masked_mean(cov, mask),
    )
    return loss, jax.tree.map(jax.lax.stop_gradient, metrics)


def _checked_arrays(logp_BGT, old_logp_BGT, advantages, mask_BGT, optional):
    """logp_BGT as float and the advantages as [B, G, 1] or [B, G, T], after checking every
    array's shape against logp's [B, G, T] (`optional`: (name, array or None) pairs)."""
    logp_BGT = as_float(logp_BGT)
    check_shape("logp_BGT", logp_BGT, (None, None, None))
    shape = logp_BGT.shape
    check_shape("old_logp_BGT", old_logp_BGT, shape)
    check_shape("mask_BGT", mask_BGT, shape)
    advantages = _checked_advantages(advantages, shape)
    for name, x in optional:
        if x is not None:
            check_shape(name, x, shape)
    return logp_BGT, advantages


def _check_settings(ref_logp_BGT, entropy_BGT, key, *, clip_eps_low, clip_eps_high, dual_clip,
                    kl_coef, entropy_coef, entropy_top_frac, cov_control, clip_cov_ratio,
                    kl_cov_ratio, cov_min_tokens, gppo=False) -> None:
    """ValueError for a setting out of range or one whose input is missing (a traced
    coefficient is not checked)."""
    if _maybe_nonzero(kl_coef) and ref_logp_BGT is None:
        raise ValueError("kl_coef != 0 needs ref_logp_BGT")
    if (_maybe_nonzero(entropy_coef) or entropy_top_frac is not None) and entropy_BGT is None:
        raise ValueError("entropy_coef != 0 or entropy_top_frac needs entropy_BGT")
    if cov_control == "clip_cov" and key is None:
        raise ValueError("cov_control='clip_cov' picks tokens at random and needs key=")
    for name, eps, hi in (("clip_eps_low", clip_eps_low, 1.0), ("clip_eps_high", clip_eps_high,
                                                                 math.inf)):
        if isinstance(eps, (int, float)) and not 0.0 <= eps <= hi:  # a traced value is not seen
            raise ValueError(f"{name}={eps} must be in [0, {hi:g}]: the ratio is clipped to "
                             "[1 - clip_eps_low, 1 + clip_eps_high]")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip={dual_clip} must be > 1 (verl's clip_ratio_c, e.g. 3.0)")
    if entropy_top_frac is not None and not 0.0 < entropy_top_frac <= 1.0:
        raise ValueError(f"entropy_top_frac={entropy_top_frac} must be in (0, 1] (a fraction)")
    for name, frac in (("clip_cov_ratio", clip_cov_ratio), ("kl_cov_ratio", kl_cov_ratio)):
        if not 0.0 < frac <= 1.0:
            raise ValueError(f"{name}={frac} must be in (0, 1] (a fraction, not a percent)")
    if int(cov_min_tokens) < 1:
        raise ValueError(f"cov_min_tokens={cov_min_tokens} must be >= 1")
    if gppo and cov_control == "kl_cov":
        raise ValueError("gppo=True changes the clipped branch, and cov_control='kl_cov' clips "
                         "nothing (pg = -A rho): choose one of them")


def _clean(mask, shape, x):
    """x broadcast to `shape` with padding zeroed (padding may hold anything, even nan/inf:
    zeroed before any arithmetic); None stays None."""
    return None if x is None else jnp.where(mask, jnp.broadcast_to(as_float(x), shape), 0.0)


def _ratios(logp_BGT, old_logp_BGT, m_BGT, ratio_level: str, clamp: float):
    """(token log-ratio clip(logp - sg(old), ±clamp), the ratio rho): per token, or GSPO's
    sequence ratio `sg[s_g] pi / sg[pi]` with log s_g = min(mean_t token log-ratio, 10)."""
    sg = jax.lax.stop_gradient
    tok_log_ratio = jnp.clip(logp_BGT - sg(old_logp_BGT), -clamp, clamp)
    if ratio_level == "token":
        log_ratio = tok_log_ratio
    else:
        len_BG = m_BGT.sum(-1)
        seq_BG = tok_log_ratio.sum(-1) / jnp.maximum(len_BG, 1.0)
        seq_BG = jnp.minimum(seq_BG, 10.0)
        log_ratio = sg(seq_BG)[..., None] + logp_BGT - sg(logp_BGT)
    return tok_log_ratio, jnp.exp(log_ratio)


def _clipped_pg(adv_BGT, ratio, mask, clip_eps_low, clip_eps_high, dual_clip, gppo=False):
    """PPO's clipped term: L1 = -A rho, L2 = -A clip(rho, 1 - eps_low, 1 + eps_high),
    pg = max(L1, L2), and with the dual clip c (A < 0) pg = min(pg, -A c) →
    (L1, L2, pg, (clipped low, clipped high, clipped dual) token masks). `gppo`: L2 = -A rho
    sg(clip(rho) / rho), PPO's values with the clipped tokens' gradient bounded (GPPO)."""
    pg1 = -adv_BGT * ratio
    bound = jnp.clip(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    if gppo:
        bound = ratio * jax.lax.stop_gradient(bound / ratio)
    pg2 = -adv_BGT * bound
    pg = jnp.maximum(pg1, pg2)
    clipped_high = mask & (adv_BGT > 0) & (ratio > 1.0 + clip_eps_high)
    clipped_low = mask & (adv_BGT < 0) & (ratio < 1.0 - clip_eps_low)
    clipped_dual = jnp.zeros(ratio.shape, bool)
    if dual_clip is not None:
        pg = jnp.where(adv_BGT < 0, jnp.minimum(pg, -adv_BGT * dual_clip), pg)
        clipped_dual = mask & (adv_BGT < 0) & (ratio > dual_clip)
    return pg1, pg2, pg, (clipped_low, clipped_high, clipped_dual)


def _penalties(pg, logp_BGT, ref_logp_BGT, entropy_BGT, mask, kl_coef, kl_estimator,
               entropy_coef):
    """L = pg + kl_coef KL_k(logp, ref) - entropy_coef H per token (each term where its input
    is given) → (L, {"kl", "entropy"} means over valid tokens)."""
    per_token = pg
    metrics = {}
    if ref_logp_BGT is not None:
        kl = kl_estimate(logp_BGT, jax.lax.stop_gradient(ref_logp_BGT), kl_estimator)
        per_token = per_token + kl_coef * kl
        metrics["kl"] = masked_mean(kl, mask)
    if entropy_BGT is not None:
        per_token = per_token - entropy_coef * entropy_BGT
        metrics["entropy"] = masked_mean(entropy_BGT, mask)
    return per_token, metrics


def _aggregate(per_token, pg, mask, m_BGT, agg: str, loss_denominator, horizon):
    """loss = agg numerator / denominator (`loss_denominator`, computed from `mask` unless
    given; 1 where it is 0) → (loss, {"loss", "pg_loss", "loss_numerator",
    "loss_denominator"})."""
    if loss_denominator is None:
        den = _denominator(mask, agg, horizon=horizon)
    else:
        den = jnp.asarray(loss_denominator, jnp.float32)
    safe_den = jnp.where(den > 0, den, 1.0)
    num = _numerator(per_token, m_BGT, agg)
    loss = num / safe_den
    return loss, dict(loss=loss, pg_loss=_numerator(pg, m_BGT, agg) / safe_den,
                      loss_numerator=num, loss_denominator=den)


_denominator = loss_denominator


def _numerator(loss_BGT: Array, m_BGT: Array, agg: str) -> Array:
    """Sum part of the aggregation; per-sequence means for "seq-mean-token-mean"."""
    summed_BG = jnp.sum(jnp.where(m_BGT > 0, loss_BGT, 0.0), axis=-1)
    if agg == "seq-mean-token-mean":
        summed_BG = summed_BG / jnp.maximum(m_BGT.sum(-1), 1.0)
    return jnp.sum(summed_BG)


_UNKNOWN = set(LOSS_FIELDS) - set(inspect.signature(policy_loss).parameters)
if _UNKNOWN:  # one list of names: each a keyword of the loss
    raise ImportError(f"vpo.objectives.policy_loss.LOSS_FIELDS: no keyword of policy_loss: "
                      f"{sorted(_UNKNOWN)}")
