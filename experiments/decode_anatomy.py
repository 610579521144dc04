"""Where a decode step's time goes on an H100, read from the compiled program on a CPU host:
the sampler built ahead of time for the target (`vpo.accel`), its decode loop body's kernels
(fusions, custom calls, library calls such as cuBLAS GEMMs, copies, sorts), the bytes each
moves (an estimate from the operand and result shapes: in-place updates, gathers and slices
counted by what they touch, a cuBLAS call's scratch result left out), and the kernels over a
vocabulary-wide array; against the step's floor, the bf16 weights and the whole suffix cache
read once. `--separate` builds the loop without `Decoder.loop_weights`, for the comparison.

    .venv-aot/bin/python experiments/decode_anatomy.py [--target h100] [--model qwen2.5-0.5b]
        [--B 16] [--G 8] [--T 512] [--separate] [--set KEY=VALUE ...] [--json OUT.json]

(the interpreter needs jax's CUDA plugin: the `aot` extra, as for `vpo plan`). Nothing runs on
a device; the kernel count bounds the launch overhead (a few microseconds each on an H100
without CUDA graphs), the bytes bound the memory time at the chip's bandwidth.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re

# HLO text: `%name = f32[128,151936]{1,0} fusion(...), kind=kLoop, calls=%fused_computation...`
_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.+?) ([\w\-]+)\((.*)$")
_ARRAY = re.compile(r"\b(pred|s8|u8|s16|u16|s32|u32|s64|u64|f16|bf16|f32|f64)\[([\d,]*)\]")
_S8 = re.compile(r"\bs8\[([\d,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
# instructions that launch no kernel of their own
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
         "partition-id", "replica-id", "opt-barrier"}
HBM_BYTES_PER_S = {"h100": 3.35e12}  # H100 SXM HBM3


def array_bytes(text: str) -> int:
    """Bytes of every array type written in `text` (an HLO shape, possibly a tuple)."""
    total = 0
    for dtype, dims in _ARRAY.findall(text):
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total += n * _BYTES[dtype]
    return total


def computations(hlo: str) -> dict[str, list[str]]:
    """{computation name: its instruction lines} of an HLO module's text."""
    comps, name = {}, None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head and not line.startswith(" "):
            name = head.group(1)
            comps[name] = []
        elif name and line.strip() == "}":
            name = None
        elif name:
            comps[name].append(line)
    return comps


def loop_bodies(hlo: str, comps: dict[str, list[str]]) -> list[str]:
    """Names of the while loops' body computations."""
    return re.findall(r"\bwhile\(.*?body=%?([\w.\-]+)", hlo)


def _moved(name: str, result: int, operands: list[int]) -> int:
    """Bytes a kernel reads and writes, from its shapes: result + operands, except where the
    text's shapes overstate it: an in-place dynamic-update-slice writes and reads its update
    (every operand but the buffer), a gather or slice reads what it writes."""
    if "dynamic_update_slice" in name and operands:
        return 2 * (sum(operands) - max(operands))
    if "gather" in name or "slice" in name:
        return 2 * result
    return result + sum(operands)


def anatomy(lines: list[str], vocab: int) -> dict:
    """Kernels of one loop body: count by kind, bytes read + written by each (its result and
    its operands' shapes as written in the text), and the kernels touching a vocabulary-wide
    array."""
    shapes = {}
    kinds, bytes_by_kind = collections.Counter(), collections.Counter()
    vocab_passes, big = [], []
    for line in lines:
        m = _INSTR.match(line)
        if not m:
            continue
        name, shape, op, rest = m.groups()
        shapes[name] = shape
        if op in _FREE:
            continue
        operands = re.findall(r"%([\w.\-]+)", rest.split("),")[0])
        result = array_bytes(shape)
        kind = op
        if op == "fusion":
            kind = "fusion " + (re.search(r"kind=(\w+)", rest) or [None, "?"])[1]
        elif op == "custom-call":
            target = re.search(r'custom_call_target="([^"]+)"', rest)
            kind = "custom-call " + (target.group(1) if target else "?")
            if "cublas" in kind:  # its s8 result is the library's scratch, not moved data
                result -= array_bytes(" ".join(f"s8[{d}]" for d in _S8.findall(shape)))
        moved = _moved(name, result, [array_bytes(shapes.get(o, "")) for o in operands])
        kinds[kind] += 1
        bytes_by_kind[kind] += moved
        touched = [shape] + [shapes.get(o, "") for o in operands]
        if any(re.search(rf"\[[\d,]*\b{vocab}\b[\d,]*\]", t) for t in touched):
            vocab_passes.append(dict(name=name, kind=kind, bytes=moved))
        big.append((moved, kind, name))
    big.sort(reverse=True)
    return dict(kernels=sum(kinds.values()), by_kind=dict(kinds.most_common()),
                bytes=sum(bytes_by_kind.values()), bytes_by_kind=dict(bytes_by_kind),
                vocab_kernels=vocab_passes,
                vocab_bytes=sum(v["bytes"] for v in vocab_passes),
                largest=[dict(bytes=b, kind=k, name=n) for b, k, n in big[:12]])


