"""The host loop: feed batches, run the jitted step, log one step late, checkpoint, resume."""

from __future__ import annotations

import json
import os
import time

import jax
import numpy as np
from flax import nnx

from vpo import data as data_lib
from vpo import lora as lora_lib
from vpo import sharding as sharding_lib
from vpo.config import ConfigError
from vpo.model import Decoder
from vpo.tasks.bound import BoundTask
from vpo.train import (
    HostRLStep,
    TrainState,
    check_run,
    init_state,
    make_host_rl_step,
    make_optimizer,
    make_rl_step,
    make_sample_step,
    policy_of,
    state_from_model,
    step_config,
)
from vpo.train_config import RunConfig


def shard_batch(batch, mesh):
    """Host numpy batch → global arrays with the leading axis over the data axes."""
    def put(x):
        x = np.asarray(x)
        sh = sharding_lib.batch_sharding(mesh, x.ndim)
        if jax.process_count() == 1:
            return jax.device_put(x, sh)
        return jax.make_array_from_process_local_data(sh, x)

    return jax.tree.map(put, batch)


def train(config: RunConfig, out_dir: str, resume: bool = False, *, task: BoundTask,
          mesh=None, progress: bool = True, init: Decoder | None = None,
          stop_at: int | None = None) -> tuple[nnx.GraphDef, TrainState]:
    """Train `config.train.steps` RL steps on `task`, logging to out_dir and checkpointing there.

    `resume=True` continues from the latest complete checkpoint in out_dir/checkpoints (state,
    data position and rng), so the run continues exactly as the uninterrupted one would.
    `init` starts from an existing policy (e.g. `vpo sft`'s, via `load_policy`).
    `config.model.lora_rank` > 0 trains LoRA adapters only (a plain `init` gets them, see
    `vpo.lora.as_configured`); the exported `policy/` is then the merged plain model.
    `stop_at` ends the loop early after that many steps (the schedule still spans `steps`).
    Returns (graphdef, final state).
    """
    import tqdm

    from vpo import checkpoint as ckpt_lib
    from vpo.metrics_log import MetricsLogger
    from vpo.samples_log import SampleLog, one_line, sample_rows

    tcfg = config.train
    records = task.make_problems(tcfg.seed, tcfg.num_problems)
    tables = data_lib.prompt_tables(task, records, tcfg.num_answers,
                                    mutation_fraction=tcfg.mutation_fraction,
                                    mutation_parents=tcfg.mutation_parents, seed=tcfg.seed)
    check_run(config, task, tables.prompt_len)
    out_dir = os.path.abspath(out_dir)
    mesh = mesh or sharding_lib.make_mesh(config.mesh_data, config.mesh_fsdp, config.mesh_tensor)
    dp = int(np.prod([mesh.shape[a] for a in sharding_lib.RULES["batch"] if a in mesh.shape]))
    if tcfg.batch_size % dp:
        raise ConfigError(f"train.batch_size: {tcfg.batch_size} prompts do not split over the "
                          f"{dp} data-parallel devices of the mesh; use a multiple of {dp} or "
                          "set mesh_data smaller")
    tx = make_optimizer(tcfg)
    with_ref = config.objective.kl_coef > 0
    if init is None:
        graphdef, state, _ = init_state(config.model, tx, mesh, seed=tcfg.seed,
                                        with_ref=with_ref)
    else:
        graphdef, state, _ = state_from_model(
            lora_lib.as_configured(init, config.model, seed=tcfg.seed), tx, mesh,
            seed=tcfg.seed, with_ref=with_ref)
    data_it = data_lib.problem_iterator(task, tcfg.batch_size * config.objective.oversample,
                                        tcfg.num_answers,
                                        seed=tcfg.seed, records=records, tables=tables,
                                        mutation_fraction=tcfg.mutation_fraction,
                                        mutation_parents=tcfg.mutation_parents)
    os.makedirs(out_dir, exist_ok=True)
    manager = ckpt_lib.CheckpointManager(os.path.join(out_dir, "checkpoints"),
                                         keep=tcfg.keep_checkpoints)
    start = 0
    if resume and manager.latest_step() is not None:
        state, start = manager.restore(state, data_it)
        if jax.process_index() == 0:
            print(f"resuming: restored step {start} from {manager.directory}", flush=True)
    else:
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(config.to_json(), f, indent=1)
        if jax.process_index() == 0:
            task.tokenizer.save(out_dir)  # `vpo train --resume` reads the task through it
    cfg = step_config(config, task)
    step_fn = (make_host_rl_step(graphdef, tx, task, cfg, records) if task.is_host
               else make_rl_step(graphdef, tx, task, cfg))
    logger = MetricsLogger(out_dir, resume_from=start if start else None, every=tcfg.log_every)
    end = tcfg.steps if stop_at is None else min(stop_at, tcfg.steps)
    bar = tqdm.tqdm(range(start, end), initial=start, total=tcfg.steps,
                    disable=not progress or jax.process_index() != 0)
    samples = SampleLog(out_dir, resume_from=start if start else None)
    probe_fn = (make_sample_step(graphdef, cfg)
                if (tcfg.profile_every or tcfg.sample_every) and not task.is_host else None)

    def due(every: int, step: int) -> bool:
        return every > 0 and (step + 1) % every == 0

    compiled = False  # the sampling probe's first call compiles it: done once, untimed
    try:
        for step in bar:
            batch = shard_batch(next(data_it), mesh)
            host = rollout = rewards = None
            if due(tcfg.profile_every, step) or due(tcfg.sample_every, step):
                logger.flush()  # the previous step's row first: its time excludes this probe
                if not compiled and not task.is_host:
                    jax.block_until_ready(probe_fn(state, batch))
                    compiled = True
                state, metrics, host, rollout, rewards = profile_step(step_fn, probe_fn, state,
                                                                      batch)
            else:
                state, metrics = step_fn(state, batch)
            done = logger.log(step + 1, metrics, host)  # fetches the previous step's metrics
            if done is not None:
                bar.set_postfix(loss=f"{done['loss']:.3g}", reward=f"{done['reward']:.3f}")
            if rollout is not None and due(tcfg.sample_every, step):
                rows = sample_rows(task, records, batch, rollout, tcfg.num_answers,
                                   rewards=rewards)
                samples.write(step + 1, rows)
                if rows and progress and jax.process_index() == 0:
                    bar.write(f"step {step + 1}: {one_line(rows[0])}")
            if (step + 1) % tcfg.checkpoint_every == 0:
                manager.save(step + 1, state, data_it, config.to_json())
    except KeyboardInterrupt:
        _save_at_exit(manager, state, data_it, config, start)
        raise
    except Exception:  # a bad reward, a non-finite value: keep the last complete checkpoint
        manager.wait()
        raise
    finally:
        logger.close()
        samples.close()
    _save_at_exit(manager, state, data_it, config, start)
    manager.close()
    policy = policy_of(graphdef, state)  # LoRA: adapters folded in, a plain Decoder
    ckpt_lib.save_policy(os.path.join(out_dir, "policy"), lora_lib.base_config(config.model),
                         nnx.state(policy, nnx.Param),
                         {"task": config.task, "task_kwargs": config.task_kwargs,
                          "num_answers": config.train.num_answers,
                          "advantage": config.objective.advantage,
                          "steps": int(jax.device_get(state.step)),
                          **({"lora": lora_lib.settings(config.model)}
                             if config.model.lora_rank else {})},
                         tokenizer=task.tokenizer)  # all processes take part
    return graphdef, state


