"""Race the peers: vpo against HF `generate`, Tunix and TRL on the same checkpoints.

Run:  python experiments/bench_peers.py                 (three sizes, peers included when built)
      python experiments/bench_peers.py --sizes tiny --rounds 1 --no-peers      (vpo side only)
      python experiments/bench_peers.py --sizes smollm2 --rounds 1 --reps 2     (the real model)

Sizes: `tiny` and `small` are random Qwen2 checkpoints (`make_ckpt.py`); `smollm2` is the real
pretrained SmolLM2-135M-Instruct (49,152-token vocabulary, 30 layers; `make_smollm2.py`, or the
same conversion of `vpo.io.gguf.smollm2_path()`), raced against HF generate and TRL only (no Tunix
model for it), on its own shapes: B=2 prompts x G=8, a 64-token prompt budget, 64 new tokens.
For it the vpo side runs in a subprocess of its own, so that its peak resident memory can be set
against the peers' (`peak_rss_mb`, each peer script's whole process).

Workloads (the peer scripts' constants, `../shared/peers/*.py`):
  * sampling: B=8 prompts x G=8 samples, P=32 prompt tokens (the Tunix scripts' random strings over
    "abcdefghij", through the checkpoint's tokenizer), exactly T=64 new tokens at temperature 1
    (vpo: a stop id no token takes, vocab_size, so no sequence stops early); warm generated
    tokens/s.
  * GRPO step: B=8 x G=8, T=64, one optimiser update per batch, no KL, reward = fraction of
    completion tokens that are "a" (the peers' string reward, computed on token ids in-graph);
    vpo runs `vpo.rl.step.make_rl_step` (sample -> reward -> advantages -> update, one jit, state
    donated); seconds per step.
  * VPO advantage: B=128 G=8 M=3 R=5 K=100, `experiments/bench_advantages.py` (exact Dirichlet(1)
    and lattice weights) against the peers' NumPy loop.

The checkpoints (`make_ckpt.py`) are loaded through `vpo.io.hf.from_pretrained`. When the peer venvs
exist (`../shared/peers/venvs.sh all`), every round runs vpo and then each peer script as a
subprocess (same machine load, interleaved), and the table shows medians over rounds of each
side's median over repetitions; compile / first-call times are reported separately. The speed
ratio is vpo speed / peer speed (tokens/s ratio, or peer s/step / vpo s/step): > 1 means vpo is
faster. No assertions: the script prints measurements.
Environment: VPO_PEERS_DIR, VPO_VENVS, VPO_PEER_CKPTS override the default locations.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import resource
import statistics
import subprocess
import sys
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vpo.config import ObjectiveConfig, SamplerConfig, TrainConfig
from vpo.io import hf
from vpo.io.tokenizer import left_pad
from vpo.model import sharding
from vpo.rl import step as step_lib
from vpo.rl.host_memory import compile_now, keep_freed_memory_for
from vpo.rollout import rewards as rewards_lib
from vpo.rollout.slots import sample_with_keys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import bench_advantages  # noqa: E402
from ab_tiny_step import sign_test_ci  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
TMP = pathlib.Path(os.environ.get("TMPDIR", "/tmp"))
PEERS = pathlib.Path(os.environ.get("VPO_PEERS_DIR", REPO.parent / "shared" / "peers"))
VENVS = pathlib.Path(os.environ.get("VPO_VENVS", TMP / "vpo-venvs"))
CKPTS = pathlib.Path(os.environ.get("VPO_PEER_CKPTS", TMP / "vpo-peer"))
SHAPES = {"tiny": (8, 8, 32, 64), "small": (8, 8, 32, 64),  # B, G, P, T of each size
          "smollm2": (2, 8, 64, 64)}
B, G, P, T = SHAPES["tiny"]  # the two random sizes and their peers' defaults
GOALS = {  # (workload, size) -> (peers, required speed ratio vpo / fastest listed peer)
    ("sampling", "tiny"): [("hf_generate", 3.0), ("tunix_sampler", 2.0)],
    ("sampling", "small"): [("hf_generate", 3.0), ("tunix_sampler", 1.3)],
    ("grpo_step", "tiny"): [("trl|tunix", 3.0)],
    ("grpo_step", "small"): [("trl|tunix", 1.3)],
    ("sampling", "smollm2"): [("hf_generate", 3.0)],
    ("grpo_step", "smollm2"): [("trl", 2.0)],  # step <= 1/2 of TRL's time
    ("step_memory", "smollm2"): [("trl", 2.0)],  # peak memory <= 1/2 of TRL's
    ("vpo_advantage", "-"): [("vpo_numpy_loop", 50.0)],
}
# Dense bf16 peak FLOP/s for the MFU line on accelerators (by jax device_kind substring).
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "v5e": 197e12, "v5p": 459e12,
              "v6e": 918e12, "v4": 275e12}


def get_config() -> dict:
    return dict(sizes=("tiny", "small", "smollm2"), rounds=3, sample_reps=5, step_reps=5,
                dtype="float32")


# ---------------------------------------------------------------------------------------------
# the vpo side


def prompt_strings(num: int, length: int = P) -> list[str]:
    """The peers' prompts: random strings over "abcdefghij" of `length` characters, seed 0."""
    rnd = random.Random(0)
    return ["".join(rnd.choice("abcdefghij") for _ in range(length)) for _ in range(num)]


