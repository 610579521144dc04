"""What an update's time is made of on an H100, read from the compiled program on a CPU host:
the RL update alone (`vpo.rl.step.update_from_rollout`: log-probs, loss, gradient, AdamW) built
ahead of time for the target (`vpo.accel`), every kernel of the program with its loops unrolled
by their trip counts (the micro-batch loop, a scanned layer stack): the count by kind, the
matrix-product FLOPs by operand dtype (cuBLAS calls and dots inside fusions, 2·M·N·K from the
shapes and dimension numbers), the bytes moved (an estimate from the shapes, as
`experiments/decode_anatomy.py`), split by what a kernel touches: attention (an array with
the query rows of a KV head, H/Z·(T-1), as a dimension, or [T-1, T-1] scores, or their
per-row statistics: scores, probabilities and their gradients), the log-prob's vocabulary
tiles (an array of `train.vocab_block` columns), or the rest of the layers. Against the model
FLOPs of `experiments/bench_accel.py` (`update_flops`, the MFU convention), the time each bound
sets at the chip's peak: FLOPs at the dense bf16 rate, float32 products at the TF32 rate, bytes
at HBM bandwidth.

    .venv-aot/bin/python experiments/update_anatomy.py [--target h100] [--model qwen2.5-0.5b]
        [--B 16] [--G 8] [--T 512] [--grad-accum 8] [--remat] [--set KEY=VALUE ...]
        [--json OUT.json]

(the interpreter needs jax's CUDA plugin: the `aot` extra, as for `vpo plan`). Nothing runs on
a device. The prompts are the smoke preset's (a few tokens): the update's cost is the T
completion tokens. A conditional counts its largest branch.
"""

from __future__ import annotations

import argparse
import collections
import math
import re

import decode_anatomy as da

