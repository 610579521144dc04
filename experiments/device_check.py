"""The device check: one call on one GPU (H100 / H200) measures every accelerator number the
project reports, writing one JSON file and one markdown table.

Run on a lent GPU, from a plain copy of the tree, with the machine's own python (jax with CUDA,
flax, optax, torch and transformers; no network, nothing downloaded: every model has random
weights from a config):

    PYTHONUNBUFFERED=1 python3 experiments/device_check.py --out $OUT

(about 7 minutes at the default `--budget-s 420`; give the call 8 minutes or more). Tested on a
CPU at tiny shapes, each part included (HF generate only where torch is installed):

    python experiments/device_check.py --cpu-smoke --out /tmp/device_check

Writes `OUT/device_check.json` (every part's status, seconds, raw measurements and rows),
`OUT/device_check.md` (one table: part, what was measured, value, baseline, ratio, seconds,
status) and `OUT/device_check.log` (each part's output); the JSON and the table are rewritten
after every part, so a call stopped early keeps what finished. Where the kernels part timed a
kernel on the accelerator, `OUT/kernel_table.json` is `kernels/measured.json` with this run's
rows merged in: committed over it, it changes each platform's default path
(`vpo.kernels.choice`: a kernel only where it was measured faster than XLA).

The parts, in this order, each a subprocess of this same python (`--part NAME`) with its own
share of the budget (`subprocess.run(timeout=...)`; the time a part leaves unused passes to the
parts after it), so a part that fails or runs out of time is recorded as such, with the tail of
its output, and the others still run:

  kernels  the Pallas kernels against their XLA paths: `logprob_entropy` forward and backward
           (gradient of hidden and weights) against `logprob_entropy_chunked`, the library's XLA
           path, at a short and a long row count; `decode_attention` against
           `decode_attention_reference` at a short and a long prompt prefix. Times, speed-up and
           the largest difference. Where this jax has no Pallas GPU lowering
           (`hardware.pallas_supported`) only the XLA side runs and the kernel rows say why.
  accel    `bench_accel.main` at its default shape (Qwen2.5-0.5B-shaped, bf16, B=16 x G=8,
           P=256, T=512): sampling tokens/s, decode step and its HBM roofline fraction, the
           update alone and the fused RL step, peak memory, compile and init times; the update's
           MFU under three counts: bench_accel's (each prompt once per group), the
           completion-token count (6 N per completion token + its attention) and the all-token
           count (6 N per token of every sequence, prompt included, + full causal attention, as
           a packed trainer counts).
  slots    `bench_slots.run`: refilled slots against all rows on a long-tail length
           distribution (random smollm2-135m-shaped model; stop ids make lengths geometric).
  packed   `bench_packed.make_pass`: the update's log-prob + loss + gradient pass, packed
           against padded, on log-uniform completion lengths.
  overlap  the fused RL step with `train.off_policy_steps=1` (`vpo.rl.overlap`) against
           synchronous (0), alternating blocks of steps; `bench_accel.Bench`'s policy and
           in-graph reward, so no data pipeline is imported (grain is not on the device).
  graphs   the accel part's sampling once more with XLA's command buffers (CUDA graphs) over
           the decode loop's body (`GRAPH_FLAGS`: WHILE and CONDITIONAL added): the compiled
           H100 sampler launches ~490 kernels a decode step (experiments/decode_anatomy.py).
  hf       HF transformers `generate` on a random Qwen2.5-0.5B-shaped model at the accel part's
           sampling shape, bf16, sdpa, in its own process after the JAX parts (JAX preallocates
           the GPU); the accel part's sampling row takes it as its baseline.

Every JAX part sets vpo's XLA:GPU flags (`vpo.accel.targets.default_xla_flags`) as the `vpo`
commands do, and runs with `grain`, `portpicker` and `tensorboardX` made unimportable
(`sys.modules[name] = None`), as on the device, where they are absent: a part that imports
one fails here as it would there. Without an installed `vpo`, `vpo.kernels` (the top-level
`kernels/` folder, mapped by pyproject.toml) is loaded from the tree. Should this XLA not know
one of vpo's flags (a fatal "Unknown flag"), the part runs once more without them, and so do
the parts after it (`vpo_xla_flags_dropped` in the JSON).

`--parts accel,hf` runs a subset; `--compile-cache DIR` gives the JAX parts a persistent compile
cache, so that a second call on the same machine skips their compiles (its compile times are
then cache loads).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.util
import json
import math
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
HERE = REPO / "experiments"
ABSENT_ON_DEVICE = ("grain", "portpicker", "tensorboardX")
TARGETS = dict(update_mfu=0.35, decode_roofline=0.40)  # the project's goals on one H100
MIN_PART_S = 5.0  # a part offered less is not started
NO_VPO_FLAGS = "DEVICE_CHECK_NO_VPO_XLA_FLAGS"  # set: the JAX parts keep XLA_FLAGS as they are
UNKNOWN_FLAG = "Unknown flag"  # XLA_FLAGS naming a flag this XLA does not have: a fatal error
GIB = 2**30


class CannotRunHereError(Exception):
    """A part that cannot run here, for the reason given (recorded as skipped, not failed)."""


# ---------------------------------------------------------------------------------------------
# shapes: "gpu" for the device, "smoke" for the CPU test


SHAPES = {
    "kernels": {
        "gpu": dict(D=896, V=151936, rows={"short": 2048, "long": 16384}, block_v=4096,
                    decode=dict(B=16, G=8, N=2, R=7, E=64, C=512),
                    prefix={"short": 256, "long": 4096}, reps=5),
        "smoke": dict(D=32, V=200, rows={"short": 8, "long": 32}, block_v=64,
                      decode=dict(B=2, G=2, N=2, R=2, E=16, C=16),
                      prefix={"short": 8, "long": 64}, reps=1)},
    "accel": {
        "gpu": dict(argv=["--reps", "3"]),
        "smoke": dict(argv=["--preset", "tiny", "--dtype", "float32", "--B", "2", "--G", "2",
                            "--P", "4", "--T", "4", "--reps", "1", "--grad-accum", "1"])},
    "graphs": {  # the accel part's sampling shape
        "gpu": dict(argv=["--reps", "3"]),
        "smoke": dict(argv=["--preset", "tiny", "--dtype", "float32", "--B", "2", "--G", "2",
                            "--P", "4", "--T", "4", "--reps", "1"])},
    "slots": {
        "gpu": dict(preset="smollm2-135m", prompts=16, samples=8, slots="64", prompt_len=32,
                    max_new_tokens=256, stops=768, repeats=3),  # mean length ~ 49152 / 768
        "smoke": dict(preset="tiny", prompts=2, samples=2, slots="2", prompt_len=4,
                      max_new_tokens=8, stops=8, repeats=1)},
    "packed": {
        "gpu": dict(model="smollm2-135m", B=4, G=8, T=512, P=64, min_len=4, repeats=3,
                    vocab_block=4096),
        "smoke": dict(model="tiny", B=2, G=2, T=8, P=4, min_len=1, repeats=1, vocab_block=64)},
    "overlap": {
        "gpu": dict(argv=["--preset", "smollm2-135m", "--B", "8", "--G", "8", "--P", "64",
                          "--T", "128", "--grad-accum", "1"], steps=3, repeats=3),
        "smoke": dict(argv=["--preset", "tiny", "--dtype", "float32", "--B", "2", "--G", "2",
                            "--P", "4", "--T", "4", "--grad-accum", "1"], steps=1, repeats=1)},
    "hf": {
        "gpu": dict(B=16, G=8, P=256, T=512, reps=2, dtype="bfloat16",
                    config=dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                num_hidden_layers=24, num_attention_heads=14,
                                num_key_value_heads=2, max_position_embeddings=32768,
                                rope_theta=1e6, tie_word_embeddings=True)),
        "smoke": dict(B=2, G=2, P=4, T=4, reps=1, dtype="float32",  # the accel smoke shape
                      config=dict(vocab_size=256, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=64,
                                  tie_word_embeddings=True))},
}


# ---------------------------------------------------------------------------------------------
# the child process: imports as on the device, one part, its result as JSON


def _child_setup() -> None:
    """sys.path, the device's missing packages made unimportable, `vpo.kernels` from the tree
    when no installed vpo maps it, vpo's XLA:GPU flags (before any backend starts)."""
    for path in (str(HERE), str(REPO)):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
    for name in ABSENT_ON_DEVICE:
        sys.modules[name] = None  # `import grain` raises ImportError, as where it is absent
    try:
        found = importlib.util.find_spec("vpo.kernels") is not None
    except ModuleNotFoundError:
        found = False
    if not found:  # a plain copy of the tree: pyproject.toml maps kernels/ to vpo.kernels
        import vpo

        spec = importlib.util.spec_from_file_location(
            "vpo.kernels", REPO / "kernels" / "__init__.py",
            submodule_search_locations=[str(REPO / "kernels")])
        module = importlib.util.module_from_spec(spec)
        sys.modules["vpo.kernels"] = module
        spec.loader.exec_module(module)
        vpo.kernels = module