def encode_prompts(tok, texts: list[str], length: int = P) -> tuple[np.ndarray, np.ndarray]:
    ids = [tok.encode(t) for t in texts]
    return left_pad(ids, length, tok.pad_id, truncate=True)


class CountATask(NamedTuple):
    """GRPO benchmark task on a checkpoint's own token ids: reward = fraction of the completion's
    tokens that are `a_id` (the peers' `c.count("a") / len(c)`), R = 1, one answer. It has
    exactly the attributes the in-graph RL step reads from a `vpo.tasks.bound.BoundTask`; it has
    no demonstrations or mutation prompts (it only times the step)."""

    a_id: int
    tokenizer: object
    name: str = "count_a"
    reward_names: tuple[str, ...] = ("frac_a",)
    eval_weights_R: np.ndarray = np.ones((1,), np.float32)

    def reward(self, problem, completion_T, mask_T, num_answers: int):
        del problem, num_answers
        n = jnp.maximum(mask_T.sum(), 1)
        frac = jnp.sum((completion_T == self.a_id) & mask_T) / n
        return frac.reshape(1, 1).astype(jnp.float32), jnp.ones((1,), bool)

    def solved(self, rewards_R):
        return rewards_R[0] >= 0.5

    def __hash__(self):  # a static jit argument: hashed by identity
        return id(self)

    def __eq__(self, other):
        return self is other


