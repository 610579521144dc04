"""The `vpo compare` report: `write_report` computes its numbers (`vpo.compare.numbers`),
stores them in summary.json, renders report.md from the summary as written
(`vpo.compare.render`) and draws the PNGs (`vpo.compare.figures`). Reads what the stages in
`vpo.compare.driver` produced; computes nothing new about the policies.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np

from vpo.compare.config import CompareConfig
from vpo.compare.figures import write_figures
from vpo.compare.numbers import (
    PRIMARY,
    TREND_METRICS,
    headline,
    law_table,
    law_trajectories,
    static_arms,
    verdict_families,
)
from vpo.compare.render import render
from vpo.eval import claims
from vpo.eval import policies as policy_eval


def write_report(out_dir: str, cfg: CompareConfig, *, command: str, wall: dict[str, float],
                 runs, evals, searches=None, probes=None, temperatures=None, load: str = "",
                 gate: dict[str, Any] | None = None,
                 data: dict[str, Any] | None = None) -> dict[str, Any]:
    """summary.json, the PNGs (best@k, pass@k, training curves, search, entropy law, and all
    in report.png) and report.md, rendered from the summary as written (`render`), in out_dir;
    returns the summary. `data`: your data's record (`vpo.compare.data.describe`)."""
    head = headline(cfg, runs, evals, searches)
    ks, N = evals["ks"], cfg.eval_budget
    law = law_trajectories(runs)
    # what the report reads (the run folders hold all); set_reward marks the per-answer scale
    kept = ("step", "grad_norm", "set_reward", *TREND_METRICS)
    train = {arm: [{"seed": r.seed, "dir": os.path.relpath(r.out_dir, out_dir),
                    "metrics": [{k: row[k] for k in kept if k in row} for row in r.metrics]}
                   for r in rs] for arm, rs in runs.items()}
    families = verdict_families(cfg, head, ks, law, searches, probes, train)
    laws = law_table(law)
    means = {}
    for name, h in head.items():
        rows = evals["rows"][name]
        label = name if name.startswith("sft") else f"{name} (m={h['m']})"
        means[label] = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]
                        if isinstance(rows[0][k], float)}
    policy_eval.write_eval_table(out_dir, means, ks, title=f"{cfg.task}: {cfg.eval_problems} "
                                 f"problems, {N} candidates each, T = {cfg.eval_temperature:g} "
                                 "(mean over seeds)")
    write_figures(out_dir, cfg, runs, head, law, searches, temperatures)
    summary = {"config": dataclasses.asdict(cfg), "command": command, "wall_s": wall,
               "load": load, **({"data": data} if data else {}), "headline": head,
               "gate": gate, **families,
               "corrections": {k: f"Holm 1979 over {len(families[k])} claims, both directions, "
                                  f"one-sided {claims.LEVEL:g}" for k in families},
               "design": claims.design(cfg.num_seeds, len(families[PRIMARY[0]])),
               "static": static_arms(runs),
               "entropy_law": {a: {k: v for k, v in t.items() if k != "fits"} | {
                   "trajectories": law[a]} for a, t in laws.items()},
               "eval": evals, "search": searches, "probe": probes, "train": train,
               **({"temperature": temperatures} if temperatures is not None else {})}
    text = json.dumps(summary, indent=1, default=float)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(render(json.loads(text)))  # the report is what summary.json renders to
    return summary


def machine_load() -> str:
    """CPU count and 1-minute load average, for the report (timings depend on both)."""
    try:
        load = f", load average {os.getloadavg()[0]:.2f}"
    except OSError:
        load = ""
    return f"{os.cpu_count()} CPUs{load}, JAX backend {jax.default_backend()}"
