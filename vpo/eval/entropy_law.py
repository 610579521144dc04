"""The entropy law of RL on language models (Cui et al., arXiv 2505.22617): R = -a·exp(H) + b.

R is the policy's held-out evaluation score and H its mean token entropy along a training
trajectory; a > 0 means score is bought with entropy, and b - a is the predicted ceiling once
entropy reaches 0. The law is only evidence if it predicts later points better than simpler
stories that any two monotone curves satisfy, so `heldout_fits` fits it and three alternatives on
the early points and scores all four on the later ones:

    law       R = -a·exp(H) + b         regressors [-exp(H), 1]
    linear_h  R = c·H + d               regressors [H, 1]
    trend     R = e·step + f            regressors [step, 1]   (ignores entropy)
    constant  R = mean of the fit points
"""

from __future__ import annotations

import numpy as np

MODELS = ("law", "linear_h", "trend", "constant")


def _lstsq(X, y) -> np.ndarray:
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return coef


def fit_entropy_law(entropy, reward) -> tuple[float, float]:
    """Least squares fit of R = -a·exp(H) + b (Cui et al., arXiv 2505.22617) on the regressors
    [-exp(H), 1] → (a, b); the predicted ceiling at H = 0 is b - a."""
    H, R = np.asarray(entropy, float), np.asarray(reward, float)
    if H.shape != R.shape or H.size < 2:
        raise ValueError(f"fit_entropy_law: need >= 2 paired points; got {H.shape}, {R.shape}")
    a, b = _lstsq(np.stack([-np.exp(H), np.ones_like(H)], axis=-1), R)
    return float(a), float(b)


def _design(model: str, step, H) -> np.ndarray:
    one = np.ones_like(H)
    return {"law": np.stack([-np.exp(H), one], -1), "linear_h": np.stack([H, one], -1),
            "trend": np.stack([step, one], -1), "constant": one[:, None]}[model]


def heldout_fits(step, entropy, score, *, fit_frac: float = 0.5) -> dict:
    """Fit the four `MODELS` on the first `fit_frac` of the points (at least 2, leaving at least
    1) and report each one's RMSE and mean residual (observed - predicted) on the rest →
    {"rmse": {model: float}, "bias": {model: float}, "a", "b" (the law
    fitted on ALL points), "r2" (of that full fit), "fit_points", "points"}."""
    t, H, R = (np.asarray(x, float) for x in (step, entropy, score))
    if not t.shape == H.shape == R.shape or H.ndim != 1 or H.size < 3:
        raise ValueError(f"heldout_fits: need >= 3 paired (step, entropy, score) points; got "
                         f"shapes {t.shape}, {H.shape}, {R.shape}")
    k = min(max(2, round(fit_frac * H.size)), H.size - 1)
    rmse, bias = {}, {}
    for model in MODELS:
        coef = _lstsq(_design(model, t[:k], H[:k]), R[:k])
        resid = R[k:] - _design(model, t[k:], H[k:]) @ coef
        rmse[model] = float(np.sqrt(np.mean(resid ** 2)))
        bias[model] = float(np.mean(resid))
    a, b = fit_entropy_law(H, R)
    pred = b - a * np.exp(H)
    ss_res, ss_tot = float(np.sum((R - pred) ** 2)), float(np.sum((R - R.mean()) ** 2))
    return {"rmse": rmse, "bias": bias, "a": a, "b": b, "ceiling": b - a,
            "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 0.0, "fit_points": k,
            "points": int(H.size)}


def entropy_law_report(entropy, reward, *, bins: int = 10, fit_frac: float = 0.5
                       ) -> dict[str, float]:
    """Fit the entropy law on a training trajectory averaged into `bins` consecutive chunks of
    steps (per-step rewards are noisy): a, b, ceiling b - a and R² on all chunks; then refit on
    the first `fit_frac` of the chunks and report the RMSE of its prediction on the rest
    (`rmse_heldout`) next to the RMSE of predicting the early mean (`rmse_constant`), of a
    linear-in-H fit (`rmse_linear_h`) and of a trend in steps (`rmse_trend`)."""
    H, R = np.asarray(entropy, float), np.asarray(reward, float)
    if H.size < 4:
        raise ValueError(f"entropy_law_report: need >= 4 steps (2 to fit, 2 held out); got "
                         f"{H.size}")
    n = min(bins, H.size)
    Hb = np.array([c.mean() for c in np.array_split(H, n)])
    Rb = np.array([c.mean() for c in np.array_split(R, n)])
    tb = np.array([c.mean() for c in np.array_split(np.arange(H.size, dtype=float), n)])
    fits = heldout_fits(tb, Hb, Rb, fit_frac=fit_frac)
    k = fits["fit_points"]
    ea, eb = fit_entropy_law(Hb[:k], Rb[:k])
    return {"a": fits["a"], "b": fits["b"], "ceiling": fits["ceiling"], "r2": fits["r2"],
            "early_a": ea, "early_b": eb, "fit_chunks": k, "chunks": n,
            "rmse_heldout": fits["rmse"]["law"], "rmse_constant": fits["rmse"]["constant"],
            "rmse_linear_h": fits["rmse"]["linear_h"], "rmse_trend": fits["rmse"]["trend"],
            "entropy_first": float(Hb[0]), "entropy_last": float(Hb[-1])}