def _rss_mb() -> float:
    """This process's resident memory now (MB, /proc/self/statm; NaN where there is none)."""
    try:
        return int(pathlib.Path("/proc/self/statm").read_text().split()[1]) * os.sysconf(
            "SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return float("nan")


def _timed(fn):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t0


class VpoSize:
    """One checkpoint loaded through `vpo.io.hf`, with its compiled sampling call and RL step."""

    def __init__(self, size: str, dtype: str, remat: bool = False, scan_layers: bool = False):
        self.size = size
        self.B, self.G, self.P, self.T = SHAPES[size]
        self.remat = remat
        folder = CKPTS / size
        self.model = hf.from_pretrained(folder, dtype=dtype, scan_layers=scan_layers)
        self.tok = hf.load_tokenizer(folder)
        self.prompts_BP, self.mask_BP = encode_prompts(
            self.tok, prompt_strings(self.B, self.P), self.P)
        self.cfg = SamplerConfig(max_new_tokens=self.T, num_samples=self.G, temperature=1.0)
        # a stop id no token takes (ids are < vocab_size): every sample generates exactly T tokens
        self.no_eos = self.model.cfg.vocab_size
        self.compile_s: dict[str, float] = {}
        self.calls = 0
        self._build_step()

    # -- sampling -------------------------------------------------------------------------------
    def _sample(self):
        self.calls += 1
        B, G = self.B, self.G
        keys = jax.random.split(jax.random.key(self.calls), B * G).reshape(B, G)
        model = step_lib.model_of(self.graphdef, self.state)  # the state's own weights
        return sample_with_keys(model, self.prompts_BP, self.mask_BP, keys, self.cfg,
                                stop_ids=(self.no_eos,), pad_id=self.tok.pad_id)

    def sampling(self, reps: int) -> float:
        """Median warm generated tokens/s over `reps` calls (first call: compile, reported)."""
        B, G, T = self.B, self.G, self.T
        if "sampling" not in self.compile_s:
            rollout, self.compile_s["sampling"] = _timed(self._sample)
            n = int(rollout.mask_BGT.sum())
            if n != B * G * T:
                raise RuntimeError(f"vpo sampled {n} tokens, expected exactly {B * G * T}")
        return B * G * T / statistics.median(_timed(self._sample)[1] for _ in range(reps))

    # -- GRPO step ------------------------------------------------------------------------------
    def _build_step(self):
        a_id = self.tok.encode("a")[0]
        B = self.B
        prompts, pmask = self.prompts_BP, self.mask_BP
        self.task = CountATask(a_id, self.tok)
        tcfg = TrainConfig(batch_size=B, num_answers=1, learning_rate=1e-5, steps=10**6,
                           remat=self.remat)
        self.step_cfg = step_lib.StepConfig(self.cfg, ObjectiveConfig(advantage="grpo"), tcfg,
                                             stop_ids=(self.no_eos,), pad_id=self.tok.pad_id)
        self.tx = step_lib.make_optimizer(tcfg)
        self.mesh = sharding.make_mesh(devices=jax.devices()[:1])
        # the state takes the loaded weights (`vpo train` does the same): not held twice
        self.model_cfg = self.model.cfg
        self.graphdef, self.state, _ = step_lib.state_from_model(self.model, self.tx, self.mesh,
                                                                  consume=True)
        self.model = None
        self.batch = dict(problems={"task": jnp.zeros((B,), jnp.int32)},
                          prompt_BP=jnp.asarray(prompts), prompt_mask_BP=jnp.asarray(pmask))
        self.step_jit = step_lib.make_rl_step(self.graphdef, self.tx, self.task, self.step_cfg)
        self.step = None  # compiled on the first call, as `vpo train` does (`compile_now`)

    def _one_step(self):
        if self.step is None:
            self.rss_before_step = _rss_mb()
            self.step = compile_now(self.step_jit, self.state, self.batch)
        self.state, metrics = self.step(self.state, self.batch)
        return metrics

    def step_memory(self) -> dict:
        """Where the step's memory goes (MB), after `grpo_step`: the donated train state by part,
        the compiled step's XLA temporaries (gradients, activations, log-prob tiles) and the
        process's resident memory just before the first step (runtime, state, loader leftovers)."""
        mb = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree)) / 2**20  # noqa: E731
        return dict(params=mb(self.state.params), opt_state=mb(self.state.opt_state),
                    temp=self.step.memory_analysis().temp_size_in_bytes / 2**20,
                    rss_before_step=self.rss_before_step)

    def grpo_step(self, reps: int) -> float:
        """Median seconds per fused RL step (sample -> reward -> GRPO advantage -> one update)."""
        if "grpo_step" not in self.compile_s:
            metrics, self.compile_s["grpo_step"] = _timed(self._one_step)
            if not np.isfinite(float(metrics["loss"])):
                raise RuntimeError(f"vpo GRPO step gave a non-finite loss: {metrics['loss']}")
        return statistics.median(_timed(self._one_step)[1] for _ in range(reps))

    def step_split(self, reps: int) -> dict:
        """Where a step's time goes: the sampling jit alone and the update jit alone (reward,
        advantages, training forward/backward, optimiser), plus the update's XLA FLOP count."""
        sample = step_lib.make_sample_step(self.graphdef, self.step_cfg)
        task, cfg, graphdef, tx = self.task, self.step_cfg, self.graphdef, self.tx

        @jax.jit
        def update(state, batch, rollout):
            rewards, smask = rewards_lib.in_graph_rewards(task, batch["problems"],
                                                        rollout.tokens_BGT, rollout.mask_BGT, 1)
            return step_lib.update_from_rollout(state, batch, rollout, rewards, smask,
                                                 graphdef=graphdef, tx=tx, task=task, cfg=cfg)

        rollout = jax.block_until_ready(sample(self.state, self.batch))
        compiled = update.lower(self.state, self.batch, rollout).compile()
        jax.block_until_ready(compiled(self.state, self.batch, rollout))
        t_sample = statistics.median(
            _timed(lambda: sample(self.state, self.batch))[1] for _ in range(reps))
        t_update = statistics.median(
            _timed(lambda: compiled(self.state, self.batch, rollout))[1] for _ in range(reps))
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        return dict(sample_s=t_sample, update_s=t_update, update_flops=float(cost["flops"]))


