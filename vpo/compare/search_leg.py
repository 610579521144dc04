"""The search leg of `vpo compare`: which problems are searched, at which budget, and every
policy's searches on them.

  1. `hard_problems`  before RL: of `search_pool` problems of a split of their own
                      (`search_split_seed`, which no arm trains, evaluates or is chosen on), the
                      `search_problems` the warm start's sampling found hardest.
  2. `calibrate`      before RL: the warm start's island search on them with calibration keys of
                      its own, in each of its m modes; the stronger mode's solved fraction at
                      every budget point picks the budget the search claim is judged at
                      (`budget_point`: the largest point where it is at most `search_band_hi`,
                      in band when also at least `search_band_lo`). Never tuned on RL outcomes.
  3. `search_arms`    after RL: every row (warm start in each m, every arm) and training seed
                      searches the problems `search_seeds` times per method (island search,
                      best-of-N, sequential revision; `search_methods`) at the largest budget;
                      seed i of every row uses the same keys, so rows pair by seed and the warm
                      start's searches vary as the arms' do. Each search records the budget
                      point at which it first solved each problem (`first_SP`), so the solved
                      fraction at every budget (the budget curves) comes from one run.
  4. `temperature_sweep` after the search stage (`search_temperatures`): can inference buy
                      back what training removed? The warm start in its calibrated mode and the
                      primary claims' arms search again at other sampling temperatures.

The island search is Mind Evolution's (Lee et al., arXiv 2501.09891) with the policy as mutation
operator, as in the VPO paper's test-time search (Bahlous-Boldi et al., arXiv 2605.22817).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np

from vpo.compare import data as compare_data
from vpo.eval import policies as policy_eval
from vpo.search.methods import run_all_methods

CALIBRATION_KEY = 101  # calibration searches: key(search_split_seed + 101), not the arms' keys
SEARCH_KEY = 1  # the rows' searches: fold_in(key(search_split_seed + 1), training seed)


def hard_problems(cfg, task, policy) -> dict[str, Any]:
    """The search problems: of `search_pool` problems from the split `search_split_seed` (your
    data: its search rows; used by no other stage), the `search_problems` the warm start found
    hardest at the evaluation budget, over its m modes: fewest solved, then lowest best score;
    ties keep the order."""
    records = compare_data.search_pool(cfg, task)
    solved, best = [], []
    for m in cfg.all_answers:
        _, per = policy_eval.evaluate_policy_per_problem(
            policy, task, records, num_answers=m, budget=cfg.eval_budget, ks=[1],
            key=jax.random.key(cfg.search_split_seed), temperature=cfg.eval_temperature)
        solved.append(per["solved_P"])
        best.append(per["best_P"])
    s, b = np.mean(solved, axis=0), np.mean(best, axis=0)
    idx = [int(i) for i in np.lexsort((np.arange(b.size), b, s))[:cfg.search_problems]]
    return {"split_seed": cfg.search_split_seed, "pool": cfg.search_pool, "problems": idx,
            "warm_start_solved": s[idx].tolist(), "warm_start_best": b[idx].tolist(),
            "pool_solved_mean": float(s.mean())}


def _trace(task, model, records, scfg, method: str, key):
    """One method over `records` (copies repeated, each its own key fold_in(key, i)): in one
    jit for in-graph tasks, on the host between generations for host-scored ones."""
    return run_all_methods(key, model, task, records, scfg, methods=(method,))[method].trace


def first_solved(solved, S: int, P: int) -> np.ndarray:
    """[S, P] int: the first budget point at which each search had solved its problem (-1:
    never), from a trace's solved [S·P copies, G + 1] (copies ordered search-major)."""
    s = np.asarray(solved, bool).reshape(S, P, -1)
    return np.where(s.any(-1), s.argmax(-1), -1)


def solved_at(first, point: int) -> np.ndarray:
    """[S, P] bool: solved by budget point `point` (0 = after the initial population)."""
    f = np.asarray(first)
    return (f >= 0) & (f <= point)


