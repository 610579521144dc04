"""The search's positive control: does island search beat best-of-N at equal candidate budget on
a warm start, before any RL, and why (or why not)?

Design, fixed before the run (the defaults below):

- Policy: the maze preset's warm start recipe (`vpo.compare.driver.warm_start` on
  `--preset maze`: the tiny model, 300 SFT steps, half of them mutation prompts, 2 parents),
  on `--task` (with `--task-kwargs`), trained with `--warm-starts` seeds (1000, 1001, ...: no
  quickstart run uses them).
- Problems: `--problems` of their own split (seed `--split-seed`), which no SFT row comes from.
- Search: the maze preset's island search (2 islands x 6 members, 2 parents, 6 children, 9
  generations, m = 1, temperature 0.7: 120 candidates, 12 per point) and best-of-N at the same
  budget with the same keys; each warm start searches every problem `--search-seeds` times.
- Unit: a block = (warm start, search seed); statistic: island-solved minus best-of-N-solved
  problems at 120 candidates; test: the exact one-sided sign-flip test over the blocks
  (`vpo.eval.claims.sign_flip_p`); with 2 x 4 blocks the smallest p is 2^-8 = 0.0039. The
  per-problem view (problems solved by one method in more of the searches) is descriptive.
- Mechanism, per generation (`vpo.search.ingraph.PROBE_FIELDS`): the share of mutation children
  that beat the best parent shown to them, against the share of plain-prompt samples drawn in the
  same generation (`fresh_rate` 1/6) that beat the parents selected for their call.

Writes `--out`/summary.json and solved.png (solved fraction against candidates, both methods)
and prints a Markdown table.

Run:  PYTHONPATH=. .venv/bin/python experiments/search_control.py --out runs/control
      (maze7, the maze preset's task: --task maze --task-kwargs '{"size": 7, "demos": "partial"}')
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import jax
import numpy as np

from vpo.compare import data as compare_data
from vpo.compare import driver
from vpo.compare.config import make_config
from vpo.eval import claims, plots
from vpo.search.ingraph import PROBE_FIELDS
from vpo.search.methods import run_all_methods

METHODS = ("search", "best_of_n")


def rates(probe_G4: np.ndarray) -> dict[str, list[float | None]]:
    """Per generation: the child-beats-parent share of mutation children and of fresh samples."""
    p = dict(zip(PROBE_FIELDS, np.asarray(probe_G4, float).T, strict=True))

    def share(beat, n):
        return [None if k == 0 else round(float(b / k), 4) for b, k in zip(beat, n, strict=True)]

    return {"mutated_beat_rate": share(p["mutated_beat"], p["mutated"]),
            "fresh_beat_rate": share(p["fresh_beat"], p["fresh"]),
            "mutated": p["mutated"].astype(int).tolist(), "fresh": p["fresh"].astype(int).tolist()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="codeword")
    ap.add_argument("--task-kwargs", default="{}", help="JSON, e.g. '{\"length\": 6}'")
    ap.add_argument("--warm-starts", type=int, default=2)
    ap.add_argument("--first-seed", type=int, default=1000)
    ap.add_argument("--search-seeds", type=int, default=4)
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--split-seed", type=int, default=7373)
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--set", action="append", default=[],
                    help="a compare override (section.key=value), e.g. search.generations=19")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    kwargs = json.loads(args.task_kwargs)
    t0 = time.time()
    blocks, curves, probes, timing = [], {m: [] for m in METHODS}, [], {}
    per_problem = {m: np.zeros(args.problems) for m in METHODS}
    for w in range(args.warm_starts):
        seed = args.first_seed + w
        cfg = make_config("maze", [f"task={args.task}", f"train.seed={seed}",
                                      f"sft_steps={args.sft_steps}", *args.set])
        cfg = dataclasses.replace(cfg, task_kwargs=kwargs)
        task = compare_data.load_tasks(cfg, with_search=False)
        t = time.time()
        policy = driver.warm_start(cfg, task, os.path.join(args.out, f"warm{w}"))
        timing[f"sft_{w}"] = round(time.time() - t, 1)
        records = task.make_problems(args.split_seed, args.problems)
        copies = list(records) * args.search_seeds  # search-major: copy i = (seed i // P, i % P)
        key = jax.random.key(args.split_seed + 1 + w)
        solved = {}
        for method in METHODS:
            t = time.time()
            trace = run_all_methods(key, policy, task, copies, cfg.search,
                                    methods=(method,))[method].trace
            timing[f"{method}_{w}"] = round(time.time() - t, 1)
            s = np.asarray(trace.solved, bool).reshape(args.search_seeds, args.problems, -1)
            solved[method] = s
            per_problem[method] += s[:, :, -1].sum(0)
            curves[method].append(s.mean(1))  # [S, G + 1]
            if method == "search":
                probes.append(np.asarray(trace.probe).sum(0))  # [G + 1, 4]
            evaluated = np.asarray(trace.evaluated)[0].tolist()
        for s_i in range(args.search_seeds):
            blocks.append({"warm_start": w, "search_seed": s_i,
                           **{m: int(solved[m][s_i, :, -1].sum()) for m in METHODS}})
        print(json.dumps(blocks[-args.search_seeds:]), flush=True)
    diffs = [b["search"] - b["best_of_n"] for b in blocks]
    d = np.asarray(diffs, float)
    half = (2.0 * d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else float("nan")
    probe = np.sum(probes, axis=0)
    only = {m: int(np.sum(per_problem[m] > per_problem[o])) for m, o in
            (("search", "best_of_n"), ("best_of_n", "search"))}
    summary = {
        "task": args.task, "task_kwargs": kwargs, "overrides": args.set,
        "warm_start_seeds": [args.first_seed + w for w in range(args.warm_starts)],
        "search_seeds": args.search_seeds, "problems": args.problems,
        "split_seed": args.split_seed, "budget": evaluated[-1], "evaluated": evaluated,
        "blocks": blocks, "search_minus_best_of_n": {
            "mean": float(d.mean()), "half_width_2se": float(half),
            "sign_flip_p": claims.sign_flip_p(diffs, higher=True),
            "positive_blocks": int(np.sum(d > 0)), "negative_blocks": int(np.sum(d < 0))},
        "problems_solved_more_often": only,
        "solved_fraction": {m: np.mean(np.concatenate(curves[m]), 0).round(4).tolist()
                            for m in METHODS},
        "probe": {"all": rates(probe), **{f"warm{w}": rates(p) for w, p in enumerate(probes)}},
        "timing_s": timing, "wall_s": round(time.time() - t0, 1)}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    plots.plot_metric_vs_k(os.path.join(args.out, "solved.png"),
                           {m: (evaluated, summary["solved_fraction"][m]) for m in METHODS},
                           metric="solved fraction", log_x=False,
                           title=f"{args.task}: island search vs best-of-N (warm start)")
    r = summary["probe"]["all"]
    print("| generation | mutation children | beat best parent | fresh samples | beat parents |")
    print("|---|---|---|---|---|")
    for g in range(1, len(r["mutated"])):
        print(f"| {g} | {r['mutated'][g]} | {r['mutated_beat_rate'][g]} | {r['fresh'][g]} | "
              f"{r['fresh_beat_rate'][g]} |")
    s = summary["search_minus_best_of_n"]
    print(f"search - best_of_n: {s['mean']:+.2f} +/- {s['half_width_2se']:.2f} of "
          f"{args.problems} problems per block ({s['positive_blocks']} of {len(blocks)} blocks "
          f"above, {s['negative_blocks']} below), sign-flip p {s['sign_flip_p']:.4f}; "
          f"solved fraction at {evaluated[-1]}: search "
          f"{summary['solved_fraction']['search'][-1]:.3f}, best-of-N "
          f"{summary['solved_fraction']['best_of_n'][-1]:.3f}; wall {summary['wall_s']} s")


if __name__ == "__main__":
    main()