PEAK = {"h100": dict(bf16=989e12, tf32=494e12, hbm=3.35e12)}  # dense, H100 SXM
_DOT_DIMS = re.compile(r'"(lhs|rhs)_(contracting|batch)_dimensions":\[([^\]]*)\]')
_HLO_DIMS = re.compile(r"(lhs|rhs)_(contracting|batch)_dims=\{([\d,]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def dims_of(shape: str) -> tuple[str, list[int]]:
    """(dtype, dims) of the first array in an HLO shape."""
    m = da._ARRAY.search(shape)
    return (m.group(1), [int(d) for d in m.group(2).split(",") if d]) if m else ("?", [])


def dot_flops(lhs: str, rhs: str, text: str, hlo_syntax: bool) -> tuple[float, str]:
    """(2·batch·M·N·K, "lhs-dtype x rhs-dtype") of a dot from its operand shapes and the
    dimension numbers written in `text` (HLO attributes, or a cuBLAS call's backend config)."""
    (lt, ld), (rt, rd) = dims_of(lhs), dims_of(rhs)
    nums = {}
    for side, what, idx in (_HLO_DIMS if hlo_syntax else _DOT_DIMS).findall(text):
        nums[side, what] = [int(i.strip('"')) for i in idx.split(",") if i.strip('"')]
    lc, lb = nums.get(("lhs", "contracting"), []), nums.get(("lhs", "batch"), [])
    rc, rb = nums.get(("rhs", "contracting"), []), nums.get(("rhs", "batch"), [])
    k = math.prod(ld[i] for i in lc)
    batch = math.prod(ld[i] for i in lb)
    m = math.prod(d for i, d in enumerate(ld) if i not in lc and i not in lb)
    n = math.prod(d for i, d in enumerate(rd) if i not in rc and i not in rb)
    return 2.0 * batch * m * n * k, f"{lt} x {rt}"


class Walk:
    """Totals over an HLO module's entry computation, loops multiplied by their trip counts."""

    def __init__(self, hlo: str, T: int):
        self.comps = da.computations(hlo)
        self.entry = re.search(r"^ENTRY %?([\w.\-]+)", hlo, re.M).group(1)
        self.T = T
        self.kinds = collections.Counter()
        self.bytes = collections.Counter()
        self.flops = collections.Counter()
        self.part_bytes, self.part_kernels = collections.Counter(), collections.Counter()
        self.unknown_trips = 0
        self.parts = ()  # (name, regex over the shapes a kernel touches), first match wins

    def instructions(self, comp: str, shapes: dict):
        """(name, shape, op, rest) of each instruction of `comp`, its shape recorded in
        `shapes`."""
        for line in self.comps.get(comp, []):
            m = da._INSTR.match(line)
            if m:
                shapes[m.group(1)] = m.group(2)
                yield m.groups()

    def fused_dots(self, comp: str, shapes: dict) -> list[tuple[float, str]]:
        out = []
        for _, _, op, rest in self.instructions(comp, shapes):
            if op == "dot":
                ops = re.findall(r"%([\w.\-]+)", rest.split("),")[0])
                out.append(dot_flops(shapes.get(ops[0], ""), shapes.get(ops[1], ""), rest, True))
        return out

    def visit(self, comp: str, times: float) -> None:
        shapes = {}
        for name, shape, op, rest in self.instructions(comp, shapes):
            if op in da._FREE:
                continue
            if op == "while":
                trip = _TRIP.search(rest)
                self.unknown_trips += trip is None
                body = re.search(r"body=%?([\w.\-]+)", rest).group(1)
                self.visit(body, times * (int(trip.group(1)) if trip else 1))
                continue
            if op == "conditional":
                branches = re.findall(r"%([\w.\-]+)", rest.split("branch_computations=")[-1]
                                      .split("}")[0]) if "branch_computations" in rest else \
                    re.findall(r"(?:true|false)_computation=%?([\w.\-]+)", rest)
                best = max(branches, key=lambda b: len(self.comps.get(b, [])))
                self.visit(best, times)
                continue
            if op == "call":
                self.visit(re.search(r"to_apply=%?([\w.\-]+)", rest).group(1), times)
                continue
            operands = re.findall(r"%([\w.\-]+)", rest.split("),")[0])
            result = da.array_bytes(shape)
            kind = op
            if op == "fusion":
                kind = "fusion " + (re.search(r"kind=(\w+)", rest) or [None, "?"])[1]
                calls = re.search(r"calls=%?([\w.\-]+)", rest)
                for f, dt in self.fused_dots(calls.group(1), {}) if calls else []:
                    self.flops[dt] += f * times
            elif op == "custom-call":
                target = re.search(r'custom_call_target="([^"]+)"', rest)
                kind = "custom-call " + (target.group(1) if target else "?")
                if "cublas" in kind:
                    result -= da.array_bytes(" ".join(f"s8[{d}]" for d in da._S8.findall(shape)))
                    if len(operands) >= 2:
                        f, dt = dot_flops(shapes.get(operands[0], ""), shapes.get(operands[1], ""),
                                          rest, False)
                        self.flops[dt] += f * times
            elif op == "dot":
                f, dt = dot_flops(shapes.get(operands[0], ""), shapes.get(operands[1], ""), rest,
                                  True)
                self.flops[dt] += f * times
            moved = da._moved(name, result, [da.array_bytes(shapes.get(o, "")) for o in operands])
            self.kinds[kind] += times
            self.bytes[kind] += moved * times
            touched = " ".join([shape] + [shapes.get(o, "") for o in operands])
            part = next((p for p, pattern in self.parts if re.search(pattern, touched)), "layers")
            self.part_bytes[part] += moved * times
            self.part_kernels[part] += times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="h100")
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--grad-accum", type=int, default=8)
    ap.add_argument("--remat", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a run override (e.g. train.vocab_block=8192); repeatable")
    ap.add_argument("--json")
    a = ap.parse_args()

    from vpo.accel import targets

    target = targets.parse_target(a.target)
    targets.set_up_env(target)
    import jax

    jax.config.update("jax_platforms", "cpu")
    import bench_accel

    from vpo.accel import build as build_lib
    from vpo.launch.assemble import assemble_run
    from vpo.rl import step as step_lib

    overrides = [f"model={a.model}", "model.dtype=bfloat16", f"train.batch_size={a.B}",
                 f"sampler.num_samples={a.G}", f"sampler.max_new_tokens={a.T}",
                 f"train.grad_accum={a.grad_accum}", f"train.remat={str(a.remat).lower()}",
                 *a.set]
    run, task = (x := assemble_run("smoke", None, overrides)).run, x.task
    mesh = targets.mesh(target, run.mesh_data, run.mesh_fsdp, run.mesh_tensor)
    tx = step_lib.make_optimizer(run.train)
    graphdef, state = build_lib.abstract_state(run.model, tx, mesh, seed=run.train.seed)
    batch = build_lib.abstract_batch(build_lib.rl_batch(run, task, a.B), mesh)
    cfg = step_lib.step_config(run, task)
    rollout = jax.eval_shape(step_lib.make_sample_step(graphdef, cfg), state, batch)
    G, M, R = a.G, run.train.num_answers, task.num_rewards
    rewards = jax.ShapeDtypeStruct((a.B, G, M, R), jax.numpy.float32)
    smask = jax.ShapeDtypeStruct((a.B, G, M), bool)

    def update(state, batch, rollout, rewards, smask):
        return step_lib.update_from_rollout(state, batch, rollout, rewards, smask,
                                            graphdef=graphdef, tx=tx, task=task, cfg=cfg)

    program = build_lib.Program("rl_update", jax.jit(update, donate_argnums=0),
                                (state, batch, rollout, rewards, smask))
    built = build_lib.compile_program(program, mesh)
    if built.error is not None:
        raise SystemExit(f"the update did not compile: {built.error}")
    walk = Walk(built.compiled.as_text(), a.T)
    m = run.model
    hz, t1 = m.num_heads // m.num_kv_heads, a.T - 1  # query heads per KV head, positions
    attention = (rf"[\[,]({hz * t1}|{hz * a.T})[\],]"  # a KV head's query rows (padded or not)
                 rf"|[\[,]{t1},{t1}[\],]|,{hz},{t1}[\],]")  # scores, their per-row statistics
    walk.parts = (("attention", attention),
                  ("vocabulary tiles", rf"[\[,]{run.train.vocab_block}[\],]"))
    walk.visit(walk.entry, 1)
    P = batch["prompt_BP"].shape[1]
    model = bench_accel.update_flops(run.model, a.B, a.G, P, a.T)
    peak = PEAK.get(target.chip.name)
    gemm = sum(walk.flops.values())
    f32 = sum(v for k, v in walk.flops.items() if "f32" in k)
    out = dict(target=target.name, model=a.model, B=a.B, G=a.G, P=P, T=a.T,
               grad_accum=a.grad_accum, remat=a.remat, compile_s=built.seconds,
               kernels=sum(walk.kinds.values()),
               kernels_by_kind=dict(walk.kinds.most_common()),
               bytes=sum(walk.bytes.values()), bytes_by_kind=dict(walk.bytes),
               bytes_by_part=dict(walk.part_bytes), kernels_by_part=dict(walk.part_kernels),
               gemm_flops=gemm,
               gemm_flops_by_dtype=dict(walk.flops), model_flops=model["total"],
               unknown_trip_counts=walk.unknown_trips)
    if peak:
        out.update(time_flops_s=(gemm - f32) / peak["bf16"] + f32 / peak["tf32"],
                   time_bytes_s=out["bytes"] / peak["hbm"],
                   time_bytes_by_part_s={k: v / peak["hbm"] for k, v in walk.part_bytes.items()},
                   time_model_flops_at_peak_s=model["total"] / peak["bf16"])
    da.report(out, a.json)


if __name__ == "__main__":
    main()
