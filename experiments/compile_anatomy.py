"""What `vpo plan`'s compile time is spent on: per program, jax's tracing and lowering, then
XLA's HLO passes (summed by pass name) and the rest of XLA's compile (code generation: LLVM and
the GPU assembler for an H100, the TPU backend for a TPU), from the logs of one `vpo plan` run.

    .venv-aot/bin/python experiments/compile_anatomy.py [--top 12] -- --target h100 \
        --preset smoke model=qwen2.5-0.5b model.lora_rank=16 --programs rl_step

Everything after `--` is `vpo plan`'s command line; the plan runs in a child process of this
interpreter with `JAX_LOG_COMPILES=1` and XLA's pass-pipeline log (`TF_CPP_VMODULE`).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys

_JAX = re.compile(r"Finished (tracing (\S+) for jit|jaxpr to MLIR module conversion jit\((\S+)\)"
                  r"|XLA compilation of jit\((\S+)\)) in ([\d.]+) sec")
_PASS = re.compile(r"HLO pass: (\S+) time: ([\d.]+) (us|ms|s) ")
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse(log: str, top: int) -> dict:
    """{program: {trace_s, lower_s, compile_s}} and the HLO passes' seconds by name."""
    programs = collections.defaultdict(dict)
    for m in _JAX.finditer(log):
        seconds = float(m.group(5))
        if m.group(2):
            programs[m.group(2)]["trace_s"] = seconds
        elif m.group(3):
            programs[m.group(3)]["lower_s"] = seconds
        else:
            programs[m.group(4)]["compile_s"] = seconds
    passes = collections.Counter()
    for m in _PASS.finditer(log):
        passes[m.group(1)] += float(m.group(2)) * _UNIT[m.group(3)]
    total = sum(p.get("compile_s", 0.0) for p in programs.values())
    in_passes = sum(passes.values())
    return dict(programs=dict(programs), xla_compile_s=total, hlo_passes_s=in_passes,
                codegen_and_rest_s=total - in_passes,
                top_passes=[dict(name=n, seconds=s) for n, s in passes.most_common(top)])


def main() -> None:
    argv = sys.argv[1:]
    plan_args = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json")
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    env = dict(os.environ, JAX_LOG_COMPILES="1", TF_CPP_MIN_LOG_LEVEL="0",
               TF_CPP_VMODULE="hlo_pass_pipeline=1")
    proc = subprocess.run([sys.executable, "-m", "vpo.cli.main", "plan", *plan_args], env=env,
                          capture_output=True, text=True)
    print(proc.stdout)
    out = parse(proc.stderr, a.top)
    out["command"] = ["vpo", "plan", *plan_args]
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
