"""GRPO vs VPO and their baselines from one warm start to search: the script form of
`vpo compare`.

Run:  python experiments/compare.py [--preset smoke|default|full|paper] [section.key=value ...]
      [--out runs/compare]

`get_config()` is the default preset (`vpo.compare.PRESETS`; `--preset full` is every arm on the
9x9 maze with 5 seeds, hours on CPU, its estimate printed first); edit it or pass overrides such
as `num_seeds=5 arms=grpo,maxk,vpo train.steps=300`. The run folder gets report.md (headline
table with 95% t-intervals over seeds, three-way verdicts on paired differences, the search
solve matrix and mutation-operator probe, the entropy law on held-out score, wall time per
stage), summary.json and best@k, pass@k, training, entropy-law and search PNGs.
"""

from __future__ import annotations

import argparse
import sys

from vpo import compare


def get_config(preset: str = "default", overrides: list[str] | None = None
               ) -> compare.CompareConfig:
    return compare.make_config(preset, overrides or [])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*")
    p.add_argument("--preset", default="default", choices=tuple(compare.PRESETS))
    p.add_argument("--out", default="runs/compare")
    p.add_argument("--no-search", action="store_true")
    args = p.parse_args(argv)
    cfg = get_config(args.preset, args.overrides)
    command = " ".join(["python experiments/compare.py", f"--preset {args.preset}",
                        *args.overrides, f"--out {args.out}"])
    return compare.run_compare(cfg, args.out, command=command, with_search=not args.no_search)


if __name__ == "__main__":
    main(sys.argv[1:])
