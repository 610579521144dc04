"""Accelerator benchmark of a Qwen2.5-0.5B-shaped policy (random weights, bf16): sampling, RL step,
update MFU, decode HBM roofline, peak memory.

Run on the lent GPU (the device tool runs in the repo root; its `python3` has jax 0.11 CUDA, flax
and optax; no network, nothing to download: the weights are random):

    PYTHONUNBUFFERED=1 python3 experiments/bench_accel.py --json $OUT/accel.json

(about 5-8 minutes on one H100, compiles included; `--reps 3` for less). The CPU check, as the
test runs it:

    python experiments/bench_accel.py --preset tiny --dtype float32 --B 2 --G 2 --P 8 --T 8 \
        --reps 2 --grad-accum 1

What it measures (warm medians over `--reps` calls; compile / first call reported separately):
  1. sampling: generated tokens/s of `vpo.rollout.slots.sample_with_keys` (as
     `bench_peers.VpoSize`), B prompts x G samples, P prompt tokens, exactly T new tokens at
     temperature 1 (the stop id is `vocab_size`, which no token takes, so every sample runs all T
     steps).
  2. decode step: (sampling call - prefill call) / T, the prefill being the same
     `Decoder.prefill` + last-position logits under its own jit. Its HBM roofline fraction is
     bytes / step seconds / HBM bandwidth, with the bytes one decode step must read, averaged
     over the T steps:
         params_bytes + L * 2 * Z * E * kv_bytes * (B * P + B * G * (T + 1) / 2)
     (every weight once; the prompt's keys/values once per prompt, since its G samples share
     them; step t reads t + 1 suffix slots of each sample). Not counted: the fp32 logits
     (B * G * V * 4 bytes, 78 MB at the default shape, written once and read by each pass of
     the draw, log-prob and entropy) and cache writes, so the fraction is a lower bound on
     the bandwidth actually used. HBM bandwidth by device kind (`HBM_BW`).
  3. the fused RL step `vpo.rl.step.make_rl_step` (sample -> reward -> GRPO advantages -> one
     AdamW update, one jit, state donated; built as `bench_peers.VpoSize._build_step`, with
     `bench_peers.CountATask` as the in-graph reward): seconds/step, completion tokens/s.
     And the update alone (`vpo.rl.step.update_from_rollout` after
     `vpo.rollout.rewards.in_graph_rewards`, jitted and donated): reward + advantage +
     forward/backward over `--grad-accum` micro-batches + AdamW, on a rollout from (1).
  4. update MFU = update FLOPs / update seconds / dense bf16 peak (`bench_peers.PEAK_FLOPS`),
     update FLOPs (full fine-tuning, every parameter trained; `update_flops`):
         6 * N_body * (B * P + B * G * T)      body: every prompt token once per group (its G
                                              samples share the prefix), every completion token
       + 6 * V * D * B * G * T                 LM head: completion tokens only
       + 12 * L * H * E * ctx                  attention, forward 4*H*E per (query, key) pair,
                                              x3 for forward + backward, causal:
         ctx = B * P * (P + 1) / 2 + B * G * (T * P + T * (T + 1) / 2)
     with N_body the parameters less the embedding table (and less the LM head if untied).
     This is the convention of the anchor below: 6 * N + 6 * L * H * E * S per token at packed
     length S = 16384 gives (6 * 0.596e9 + 6 * 28 * 16 * 128 * 16384) * 11.9e3 / 989e12 = 11.1%
     for Qwen3-0.6B, its published figure. XLA's own count of the compiled update is in the
     JSON (`xla_update_flops`; XLA counts a scanned loop body once, so it can be low).
  5. peak memory: `memory_stats()['peak_bytes_in_use']` of the device after sampling and at the
     end (the update / RL step), or the process's peak resident memory on CPU.

Shapes (defaults, for an H100 80GB): B=16 prompts x G=8 samples = 128 sequences, P=256,
T=512. 128 concurrent sequences is past the goal's decode batch >= 64 and is the size of a
common GRPO step (e.g. 16 x 8 in DAPO-style recipes at a 512-token budget); the RL step then
trains on 65,536 completion tokens (+ 4,096 prompt tokens). `--grad-accum 8` splits them into
micro-batches of 2 prompts x 8 samples (8,192 completion tokens; the anchor packs 16K), because
this model's XLA attention keeps float32 scores [B, G, H, T, P + T] per layer for the backward
(~0.35 GB per layer per micro-batch here). If the update runs out of memory anyway, the script
doubles `grad_accum` and tries again (reported as `grad_accum_used`). bf16 params and compute
(`--dtype`); `XLA_PYTHON_CLIENT_MEM_FRACTION` defaults to 0.95 here so that the allocator may
use most of the card. The attention path of decode is `vpo.model.decoder.decode_attention_impl()`
(the Pallas kernel on one GPU).

At the default shape the update is 2.12e14 model FLOPs (2.03e14 matmul + 8.8e12 attention), so
30% MFU on an H100 (989 TFLOP/s) is 0.71 s per update; a decode step must read 1.44 GB (0.99 GB
of weights + 0.45 GB of cache on average), so 50% of the H100's 3.35 TB/s is 0.86 ms per step
(149k generated tokens/s at 128 sequences).

Targets and anchor (the project's issue): on one H100, update MFU >= 30% in bf16 and decode >=
50% of the HBM roofline at batch >= 64. The only published single-H100 anchor at this size is
prime-rl's trainer: Qwen3-0.6B at 11.9k tokens/s, MFU 11.1% (16K packed sequences). This script
reports `update_seq_tok_s` (B * G * (P + T) tokens per update second, every sample's prompt
counted, as a packed trainer counts them) for that comparison.

Prints the device, jax version and the exact command, one markdown table and one JSON line;
`--json PATH` writes the JSON too. No assertions on speed.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import pathlib
import platform
import resource
import shlex
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")  # before jax starts a backend

_HERE = pathlib.Path(__file__).resolve().parent
for _p in (str(_HERE.parent), str(_HERE)):  # `vpo` without an install; bench_peers beside us
    if _p not in sys.path:
        sys.path.insert(0, _p)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from bench_peers import PEAK_FLOPS, CountATask, _timed  # noqa: E402
from flax import nnx  # noqa: E402

from vpo.config import (  # noqa: E402
    MODEL_PRESETS,
    ModelConfig,
    ObjectiveConfig,
    SamplerConfig,
    TrainConfig,
    model_preset,
)
from vpo.model import sharding  # noqa: E402
from vpo.model.decoder import decode_attention_impl  # noqa: E402
from vpo.rl import step as step_lib  # noqa: E402
from vpo.rollout import rewards as rewards_lib  # noqa: E402
from vpo.rollout.slots import sample_with_keys  # noqa: E402

# HBM bandwidth in bytes/s by jax `device_kind` substring, most specific first (vendor sheets).
HBM_BW = (("H100 PCIe", 2.0e12), ("H100 NVL", 3.9e12), ("H100", 3.35e12),  # H100 SXM 80GB HBM3
          ("H200", 4.8e12), ("GH200", 4.0e12), ("B200", 8.0e12),
          ("A100-SXM4-40GB", 1.555e12), ("A100-PCIE-40GB", 1.555e12), ("A100", 2.0e12),
          ("L40S", 0.864e12), ("A10G", 0.6e12), ("L4", 0.3e12),
          ("TPU v5 lite", 0.819e12), ("v5e", 0.819e12), ("TPU v5p", 2.765e12),
          ("TPU v5", 2.765e12), ("TPU v6 lite", 1.64e12), ("v6e", 1.64e12),
          ("TPU v4", 1.2e12))
DEFAULTS = dict(preset="qwen2.5-0.5b", dtype="bfloat16", B=16, G=8, P=256, T=512, reps=5,
                grad_accum=8, vocab_block=4096, logprob_impl="chunked", lr=1e-6)
PAD = 0
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# ---------------------------------------------------------------------------------------------
# formulas


def update_flops(cfg: ModelConfig, B: int, G: int, P: int, T: int) -> dict[str, float]:
    """Model FLOPs of one update over B prompts x G completions (see the module docstring):
    {"matmul": 6 N_body (BP + BGT) + 6 V D BGT, "attention": 12 L H E ctx, "total"}."""
    V, D, L, H, E = cfg.vocab_size, cfg.dim, cfg.num_layers, cfg.num_heads, cfg.head_dim
    head = V * D  # the LM head (tied: the embedding table itself)
    body = cfg.num_params - head * (1 if cfg.tie_embeddings else 2)
    matmul = 6 * body * (B * P + B * G * T) + 6 * head * B * G * T
    ctx = B * P * (P + 1) // 2 + B * G * (T * P + T * (T + 1) // 2)
    attention = 12 * L * H * E * ctx
    return dict(matmul=float(matmul), attention=float(attention),
                total=float(matmul + attention), n_body=body, ctx=ctx)


def decode_bytes(cfg: ModelConfig, B: int, G: int, P: int, T: int) -> dict[str, float]:
    """Bytes one decode step must read, averaged over T steps: every parameter once plus the
    KV cache so far (the prompt's once per prompt, t + 1 suffix slots per sample at step t)."""
    params = cfg.num_params * _DTYPE_BYTES[cfg.param_dtype]
    per_token = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * _DTYPE_BYTES[cfg.dtype]
    kv = per_token * (B * P + B * G * (T + 1) / 2)
    return dict(params=float(params), kv=float(kv), total=float(params + kv),
                kv_per_token=per_token)


def _lookup(table, kind: str):
    return next((v for k, v in table if k in kind), None)


def hbm_bandwidth(device) -> float | None:
    """Bytes/s of the device's HBM (None on CPU or an unknown kind)."""
    return None if device.platform == "cpu" else _lookup(HBM_BW, device.device_kind)


def peak_flops(device) -> float | None:
    """Dense bf16 FLOP/s (`bench_peers.PEAK_FLOPS`; None on CPU or an unknown kind)."""
    return None if device.platform == "cpu" else _lookup(PEAK_FLOPS.items(), device.device_kind)


def peak_memory(device) -> tuple[int, str]:
    """(bytes, source): the device allocator's peak, or this process's peak RSS (CPU)."""
    stats = device.memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use"
    scale = 1 if platform.system() == "Darwin" else 1024  # ru_maxrss: bytes on macOS, KiB here
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, "process peak RSS"


def _median_s(fn, reps: int) -> float:
    return statistics.median(_timed(fn)[1] for _ in range(reps))


def _is_oom(err: Exception) -> bool:
    text = str(err)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


# ---------------------------------------------------------------------------------------------
# the measurements


@functools.partial(jax.jit, static_argnames="graphdef")
def _prefill(graphdef, state, prompts_BP, mask_BP):
    """The sampler's prefill (`vpo.rollout.sampler.generate`'s first lines) under its own jit."""
    model = nnx.merge(graphdef, state)
    hidden_BPD, prefix = model.prefill(prompts_BP, mask_BP)
    return model.logits(hidden_BPD[:, -1]), prefix


class Bench:
    """One random-weight policy, its prompts, and the step settings of every measurement."""

    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.cfg = model_preset(a.preset, param_dtype=a.dtype, dtype=a.dtype,
                                max_seq_len=max(MODEL_PRESETS[a.preset].get("max_seq_len", 512),
                                                a.P + a.T))
        self.B, self.G, self.P, self.T = a.B, a.G, a.P, a.T
        rng = np.random.default_rng(0)
        self.prompts_BP = rng.integers(0, self.cfg.vocab_size, (a.B, a.P)).astype(np.int32)
        self.mask_BP = np.ones((a.B, a.P), bool)
        self.sampler_cfg = SamplerConfig(max_new_tokens=a.T, num_samples=a.G, temperature=1.0)
        self.no_eos = self.cfg.vocab_size  # no token takes it: every sample runs all T steps
        self.task = CountATask(1, None)  # reward = fraction of completion tokens equal to 1
        self.mesh = sharding.make_mesh(devices=jax.devices()[:1])
        self.batch = dict(problems={"task": jnp.zeros((a.B,), jnp.int32)},
                          prompt_BP=jnp.asarray(self.prompts_BP),
                          prompt_mask_BP=jnp.asarray(self.mask_BP))
        self.calls = 0
        self.fresh = None

    def step_setup(self, grad_accum: int):
        """(tx, StepConfig), as `bench_peers.VpoSize._build_step` (GRPO, one answer, one update
        per step) with this run's micro-batching."""
        a = self.a
        tcfg = TrainConfig(batch_size=a.B, num_answers=1, learning_rate=a.lr, steps=10**6,
                           grad_accum=grad_accum, vocab_block=a.vocab_block,
                           logprob_impl=a.logprob_impl)
        step_cfg = step_lib.StepConfig(self.sampler_cfg, ObjectiveConfig(advantage="grpo"),
                                        tcfg, stop_ids=(self.no_eos,), pad_id=PAD)
        return step_lib.make_optimizer(tcfg), step_cfg

    def new_state(self):
        """(graphdef, TrainState) of a fresh random policy, born on the device (`init_state`;
        the optimiser state does not depend on grad_accum)."""
        graphdef, state, _ = step_lib.init_state(self.cfg, self.step_setup(1)[0], self.mesh,
                                                  seed=0)
        return graphdef, state

    # -- 1, 2: sampling and the decode step ------------------------------------------------------
    def _sample(self, model):
        self.calls += 1
        keys = jax.random.split(jax.random.key(self.calls), self.B * self.G).reshape(
            self.B, self.G)
        return sample_with_keys(model, self.prompts_BP, self.mask_BP, keys, self.sampler_cfg,
                                stop_ids=(self.no_eos,), pad_id=PAD)

    def sampling(self, out: dict):
        B, G, T, reps = self.B, self.G, self.T, self.a.reps
        t0 = time.perf_counter()
        graphdef, state = self.new_state()
        jax.block_until_ready(state)
        self.fresh = (graphdef, state)  # the first update attempt trains this same policy
        out["compile_s"]["init_state"] = time.perf_counter() - t0
        model = step_lib.model_of(graphdef, state)
        rollout, out["compile_s"]["sampling"] = _timed(lambda: self._sample(model))
        n = int(rollout.mask_BGT.sum())
        if n != B * G * T:
            raise RuntimeError(f"sampled {n} tokens, expected exactly {B * G * T}")
        sample_s = _median_s(lambda: self._sample(model), reps)
        rollout = jax.block_until_ready(self._sample(model))  # the update's input
        mgraph, mstate = nnx.split(model)
        prompts, mask = jnp.asarray(self.prompts_BP), jnp.asarray(self.mask_BP)
        _, out["compile_s"]["prefill"] = _timed(lambda: _prefill(mgraph, mstate, prompts, mask))
        prefill_s = _median_s(lambda: _prefill(mgraph, mstate, prompts, mask), reps)
        step_s = max(sample_s - prefill_s, 1e-12) / T
        nbytes = decode_bytes(self.cfg, B, G, self.P, T)
        bw = hbm_bandwidth(jax.devices()[0])
        out.update(
            sample_s=sample_s, sample_tok_s=B * G * T / sample_s, prefill_s=prefill_s,
            decode_step_s=step_s, decode_tok_s=B * G / step_s,
            decode_bytes_per_step=nbytes["total"], decode_param_bytes=nbytes["params"],
            decode_kv_bytes_per_step=nbytes["kv"], decode_gb_s=nbytes["total"] / step_s / 1e9,
            hbm_bw=bw, decode_roofline_frac=None if bw is None else nbytes["total"] / step_s / bw,
            decode_attention=decode_attention_impl(keys=self.P + T))
        out["peak_mem_sampling_bytes"], out["peak_mem_source"] = peak_memory(jax.devices()[0])
        return rollout

    # -- 3, 4: the update alone and the fused RL step --------------------------------------------
    def update_and_step(self, rollout, grad_accum: int, out: dict):
        B, G, P, T, reps = self.B, self.G, self.P, self.T, self.a.reps
        tx, step_cfg = self.step_setup(grad_accum)
        graphdef, state = self.fresh or self.new_state()
        self.fresh = None
        task = self.task

        def update(state, batch, rollout):
            rewards, smask = rewards_lib.in_graph_rewards(task, batch["problems"],
                                                          rollout.tokens_BGT, rollout.mask_BGT,
                                                          1)
            return step_lib.update_from_rollout(state, batch, rollout, rewards, smask,
                                                 graphdef=graphdef, tx=tx, task=task,
                                                 cfg=step_cfg)

        t0 = time.perf_counter()
        compiled = jax.jit(update, donate_argnums=0).lower(state, self.batch, rollout).compile()
        out["compile_s"]["update"] = time.perf_counter() - t0
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        xla_flops = float((cost or {}).get("flops", float("nan")))
        holder = {"state": state}
        del state

        def one_update():
            holder["state"], metrics = compiled(holder["state"], self.batch, rollout)
            return metrics

        metrics = jax.block_until_ready(one_update())  # warm-up
        if not np.isfinite(float(metrics["loss"])):
            raise RuntimeError(f"the update gave a non-finite loss: {metrics['loss']}")
        update_s = _median_s(one_update, reps)

        step = step_lib.make_rl_step(graphdef, tx, task, step_cfg)

        def one_step():
            holder["state"], metrics = step(holder["state"], self.batch)
            return metrics

        metrics, out["compile_s"]["rl_step"] = _timed(one_step)
        if int(metrics["generated_tokens"]) != B * G * T or not np.isfinite(
                float(metrics["loss"])):
            raise RuntimeError(f"RL step: {int(metrics['generated_tokens'])} tokens (expected "
                               f"{B * G * T}), loss {float(metrics['loss'])}")
        step_s = _median_s(one_step, reps)
        flops = update_flops(self.cfg, B, G, P, T)
        peak = peak_flops(jax.devices()[0])
        out.update(
            grad_accum_used=grad_accum, update_s=update_s, update_tok_s=B * G * T / update_s,
            update_seq_tok_s=B * G * (P + T) / update_s, rl_step_s=step_s,
            rl_step_tok_s=B * G * T / step_s, update_flops=flops["total"],
            update_flops_matmul=flops["matmul"], update_flops_attention=flops["attention"],
            update_tflop_s=flops["total"] / update_s / 1e12, xla_update_flops=xla_flops,
            peak_flops=peak, update_mfu=None if peak is None else flops["total"] / update_s / peak)
        holder.clear()


def parse_args(argv):
    d = DEFAULTS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default=d["preset"], choices=list(MODEL_PRESETS))
    ap.add_argument("--dtype", default=d["dtype"], choices=["bfloat16", "float32", "float16"],
                    help="param and compute dtype")
    for k in "BGPT":
        ap.add_argument(f"--{k}", type=int, default=d[k],
                        help={"B": "prompts", "G": "samples per prompt", "P": "prompt tokens",
                              "T": "new tokens per sample"}[k])
    ap.add_argument("--reps", type=int, default=d["reps"], help="timed calls per measurement")
    ap.add_argument("--grad-accum", type=int, default=d["grad_accum"],
                    help="micro-batches of the update (whole prompt groups; divides B)")
    ap.add_argument("--vocab-block", type=int, default=d["vocab_block"])
    ap.add_argument("--logprob-impl", default=d["logprob_impl"],
                    choices=["chunked", "pallas", "reference"])
    ap.add_argument("--lr", type=float, default=d["lr"])
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--allow-cpu", action="store_true",
                    help="run a model of > 50M parameters on CPU anyway (slow)")
    return ap.parse_args(argv)


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def table(res: dict) -> list[str]:
    def f(x, spec):
        return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)

    gib = 2**30
    c = res["compile_s"]
    rows = [
        ("sampling tokens/s", f(res["sample_tok_s"], ",.0f"),
         f"B*G*T / {f(res['sample_s'], '.4f')} s per call"),
        ("decode step", f(res["decode_step_s"] * 1e3, ".3f") + " ms",
         f"(call - prefill {f(res['prefill_s'] * 1e3, '.2f')} ms) / T; "
         f"{f(res['decode_tok_s'], ',.0f')} tok/s; attention {res['decode_attention']}"),
        ("decode bytes/step", _bytes(res["decode_bytes_per_step"]),
         f"params {_bytes(res['decode_param_bytes'])} + mean KV "
         f"{_bytes(res['decode_kv_bytes_per_step'])}"),
        ("decode HBM roofline", f(res["decode_roofline_frac"], ".1%"),
         f"{f(res['decode_gb_s'], ',.0f')} GB/s of "
         f"{f(res['hbm_bw'] and res['hbm_bw'] / 1e9, ',.0f')} GB/s"),
        ("RL step (fused)", f(res["rl_step_s"], ".3f") + " s",
         f"{f(res['rl_step_tok_s'], ',.0f')} completion tok/s"),
        ("update alone", f(res["update_s"], ".3f") + " s",
         f"{f(res['update_tok_s'], ',.0f')} completion tok/s, {f(res['update_seq_tok_s'], ',.0f')}"
         f" prompt+completion tok/s; grad_accum {res['grad_accum_used']}"),
        ("update FLOPs", f(res["update_flops"], ".4g"),
         f"matmul {f(res['update_flops_matmul'], '.4g')} + attention "
         f"{f(res['update_flops_attention'], '.4g')}; {f(res['update_tflop_s'], '.2f')} TFLOP/s"),
        ("update MFU", f(res["update_mfu"], ".1%"),
         f"of {f(res['peak_flops'] and res['peak_flops'] / 1e12, '.0f')} TFLOP/s dense bf16"),
        ("peak memory", f(res["peak_mem_bytes"] / gib, ".2f") + " GiB",
         f"{res['peak_mem_source']}; after sampling "
         f"{f(res['peak_mem_sampling_bytes'] / gib, '.2f')} GiB"),
        ("compile / first call", f(c.get("rl_step"), ".1f") + " s (RL step)",
         f"sampling {f(c.get('sampling'), '.1f')} s, prefill {f(c.get('prefill'), '.1f')} s, "
         f"update {f(c.get('update'), '.1f')} s, state {f(c.get('init_state'), '.1f')} s"),
    ]
    return ["| metric | value | detail |", "|---|---|---|",
            *(f"| {m} | {v} | {d} |" for m, v, d in rows)]


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    dev = jax.devices()[0]
    command = shlex.join(["python", "experiments/bench_accel.py", *argv])
    print(f"command: {command}")
    print(f"jax {jax.__version__} on {dev.platform} ({dev.device_kind}) x{jax.device_count()}")
    bench = Bench(a)
    cfg = bench.cfg
    if dev.platform == "cpu" and cfg.num_params > 50e6 and not a.allow_cpu:
        raise SystemExit(f"{a.preset} has {cfg.num_params / 1e6:.0f}M parameters: an accelerator "
                         "benchmark; on CPU use --preset tiny (or --allow-cpu)")
    if a.B % a.grad_accum:
        raise SystemExit(f"--grad-accum {a.grad_accum} must divide --B {a.B}")
    print(f"model {a.preset} ({cfg.num_params:,} params, {a.dtype}), B={a.B} G={a.G} P={a.P} "
          f"T={a.T}, reps {a.reps}", flush=True)
    res = dict(command=command, device=dev.device_kind, platform=dev.platform,
               jax=jax.__version__, preset=a.preset, dtype=a.dtype, params=cfg.num_params,
               B=a.B, G=a.G, P=a.P, T=a.T, reps=a.reps, grad_accum=a.grad_accum,
               logprob_impl=a.logprob_impl, compile_s={})
    rollout = bench.sampling(res)
    gc.collect()
    print(f"sampling {res['sample_tok_s']:,.0f} tok/s; decode step "
          f"{res['decode_step_s'] * 1e3:.3f} ms", flush=True)
    ga, done = a.grad_accum, False
    while not done:
        gc.collect()  # a failed attempt's state is garbage once its exception is gone
        try:
            bench.update_and_step(rollout, ga, res)
            done = True
        except Exception as err:  # XlaRuntimeError; only an out-of-memory is retried
            if not _is_oom(err) or a.B % (2 * ga):
                raise
            print(f"out of memory at grad_accum {ga}: retrying with {2 * ga}", flush=True)
            res.setdefault("oom_at_grad_accum", []).append(ga)
            ga *= 2
    res["peak_mem_bytes"], res["peak_mem_source"] = peak_memory(dev)
    print("\n".join(["", *table(res), ""]))
    print(json.dumps(res), flush=True)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
