"""Can inference buy back what training removed? Island search and best-of-N at several sampling
temperatures, from the policies a `vpo compare` run saved (exploratory).

For the warm start and each arm in `--arms`, trained seeds `--seeds`: the comparison's search
problems (its `stages/hard_problems.json`), its search settings with `temperature` replaced by
each of `--temperatures`, island search and best-of-N at the full budget with the comparison's
keys of each seed (`vpo.compare.search_leg.SEARCH_KEY`). Per row and temperature: problems
solved by each method (mean over seeds, with the per-seed values), island minus best-of-N, and
the search's mechanism probe (children beating their best parent against fresh samples beating
theirs, pooled over generations). Writes `--out`/summary.json and temperature.png.

Run:  PYTHONPATH=. .venv/bin/python experiments/search_temperature.py --compare runs/compare \
        --out runs/temperature
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import jax
import matplotlib
import numpy as np

from vpo.compare import data as compare_data
from vpo.compare import search_leg
from vpo.compare.config import make_config
from vpo.io.policy_folder import load_model
from vpo.search.ingraph import PROBE_FIELDS
from vpo.search.methods import run_all_methods

matplotlib.use("Agg")


def pooled_rates(probe_G4) -> tuple[float, float]:
    """(mutation children's beat rate, fresh samples' beat rate) over all generations."""
    p = dict(zip(PROBE_FIELDS, np.asarray(probe_G4, float).sum(0), strict=True))
    return (p["mutated_beat"] / max(p["mutated"], 1), p["fresh_beat"] / max(p["fresh"], 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare", required=True, help="a finished vpo compare --out folder")
    ap.add_argument("--preset", default="default")
    ap.add_argument("--arms", default="grpo,vpo")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--temperatures", default="0.7,1.0,1.3")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cfg = make_config(args.preset)
    task = compare_data.load_tasks(cfg, with_search=False)
    with open(os.path.join(args.compare, "stages", "hard_problems.json")) as f:
        chosen = json.load(f)["result"]
    records = search_leg.search_records(cfg, task, chosen)
    seeds = [int(s) for s in args.seeds.split(",")]
    temps = [float(t) for t in args.temperatures.split(",")]
    warm = load_model(os.path.join(args.compare, "sft"))[0]
    rows = [(f"sft (m={m})", m, {s: warm for s in seeds}) for m in cfg.all_answers]
    for arm in args.arms.split(","):
        m = cfg.num_answers if arm in ("vpo", "multi_rlvr") else 1
        rows.append((arm, m, {s: load_model(os.path.join(args.compare, "arms", arm,
                                                         f"seed{s}", "policy"))[0]
                              for s in seeds}))
    t0 = time.time()
    out: dict = {"compare": args.compare, "preset": args.preset, "seeds": seeds,
                 "temperatures": temps, "problems": len(records), "rows": {}}
    for name, m, models in rows:
        res = out["rows"].setdefault(name, {"m": m, "points": []})
        for T in temps:
            scfg = dataclasses.replace(cfg.search, num_answers=m, temperature=T)
            solved = {"search": [], "best_of_n": []}
            probe = np.zeros((len(PROBE_FIELDS),))
            for s in seeds:
                key = jax.random.fold_in(
                    jax.random.key(cfg.search_split_seed + search_leg.SEARCH_KEY), s)
                traces = run_all_methods(key, models[s], task, records, scfg,
                                         methods=("search", "best_of_n"))
                for method, r in traces.items():
                    solved[method].append(int(np.asarray(r.trace.solved)[:, -1].sum()))
                probe += np.asarray(traces["search"].trace.probe).sum((0, 1))
            mut, fresh = pooled_rates(probe[None])
            gain = np.subtract(solved["search"], solved["best_of_n"])
            res["points"].append({
                "temperature": T, "search": solved["search"], "best_of_n": solved["best_of_n"],
                "search_mean": float(np.mean(solved["search"])),
                "best_of_n_mean": float(np.mean(solved["best_of_n"])),
                "gain_mean": float(gain.mean()), "gain_positive": int(np.sum(gain > 0)),
                "gain_negative": int(np.sum(gain < 0)),
                "mutated_beat_rate": round(mut, 4), "fresh_beat_rate": round(fresh, 4)})
            print(f"{name} T={T}: island {np.mean(solved['search']):.2f}, best-of-N "
                  f"{np.mean(solved['best_of_n']):.2f} of {len(records)} (gain {gain.mean():+.2f}, "
                  f"{int(np.sum(gain > 0))}+/{int(np.sum(gain < 0))}-), children beat parents "
                  f"{mut:.3f} vs fresh {fresh:.3f}  [{time.time() - t0:.0f} s]", flush=True)
    out["wall_s"] = round(time.time() - t0, 1)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(out, f, indent=1)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (name, res) in enumerate(out["rows"].items()):
        color = f"C{i}"
        pts = res["points"]
        ax.plot(temps, [p["search_mean"] for p in pts], "-o", color=color, label=f"{name} island")
        ax.plot(temps, [p["best_of_n_mean"] for p in pts], "--", color=color,
                label=f"{name} best-of-N")
    ax.set_xlabel("sampling temperature at search time")
    ax.set_ylabel(f"problems solved (of {len(records)})")
    ax.set_title("island search (solid) and best-of-N (dashed) against temperature")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "temperature.png"), dpi=120)


if __name__ == "__main__":
    main()
