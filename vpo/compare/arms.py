"""The RL stage of `vpo compare`: every arm and seed trained from the one warm start
(`train_arms`), each run the `vpo train --init <warm start> <overrides>` run its arm names
(`arm_changes` → `arm_run_config` through `vpo.launch.assemble`; `arm_overrides` and
`train_command` render it, recorded in the run's folder), and the entropy-law trajectory of
its checkpoints (`law_trajectory`). Finished runs of an interrupted comparison are read back
(`vpo.compare.resume`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from vpo.compare import data as compare_data
from vpo.compare import resume as compare_resume
from vpo.compare.config import ARMS, CompareConfig
from vpo.config import RunConfig
from vpo.eval import policies as policy_eval
from vpo.io import run_checkpoint
from vpo.launch.assemble import assemble_config, load_init
from vpo.model import sharding
from vpo.rl.step import model_of
from vpo.run.loop import train
from vpo.run.run_folder import policy_complete, write_json_atomic


@dataclasses.dataclass
class ArmRun:
    """One trained (arm, seed): its run folder, final policy, per-step training metrics and
    the entropy-law trajectory (held-out score at each checkpoint)."""

    arm: str
    seed: int
    num_answers: int
    out_dir: str
    model: Any
    metrics: list[dict[str, float]]
    law: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0  # training + entropy-law scoring


def _copy(model):
    """The same policy on fresh buffers (the trainer donates its state; the warm start is
    shared by several runs)."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(jax.numpy.copy, state))


def arm_changes(cfg: CompareConfig, task, arm: str, seed: int, max_seq_len: int
                ) -> dict[str, Any]:
    """The typed changes of one arm and seed to `RunConfig`'s defaults, {"section.key": value}:
    the task, every shared train / sampler / objective field that differs from the default (the
    learning rate always: the comparison sets it), then the arm's own changes (`ARMS`), its
    seed, m, mutation parents, answer budget `task.completion_len(m)` and the warm start's
    `max_seq_len`; with `law_points` the run checkpoints that many times (and keeps them all)."""
    spec, m = ARMS[arm], cfg.arm_answers(arm)
    train = {**dataclasses.asdict(cfg.train), **spec.train, "seed": seed, "num_answers": m,
             "mutation_parents": cfg.search.parents}
    if cfg.law_points:
        train |= {"checkpoint_every": cfg.train.steps // cfg.law_points,
                  "keep_checkpoints": cfg.law_points + 1}
    sections = {"train": train,
                "sampler": {**dataclasses.asdict(cfg.sampler),
                            "max_new_tokens": task.completion_len(m)},
                "objective": {**dataclasses.asdict(cfg.objective), **spec.objective}}
    default = RunConfig()
    out: dict[str, Any] = {"task": cfg.task, **compare_data.run_changes(cfg),
                           "model.max_seq_len": max_seq_len}
    if cfg.lora_rank:
        out["model.lora_rank"] = cfg.lora_rank
    always = ("sampler.max_new_tokens", "train.learning_rate")
    for section, fields in sections.items():
        base = dataclasses.asdict(getattr(default, section))
        out |= {f"{section}.{key}": value for key, value in fields.items()
                if value != base[key] or f"{section}.{key}" in always}
    mesh = -1 if cfg.devices == -1 else cfg.devices
    return out | ({"mesh_data": mesh} if mesh != default.mesh_data else {})


def arm_overrides(changes: dict[str, Any]) -> list[str]:
    """`arm_changes` as the arguments of the equivalent `vpo train` command: `section.key=value`
    strings (a dict value as JSON), after the --data flags of a run on your data
    (`compare_data.flags`)."""
    data = changes.get("task_kwargs") if changes.get("task") == "dataset" else None
    return ((compare_data.flags(data) if data else [])
            + [f"{key}={json.dumps(value) if isinstance(value, dict) else value}"
               for key, value in changes.items()
               if not (data and key in ("task", "task_kwargs"))])


def _with_changes(run: RunConfig, changes: dict[str, Any]) -> RunConfig:
    """`run` with typed {"section.key": value} changes (a top-level field has no section)."""
    top = {k: v for k, v in changes.items() if "." not in k}
    sections: dict[str, dict[str, Any]] = {}
    for key, value in changes.items():
        if "." in key:
            section, field = key.split(".", 1)
            sections.setdefault(section, {})[field] = value
    return dataclasses.replace(run, **top, **{
        section: dataclasses.replace(getattr(run, section), **fields)
        for section, fields in sections.items()})


def arm_run_config(cfg: CompareConfig, task, arm: str, seed: int, init_spec: str,
                   policy) -> tuple[RunConfig, list[str]]:
    """(RunConfig, overrides) of one arm and seed: the run `vpo train --init init_spec
    <overrides>` starts, assembled from typed changes by `vpo.launch.assemble.assemble_config`
    with the task the comparison assembled once, and `load_init` on the warm start `policy`
    already in memory (its config, with the run's LoRA settings and sequence length)."""
    changes = arm_changes(cfg, task, arm, seed, policy.cfg.max_seq_len)
    plan = assemble_config(_with_changes(RunConfig(), changes), frozenset(changes),
                           init_spec=init_spec, task=task)
    _, run, _ = load_init(plan, policy=policy)
    return run, arm_overrides(changes)


def train_command(init_spec: str, path: str, overrides: list[str]) -> str:
    """The `vpo train` command line that trains the same run as an arm of `vpo compare`."""
    return shlex.join(["vpo", "train", "--init", init_spec, "--out", path, *overrides])


