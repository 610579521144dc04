"""The fit table: `vpo plan` of the RL step for published model shapes on TPU v5e / v6e and
H100 targets, full fine-tuning and LoRA, compiled ahead of time on this host; and of the
island search that learns at the quickstart's shape (`--programs search_learn`).

    .venv-aot/bin/python experiments/fit_table.py [--programs rl_step|search_learn]
        [--models ...] [--targets ...] [--jobs 2] [--timeout 900] [--xla-flags FLAGS]
        [--out experiments/fit_table.jsonl] [--table experiments/fit_table.md]

One `vpo plan --programs rl_step` per (model, target, mode) in a subprocess (a cell that runs
past --timeout is recorded as such); results are appended to --out as JSON lines (a rerun skips
cells already there) and the markdown table is written from all of them. The run: task bandit
(in-graph reward), train.batch_size=8, sampler.num_samples=4, the task's answer budget;
parameters in bfloat16; the blocks as one scan (model.scan_layers=true: one block compiled; the
unrolled SmolLM2-135M step did not finish compiling for v5e in 10 minutes on 2 cores); on
several devices mesh_fsdp = the device count (parameters and optimiser state sharded over all of
them); LoRA: model.lora_rank=16 on all seven projections. `--xla-flags`: XLA_FLAGS of the
builds (e.g. --xla_gpu_enable_triton_gemm=false, which XLA:GPU's Triton GEMM tiling needs for
these steps), recorded in each row and shown beside the target.

`--programs search_learn` (default model tiny, targets h100 and v5e): `vpo plan --programs
search_learn` with the run of docs/search_learn.md (`SEARCH_LEARN`: task codeword, the tiny
preset's float32 policy, 32 problems at once, 2 islands x 6 members, 2 parents, 6 children, 19
generations, m = 1, grpo at learning rate 0.003; mode lora: `learn.lora_rank=8` adapters, full:
`learn.lora_rank=0`); its rows form a table of their own, with the command of each.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen3-1.7b", "qwen3-4b")
TARGETS = ("v5e", "h100", "v5e-4", "v5e-8", "v6e-8", "h100x8")
MODES = ("full", "lora")
RUN = ("task=bandit", "train.batch_size=8", "sampler.num_samples=4", "model.scan_layers=true")
PROGRAMS = ("rl_step", "search_learn")
SEARCH_LEARN = ("--search-problems", "32", "task=codeword", "search.islands=2",
                "search.members=6", "search.parents=2", "search.children=6",
                "search.generations=19", "search.num_answers=1", "search.temperature=0.7",
                "learn.objective=grpo", "learn.learning_rate=0.003")
DEFAULTS = {"rl_step": (MODELS, TARGETS), "search_learn": (("tiny",), ("h100", "v5e"))}


def devices_of(target: str) -> int:
    from vpo.accel.targets import parse_target

    return parse_target(target).n_devices


def cell_args(model: str, target: str, mode: str, program: str = "rl_step") -> list[str]:
    n = devices_of(target)
    args = [f"model={model}", *(RUN if program == "rl_step" else SEARCH_LEARN)]
    if n > 1:
        args.append(f"mesh_fsdp={n}")
    if program == "search_learn":
        args.append(f"learn.lora_rank={8 if mode == 'lora' else 0}")
    elif mode == "lora":
        args.append("model.lora_rank=16")
    return args


def run_cell(model: str, target: str, mode: str, timeout: int, xla_flags: str = "",
             program: str = "rl_step") -> dict:
    """One `vpo plan` in a subprocess → a row (its report, or the timeout / crash)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "plan.json")
        cmd = [sys.executable, "-m", "vpo.cli.main", "plan", "--target", target,
               "--programs", program, "--json", path, *cell_args(model, target, mode, program)]
        t0 = time.perf_counter()
        row = {"model": model, "target": target, "mode": mode, "command": " ".join(cmd[2:]),
               "xla_flags": xla_flags}
        if program != "rl_step":
            row["program"] = program
        env = {**os.environ, "XLA_FLAGS": xla_flags} if xla_flags else None
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            row.update(status="timeout", seconds=round(time.perf_counter() - t0))
            return row
        row["seconds"] = round(time.perf_counter() - t0)
        if os.path.exists(path):
            with open(path) as f:
                row.update(status="done", reports=json.load(f))
        else:
            tail = [x for x in proc.stderr.splitlines() if x.strip()][-3:]
            row.update(status="failed", error=" | ".join(tail)[-400:])
    return row


def gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def program_of(row: dict) -> str:
    return row.get("program", "rl_step")


def table(rows: list[dict]) -> str:
    """Markdown: the RL step's table, one line per (model, target, mode); then the learning
    search's rows (if any) in a table of their own, with each row's command."""
    text = program_table([r for r in rows if program_of(r) == "rl_step"])
    learn = [r for r in rows if program_of(r) == "search_learn"]
    if learn:
        text += ("\n\n## search_learn: the island search that learns, the quickstart's shape "
                 "(docs/search_learn.md)\n\n" + program_table(learn, command=True))
    return text


def program_table(rows: list[dict], command: bool = False) -> str:
    """Markdown: one line per (model, target, mode); `command`: with the command of each."""
    extra = (" command |", " --- |") if command else ("", "")
    out = ["| model | target | mode | compiles | GiB per device (args + out − alias + temp) "
           "| of chip | fits | collectives | compile s |" + extra[0],
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |" + extra[1]]
    order = {m: i for i, m in enumerate(MODELS)}
    torder = {t: i for i, t in enumerate(TARGETS)}
    for row in sorted(rows, key=lambda r: (order.get(r["model"], 99),
                                           torder.get(r["target"], 99), r["mode"])):
        flags = f" ({row['xla_flags']})" if row.get("xla_flags") else ""
        head = f"| {row['model']} | {row['target']}{flags} | {row['mode']} "
        tail = (" `python -m " + re.sub(r" --json \S+", "", row["command"]) + "` |"
                if command else "")
        if row["status"] != "done":
            what = {"timeout": f"not finished in {row['seconds']} s",
                    "failed": f"failed: {row.get('error', '')[:120]}"}[row["status"]]
            out.append(head + f"| {what} | | | | | |" + tail)
            continue
        for r in row["reports"]:
            if not r["ok"]:
                out.append(head + f"| no: {r['error_name']} {r['error'][:100]} | | | "
                           f"no | | {r['seconds']} |" + tail)
                continue
            coll = ", ".join(f"{k} {v}" for k, v in sorted(r["collectives"].items())) or "-"
            parts = (f"{gib(r['bytes_per_device'])} ({gib(r['argument_bytes'])} + "
                     f"{gib(r['output_bytes'])} − {gib(r['alias_bytes'])} + "
                     f"{gib(r['temp_bytes'])})")
            out.append(head + f"| yes | {parts} | "
                       f"{100 * r['bytes_per_device'] / r['hbm_bytes']:.0f}% | "
                       f"{'yes' if r['fits'] else 'no'} | {coll} | {r['seconds']} |" + tail)
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--programs", choices=PROGRAMS, default="rl_step",
                   help="the RL step (default), or the learning search at the quickstart's "
                        "shape (SEARCH_LEARN)")
    p.add_argument("--models", nargs="*", default=None, help="default: MODELS (rl_step), "
                   "tiny (search_learn)")
    p.add_argument("--targets", nargs="*", default=None, help="default: TARGETS (rl_step), "
                   "h100 and v5e (search_learn)")
    p.add_argument("--modes", nargs="*", default=list(MODES))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--xla-flags", default="", help="XLA_FLAGS of the builds")
    p.add_argument("--out", default=os.path.join(ROOT, "experiments", "fit_table.jsonl"))
    p.add_argument("--table", default=os.path.join(ROOT, "experiments", "fit_table.md"))
    args = p.parse_args(argv)
    done = []
    if os.path.exists(args.out):
        with open(args.out) as f:
            done = [json.loads(x) for x in f if x.strip()]
    program = args.programs
    models, targets = (args.models or DEFAULTS[program][0]), (args.targets or DEFAULTS[program][1])
    have = {(r["model"], r["target"], r["mode"], r.get("xla_flags", ""), program_of(r))
            for r in done}
    cells = [(m, t, mode) for m in models for t in targets for mode in args.modes
             if (m, t, mode, args.xla_flags, program) not in have]

    def one(cell):
        row = run_cell(*cell, args.timeout, args.xla_flags, program)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: v for k, v in row.items() if k != "reports"}), flush=True)
        return row

    with ThreadPoolExecutor(args.jobs) as pool:
        done += list(pool.map(one, cells))
    with open(args.table, "w") as f:
        f.write(table(done) + "\n")
    print(table(done))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