def budget_point(fractions, lo: float, hi: float) -> tuple[int, bool]:
    """(point, in band): the largest budget point whose solved fraction is at most `hi` (the
    most search that leaves headroom; point 0 when even the first exceeds it), and whether its
    fraction is also at least `lo`."""
    f = np.asarray(fractions, float)
    under = np.flatnonzero(f <= hi)
    point = int(under[-1]) if under.size else 0
    return point, bool(lo <= f[point] <= hi)


def probe_counts(trace) -> list[int] | None:
    """A batched island-search trace's mechanism probe summed over copies and budget points:
    the 4 counts of `vpo.search.ingraph.PROBE_FIELDS` (None: a host search has no probe)."""
    if trace.probe is None:
        return None
    return np.asarray(trace.probe).sum((0, 1)).astype(int).tolist()


def search_records(cfg, task, chosen: dict[str, Any]) -> list:
    records = compare_data.search_pool(cfg, task)
    return [records[i] for i in chosen["problems"]]


def calibrate(cfg, task, policy, chosen: dict[str, Any]) -> dict[str, Any]:
    """The warm start's island search on the chosen problems, `search_seeds` searches each
    with the calibration keys, in every m of its mixture: per m the solved fraction at every
    budget point; the mode that solves more at the largest budget is the warm start's search,
    and `budget_point` on its fractions picks the budget of the search claim."""
    sub = search_records(cfg, task, chosen)
    S, P = cfg.search_seeds, len(sub)
    key = jax.random.key(cfg.search_split_seed + CALIBRATION_KEY)
    modes, evaluated = {}, {}
    for m in cfg.all_answers:
        scfg = dataclasses.replace(cfg.search, num_answers=m)
        trace = _trace(task, policy, sub * S, scfg, "search", key)
        first = first_solved(trace.solved, S, P)
        G = np.asarray(trace.solved).shape[-1]
        modes[str(m)] = [float(solved_at(first, g).mean()) for g in range(G)]
        evaluated[str(m)] = np.asarray(trace.evaluated)[0].tolist()
    mode = max(modes, key=lambda m: (modes[m][-1], -int(m)))
    point, in_band = budget_point(modes[mode], cfg.search_band_lo, cfg.search_band_hi)
    return {"searches": S, "problems": P, "key": cfg.search_split_seed + CALIBRATION_KEY,
            "fractions": modes, "evaluated": evaluated[mode], "mode": int(mode),
            "point": point, "budget": evaluated[mode][point],
            "fraction": modes[mode][point], "in_band": in_band,
            "band": [cfg.search_band_lo, cfg.search_band_hi]}


def calibration_failure(cfg, cal: dict[str, Any]) -> str:
    """The gate's sentence when the calibrated budget is out of band ("" when in band)."""
    if cal["in_band"]:
        return ""
    f, lo, hi = cal["fraction"], cfg.search_band_lo, cfg.search_band_hi
    if f < lo:
        return (f"the warm start's island search solves {f:.0%} of the {cal['problems']} search "
                f"problems at its largest budget ({cal['budget']} candidates; band "
                f"[{lo:.0%}, {hi:.0%}]): search has too little to find; raise "
                "search.generations or take easier problems (a larger search_pool)")
    return (f"the warm start's island search already solves {f:.0%} of the search problems at "
            f"its smallest budget ({cal['budget']} candidates; band [{lo:.0%}, {hi:.0%}]): no "
            "headroom; take harder problems (a larger search_pool) or smaller search "
            "populations")