def _law_score(cfg: CompareConfig, task, model, m: int) -> float:
    """Held-out evaluation score (mean w*ᵀr per candidate, i.e. best@1) on the law problems at
    the evaluation temperature, with the same key for every policy and checkpoint."""
    records = task.make_problems(cfg.eval_seed + 1, cfg.law_problems)
    return policy_eval.evaluate_policy(
        model, task, records, num_answers=m, budget=cfg.law_budget, ks=[1],
        key=jax.random.key(cfg.eval_seed + 1), temperature=cfg.eval_temperature)["best@1"]


def law_trajectory(cfg: CompareConfig, task, path: str, graphdef, state, metrics,
                   start_score: float, m: int) -> dict[str, list[float]]:
    """(step, H, R) at step 0 and every checkpoint of a run: H = mean token entropy of the
    training rollouts of the last (up to) 10 steps before it (step 0: the first step's, drawn
    from the warm start), R = `_law_score` of the checkpoint's policy."""
    mngr = run_checkpoint.CheckpointManager(os.path.join(path, "checkpoints"),
                                            keep=cfg.law_points + 1)
    H = np.array([r["entropy"] for r in metrics], float)
    out = {"step": [0], "entropy": [float(H[0])], "score": [start_score]}
    try:
        for s in mngr.all_steps():
            restored, _ = mngr.restore(state, step=s)
            out["step"].append(s)
            out["entropy"].append(float(H[max(0, s - 10):s].mean()))
            out["score"].append(_law_score(cfg, task, model_of(graphdef, restored), m))
    finally:
        mngr.close()
    return out


def train_arms(cfg: CompareConfig, task, policy, out_dir: str, log=print,
               resume: bool = False, progress: bool = False,
               on_pilot=None) -> dict[str, list[ArmRun]]:
    """RL for every arm and seed from the warm start → {arm: [ArmRun per seed]}, seed by seed:
    once the first seed of every arm has trained, `on_pilot(runs)` sees those runs (the
    diversity pilot, `vpo.compare.gate.diversity_pilot`) before the other seeds start.

    `resume`: finished runs of an interrupted comparison are read back
    (`vpo.compare.resume.read_arm_run`); an
    unfinished one continues from its last checkpoint (`loop.train(resume=True)`, which
    continues exactly as the uninterrupted run would), or is redone if it had finished
    training but not its entropy-law scores."""
    devices = jax.devices() if cfg.devices == -1 else jax.devices()[:cfg.devices]
    mesh = sharding.make_mesh(devices=devices)
    runs: dict[str, list[ArmRun]] = {}
    start_scores: dict[int, float] = {}
    sft = os.path.join(out_dir, "sft")  # the warm start, or the init policy when it parsed
    init_spec = os.path.abspath(sft) if policy_complete(sft) else cfg.init
    total, done, t_all = len(cfg.arm_names) * cfg.num_seeds, 0, time.perf_counter()
    train_task = compare_data.training(task)  # RL rows: your data's training part
    programs: dict = {}  # each arm's step compiled once, reused by its other seeds
    for arm in cfg.arm_names:
        m = cfg.arm_answers(arm)
        if cfg.law_points and m not in start_scores:
            start_scores[m] = _law_score(cfg, task, policy, m)
    for i, seed in enumerate(cfg.seeds):  # seed by seed: the first seed of every arm is a pilot
        for arm in cfg.arm_names:
            m = cfg.arm_answers(arm)
            path = os.path.join(out_dir, "arms", arm, f"seed{seed}")
            run, overrides = arm_run_config(cfg, train_task, arm, seed, init_spec, policy)
            earlier = (compare_resume.read_arm_run(path, policy.cfg.max_seq_len)
                       if resume else None)
            if earlier is not None:
                model, rows, record = earlier
                runs.setdefault(arm, []).append(ArmRun(arm, seed, m, path, model, rows,
                                                       record["law"], record["seconds"]))
                total -= 1
                log(f"  {arm} seed {seed}: resumed (finished earlier, {record['seconds']:.0f} s)")
                continue
            compare_resume.clear_arm(path, resume=resume)
            t0 = time.perf_counter()
            graphdef, state = train(run, path, resume=resume, task=train_task, mesh=mesh,
                                    progress=progress, init=_copy(policy),
                                    bar_label=f"{arm} seed {seed}", programs=programs)
            rows = compare_resume.metrics_rows(path)
            law = (law_trajectory(cfg, task, path, graphdef, state, rows, start_scores[m], m)
                   if cfg.law_points else {})
            seconds = time.perf_counter() - t0
            write_json_atomic(os.path.join(path, compare_resume.ARM_DONE), {
                "law": law, "seconds": seconds,
                "command": train_command(init_spec, path, overrides)})
            runs.setdefault(arm, []).append(ArmRun(arm, seed, m, path, model_of(graphdef, state),
                                                   rows, law, seconds))
            done += 1
            left = (time.perf_counter() - t_all) / done * (total - done)
            log(f"  {arm} seed {seed}: {len(rows)} steps, reward {rows[0]['reward']:.3f} -> "
                f"{rows[-1]['reward']:.3f}, entropy {rows[0]['entropy']:.3f} -> "
                f"{rows[-1]['entropy']:.3f} ({time.perf_counter() - t0:.0f} s; run {done} of "
                f"{total}, ~{left / 60:.1f} min of RL left)")
        if i == 0 and on_pilot is not None:
            on_pilot(runs)
    return runs
