"""The entropy law of RL on language models (Cui et al., arXiv 2505.22617): R = -a·exp(H) + b.

R is the policy's reward and H its mean token entropy along a training trajectory; a > 0 means
reward is bought with entropy, and b - a is the predicted ceiling once entropy reaches 0.
`vpo compare` and `experiments/entropy_law.py` fit it to every arm's training curve.
"""

from __future__ import annotations

import numpy as np


def fit_entropy_law(entropy_S, reward_S) -> tuple[float, float]:
    """Least squares fit of R = -a·exp(H) + b (Cui et al., arXiv 2505.22617) on the regressors
    [-exp(H), 1] → (a, b); the predicted ceiling at H = 0 is b - a."""
    H, R = np.asarray(entropy_S, float), np.asarray(reward_S, float)
    if H.shape != R.shape or H.size < 2:
        raise ValueError(f"fit_entropy_law: need >= 2 paired points; got {H.shape}, {R.shape}")
    X = np.stack([-np.exp(H), np.ones_like(H)], axis=-1)
    (a, b), *_ = np.linalg.lstsq(X, R, rcond=None)
    return float(a), float(b)


def entropy_law_report(entropy_S, reward_S, *, bins: int = 10, fit_frac: float = 0.5
                       ) -> dict[str, float]:
    """Fit the entropy law on a training trajectory averaged into `bins` consecutive chunks of
    steps (per-step rewards are noisy): a, b, ceiling b - a and R² on all chunks; then refit on
    the first `fit_frac` of the chunks and report the RMSE of its prediction on the rest
    (`rmse_heldout`) next to the RMSE of predicting the early mean (`rmse_constant`)."""
    H, R = np.asarray(entropy_S, float), np.asarray(reward_S, float)
    if H.size < 4:
        raise ValueError(f"entropy_law_report: need >= 4 steps (2 to fit, 2 held out); got "
                         f"{H.size}")
    n = min(bins, H.size)
    Hb = np.array([c.mean() for c in np.array_split(H, n)])
    Rb = np.array([c.mean() for c in np.array_split(R, n)])
    a, b = fit_entropy_law(Hb, Rb)
    pred = b - a * np.exp(Hb)
    ss_res, ss_tot = float(np.sum((Rb - pred) ** 2)), float(np.sum((Rb - Rb.mean()) ** 2))
    k = min(max(2, round(fit_frac * n)), n - 1)
    ea, eb = fit_entropy_law(Hb[:k], Rb[:k])
    later = Rb[k:]
    return {"a": a, "b": b, "ceiling": b - a, "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 0.0,
            "early_a": ea, "early_b": eb, "fit_chunks": k, "chunks": n,
            "rmse_heldout": float(np.sqrt(np.mean((later - (eb - ea * np.exp(Hb[k:]))) ** 2))),
            "rmse_constant": float(np.sqrt(np.mean((later - Rb[:k].mean()) ** 2))),
            "entropy_first": float(Hb[0]), "entropy_last": float(Hb[-1])}
