"""Re-render a `vpo compare` report from a run's summary.json with this checkout's report code:
the claim logic, the multiplicity correction and the design lines are recomputed from the run's
recorded per-seed values, nothing is retrained or re-evaluated. report.md is a pure function of
summary.json (`vpo.compare.render.render`), so this is how every committed docs/*/report.md is
made and what tests/project/test_committed_reports.py checks.

Run:  python experiments/rerender_compare.py docs/full/summary.json docs/full
      (report.md only; the committed summaries are left as they are)
      python experiments/rerender_compare.py runs/full/summary.json runs/full_rerendered --figures
      (also summary.json and the PNGs, through `write_report`: needs the run folder's own
      summary.json, whose `train` key keeps the per-step metrics; the committed
      docs/full/summary.json drops them, so it cannot redraw training.png)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types

from vpo.compare import render as compare_render
from vpo.compare import report as compare_report
from vpo.compare.config import CompareConfig
from vpo.config import from_dict


def rerender(src: str, out: str) -> str:
    """Write `render(summary)` of the summary.json `src` to out/report.md; returns its path."""
    with open(src) as f:
        summary = json.load(f)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "report.md")
    with open(path, "w") as f:
        f.write(compare_render.render(summary))
    return path


def rerender_with_figures(src: str, out: str) -> str:
    """The whole report folder (report.md, summary.json, PNGs) through `write_report`."""
    with open(src) as f:
        d = json.load(f)
    if "train" not in d:
        sys.exit(f"{src} has no `train` key (per-step metrics): re-render from the run "
                 "folder's own summary.json, or leave out --figures")
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
                                temperatures=d.get("temperature"), load=d["load"],
                                gate=d.get("gate"), data=d.get("data"))
    return os.path.join(out, "report.md")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("summary", help="a vpo compare summary.json")
    p.add_argument("out", help="the folder to write report.md into")
    p.add_argument("--figures", action="store_true",
                   help="also rewrite summary.json and the PNGs (needs per-step metrics)")
    args = p.parse_args(argv)
    path = (rerender_with_figures if args.figures else rerender)(args.summary, args.out)
    print(f"report: {path}")


if __name__ == "__main__":
    main()