def report(out: dict, path: str | None) -> None:
    """Print `out` as JSON, and write it to `path` when given."""
    print(json.dumps(out, indent=1))
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="h100")
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a run override (e.g. model.decode_attention=xla); repeatable")
    ap.add_argument("--separate", action="store_true",
                    help="build the decode loop without Decoder.loop_weights (the separate "
                         "products, as before the merge) to compare")
    ap.add_argument("--json")
    ap.add_argument("--hlo", help="also write the compiled program's text here")
    a = ap.parse_args()

    from vpo.accel import targets

    target = targets.parse_target(a.target)
    targets.set_up_env(target)
    import jax

    jax.config.update("jax_platforms", "cpu")
    from vpo.accel import build as build_lib
    from vpo.launch.assemble import assemble_run

    if a.separate:  # every decode loop without merged weights
        from vpo.rollout import sampler, slots

        sampler.step_kwargs = slots.step_kwargs = lambda model: {}

    overrides = [f"model={a.model}", "model.dtype=bfloat16", f"train.batch_size={a.B}",
                 f"sampler.num_samples={a.G}", f"sampler.max_new_tokens={a.T}", *a.set]
    assembled = assemble_run("smoke", None, overrides)
    run, task = assembled.run, assembled.task
    mesh = targets.mesh(target, run.mesh_data, run.mesh_fsdp, run.mesh_tensor)
    (built,) = build_lib.build("sampler", run, task, mesh)
    if built.error is not None:
        raise SystemExit(f"the sampler did not compile: {built.error}")
    hlo = built.compiled.as_text()
    if a.hlo:
        with open(a.hlo, "w") as f:
            f.write(hlo)
    comps = computations(hlo)
    m = run.model
    bodies = {b: anatomy(comps[b], m.vocab_size) for b in loop_bodies(hlo, comps) if b in comps}
    decode = max(bodies.items(), key=lambda kv: kv[1]["bytes"])
    P = build_lib.rl_batch(run, task, a.B)["prompt_BP"].shape[1]
    weight_bytes = m.num_params * 2  # bf16 compute copies read once a step
    rows = a.B * a.G
    E, Z, L = m.head_dim, m.num_kv_heads, m.num_layers
    cache_bytes = 2 * L * rows * Z * a.T * E * 2  # the whole suffix cache, k and v, bf16
    floor = weight_bytes + cache_bytes
    bw = HBM_BYTES_PER_S.get(target.chip.name)
    out = dict(target=target.name, model=a.model, B=a.B, G=a.G, T=a.T, prompt_len=P,
               merged=not a.separate,
               compile_s=built.seconds, loops=len(bodies), decode_body=decode[0],
               **{k: v for k, v in decode[1].items()},
               floor_bytes=floor, weight_bytes=weight_bytes, cache_bytes=cache_bytes,
               cost_analysis={k: v for k, v in (built.compiled.cost_analysis() or {}).items()
                              if k in ("flops", "bytes accessed")})
    if bw:
        out.update(floor_ms=floor / bw * 1e3, body_bytes_ms=decode[1]["bytes"] / bw * 1e3)
    report(out, a.json)


if __name__ == "__main__":
    main()
