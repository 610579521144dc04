"""Association across runs: does a per-run outcome rise with a per-run measurement? (e.g. a
`vpo compare` run's search solve rate against its end-of-training entropy). Spearman's ρ with
the permutation test of no association (Pitman 1937): every pairing of the outcomes with the
measurements equally likely under the null, enumerated exactly up to 8 runs (8! orders), a
fixed-seed Monte Carlo over random orders beyond (Phipson & Smyth 2010). The units are runs, so
a verdict is a statement about runs, not about a method; the claims it returns have the shape
of `vpo.eval.claims`' (three-way verdict, p on both sides) and go through the same Holm
correction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from vpo.eval.claims import (
    INCONCLUSIVE,
    LEVEL,
    MC_SEED,
    REFUTED,
    REPRODUCED,
    make_claim,
    p_text,
)

MAX_EXACT_PERMUTATIONS = 40_320  # 8!: orders enumerated up to 8 units; Monte Carlo beyond
PERMUTATION_DRAWS = 100_000


def _ranks(x: np.ndarray) -> np.ndarray:
    from scipy import stats

    return stats.rankdata(x)  # average ranks for ties


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's ρ: Pearson's correlation of the (average) ranks; 0 when either is constant."""
    rx, ry = _ranks(np.asarray(x, float)), _ranks(np.asarray(y, float))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(rx @ ry / den) if den > 0 else 0.0


def permutation_p(x: Sequence[float], y: Sequence[float], *, higher: bool = True,
                  seed: int = MC_SEED, draws: int = PERMUTATION_DRAWS) -> tuple[float, bool]:
    """(one-sided p of Spearman's ρ > 0 (< 0 if not `higher`), exact): the permutation test of
    no association (Pitman 1937): every pairing of y with x equally likely, p = #{π : ρ(x, π y)
    >= ρ(x, y)} / n!, enumerated for n! <= MAX_EXACT_PERMUTATIONS, else (1 + #{draws >=
    observed}) / (draws + 1) over `draws` random permutations from a fixed `seed` (Phipson &
    Smyth 2010). 1 for fewer than 3 units or a constant variable."""
    import itertools

    x, y = np.asarray(x, float), np.asarray(y, float)
    n = x.size
    if n < 3 or np.all(x == x[0]) or np.all(y == y[0]):
        return 1.0, True
    rx, ry = _ranks(x), _ranks(y)
    rx = rx - rx.mean()
    sign = 1.0 if higher else -1.0
    observed = sign * float(rx @ ry) - 1e-9 * n * n
    if math.factorial(n) <= MAX_EXACT_PERMUTATIONS:
        perms = np.array(list(itertools.permutations(range(n))))
        return float(np.mean(sign * (ry[perms] @ rx) >= observed)), True
    rng = np.random.default_rng(seed)
    perms = np.argsort(rng.random((draws, n)), axis=1)
    return float((1 + np.sum(sign * (ry[perms] @ rx) >= observed)) / (draws + 1)), False


def association(text: str, x: Sequence[float], y: Sequence[float], *, names=("x", "y")
                ) -> dict[str, Any]:
    """Claim "y rises with x across the units" (e.g. search solve rate with end-of-training
    entropy across RL runs): Spearman's ρ with its permutation p (`permutation_p`), reproduced
    iff p < LEVEL, refuted iff the other side's p < LEVEL. The units are the runs, so this is
    a statement about runs, not about a method."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    rho = spearman(x, y)
    p, exact = permutation_p(x, y, higher=True)
    p_other, _ = permutation_p(x, y, higher=False)
    result = REPRODUCED if p < LEVEL else REFUTED if p_other < LEVEL else INCONCLUSIVE
    how = (f"exact over all {math.factorial(x.size)} orders" if exact else
           f"{PERMUTATION_DRAWS} random orders")
    ev = (f"Spearman ρ({names[0]}, {names[1]}) = {rho:+.3f} over {x.size} runs, permutation "
          f"test ({how}) {p_text(p, p_other)}")
    c = make_claim(text, result, [rho], ev, p, p_other)
    floor = 1.0 / math.factorial(x.size) if exact else 1.0 / (PERMUTATION_DRAWS + 1)
    return {**c, "rho": rho, "n": int(x.size), "smallest_p": floor, "note": "",
            "x": x.tolist(), "y": y.tolist()}


def _block_scores(x: np.ndarray, y: np.ndarray, z: np.ndarray | None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Within one block: centred ranks of x and y, each with its least-squares line on the
    centred ranks of z removed when z is given (rank residuals: x and y given z)."""
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    if z is not None:
        rz = _ranks(z)
        rz = rz - rz.mean()
        zz = float(rz @ rz)
        if zz > 0:
            rx, ry = rx - rz * float(rx @ rz) / zz, ry - rz * float(ry @ rz) / zz
    return rx, ry


def stratified_association(text: str, blocks: Sequence[tuple[Sequence[float], ...]], *,
                           names=("x", "y"), given: str | None = None, seed: int = MC_SEED,
                           draws: int = PERMUTATION_DRAWS) -> dict[str, Any]:
    """Claim "y rises with x within every block" (e.g. search solve rate with end-of-training
    entropy within each arm, the arms as blocks): the statistic is Σ_b Σ_i rx_bi ry_bi over
    within-block centred ranks, its null distribution draws every block's y order independently
    (a stratified permutation test: units are exchanged only inside their block, so a
    difference between blocks, such as the objective an arm trains, cannot make the
    association). Blocks of (x, y, z) with `given` naming z: x and y are first replaced by
    their within-block rank residuals on z (a partial rank association given z, e.g. held-out
    pass@k, so that a measurement that only tracks competence does not pass), and the
    residuals of y are permuted (Freedman & Lane 1983). p from `draws` fixed-seed draws,
    (1 + #{T_draw >= T}) / (draws + 1); `rho` is the mean within-block ρ of the scores."""
    scores = [_block_scores(np.asarray(b[0], float), np.asarray(b[1], float),
                            None if len(b) < 3 else np.asarray(b[2], float)) for b in blocks]
    scores = [(sx, sy) for sx, sy in scores if sx.size >= 3]
    rng = np.random.default_rng(seed)
    observed = sum(float(sx @ sy) for sx, sy in scores)
    null = np.zeros(draws)
    for sx, sy in scores:
        perms = np.argsort(rng.random((draws, sx.size)), axis=1)
        null += sy[perms] @ sx
    tol = 1e-9 * max(1.0, abs(observed))
    p = float((1 + np.sum(null >= observed - tol)) / (draws + 1))
    p_other = float((1 + np.sum(null <= observed + tol)) / (draws + 1))
    rhos = [float(sx @ sy / math.sqrt(float(sx @ sx) * float(sy @ sy)))
            if float(sx @ sx) * float(sy @ sy) > 0 else 0.0 for sx, sy in scores]
    rho = float(np.mean(rhos)) if rhos else 0.0
    result = REPRODUCED if p < LEVEL else REFUTED if p_other < LEVEL else INCONCLUSIVE
    n = sum(sx.size for sx, _ in scores)
    ev = (f"mean within-block ρ({names[0]}, {names[1]}{' | ' + given if given else ''}) = "
          f"{rho:+.3f} over {len(scores)} blocks of {n} runs (per block: "
          + ", ".join(f"{r:+.2f}" for r in rhos)
          + f"), stratified permutation test ({draws} draws) {p_text(p, p_other)}")
    c = make_claim(text, result, rhos, ev, p, p_other)
    return {**c, "rho": rho, "n": int(n), "blocks": len(scores),
            "smallest_p": 1.0 / (draws + 1), "note": ""}