def search_arms(cfg, task, rows, chosen: dict[str, Any], calibration: dict[str, Any],
                log=print, progress=None) -> dict[str, Any]:
    """Every method of `cfg.search_methods` with each row's policy (rows: (name, seed, m,
    model)) on the chosen problems, `search_seeds` searches each at the largest budget, with
    key fold_in(key(search_split_seed + 1), seed) for seed `seed` of every row. Per row and
    seed: `first_SP` {method: [search, problem] first solving point}, and for the report's
    tables `solved_SP` / `solved_SG` (island search at the calibrated point / per point) and
    `best_of_n_SP` (best-of-N at the calibrated point)."""
    sub = search_records(cfg, task, chosen)
    S, P = cfg.search_seeds, len(sub)
    point = calibration["point"]
    out: dict[str, Any] = {**chosen, "budget": calibration["budget"], "point": point,
                           "max_budget": cfg.search.budget, "seeds": S, "per_seed_keys": True,
                           "methods": list(cfg.search_method_names), "calibration": calibration,
                           "rows": {}}
    t0 = time.perf_counter()
    for i, (name, seed, m, model) in enumerate(rows):
        scfg = dataclasses.replace(cfg.search, num_answers=m)
        key = jax.random.fold_in(jax.random.key(cfg.search_split_seed + SEARCH_KEY), seed)
        rec: dict[str, Any] = {"seed": seed, "m": m, "first_SP": {}}
        for method in cfg.search_method_names:
            trace = _trace(task, model, sub * S, scfg, method, key)
            first = first_solved(trace.solved, S, P)
            rec["first_SP"][method] = first.tolist()
            rec.setdefault("evaluated", np.asarray(trace.evaluated)[0].tolist())
            if method == "search" and trace.probe is not None:
                rec["probe"] = probe_counts(trace)
        island = np.asarray(rec["first_SP"]["search"])
        G = len(rec["evaluated"])
        rec["solved_SP"] = solved_at(island, point).tolist()
        rec["solved_SG"] = [[int(solved_at(island, g)[s].sum()) for g in range(G)]
                            for s in range(S)]
        if "best_of_n" in rec["first_SP"]:
            rec["best_of_n_SP"] = solved_at(rec["first_SP"]["best_of_n"], point).tolist()
        out["rows"].setdefault(name, []).append(rec)
        if progress is not None:
            progress(i + 1, len(rows), t0, f"{name} seed {seed}")
    return out


def sweep_rows(cfg, rows, calibration: dict[str, Any]) -> list:
    """The rows the temperature sweep searches with: the warm start in the mode calibration
    chose, and every arm a primary claim names (rows as `search_arms` takes them)."""
    warm = f"sft (m={calibration['mode']})"
    return [r for r in rows if r[0] == warm or r[0] in cfg.primary_arms]


def temperature_sweep(cfg, task, rows, chosen: dict[str, Any], calibration: dict[str, Any],
                      progress=None) -> dict[str, Any]:
    """Island search and best-of-N with each row's policy at every temperature of
    `cfg.search_temperatures` except `cfg.search.temperature` (that one is the search stage's),
    with the search stage's keys, so each row seed pairs with its own search at the main
    temperature. Per row, temperature and seed: problems solved at the calibrated point by each
    method, and the island search's mechanism probe summed over copies and generations
    (`vpo.search.ingraph.PROBE_FIELDS`)."""
    sub = search_records(cfg, task, chosen)
    S, P, point = cfg.search_seeds, len(sub), calibration["point"]
    temps = [t for t in cfg.search_temperatures if t != cfg.search.temperature]
    out: dict[str, Any] = {"temperatures": temps, "main": cfg.search.temperature,
                           "point": point, "budget": calibration["budget"], "rows": {}}
    t0, todo = time.perf_counter(), len(rows) * len(temps)
    for i, (T, (name, seed, m, model)) in enumerate(
            (T, r) for T in temps for r in rows):
        scfg = dataclasses.replace(cfg.search, num_answers=m, temperature=T)
        key = jax.random.fold_in(jax.random.key(cfg.search_split_seed + SEARCH_KEY), seed)
        traces = run_all_methods(key, model, task, sub * S, scfg, methods=("search", "best_of_n"))
        rec = {"temperature": T, "seed": seed, "m": m}
        for method, res in traces.items():
            first = first_solved(res.trace.solved, S, P)
            rec[method] = int(solved_at(first, point).sum()) / S
        rec["probe"] = probe_counts(traces["search"].trace)
        out["rows"].setdefault(name, []).append(rec)
        if progress is not None:
            progress(i + 1, todo, t0, f"{name} seed {seed} at T = {T:g}")
    return out