# ---------------------------------------------------------------------------------------------
# the peers (subprocesses in their own venvs)


def peers_available(size: str = "tiny") -> bool:
    """The venvs a size's peers need (SmolLM2: the hf venv only) and the peer scripts."""
    venvs = ("hf",) if size == "smollm2" else ("hf", "tunix", "jax")
    return all((VENVS / v / ".ok").exists() for v in venvs) and PEERS.is_dir()


def ensure_checkpoint(size: str) -> None:
    if (CKPTS / size / "config.json").exists():
        return
    if not (VENVS / "hf" / ".ok").exists():
        raise SystemExit(f"no checkpoint at {CKPTS / size} and no hf venv to make one; run "
                         f"bash {PEERS / 'venvs.sh'} all (or set VPO_PEER_CKPTS)")
    make = (["make_smollm2.py"] if size == "smollm2" else ["make_ckpt.py", "--size", size])
    subprocess.run([str(VENVS / "hf/bin/python"), str(PEERS / make[0]), *make[1:],
                    "--out", str(CKPTS / size)], check=True, capture_output=True)


def shape_flags(size: str) -> list[str]:
    return [x for k, v in zip("BGPT", SHAPES[size], strict=True) for x in (f"--{k}", str(v))]


def _run_peer(venv: str, script: str, *args: str, env: dict | None = None) -> dict:
    cmd = [str(VENVS / venv / "bin/python"), str(PEERS / script), *args]
    # torch's OpenMP threads spin while they wait for each other; on 2 cores shared with other
    # processes one of them is often descheduled and the other burns its slice spinning (HF
    # generate measured 6 tok/s that way, ~57 tokens per CPU-second otherwise): threads that
    # sleep instead of spinning, as XLA's do.
    full_env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0", **(env or {})}
    for k in ("XLA_FLAGS", "JAX_PLATFORMS"):  # ours must not leak into the peer's process
        if k not in (env or {}):
            full_env.pop(k, None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{") and '"peer"' in ln]
    if proc.returncode or not lines:
        raise RuntimeError(f"peer {script} failed (rc {proc.returncode}): {proc.stderr[-800:]}")
    return json.loads(lines[-1])


def peer_sampling(size: str, reps: int) -> dict:
    """name -> (tokens/s, first-call s, peak resident MB of the peer's process)."""
    ck = str(CKPTS / size)
    out = {}
    r = _run_peer("hf", "hf_generate.py", "--ckpt", ck, *shape_flags(size), "--reps", str(reps))
    out["hf_generate"] = (r["tok_per_s_median"], r["first_s"], r["peak_rss_mb"])
    if size == "smollm2":  # no Tunix model for the Llama-architecture checkpoint
        return out
    r = _run_peer("tunix", "tunix_sample.py", "--ckpt", ck, env={"JAX_PLATFORMS": "cpu"})
    out["tunix_sampler"] = (r["tok_per_s_median"], r["first_s"], r.get("peak_rss_mb"))
    return out


def peer_grpo(size: str) -> dict:
    """Seconds per step: TRL's median step; Tunix's (train 6 steps - train 2 steps) / 4.
    name -> (s/step, first/total s, peak resident MB)."""
    ck = str(CKPTS / size)
    steps = "3" if size == "smollm2" else "6"  # TRL times the steps after the first
    r = _run_peer("hf", "trl_grpo.py", "--ckpt", ck, "--steps", steps, *shape_flags(size))
    out = {"trl_grpo": (r["median_step_s"], r["total_s"], r["peak_rss_mb"])}
    if size == "smollm2":
        return out
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    t = {n: _run_peer("tunix", "tunix_grpo.py", "--ckpt", ck, "--steps", str(n), env=env)
         for n in (2, 6)}
    out["tunix_grpo"] = ((t[6]["train_s"] - t[2]["train_s"]) / 4, t[2]["train_s"],
                         t[6].get("peak_rss_mb"))
    return out


def vpo_worker(size: str, dtype: str, reps: int, part: str) -> dict:
    """The vpo side of one size in this process, `part` "sampling" or "step", with the
    process's peak resident memory (`peak_rss_mb`). The step's process keeps freed memory as
    `vpo train` does (`vpo.rl.host_memory.keep_freed_memory_for`, set in `main`); sampling runs as
    `vpo sample` does, without it (one malloc arena costs sampling ~5% here)."""
    v = VpoSize(size, dtype)
    out = v.sampling(reps) if part == "sampling" else v.grpo_step(reps)
    breakdown = None if part == "sampling" else v.step_memory()
    return dict(vpo_worker=size, part=part, value=out, compile=v.compile_s, breakdown=breakdown,
                peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def run_vpo_worker(size: str, dtype: str, reps: int, part: str) -> dict:
    cmd = [sys.executable, __file__, "--vpo-worker", size, "--part", part, "--dtype", dtype,
           "--reps", str(reps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"vpo_worker"')]
    if proc.returncode or not lines:
        raise RuntimeError(f"vpo worker for {size} {part} failed (rc {proc.returncode}): "
                           f"{proc.stderr[-800:]}")
    return json.loads(lines[-1])


def peer_numpy_loop() -> float:
    return _run_peer("jax", "vpo_numpy_loop.py")["median_ms"]


# ---------------------------------------------------------------------------------------------
# the run and the table


def _med(xs):
    return statistics.median(xs) if xs else float("nan")


def run(cfg: dict, with_peers: bool) -> dict:
    res: dict = {"vpo": {}, "peer": {}, "compile": {}, "split": {}, "memory": {},
                 "breakdown": {}}

    def add(d, key, v):  # record, and print at once (a long run shows its progress)
        d.setdefault(key, []).append(v)
        side = "vpo" if d is res["vpo"] else "peer"
        print(f"  {side} {key[0]} {key[1]}: {v:.4g} (load {os.getloadavg()[0]:.1f})", flush=True)
    for size in cfg["sizes"]:
        ensure_checkpoint(size)
        if size == "smollm2":
            run_smollm2(cfg, with_peers and peers_available(size), res, add)
            continue
        v = VpoSize(size, cfg["dtype"])
        for r in range(cfg["rounds"]):
            add(res["vpo"], ("sampling", size), v.sampling(cfg["sample_reps"]))
            add(res["vpo"], ("grpo_step", size), v.grpo_step(cfg["step_reps"]))
            if with_peers and peers_available(size):
                for name, (x, first, _) in peer_sampling(size, 5).items():
                    add(res["peer"], (name, size), x)
                    res["compile"].setdefault((name, size), first)
                for name, (x, first, _) in peer_grpo(size).items():
                    add(res["peer"], (name, size), x)
                    res["compile"].setdefault((name, size), first)
            print(f"  [{size} round {r + 1}/{cfg['rounds']} done]", flush=True)
        for k, s in v.compile_s.items():
            res["compile"][(f"vpo_{k}", size)] = s
        res["split"][size] = v.step_split(cfg["step_reps"])
    for _ in range(cfg["rounds"]):
        adv = bench_advantages.main(dict(bench_advantages.get_config(), reps=15))
        add(res["vpo"], ("vpo_advantage_iid", "-"), adv["iid"]["ms"])
        add(res["vpo"], ("vpo_advantage_lattice", "-"), adv["lattice"]["ms"])
        add(res["peer"], ("numpy_loop_inprocess", "-"), adv["numpy_ms"])
        if with_peers and peers_available():
            add(res["peer"], ("vpo_numpy_loop", "-"), peer_numpy_loop())
    return res


def run_smollm2(cfg: dict, with_peers: bool, res: dict, add) -> None:
    """SmolLM2-135M: per round the vpo side in its own process, then HF generate and TRL."""
    size = "smollm2"
    for r in range(cfg["rounds"]):
        for part, key in (("sampling", "sampling"), ("step", "grpo_step")):
            w = run_vpo_worker(size, cfg["dtype"], cfg["sample_reps"], part)
            add(res["vpo"], (key, size), w["value"])
            res["memory"].setdefault((f"vpo_{key}", size), []).append(w["peak_rss_mb"])
            for k, s in w["compile"].items():
                res["compile"].setdefault((f"vpo_{k}", size), s)
            if w["breakdown"]:
                res["breakdown"][size] = w["breakdown"]
        if with_peers:
            for name, (x, first, mb) in [*peer_sampling(size, cfg["sample_reps"]).items(),
                                         *peer_grpo(size).items()]:
                add(res["peer"], (name, size), x)
                res["compile"].setdefault((name, size), first)
                res["memory"].setdefault((name, size), []).append(mb)
        print(f"  [{size} round {r + 1}/{cfg['rounds']} done]", flush=True)


def memory_rows(res: dict) -> list[str]:
    """Peak resident memory (MB) of each process that measured a SmolLM2 workload."""
    mem = {k: _med(x) for k, x in res["memory"].items()}
    rows = []
    for work, ours, theirs, goal in (("sampling", "vpo_sampling", "hf_generate", None),
                                     ("grpo step", "vpo_grpo_step", "trl_grpo", 2.0)):
        if (ours, "smollm2") in mem and (theirs, "smollm2") in mem:
            a, b = mem[(ours, "smollm2")], mem[(theirs, "smollm2")]
            met = "" if goal is None else ("yes" if b / a >= goal else "NO")
            want = "" if goal is None else f">= {goal}x"
            rows.append(f"| peak memory, {work} | smollm2 | {a:,.0f} MB | {theirs} | {b:,.0f} MB "
                        f"| {b / a:.2f}x (peer/vpo MB) | | {want} | {met} |")
        elif (ours, "smollm2") in mem:
            rows.append(f"| peak memory, {work} | smollm2 | {mem[(ours, 'smollm2')]:,.0f} MB | "
                        f"(peers not run) | | | | | |")
    return rows


def memory_breakdown_line(res: dict) -> str | None:
    """Where vpo's SmolLM2 step memory goes, against the f32 AdamW floor and the goal's budget:
    parameters, their gradients and two moments must all exist at the update."""
    bd = res["breakdown"].get("smollm2")
    if not bd:
        return None
    floor = 2 * bd["params"] + bd["opt_state"]
    peak = _med(res["memory"].get(("vpo_grpo_step", "smollm2"), []))
    line = (f"vpo smollm2 step memory (MB): peak {peak:,.0f} = resident before the step "
            f"{bd['rss_before_step']:,.0f} (runtime, params {bd['params']:,.0f}, AdamW moments "
            f"{bd['opt_state']:,.0f}) + XLA temporaries {bd['temp']:,.0f} (gradients "
            f"{bd['params']:,.0f}, activations, log-prob tiles); the f32 AdamW floor, params + "
            f"gradients + moments, is {floor:,.0f}")
    trl = res["memory"].get(("trl_grpo", "smollm2"))
    if trl:
        budget = _med(trl) / 2
        line += f" = {floor / budget:.0%} of the goal's budget (TRL's peak / 2 = {budget:,.0f})"
    return line


def round_ratios(ours: list[float], theirs: list[float], *, time: bool) -> str:
    """The speed ratio of each round (vpo's and the peer's figure of the same round), as
    "median [95% sign-test interval]"; rounds are paired, so the machine's drift between rounds
    cancels. Needs >= 6 rounds for a 95% interval."""
    if len(ours) != len(theirs) or len(ours) < 2:
        return ""
    r = [b / a if time else a / b for a, b in zip(ours, theirs, strict=True)]
    med, (lo, hi) = sign_test_ci(r)
    return f"{med:.2f}x [{lo:.2f}, {hi:.2f}]" if lo == lo else f"{med:.2f}x (< 6 rounds)"


def table(res: dict) -> list[str]:
    vpo = {k: _med(x) for k, x in res["vpo"].items()}
    peer = {k: _med(x) for k, x in res["peer"].items()}
    rows = ["| workload | size | vpo | peer | peer value | speed ratio vpo/peer | per round "
            "| goal | met |", "|---|---|---|---|---|---|---|---|---|"]

    def row(work, vkey, pkey, unit, fmt, goal, label=None):
        """One comparison; a time (unit "s"/"ms") is faster when smaller."""
        x, p, time = vpo[vkey], peer[pkey], unit != "tok/s"
        ratio = p / x if time else x / p
        met = "" if goal is None or ratio != ratio else ("yes" if ratio >= goal else "NO")
        rounds = round_ratios(res["vpo"][vkey], res["peer"][pkey], time=time)
        size = vkey[1] if vkey[1] != "-" else "B128 G8 M3 R5 K100"
        rows.append(f"| {work} | {size} | {x:{fmt}} {unit} | {label or pkey[0]} | {p:{fmt}} "
                    f"{unit} | {ratio:.2f}x | {rounds} | {'' if goal is None else f'>= {goal}x'}"
                    f" | {met} |")

    for size in SHAPES:
        if ("sampling", size) in vpo:
            for pname, goal in GOALS[("sampling", size)]:
                if (pname, size) in peer:
                    row("sampling", ("sampling", size), (pname, size), "tok/s", ",.0f", goal)
            if not any((p, size) in peer for p, _ in GOALS[("sampling", size)]):
                rows.append(f"| sampling | {size} | {vpo[('sampling', size)]:,.0f} tok/s | "
                            "(peers not run) | | | | | |")
        if ("grpo_step", size) in vpo:
            goal = GOALS[("grpo_step", size)][0][1]
            peers = {n: peer[(n, size)] for n in ("trl_grpo", "tunix_grpo") if (n, size) in peer}
            for n in peers:
                row("grpo step", ("grpo_step", size), (n, size), "s", ".3f", None)
            if peers:
                n = min(peers, key=peers.get)
                row("grpo step", ("grpo_step", size), (n, size), "s", ".3f", goal,
                    label=f"faster ({n})")
            else:
                rows.append(f"| grpo step | {size} | {vpo[('grpo_step', size)]:.3f} s | "
                            "(peers not run) | | | | | |")
    for name in ("vpo_advantage_iid", "vpo_advantage_lattice"):
        if (name, "-") in vpo:
            for pname in ("vpo_numpy_loop", "numpy_loop_inprocess"):
                if (pname, "-") in peer:
                    goal = 50.0 if name.endswith("iid") and pname == "vpo_numpy_loop" else None
                    row(name.replace("_", " "), (name, "-"), (pname, "-"), "ms", ".3f", goal)
    return rows + memory_rows(res)


def main(argv=None):
    cfg = get_config()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=list(cfg["sizes"]), choices=list(SHAPES))
    ap.add_argument("--rounds", type=int, default=cfg["rounds"])
    ap.add_argument("--reps", type=int, default=cfg["sample_reps"])
    ap.add_argument("--dtype", default=cfg["dtype"], help="vpo param/compute dtype")
    ap.add_argument("--no-peers", action="store_true", help="vpo side only")
    ap.add_argument("--json", help="also write the raw measurements here")
    ap.add_argument("--vpo-worker", choices=list(SHAPES), help=argparse.SUPPRESS)
    ap.add_argument("--part", choices=("sampling", "step"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.vpo_worker:  # one size's vpo side in this process (its peak memory): one JSON line
        if a.part is None:
            ap.error("--vpo-worker needs --part sampling|step")
        if a.part == "step":  # as `vpo train` runs: before jax starts its threads
            keep_freed_memory_for(hf.model_config(hf.read_config(CKPTS / a.vpo_worker)).num_params)
        print(json.dumps(vpo_worker(a.vpo_worker, a.dtype, a.reps, a.part)), flush=True)
        return None
    cfg.update(sizes=tuple(a.sizes), rounds=a.rounds, sample_reps=a.reps, step_reps=a.reps,
               dtype=a.dtype)
    with_peers = not a.no_peers
    if with_peers and not all(peers_available(s) for s in cfg["sizes"]):
        print(f"peer venvs not found under {VENVS} (run bash {PEERS / 'venvs.sh'} all): "
              "vpo side only where they are missing")
    dev = jax.devices()[0]
    print(f"jax {jax.__version__} on {dev.platform} ({dev.device_kind}) x{jax.device_count()}; "
          f"load {os.getloadavg()[0]:.2f} at start; B G P T: {SHAPES}", flush=True)
    res = run(cfg, with_peers)
    print("\n".join(["", *table(res), ""]))
    if (line := memory_breakdown_line(res)) is not None:
        print(line)
    print("compile / first call (s): " + ", ".join(
        f"{n} {s}: {t:.1f}" for (n, s), t in sorted(res["compile"].items())))
    for size, sp in res["split"].items():
        step = _med(res["vpo"][("grpo_step", size)])
        line = (f"vpo {size} step split: sampling {sp['sample_s']:.3f} s, update (reward + "
                f"advantage + forward/backward + AdamW) {sp['update_s']:.3f} s, fused step "
                f"{step:.3f} s; update {sp['update_flops']:.3g} FLOPs = "
                f"{sp['update_flops'] / sp['update_s'] / 1e9:.1f} GFLOP/s")
        peak = next((f for k, f in PEAK_FLOPS.items() if k in dev.device_kind), None)
        if peak and dev.platform != "cpu":
            line += f", MFU {sp['update_flops'] / sp['update_s'] / peak:.1%} of bf16 peak"
        print(line)
    print(f"load {os.getloadavg()[0]:.2f} at end (uptime 1-min average)")
    if a.json:
        flat = {k: d if k in ("split", "breakdown") else
                {f"{n}|{s}": v for (n, s), v in d.items()} for k, d in res.items()}
        pathlib.Path(a.json).write_text(json.dumps(flat, indent=1))
    return res


if __name__ == "__main__":
    main()
