"""Re-render a `vpo compare` report (report.md, summary.json, PNGs) from a run's summary.json with
this checkout's report code: the claim logic, the multiplicity correction and the figures are
recomputed from the run's recorded per-seed values, nothing is retrained or re-evaluated.

Run:  python experiments/rerender_compare.py runs/full/summary.json runs/full_rerendered
(docs/full was made this way from the full preset's run, whose summary.json keeps its per-step
training metrics; the committed docs/full/summary.json drops them, so it cannot redraw
training.png.)
"""

from __future__ import annotations

import json
import os
import sys
import types

from vpo.compare import report as compare_report
from vpo.compare.config import CompareConfig
from vpo.config import from_dict


def main(src: str, out: str) -> None:
    """Write the re-rendered report of the summary.json `src` into the folder `out`."""
    with open(src) as f:
        d = json.load(f)
    if "train" not in d:
        sys.exit(f"{src} has no `train` key (per-step metrics): re-render from the run "
                 "folder's own summary.json")
    cfg = from_dict(CompareConfig, d["config"])
    runs = {}
    for arm, rs in d["train"].items():
        trajs = d["entropy_law"].get(arm, {}).get("trajectories")
        runs[arm] = [types.SimpleNamespace(metrics=r["metrics"], seed=r["seed"],
                                           num_answers=d["headline"][arm]["m"],
                                           out_dir=f"{out}/{r['dir']}",
                                           law=trajs[i] if trajs else {})
                     for i, r in enumerate(rs)]
    os.makedirs(out, exist_ok=True)
    compare_report.write_report(out, cfg, command=d["command"], wall=d["wall_s"], runs=runs,
                                evals=d["eval"], searches=d["search"], probes=d["probe"],
                                load=d["load"])
    print(f"report: {os.path.join(out, 'report.md')}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
