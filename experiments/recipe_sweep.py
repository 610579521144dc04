"""The toy default's RL recipe, swept at equal budget: does any learning rate / KL setting make
the RL arms improve on their warm start where the VPO paper says they should?

Run:  python experiments/recipe_sweep.py [--out runs/recipe_sweep] [--recipes NAME=OVERRIDES ...]

Each recipe is one `vpo compare` (default preset: the same warm start, 3 paired seeds, 200 steps
x 8 prompts x G = 8 for every arm, the same evaluation and search) with the recipe's overrides;
finished recipes are read back. Printed per recipe and arm: RL minus its own warm start on
best@1, best@30, pass@30, reward diversity and search solved (paired over seeds, mean ± 95%
t-interval half-width, as the report's "RL against its warm start" section), and VPO minus GRPO
on best@30.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

RECIPES = {
    "lr3e-4": "",  # the default preset
    "lr1e-4": "train.learning_rate=1e-4",
    "lr3e-5": "train.learning_rate=3e-5",
    "lr1e-4_kl1e-2": "train.learning_rate=1e-4 objective.kl_coef=1e-2",
}
ARMS = ("grpo", "multi_rlvr", "vpo")


def run_recipe(name: str, overrides: str, out: str) -> dict:
    """The recipe's summary.json, running `vpo compare` first unless it finished earlier."""
    path = os.path.join(out, name)
    summary = os.path.join(path, "summary.json")
    if not os.path.exists(summary):
        cmd = [sys.executable, "-m", "vpo.cli.main", "compare", *overrides.split(), "--out", path]
        if os.path.exists(path):
            cmd.append("--resume")
        subprocess.run(cmd, check=True)
    with open(summary) as f:
        return json.load(f)


def rows(name: str, summary: dict) -> list[str]:
    """Markdown rows: per arm, RL − warm start (paired) and VPO − GRPO at best@30."""
    head = summary["headline"]
    mean = lambda row, key: sum(head[row]["values"][key]) / len(head[row]["values"][key])  # noqa: E731
    against: dict[str, dict[str, str]] = {}
    for c in summary["against_warm_start"]:
        arm, _, rest = c["claim"].partition(" ")
        against.setdefault(arm, {})[rest.split(" above")[0]] = (
            f"{c['diff']:+.3f} ± {c['half_width']:.3f}")
    gap = mean("vpo", "best@30") - mean("grpo", "best@30")
    out = []
    for arm in ARMS:
        warm = "sft (m=1)" if arm == "grpo" else "sft (m=3)"
        a = against.get(arm, {})
        out.append(f"| {name} | {arm} | {a.get('best@1', '')} | {a.get('best@30', '')} | "
                   f"{mean(arm, 'pass@30') - mean(warm, 'pass@30'):+.3f} | "
                   f"{a.get('diversity', '')} | {a.get('search solved', '')} | {gap:+.3f} |")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/recipe_sweep")
    p.add_argument("--recipes", nargs="*", default=None, metavar="NAME=OVERRIDES",
                   help="recipes as name='section.key=value ...' (default: the four above)")
    args = p.parse_args(argv)
    recipes = (dict(r.split("=", 1) for r in args.recipes) if args.recipes else RECIPES)
    lines = ["| recipe | arm | best@1 − warm | best@30 − warm | pass@30 − warm | "
             "diversity − warm | search solved − warm | best@30 vpo − grpo |",
             "|---|---|---|---|---|---|---|---|"]
    for name, overrides in recipes.items():
        lines += rows(name, run_recipe(name, overrides, args.out))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