def _jax_backend(started: float) -> tuple[object, dict]:
    """(the first device, its facts): jax's backend started now, its start timed; `started`
    is the child's start, so `import_s` is the imports before it."""
    import jax

    t0 = time.perf_counter()
    dev = jax.devices()[0]
    init_s = time.perf_counter() - t0
    return dev, dict(jax=jax.__version__, platform=dev.platform, device=dev.device_kind,
                     device_count=jax.device_count(), import_s=t0 - started,
                     backend_init_s=init_s, xla_flags=os.environ.get("XLA_FLAGS", ""))


def _peak(dev) -> dict:
    from bench_accel import peak_memory

    stats = dev.memory_stats() or {}
    peak, source = peak_memory(dev)
    return dict(peak_mem_bytes=peak, peak_mem_source=source,
                device_mem_bytes=stats.get("bytes_limit"))


def _plain(x):
    """JSON-ready: numpy scalars and arrays, tuples and nested dicts."""
    import numpy as np

    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _time_left(deadline: float) -> float:
    return deadline - time.time()


# -- kernels ------------------------------------------------------------------------------------


def part_kernels(s: dict, smoke: bool, deadline: float, started: float) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from bench_accel import _median_s
    from bench_peers import _timed
    from vpo.kernels import decode_attention as dlib
    from vpo.kernels import hardware
    from vpo.kernels import logprob_entropy as llib

    dev, data = _jax_backend(started)
    plat = hardware.platform_of(dev)
    interpret = plat == "cpu"  # CPU: the GPU kernel bodies in interpret mode
    kplat = "gpu" if interpret else plat
    supported = interpret or hardware.pallas_supported(plat)
    data.update(kernel_platform=kplat, interpret=interpret, kernel_supported=supported,
                reps=s["reps"], cells=[])
    if not supported:
        data["kernel_reason"] = (f"jax {jax.__version__} has no Pallas lowering for {plat} "
                                 "(hardware.pallas_supported is False): vpo keeps the XLA path")
    dtype = jnp.float32 if interpret else jnp.bfloat16

    def timed(fn, *args):
        out, first = _timed(lambda: fn(*args))
        return out, first, _median_s(lambda: fn(*args), s["reps"])

    def gap(a, b):
        return max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32))))
                   for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))

    def cell(record, xla, kern, *args):
        """Time the XLA side, then the kernel where it compiles; `record` gets the numbers."""
        if _time_left(deadline) < 3:
            record["skipped"] = "out of time"
            data["cells"].append(record)
            return
        ref, record["xla_first_s"], record["xla_s"] = timed(xla, *args)
        if supported:
            got, record["kernel_first_s"], record["kernel_s"] = timed(kern, *args)
            record["max_abs_diff"] = gap(got, ref)
            record["ref_scale"] = max(float(jnp.max(jnp.abs(x.astype(jnp.float32))))
                                      for x in jax.tree.leaves(ref))
        data["cells"].append(record)
        print(record, flush=True)

    D, V = s["D"], s["V"]
    for case, N in s["rows"].items():
        k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
        h = jax.random.normal(k1, (N, D), dtype)
        w = (0.05 * jax.random.normal(k2, (D, V))).astype(dtype)
        t = jax.random.randint(k3, (N,), 0, V)
        xla_f = functools.partial(llib.logprob_entropy_chunked, block_v=s["block_v"])
        kern_f = functools.partial(llib.logprob_entropy, interpret=interpret, platform=kplat)

        def grad_of(f):
            def loss(hidden, weight, targets):
                logp, ent = f(hidden, weight, targets)
                return jnp.sum(logp.astype(jnp.float32)) + jnp.sum(ent.astype(jnp.float32))
            return jax.jit(jax.grad(loss, argnums=(0, 1)))

        shape = dict(N=N, D=D, V=V, dtype=jnp.dtype(dtype).name)
        cell(dict(kernel="logprob_entropy", direction="forward", case=case, shape=shape,
                  xla="logprob_entropy_chunked"), jax.jit(xla_f), jax.jit(kern_f), h, w, t)
        cell(dict(kernel="logprob_entropy", direction="backward", case=case, shape=shape,
                  xla="logprob_entropy_chunked"), grad_of(xla_f), grad_of(kern_f), h, w, t)

    d = s["decode"]
    B, G, N, R, E, C = d["B"], d["G"], d["N"], d["R"], d["E"], d["C"]
    for case, P in s["prefix"].items():
        rng = np.random.default_rng(1)
        q, k_pre, v_pre, k_suf, v_suf = (
            jnp.asarray(rng.standard_normal(shape), dtype) for shape in (
                (B, G, N, R, E), (B, N, P, E), (B, N, P, E), (B, G, N, C, E), (B, G, N, C, E)))
        mask = np.ones((B, P), bool)
        mask[0, :P // 4] = False  # one left-padded prompt
        args = (q, k_pre, v_pre, jnp.asarray(mask), k_suf, v_suf)
        xla_d = jax.jit(lambda *a: dlib.decode_attention_reference(*a, C))
        kern_d = jax.jit(lambda *a: dlib.decode_attention(*a, C, interpret=interpret,
                                                          platform=kplat))
        cell(dict(kernel="decode_attention", direction="forward", case=f"{case} prefix",
                  shape=dict(B=B, G=G, N=N, H=N * R, E=E, P=P, C=C, length=C,
                             dtype=jnp.dtype(dtype).name),
                  xla="decode_attention_reference"), xla_d, kern_d, *args)
    data.update(_peak(dev))
    return data


# -- accel --------------------------------------------------------------------------------------


def mfu_counts(cfg, B: int, G: int, P: int, T: int, update_s: float, peak: float | None
               ) -> dict:
    """Update FLOPs and MFU under the completion-token count (6 N per completion token + the
    causal attention of completion tokens over prompt and earlier completion) and the all-token
    count (6 N per token of every sequence, its prompt included, + full causal attention over
    P + T), N = the parameters a token's forward multiplies by (`update_flops`' N_body + the LM
    head V * D)."""
    from bench_accel import update_flops

    n = update_flops(cfg, B, G, P, T)["n_body"] + cfg.vocab_size * cfg.dim
    per_pair = 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim
    counts = dict(
        completion=6 * n * B * G * T + per_pair * B * G * (T * P + T * (T + 1) // 2),
        all_tokens=6 * n * B * G * (P + T) + per_pair * B * G * ((P + T) * (P + T + 1) // 2))
    out = dict(n_per_token=n)
    for name, flops in counts.items():
        out[f"{name}_flops"] = float(flops)
        out[f"{name}_mfu"] = None if not peak else flops / update_s / peak
    return out


def part_accel(s: dict, smoke: bool, deadline: float, started: float) -> dict:
    import bench_accel  # sets XLA_PYTHON_CLIENT_MEM_FRACTION before the backend starts

    from vpo.config import model_preset

    dev, info = _jax_backend(started)
    path = pathlib.Path(tempfile.mkdtemp(prefix="device_check_accel_")) / "accel.json"
    res = bench_accel.main([*s["argv"], "--json", str(path)])
    cfg = model_preset(res["preset"])
    res["mfu"] = mfu_counts(cfg, res["B"], res["G"], res["P"], res["T"], res["update_s"],
                            res["peak_flops"])
    res["device_mem_bytes"] = (dev.memory_stats() or {}).get("bytes_limit")
    return {**info, **res}


# -- graphs -------------------------------------------------------------------------------------

# XLA's command buffers (CUDA graphs) over the decode loop's body too: the compiled H100 sampler
# launches ~490 kernels a decode step (experiments/decode_anatomy.py), a launch-bound loop
GRAPH_FLAGS = "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,WHILE,CONDITIONAL"


def part_graphs(s: dict, smoke: bool, deadline: float, started: float) -> dict:
    """The accel part's sampling once more, its decode loop in XLA command buffers
    (`GRAPH_FLAGS` added to XLA_FLAGS before the backend starts)."""
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {GRAPH_FLAGS}".strip()
    import bench_accel

    dev, info = _jax_backend(started)
    bench = bench_accel.Bench(bench_accel.parse_args(s["argv"]))
    out = dict(compile_s={}, flags_added=GRAPH_FLAGS, B=bench.B, G=bench.G, P=bench.P,
               T=bench.T, preset=bench.a.preset)
    bench.sampling(out)
    return {**info, **out}


# -- slots --------------------------------------------------------------------------------------


def part_slots(s: dict, smoke: bool, deadline: float, started: float) -> dict:
    import bench_slots
    import numpy as np

    dev, data = _jax_backend(started)
    cfg = {**bench_slots.get_config(), **s}
    r = bench_slots.run(cfg)
    print(bench_slots.report(cfg, r), flush=True)
    lens = np.asarray(r.pop("lengths"))
    data.update(cfg=cfg, **r, lengths=dict(
        min=int(lens.min()), median=float(np.median(lens)), mean=float(lens.mean()),
        max=int(lens.max()), at_budget=int((lens == cfg["max_new_tokens"]).sum()),
        count=int(lens.size)))
    data.update(_peak(dev))
    return data


# -- packed -------------------------------------------------------------------------------------


def part_packed(s: dict, smoke: bool, deadline: float, started: float) -> dict:
    import statistics

    import jax
    import jax.numpy as jnp
    import numpy as np
    from bench_packed import long_tail_lengths_BG, make_pass
    from bench_peers import _timed
    from flax import nnx

    from vpo.config import model_preset
    from vpo.model.decoder import Decoder
    from vpo.rl import packing

    dev, data = _jax_backend(started)
    B, G, T, P = s["B"], s["G"], s["T"], s["P"]
    cfg = model_preset(s["model"], max_seq_len=P + T, param_dtype="float32", dtype="float32")
    rng = np.random.default_rng(0)
    length_BG = long_tail_lengths_BG(rng, B, G, s["min_len"], T)
    real_BGT = jnp.arange(T)[None, None, :] < jnp.asarray(length_BG)[..., None]
    V = cfg.vocab_size
    inputs = (jnp.asarray(rng.integers(3, V, (B, P)), jnp.int32), jnp.ones((B, P), bool),
              jnp.asarray(rng.integers(3, V, (B, G, T)), jnp.int32), real_BGT,
              jnp.asarray(rng.normal(-np.log(V), 0.1, (B, G, T)), jnp.float32),
              jnp.asarray(rng.normal(0.0, 1.0, (B, G)), jnp.float32))
    R = int(jnp.max(packing.plan_rows(real_BGT).rows_needed_B))
    real = int(length_BG.sum())
    params = nnx.state(Decoder(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    arms = {"padded": make_pass(cfg, inputs, 0, s["vocab_block"]),
            "packed": make_pass(cfg, inputs, R, s["vocab_block"])}
    out, first, times = {}, {}, {name: [] for name in arms}
    for name, fn in arms.items():
        out[name], first[name] = _timed(lambda fn=fn: fn(params))
    for _ in range(s["repeats"]):  # alternate: a change of load hits both arms
        for name, fn in arms.items():
            times[name].append(_timed(lambda fn=fn: fn(params))[1])
    median = {name: statistics.median(t) for name, t in times.items()}
    (loss_pad, _), grad_pad = out["padded"]
    (loss_pack, _), grad_pack = out["packed"]
    d_grad = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                 zip(jax.tree.leaves(grad_pack), jax.tree.leaves(grad_pad), strict=True))
    data.update(shape=s, params=cfg.num_params, pack_rows=R, real_tokens=real,
                padded_positions=B * G * T, packed_positions=B * (G + R * (T - 1)),
                lengths=dict(mean=float(length_BG.mean()), median=float(np.median(length_BG)),
                             max=int(length_BG.max())),
                compile_s=first, median_s=median,
                tokens_per_s={n: real / t for n, t in median.items()},
                loss_diff=abs(float(loss_pack - loss_pad)), max_grad_diff=d_grad)
    print(data, flush=True)
    data.update(_peak(dev))
    return data


# -- overlap ------------------------------------------------------------------------------------


def part_overlap(s: dict, smoke: bool, deadline: float, started: float) -> dict:
    import statistics

    import bench_accel
    import jax
    import jax.numpy as jnp

    from vpo.config import ObjectiveConfig, TrainConfig
    from vpo.rl import overlap
    from vpo.rl import step as step_lib

    dev, data = _jax_backend(started)
    a = bench_accel.parse_args(s["argv"])
    bench = bench_accel.Bench(a)  # the policy, prompts, in-graph reward of the accel part
    arms, compile_s, first_state = {}, {}, None
    for k in (0, 1):
        tcfg = TrainConfig(batch_size=a.B, num_answers=1, learning_rate=a.lr, steps=10**6,
                           grad_accum=a.grad_accum, vocab_block=a.vocab_block,
                           logprob_impl=a.logprob_impl, off_policy_steps=k)
        step_cfg = step_lib.StepConfig(bench.sampler_cfg, ObjectiveConfig(advantage="grpo"),
                                        tcfg, stop_ids=(bench.no_eos,), pad_id=bench_accel.PAD)
        tx = step_lib.make_optimizer(tcfg)  # the same optimiser state for both arms
        if first_state is None:
            t0 = time.perf_counter()
            graphdef, first_state, _ = step_lib.init_state(bench.cfg, tx, bench.mesh, seed=0)
            jax.block_until_ready(first_state)
            compile_s["init_state"] = time.perf_counter() - t0
        state = jax.tree.map(jnp.copy, first_state)  # each arm's step donates its own
        step = overlap.make_in_graph_step(graphdef, tx, bench.task, step_cfg)
        if k:
            t0 = time.perf_counter()
            state = jax.block_until_ready(overlap.make_prime_step(graphdef, bench.task,
                                                                  step_cfg)(state, bench.batch))
            compile_s["k=1 prime"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        state, metrics = jax.block_until_ready(step(state, bench.batch))
        compile_s[f"k={k} first step"] = time.perf_counter() - t0
        arms[k] = dict(state=state, step=step, times=[], tokens=[])
    del first_state
    for arm in arms.values():  # one more untimed step each, now that both are compiled
        arm["state"], _ = jax.block_until_ready(arm["step"](arm["state"], bench.batch))
    for _ in range(s["repeats"]):  # alternate blocks: a change of load hits both arms
        if _time_left(deadline) < 5 and arms[1]["times"]:
            break
        for arm in arms.values():
            state, counts = arm["state"], []
            t0 = time.perf_counter()
            for _ in range(s["steps"]):
                state, metrics = arm["step"](state, bench.batch)
                counts.append(metrics["generated_tokens"])  # summed on the host, untimed
            jax.block_until_ready(state)
            arm["times"].append((time.perf_counter() - t0) / s["steps"])
            arm["tokens"].append(sum(int(n) for n in counts) / s["steps"])
            arm["state"] = state
    median = {k: statistics.median(arm["times"]) for k, arm in arms.items()}
    data.update(preset=a.preset, dtype=a.dtype, B=a.B, G=a.G, P=a.P, T=a.T,
                params=bench.cfg.num_params, steps_per_block=s["steps"],
                blocks=len(arms[0]["times"]), compile_s=compile_s,
                step_s={f"k={k}": t for k, t in median.items()},
                block_s={f"k={k}": arm["times"] for k, arm in arms.items()},
                generated_tokens_per_step={f"k={k}": statistics.mean(arm["tokens"])
                                           for k, arm in arms.items()},
                speedup=median[0] / median[1])
    print(data, flush=True)
    data.update(_peak(dev))
    return data


# -- HF generate --------------------------------------------------------------------------------


def part_hf(s: dict, smoke: bool, deadline: float, started: float) -> dict:
    try:
        import torch
        import transformers
    except ImportError as err:
        raise CannotRunHereError(f"{err.name or err} is not installed here") from None
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cuda = torch.cuda.is_available()
    if not cuda and not smoke:
        raise RuntimeError("torch sees no CUDA device")
    device = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    B, G, P, T = s["B"], s["G"], s["P"], s["T"]
    data = dict(torch=torch.__version__, transformers=transformers.__version__, device=device,
                device_name=torch.cuda.get_device_name(0) if cuda else platform.processor(),
                B=B, G=G, P=P, T=T, dtype=s["dtype"], attn="sdpa",
                import_s=time.perf_counter() - started)
    t0 = time.perf_counter()
    cfg = Qwen2Config(**s["config"], attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):  # random weights made where they run
        model = Qwen2ForCausalLM(cfg).to(getattr(torch, s["dtype"])).eval()
    sync()
    data["init_s"] = time.perf_counter() - t0
    data["params"] = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, cfg.vocab_size - 1, (B, P), device=device)
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=G,
              max_new_tokens=T, min_new_tokens=T, eos_token_id=None, pad_token_id=0)

    def generate():
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        sync()
        return out, time.perf_counter() - t0

    out, data["first_call_s"] = generate()
    times = []
    for _ in range(s["reps"]):
        if times and _time_left(deadline) < 1.5 * times[-1]:
            break
        out, seconds = generate()
        times.append(seconds)
    new = out.shape[1] - P
    data.update(times_s=times, new_tokens=int(new), generate_s=min(times),
                tok_s=B * G * new / min(times),
                peak_mem_bytes=torch.cuda.max_memory_allocated() if cuda else None)
    print(data, flush=True)
    return data


def salvage_accel(log: str) -> str:
    """What bench_accel printed before it stopped: its sampling line, out-of-memory retries."""
    keep = [ln.strip() for ln in log.splitlines()
            if (ln.startswith("sampling ") and "decode step" in ln)
            or ln.startswith("out of memory at grad_accum")]
    return "; ".join(keep)


@dataclasses.dataclass(frozen=True)
class Part:
    fn: object
    weight: float  # its share of the budget
    what: str
    salvage: object = None  # log text -> what a part that did not finish had measured


PARTS = {
    "kernels": Part(part_kernels, 1.0, "Pallas kernels against XLA"),
    "accel": Part(part_accel, 4.4, "sampling, decode roofline, update MFU, memory, compiles",
                  salvage_accel),
    "slots": Part(part_slots, 1.2, "refilled slots against all rows, long-tail lengths"),
    "packed": Part(part_packed, 1.2, "packed against padded update pass"),
    "overlap": Part(part_overlap, 2.0, "overlapped RL step against synchronous"),
    "graphs": Part(part_graphs, 1.2, "sampling with command buffers over the decode loop"),
    "hf": Part(part_hf, 1.2, "HF transformers generate, same card, own process"),
}


def child_main(a: argparse.Namespace) -> int:
    started = time.perf_counter()
    if a.part != "hf":
        _child_setup()
        from vpo.accel.targets import default_xla_flags

        if not os.environ.get(NO_VPO_FLAGS):
            default_xla_flags()
    else:
        for name in ABSENT_ON_DEVICE:
            sys.modules[name] = None
    shape = SHAPES[a.part]["smoke" if a.cpu_smoke else "gpu"]
    result = dict(part=a.part, status="ok")
    try:
        result["data"] = _plain(PARTS[a.part].fn(shape, a.cpu_smoke, a.deadline, started))
    except CannotRunHereError as why:
        result.update(status="skipped", reason=str(why))
    pathlib.Path(a.part_json).write_text(json.dumps(result, indent=1))
    return 0


# ---------------------------------------------------------------------------------------------
# rows of the table, from the parts' data (the sampling row takes HF's as its baseline)


def _row(what, value=None, unit="", baseline=None, baseline_of="", ratio=None, note=""):
    return dict(what=what, value=value, unit=unit, baseline=baseline, baseline_of=baseline_of,
                ratio=ratio, note=note)


def _div(a, b):
    return None if a is None or b in (None, 0) else a / b


def _init_rows(d: dict) -> list[dict]:
    rows = []
    if "backend_init_s" in d:
        rows.append(_row("init: imports + jax backend start", d["import_s"] + d["backend_init_s"],
                         "s", note=f"backend {d['backend_init_s']:.1f} s"))
    return rows


def _peak_row(d: dict) -> list[dict]:
    if d.get("peak_mem_bytes") is None:
        return []
    return [_row(f"peak memory ({d.get('peak_mem_source', 'device')})", d["peak_mem_bytes"] / GIB,
                 "GiB", _div(d.get("device_mem_bytes"), GIB), "allocator limit",
                 _div(d["peak_mem_bytes"], d.get("device_mem_bytes")))]


def rows_kernels(d: dict, parts: dict) -> list[dict]:
    rows = []
    for c in d["cells"]:
        sh = ", ".join(f"{k}={v}" for k, v in c["shape"].items())
        what = f"{c['kernel']} {c['direction']}, {c['case']} ({sh})"
        if "skipped" in c:
            rows.append(_row(what, note=c["skipped"]))
            continue
        note = (f"max abs diff {c['max_abs_diff']:.2e} of {c['ref_scale']:.2e}"
                if "kernel_s" in c else d.get("kernel_reason", ""))
        rows.append(_row(what, _div(c.get("kernel_s"), 1e-3), "ms",
                         c["xla_s"] * 1e3, f"XLA {c['xla']}",
                         _div(c["xla_s"], c.get("kernel_s")), note))
        rows.append(_row(f"compile + first call: {what}", c.get("kernel_first_s"), "s",
                         c["xla_first_s"], "XLA"))
    return _init_rows(d) + rows + _peak_row(d)


def rows_accel(d: dict, parts: dict) -> list[dict]:
    hf = parts.get("hf", {}).get("data") or {}
    hf_ok = hf.get("B") == d["B"] and hf.get("G") == d["G"] and hf.get("T") == d["T"] \
        and hf.get("P") == d["P"]
    hf_tok_s = hf.get("tok_s") if hf_ok else None
    m = d["mfu"]
    shape = f"{d['preset']} {d['dtype']}, B={d['B']} G={d['G']} P={d['P']} T={d['T']}"
    rows = [
        _row(f"sampling tokens/s ({shape})", d["sample_tok_s"], "tok/s", hf_tok_s,
             "HF generate", _div(d["sample_tok_s"], hf_tok_s),
             "" if hf_tok_s else "no HF generate at this shape"),
        _row("decode step (call - prefill) / T", d["decode_step_s"] * 1e3, "ms",
             note=f"attention {d['decode_attention']}"),
        _row("decode HBM roofline fraction", d["decode_roofline_frac"], "frac",
             TARGETS["decode_roofline"], "target", _div(d["decode_roofline_frac"],
                                                       TARGETS["decode_roofline"]),
             f"{d['decode_gb_s']:.0f} GB/s"),
        _row("update alone (reward, advantages, fwd/bwd, AdamW)", d["update_s"], "s",
             note=f"grad_accum {d['grad_accum_used']}; {d['update_tok_s']:.0f} completion tok/s"),
        _row("update MFU, completion-token count", m["completion_mfu"], "frac",
             TARGETS["update_mfu"], "target", _div(m["completion_mfu"], TARGETS["update_mfu"]),
             f"{m['completion_flops']:.3g} FLOPs"),
        _row("update MFU, all-token count", m["all_tokens_mfu"], "frac",
             TARGETS["update_mfu"], "target", _div(m["all_tokens_mfu"], TARGETS["update_mfu"]),
             f"{m['all_tokens_flops']:.3g} FLOPs"),
        _row("update MFU, bench_accel count (prompt once per group)", d["update_mfu"], "frac",
             TARGETS["update_mfu"], "target", _div(d["update_mfu"], TARGETS["update_mfu"]),
             f"{d['update_flops']:.3g} FLOPs"),
        _row("fused RL step (sample, reward, update)", d["rl_step_s"], "s",
             note=f"{d['rl_step_tok_s']:.0f} completion tok/s"),
    ]
    rows += [_row(f"compile + first call: {k}", v, "s") for k, v in d["compile_s"].items()]
    return _init_rows(d) + rows + _peak_row(d)


def rows_graphs(d: dict, parts: dict) -> list[dict]:
    base = parts.get("accel", {}).get("data") or {}
    same = all(base.get(k) == d[k] for k in ("B", "G", "P", "T", "preset"))
    step = base.get("decode_step_s") if same else None
    return _init_rows(d) + [
        _row("decode step with command buffers over the loop", d["decode_step_s"] * 1e3, "ms",
             None if step is None else step * 1e3, "accel part (XLA's default)",
             _div(step, d["decode_step_s"]), f"{d['flags_added']}"),
        _row("decode HBM roofline fraction, command buffers", d["decode_roofline_frac"],
             "frac", TARGETS["decode_roofline"], "target",
             _div(d["decode_roofline_frac"], TARGETS["decode_roofline"])),
        _row("sampling tokens/s, command buffers", d["sample_tok_s"], "tok/s")]


def rows_slots(d: dict, parts: dict) -> list[dict]:
    c, L = d["cfg"], d["lengths"]
    rows = []
    for name, tok_s in d["tokens_per_s"].items():
        if name == "all rows":
            continue
        same, n, _ = d["same"][name]
        rows.append(_row(f"useful tokens/s, {name} vs all rows ({c['preset']}, "
                         f"{c['prompts']}x{c['samples']}, T={c['max_new_tokens']}, lengths "
                         f"mean {L['mean']:.0f} max {L['max']})", tok_s, "tok/s",
                         d["tokens_per_s"]["all rows"], "all rows", d["ratio"][name],
                         f"steps {d['steps'][name]} vs {d['steps']['all rows']}; "
                         f"{same}/{n} rollouts identical"))
    rows += [_row(f"compile + first call: {k}", v, "s") for k, v in d["compile_s"].items()]
    return _init_rows(d) + rows + _peak_row(d)


def rows_packed(d: dict, parts: dict) -> list[dict]:
    s = d["shape"]
    rows = [_row(f"real tokens/s, packed vs padded pass ({s['model']} f32, B={s['B']} "
                 f"G={s['G']} T={s['T']}, mean length {d['lengths']['mean']:.0f})",
                 d["tokens_per_s"]["packed"], "tok/s", d["tokens_per_s"]["padded"], "padded",
                 _div(d["median_s"]["padded"], d["median_s"]["packed"]),
                 f"positions {d['packed_positions']} vs {d['padded_positions']}; max abs grad "
                 f"diff {d['max_grad_diff']:.1e}")]
    rows += [_row(f"compile + first call: {k}", v, "s") for k, v in d["compile_s"].items()]
    return _init_rows(d) + rows + _peak_row(d)


def rows_overlap(d: dict, parts: dict) -> list[dict]:
    rows = [_row(f"RL step, overlapped (k=1) vs synchronous (k=0) ({d['preset']} {d['dtype']}, "
                 f"B={d['B']} G={d['G']} P={d['P']} T={d['T']})", d["step_s"]["k=1"], "s",
                 d["step_s"]["k=0"], "synchronous", d["speedup"],
                 f"{d['blocks']} blocks of {d['steps_per_block']} steps")]
    rows += [_row(f"compile + first call: {k}", v, "s") for k, v in d["compile_s"].items()]
    return _init_rows(d) + rows + _peak_row(d)


def rows_hf(d: dict, parts: dict) -> list[dict]:
    rows = [_row(f"HF generate tokens/s ({d['device_name']}, {d['dtype']}, {d['attn']}, "
                 f"B={d['B']} G={d['G']} P={d['P']} T={d['T']})", d["tok_s"], "tok/s",
                 note=f"transformers {d['transformers']}, torch {d['torch']}"),
            _row("init: imports", d["import_s"], "s"),
            _row("init: random model on the device", d["init_s"], "s"),
            _row("first generate call", d["first_call_s"], "s")]
    if d.get("peak_mem_bytes"):
        rows.append(_row("peak memory (torch max allocated)", d["peak_mem_bytes"] / GIB, "GiB"))
    return rows


ROWS = dict(kernels=rows_kernels, accel=rows_accel, slots=rows_slots, packed=rows_packed,
            overlap=rows_overlap, graphs=rows_graphs, hf=rows_hf)


def part_rows(name: str, rec: dict, parts: dict) -> list[dict]:
    if rec["status"] != "ok":
        return [_row(PARTS[name].what, note=rec.get("reason", ""))]
    try:
        return ROWS[name](rec["data"], parts)
    except Exception as err:  # a row that cannot be made must not lose the others
        return [_row(PARTS[name].what, note=f"rows failed: {type(err).__name__}: {err}")]


def _fmt(x, unit=""):
    if x is None:
        return "n/a"
    if unit == "frac":
        return f"{x:.1%}"
    if unit == "tok/s":
        return f"{x:,.0f} tok/s"
    text = f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return f"{text} {unit}".strip()


def table(report: dict) -> list[str]:
    lines = ["| part | what was measured | value | baseline | ratio | seconds | status |",
             "|---|---|---|---|---|---|---|"]
    for row in report.get("rows", []):
        base = "" if row["baseline"] is None else (
            f"{_fmt(row['baseline'], row['unit'])} ({row['baseline_of']})")
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        status = row["status"] + (f": {row['note']}" if row["note"] else "")
        lines.append(f"| {row['part']} | {row['what']} | {_fmt(row['value'], row['unit'])} | "
                     f"{base} | {ratio} | {row['seconds']:.1f} | {status.replace('|', '/')} |")
    return lines


def write_outputs(report: dict, out: pathlib.Path) -> None:
    parts = report["parts"]
    report["rows"] = [dict(part=name, seconds=rec["seconds"], status=rec["status"], **row)
                      for name, rec in parts.items() for row in part_rows(name, rec, parts)]
    (out / "device_check.json").write_text(json.dumps(report, indent=1))
    dev = next((rec["data"] for rec in parts.values() if rec.get("data", {}).get("jax")), {})
    head = [f"# Device check{' (CPU smoke)' if report['cpu_smoke'] else ''}", "",
            f"`{report['command']}`, {report['started_utc']}; {dev.get('device', '?')} "
            f"({dev.get('platform', '?')}), jax {dev.get('jax', '?')}, python "
            f"{report['python']}; budget {report['budget_s']:.0f} s, wall "
            f"{report.get('wall_s', 0):.0f} s.", "",
            "Ratios: kernels XLA time / kernel time; sampling vpo / HF tokens/s; MFU and "
            "roofline against the target; slots, packed and overlap: new / old throughput.",
            *([f"Compile times may be loads from the cache {report['compile_cache']}.", ""]
              if report.get("compile_cache") else [""])]
    refreshed = write_kernel_table(report, out)
    if refreshed:
        head += [f"The kernel rows of this run refresh the table of measured defaults: "
                 f"`{refreshed.name}` here; copy it over `kernels/measured.json` and commit it "
                 "to change which path each platform takes by default (`vpo.kernels.choice`).",
                 ""]
    (out / "device_check.md").write_text("\n".join(head + table(report)) + "\n")


def write_kernel_table(report: dict, out: pathlib.Path) -> pathlib.Path | None:
    """`OUT/kernel_table.json`: the committed table of kernel-against-XLA measurements with this
    run's kernel cells merged in (`vpo.kernels.choice.merge_rows`); None when the run timed no
    kernel on an accelerator (a CPU smoke run times the interpreter)."""
    data = report["parts"].get("kernels", {}).get("data", {})
    if data.get("interpret", True) or not any("kernel_s" in c for c in data.get("cells", [])):
        return None
    _child_setup()
    from vpo.kernels import choice

    rows = choice.rows_from_cells(data["cells"], platform=data["platform"],
                                  device=data["device"], measured_at=report["measured_at"],
                                  jax_version=data["jax"])
    path = out / "kernel_table.json"
    choice.write_table(choice.merge_rows(choice.committed_table(), rows), path)
    return path


def _commit() -> str:
    """The tree's commit (short hash), or "unknown" in a copy without git."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                              capture_output=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# ---------------------------------------------------------------------------------------------
# the orchestrator


def _tail(path: pathlib.Path, chars: int = 3000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-chars:]


def run_part(name: str, budget_s: float, smoke: bool, work: pathlib.Path,
             log: pathlib.Path, compile_cache: str | None = None) -> dict:
    part_json, part_log = work / f"{name}.json", work / f"{name}.log"
    deadline = time.time() + budget_s
    flags = getattr(subprocess, "_args_from_interpreter_flags", lambda: [])()
    cmd = [sys.executable, *flags, str(pathlib.Path(__file__).resolve()), "--part", name,
           "--part-json", str(part_json), "--deadline", f"{deadline:.3f}"]
    cmd += ["--cpu-smoke"] if smoke else []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if smoke:
        env["JAX_PLATFORMS"] = "cpu"
    if compile_cache:
        env["JAX_COMPILATION_CACHE_DIR"] = compile_cache
    rec = dict(budget_s=budget_s)
    t0 = time.perf_counter()
    with open(part_log, "w") as f:
        try:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                  timeout=budget_s)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = None
    rec["seconds"] = time.perf_counter() - t0
    if rc is None:
        rec.update(status="timed out", reason=f"ran past its {budget_s:.0f} s",
                   output_tail=_tail(part_log))
    elif rc != 0 or not part_json.exists():
        tail = _tail(part_log)
        last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
        rec.update(status="failed", reason=f"exit {rc}: {last[:300]}", output_tail=tail)
    if rec.get("status") in ("failed", "timed out") and PARTS[name].salvage:
        rec["partial"] = PARTS[name].salvage(part_log.read_text(errors="replace"))
        if rec["partial"]:
            rec["reason"] += f"; before it stopped: {rec['partial']}"
    if "status" not in rec:
        rec.update(json.loads(part_json.read_text()))
        rec.pop("part", None)
    with open(log, "a") as f:
        f.write(f"\n===== {name}: {rec['status']} in {rec['seconds']:.1f} s =====\n")
        f.write(_tail(part_log, 200_000))
    return rec


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="device_check_out",
                    help="folder for device_check.json, .md and .log")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="seconds for all parts together, shared by weight")
    ap.add_argument("--cpu-smoke", action="store_true", help="every part at tiny shapes on CPU")
    ap.add_argument("--compile-cache", metavar="DIR",
                    help="a persistent XLA compile cache for the JAX parts (a rerun on the same "
                         "machine then loads its programs: its compile times are cache loads)")
    ap.add_argument("--measured-at", metavar="COMMIT",
                    help="the commit the tree is at, for the refreshed kernel table (default: "
                         "`git rev-parse --short HEAD`, else unknown)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated subset of {','.join(PARTS)} (their order is kept)")
    ap.add_argument("--part", choices=list(PARTS), help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--part-json", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=math.inf, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    if a.part:
        return child_main(a)
    chosen = [p.strip() for p in a.parts.split(",") if p.strip()]
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown:
        raise SystemExit(f"unknown part(s) {unknown}; choose from {list(PARTS)}")
    names = [n for n in PARTS if n in chosen]
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "device_check.log"
    log.write_text("")
    report = dict(command=shlex.join(["python3", "experiments/device_check.py", *argv]),
                  started_utc=datetime.datetime.now(datetime.UTC).strftime(
                      "%Y-%m-%d %H:%M:%S UTC"),
                  python=platform.python_version(), host=platform.node(),
                  cpu_smoke=a.cpu_smoke, budget_s=a.budget_s, compile_cache=a.compile_cache,
                  measured_at=a.measured_at or _commit(), parts={})
    print(f"command: {report['command']}", flush=True)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="device_check_") as tmp:
        for i, name in enumerate(names):
            left = a.budget_s - (time.perf_counter() - t_start)
            share = left * PARTS[name].weight / sum(PARTS[n].weight for n in names[i:])
            if share < MIN_PART_S:
                rec = dict(status="skipped", reason=f"{max(left, 0):.0f} s of the budget left",
                           seconds=0.0, budget_s=share)
            else:
                print(f"[{name}] {PARTS[name].what}: up to {share:.0f} s", flush=True)
                rec = run_part(name, share, a.cpu_smoke, pathlib.Path(tmp), log,
                               a.compile_cache)
                if (rec["status"] == "failed" and UNKNOWN_FLAG in rec.get("output_tail", "")
                        and not os.environ.get(NO_VPO_FLAGS)):
                    # this XLA lacks one of vpo's flags: once more without them, and after
                    os.environ[NO_VPO_FLAGS] = "1"
                    report["vpo_xla_flags_dropped"] = rec["reason"]
                    print(f"[{name}] {rec['reason']}: again without vpo's XLA flags", flush=True)
                    rec = run_part(name, max(share - rec["seconds"], MIN_PART_S), a.cpu_smoke,
                                   pathlib.Path(tmp), log, a.compile_cache)
            report["parts"][name] = rec
            report["wall_s"] = time.perf_counter() - t_start
            write_outputs(report, out)
            print(f"[{name}] {rec['status']} in {rec['seconds']:.1f} s"
                  + (f": {rec['reason']}" if rec.get("reason") else ""), flush=True)
    print("\n".join(["", *table(report), ""]), flush=True)
    print(f"wrote {out / 'device_check.json'} and {out / 'device_check.md'}", flush=True)
    return 0 if all(r["status"] in ("ok", "skipped") for r in report["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