def profile_step(step_fn, sample_fn, state, batch):
    """Run one step with the sampling vs update split measured → (state, metrics, timings,
    the step's rollout, its rewards or None).

    A host-reward step (`HostRLStep`) is run part by part: sampling, the reward functions
    (`reward_time_s`) and the update are timed as they run, and the rewards come back for the
    sample log. The fused in-graph step cannot be timed in parts, so its sampling is timed on
    its own first (a separate jit on the same state and batch: the same samples the step
    draws), then the unchanged step; `update_time_s` = step − sampling. Training is the same
    as without profiling; for the fused step the probe costs one extra sampling pass.
    """
    jax.block_until_ready(state)  # the previous step is done
    if isinstance(step_fn, HostRLStep):
        t0 = time.perf_counter()
        rollout = jax.block_until_ready(step_fn.sample(state, batch))
        t1 = time.perf_counter()
        rewards = step_fn.score(batch, rollout)
        t2 = time.perf_counter()
        state, metrics = jax.block_until_ready(step_fn.update(state, batch, rollout, *rewards))
        t3 = time.perf_counter()
        return state, metrics, {"step_time_s": t3 - t0, "sampling_time_s": t1 - t0,
                                "reward_time_s": t2 - t1, "update_time_s": t3 - t2}, \
            rollout, rewards
    t0 = time.perf_counter()
    rollout = jax.block_until_ready(sample_fn(state, batch))
    t1 = time.perf_counter()
    state, metrics = jax.block_until_ready(step_fn(state, batch))
    t2 = time.perf_counter()
    return state, metrics, {"step_time_s": t2 - t1, "sampling_time_s": t1 - t0,
                            "update_time_s": max(t2 - t1 - (t1 - t0), 0.0)}, rollout, None


def _save_at_exit(manager, state, data_it, config: RunConfig, start: int) -> None:
    final = int(jax.device_get(state.step))
    if final > start and manager.latest_step() != final:
        manager.save(final, state, data_it, config.to_json())
    manager.wait()
