"""The host loop: feed batches, run the jitted step, log one step late, checkpoint, resume.

Run folders are never lost: one process at a time holds a run folder (`lock_run`, an
exclusive lock on `<out>/.vpo.lock`), `check_new_run` refuses an `--out` that already holds a
run, `resume_config` reads a run back with only the overrides that keep it the same run (and its
--data file unchanged), and the loop stops with a named error after `train.max_skipped_updates`
consecutive skipped updates. SIGINT / SIGTERM stop the loop after the step in flight with its
metrics row and its checkpoint written (`RunInterrupted`); a second one quits at once.
`train(on_event=...)` is told when the loop passes each of its named points (`EVENTS`); the kill
soak (`experiments/kill_soak.py`) stops the process there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx

from vpo.config import ConfigError, RunConfig
from vpo.model import lora as lora_lib
from vpo.model import sharding as sharding_lib
from vpo.model.decoder import Decoder
from vpo.rl import overlap
from vpo.rl.checks import check_run
from vpo.rl.env_step import EnvRLStep
from vpo.rl.step import (
    HostRLStep,
    TrainState,
    init_state,
    make_optimizer,
    policy_of,
    state_from_model,
    step_config,
)
from vpo.run import data as data_lib
from vpo.run.programs import step_functions
from vpo.run.run_folder import (  # the run folder the loop writes
    CONFIG,
    INIT_FILE,
    base_name,
    base_spec,
    check_data,
    discard_start,
    has_checkpoint,
    lock_run,
    policy_complete,
    read_json,
    record_data,
    release_run,
    run_contents,
    write_json_atomic,
)
from vpo.run.stopping import RunInterrupted, SkipGuard, StopSignals
from vpo.tasks.bound import BoundTask


def shard_batch(batch, mesh):
    """Host numpy batch → global arrays with the leading axis over the data axes."""
    def put(x):
        x = np.asarray(x)
        sh = sharding_lib.batch_sharding(mesh, x.ndim)
        if jax.process_count() == 1:
            return jax.device_put(x, sh)
        return jax.make_array_from_process_local_data(sh, x)

    return jax.tree.map(put, batch)


# The loop's named points, in order within a step, as `train(on_event=)` reports them with the
# step number: before a step, after its metrics row was handed to the logger, a checkpoint save
# started (in flight), that save complete on disk, the save at exit, before the policy export.
EVENTS = ("step", "logged", "save", "saved", "exit-save", "policy")


def _no_events(point: str, step: int) -> None:
    """The default `on_event`: nobody is told."""


def train(config: RunConfig, out_dir: str, resume: bool = False, *, task: BoundTask,
          mesh=None, progress: bool = True, init: Decoder | None = None,
          consume_init: bool = False, stop_at: int | None = None, report_to=None,
          bar_label: str | None = None,
          on_event: Callable[[str, int], None] | None = None,
          programs: dict | None = None) -> tuple[nnx.GraphDef, TrainState]:
    """Train `config.train.steps` RL steps on `task`, logging to out_dir and checkpointing there.

    `resume=True` continues from the latest complete checkpoint in out_dir/checkpoints (state,
    data position and rng), so the run continues exactly as the uninterrupted one would.
    `init` starts from an existing policy (e.g. `vpo sft`'s, via `load_policy`);
    `consume_init=True` hands its arrays to the train state (`state_from_model(consume=True)`:
    the weights are not held twice through the run; `init` is unusable afterwards).
    `config.model.lora_rank` > 0 trains LoRA adapters only (a plain `init` gets them, see
    `vpo.model.lora.as_configured`); the exported `policy/` is then the merged plain model.
    `stop_at` ends the loop early after that many steps (the schedule still spans `steps`).
    `report_to`: the metric sinks beside metrics.jsonl (`metrics_log.parse_report_to`).
    `progress`: the step bar on stderr, with a sample line every `train.sample_every` steps;
    `bar_label` labels the bar of one run of several (a `vpo compare` arm), without sample lines.
    `on_event(point, step)`: called at each of the loop's named points (`EVENTS`); with it, the
    loop waits for each checkpoint save to complete before reporting "saved".
    `programs`: a dict the runs of one process share, so a run differing from an earlier one
    only in its seed reuses that run's compiled step (`vpo.run.programs`; `vpo compare`'s seeds).
    The run holds out_dir's lock (`lock_run`) throughout: a folder another process is using is
    a `RunFolderLockedError`. A new run that fails before its first step (a check that refuses
    it, an error setting it up) leaves nothing in out_dir (`run_folder.discard_start`): the
    corrected command starts there as if it had not been run. SIGINT / SIGTERM stop it after
    the step in flight, that step's metrics row and checkpoint written, with `RunInterrupted`.
    Returns (graphdef, final state).
    """
    out_dir = os.path.abspath(out_dir)
    lock_run(out_dir)
    # a new run in a folder holding nothing but what its start wrote (`start.start_new`'s
    # init.json): if it fails before its first step, what it wrote goes (`discard_start`)
    fresh = not resume and set(run_contents(out_dir)) <= {INIT_FILE}
    try:
        run = _prepare(config, out_dir, task=task, mesh=mesh, init=init,
                       consume_init=consume_init)
        start = _open_folder(run, out_dir, resume)
        state = _run_steps(run, out_dir, start, progress=progress, stop_at=stop_at,
                           report_to=report_to, bar_label=bar_label,
                           on_event=on_event or _no_events, programs=programs)
        (on_event or _no_events)("policy", int(jax.device_get(state.step)))
        export_policy(os.path.join(out_dir, "policy"), config, run.graphdef, state, task)
        return run.graphdef, state
    except Exception:  # not a signal: an interrupted start is continued with --resume
        if fresh and not _stepped(out_dir):
            discard_start(out_dir)
        raise
    finally:
        release_run(out_dir)


def _stepped(out_dir: str) -> bool:
    """Whether a run in `out_dir` took a step: a metrics row written or a checkpoint saved."""
    path = os.path.join(out_dir, "metrics.jsonl")
    return has_checkpoint(out_dir) or (os.path.isfile(path) and os.path.getsize(path) > 0)


@dataclasses.dataclass
class _Run:
    """What the loop works with once a run is set up: its config and task, the problem records,
    the mesh, the model's graphdef, the train state (replaced as steps run), the optimiser, the
    data iterator and the checkpoint manager."""

    config: RunConfig
    task: BoundTask
    records: list
    mesh: Any
    graphdef: nnx.GraphDef
    state: TrainState
    tx: Any
    data_it: Any
    manager: Any


def _prepare(config: RunConfig, out_dir: str, *, task: BoundTask, mesh, init: Decoder | None,
             consume_init: bool) -> _Run:
    """The run's checks (`check_run`, the skip limit, the batch over the mesh), its problems,
    prompt tables and data iterator, its train state (fresh or from `init`) and checkpoint
    manager. Nothing is written to out_dir but the empty checkpoint folder."""
    from vpo.io import run_checkpoint as ckpt_lib

    tcfg = config.train
    limit = tcfg.max_skipped_updates
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ConfigError(f"train.max_skipped_updates: must be an integer >= 0 (0: never stop); "
                          f"got {limit!r}")
    records = task.make_problems(tcfg.seed, tcfg.num_problems)
    tables = data_lib.prompt_tables(task, records, tcfg.num_answers,
                                    mutation_fraction=tcfg.mutation_fraction,
                                    mutation_parents=tcfg.mutation_parents, seed=tcfg.seed)
    check_run(config, task, tables.prompt_len)
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
            seed=tcfg.seed, with_ref=with_ref, consume=consume_init)
    data_it = data_lib.problem_iterator(task, tcfg.batch_size * config.objective.oversample,
                                        tcfg.num_answers,
                                        seed=tcfg.seed, records=records, tables=tables,
                                        mutation_fraction=tcfg.mutation_fraction,
                                        mutation_parents=tcfg.mutation_parents)
    os.makedirs(out_dir, exist_ok=True)
    manager = ckpt_lib.CheckpointManager(os.path.join(out_dir, "checkpoints"),
                                         keep=tcfg.keep_checkpoints,
                                         base=base_spec(out_dir, config))  # LoRA: not saved
    return _Run(config, task, records, mesh, graphdef, state, tx, data_it, manager)


def _open_folder(run: _Run, out_dir: str, resume: bool) -> int:
    """The step the loop starts at: a resumed run's newest checkpoint restored into `run` (its
    data file checked, its config rewritten if `--resume` changed a safe field), or 0 for a new
    run, whose tokenizer, data hash and config (last: it marks a run) are written."""
    config, tcfg = run.config, run.config.train
    if resume and run.manager.latest_step() is not None:
        check_data(out_dir, config)
        like = run.state
        if tcfg.off_policy_steps:  # the rollout in flight is restored with the state
            like = like._replace(pending=overlap.pending_like(
                run.state, shard_batch(next(run.data_it), run.mesh), run.mesh,  # its shapes
                graphdef=run.graphdef, task=run.task, cfg=step_config(config, run.task)))
        run.state, start = run.manager.restore(like, run.data_it, config=config.to_json())
        if start > tcfg.steps:
            raise ConfigError(f"train.steps: {tcfg.steps} is below step {start}, already trained "
                              f"in {out_dir}; give train.steps >= {start}")
        if start == tcfg.steps and policy_complete(os.path.join(out_dir, "policy")):
            raise ConfigError(f"--resume: the run in {out_dir} already finished all {start} "
                              f"steps; pass train.steps=N (N > {start}) to train it longer")
        if jax.process_index() == 0:
            if read_json(os.path.join(out_dir, CONFIG)) != config.to_json():
                write_json_atomic(os.path.join(out_dir, CONFIG), config.to_json())
            print(f"resuming: restored step {start} from {run.manager.directory}", flush=True)
        return start
    if jax.process_index() == 0:
        run.task.tokenizer.save(out_dir)  # `vpo train --resume` reads the task through it
        record_data(out_dir, config)
        write_json_atomic(os.path.join(out_dir, CONFIG), config.to_json())  # last: a run
    return 0


def _run_steps(run: _Run, out_dir: str, start: int, *, progress: bool, stop_at: int | None,
               report_to, bar_label: str | None, on_event: Callable[[str, int], None],
               programs: dict | None = None) -> TrainState:
    """The steps from `start`: batches, the jitted step, metrics one step late, sample rows,
    checkpoints, the skip guard and the stop signals → the final state (all steps saved)."""
    import tqdm

    from vpo.run.metrics_log import MetricsLogger
    from vpo.run.samples_log import SampleLog, sample_rows, write_samples
    from vpo.run.watch import RunWatch

    config, task, tcfg, manager = run.config, run.task, run.config.train, run.manager
    step_fn, probe_fn = step_functions(run.config, run.task, run.graphdef, run.tx, run.mesh,
                                       run.records, programs)
    state, data_it = _primed(run, run.state), run.data_it
    logger = MetricsLogger(out_dir, resume_from=start if start else None, every=tcfg.log_every,
                           report_to=report_to, config=config.to_json(),
                           watch=RunWatch(config.sampler.max_new_tokens).check)
    end = tcfg.steps if stop_at is None else min(stop_at, tcfg.steps)
    bar = tqdm.tqdm(range(start, end), initial=start, total=tcfg.steps, desc=bar_label,
                    disable=not progress or jax.process_index() != 0)
    samples = SampleLog(out_dir, resume_from=start if start else None,
                        tensorboard=logger.tensorboard)

    compiled = False  # the sampling probe's first call compiles it: done once, untimed
    guard = SkipGuard(tcfg.max_skipped_updates, tcfg.updates_per_step, task)
    logged = start  # the last step handed to the logger (its row written, queued or not due)
    stop, stopped = StopSignals(), False
    with stop:
        try:
            for step in bar:
                if stop.signum is not None:
                    stopped = True
                    break
                manager.check()  # a save that failed on the disk ends the run here, named
                on_event("step", step + 1)
                batch = shard_batch(next(data_it), run.mesh)
                host = rollout = rewards = None
                if _due(tcfg.profile_every, step) or _sample_due(tcfg, step):
                    logger.flush()  # the previous step's row first: its time excludes this probe
                    if not compiled and probe_fn is not None:
                        jax.block_until_ready(probe_fn(state, batch))
                        compiled = True
                    state, metrics, host, rollout, rewards = profile_step(step_fn, probe_fn,
                                                                          state, batch)
                else:
                    state, metrics = step_fn(state, batch)
                done = logger.log(step + 1, metrics, host)  # fetches the previous step's metrics
                logged = step + 1
                on_event("logged", step + 1)
                guard.check(step + 1, metrics)
                if done is not None:
                    bar.set_postfix(loss=f"{done['loss']:.3g}", reward=f"{done['reward']:.3f}")
                if rollout is not None and _sample_due(tcfg, step):
                    rows = (step_fn.sample_rows(task) if isinstance(step_fn, EnvRLStep)
                            else sample_rows(task, run.records, batch, rollout,
                                             tcfg.num_answers, rewards=rewards))
                    write_samples(step + 1, rows, samples, logger,
                                  bar if progress and bar_label is None else None)
                if (step + 1) % tcfg.checkpoint_every == 0:
                    logger.flush()  # the step's metrics row lands before its checkpoint can
                    manager.save(step + 1, state, data_it, config.to_json())
                    on_event("save", step + 1)
                    if on_event is not _no_events:
                        manager.wait()
                        on_event("saved", step + 1)
            bar.close()
            guard.check()
            logger.flush()  # the last step's row before its checkpoint
            _save_at_exit(manager, state, data_it, config, start, on_event)
        except KeyboardInterrupt:  # no handler (another thread, several processes)
            _save_consistent(manager, logger, state, data_it, config, start, logged)
            raise
        except Exception:  # a bad reward, a non-finite value: keep the last complete checkpoint
            with contextlib.suppress(Exception):  # the error in hand is the one to report
                manager.wait()
            raise
        finally:
            _close_logs(logger, samples)
        if stopped:
            raise RunInterrupted(stop.signum, int(jax.device_get(state.step)), out_dir)
        manager.close()  # all steps taken: a signal from here on lets the export finish
    return state


def _primed(run: _Run, state: TrainState) -> TrainState:
    """The state with its first rollout pending (`train.off_policy_steps` = 1: batch 0 sampled
    by θ_0, `vpo.rl.overlap.prime_overlap`) unless it has one; unchanged otherwise."""
    if not run.config.train.off_policy_steps or state.pending is not None:
        return state
    prime = overlap.make_prime_step(run.graphdef, run.task, step_config(run.config, run.task))
    return prime(state, shard_batch(next(run.data_it), run.mesh))


def _due(every: int, step: int) -> bool:
    """Step index `step` (0-based) is a multiple-of-`every` step (every > 0)."""
    return every > 0 and (step + 1) % every == 0


def _sample_due(tcfg, step: int) -> bool:
    """Sample rows are logged every `train.sample_every` steps and at the run's last step (a
    short run logs one too)."""
    return _due(tcfg.sample_every, step) or (tcfg.sample_every > 0 and step + 1 == tcfg.steps)


def _close_logs(*logs) -> None:
    """Close every log (metrics, samples). While an error is on its way out, a log that fails to
    close (the same full disk) is not raised over it; otherwise the first failure is raised once
    all are closed."""
    failed = None
    for log in logs:
        try:
            log.close()
        except Exception as e:  # noqa: BLE001 -- closed the rest first
            failed = failed or e
    if failed is not None and sys.exc_info()[1] is None:
        raise failed


def export_policy(directory: str, config: RunConfig, graphdef, state: TrainState,
                  task: BoundTask) -> None:
    """Write the run's policy folder (`policy_folder.save_policy`; all processes take part): the
    plain model (LoRA adapters folded in), its tokenizer, and what the run was; a LoRA run also
    writes its adapters as a PEFT folder, `adapter/` (`vpo.io.peft`, read by `vpo export
    --adapter`), its base named as the run's starting policy."""
    from vpo.io import peft, policy_folder

    write_adapter = None
    if config.model.lora_rank:
        tensors = peft.adapter_tensors(lora_lib.merge(graphdef, state.params, state.frozen))
        adapter_cfg = peft.adapter_config(config.model, base_name(os.path.dirname(directory)))
        write_adapter = lambda d: peft.save_adapter(os.path.join(d, "adapter"),  # noqa: E731
                                                    tensors, adapter_cfg)
    policy = policy_of(graphdef, state)
    steps = int(jax.device_get(state.step))
    policy_folder.save_policy(directory, lora_lib.base_config(config.model),
                              nnx.state(policy, nnx.Param),
                              {"task": config.task, "task_kwargs": config.task_kwargs,
                               "num_answers": config.train.num_answers,
                               "advantage": config.objective.advantage, "steps": steps,
                               "max_new_tokens": config.sampler.max_new_tokens,
                               **({"lora": lora_lib.settings(config.model)}
                                  if config.model.lora_rank else {})},
                              tokenizer=task.tokenizer, write_into=write_adapter)


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
        state, metrics = jax.block_until_ready(step_fn.apply(state, batch, rollout, rewards))
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


def _save_at_exit(manager, state, data_it, config: RunConfig, start: int,
                  on_event: Callable[[str, int], None] = _no_events) -> None:
    """Save the final state unless that step is saved already; wait for the saves."""
    final = int(jax.device_get(state.step))
    if final > start and manager.latest_step() != final:
        manager.save(final, state, data_it, config.to_json())
        on_event("exit-save", final)
    manager.wait()


def _save_consistent(manager, logger, state, data_it, config: RunConfig, start: int,
                     logged: int) -> None:
    """On a KeyboardInterrupt raised in the loop: write the queued metrics row, then save the
    state only if it is the step last handed to the logger (its row is written), so the newest
    checkpoint never runs ahead of metrics.jsonl; otherwise the newest checkpoint stands."""
    try:
        logger.flush()
        if int(jax.device_get(state.step)) == logged:
            _save_at_exit(manager, state, data_it, config, start)
            return
    except Exception as e:  # noqa: BLE001 -- a state donated to an interrupted step
        print(f"not saving the interrupted step ({type(e).__name__}); --resume continues from "
              "the newest checkpoint", file=sys.stderr)
    manager.wait()
