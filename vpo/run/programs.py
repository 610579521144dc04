"""The compiled programs of an RL run's step, and their reuse across the runs of one process.

A run's step is the fused jitted step (in-graph reward), or jitted sampling and update around a
host reward, or episodes on the host around a jitted update (an environment task). Each is
compiled ahead of its first call with the compiler's freed memory given back first
(`vpo.rl.host_memory.compiled_per_signature`). Runs that differ only in their seed (the seed
enters the state, never the program: `vpo compare`'s seeds) share one executable per argument
signature through a `programs` dict, instead of tracing and compiling the step again.
"""

from __future__ import annotations

import dataclasses

from vpo.config import RunConfig
from vpo.env.task import EnvTask
from vpo.rl.env_step import make_env_rl_step
from vpo.rl.host_memory import compiled_per_signature
from vpo.rl.overlap import make_in_graph_step
from vpo.rl.step import make_host_rl_step, make_sample_step, step_config
from vpo.tasks.bound import BoundTask, GraphTask, HostTask, for_kind


def _fused_step(graphdef, tx, task, cfg, records, shared):
    """An in-graph task's step: one jit (sample, reward, update), compiled once and shared."""
    del records
    if shared is None:
        shared = compiled_per_signature(make_in_graph_step(graphdef, tx, task, cfg))
    return shared, shared, make_sample_step(graphdef, cfg)


def _host_step(graphdef, tx, task, cfg, records, shared):
    """A host-scored task's step: jitted sampling and update around the score, which (over
    this run's records) stays the run's own."""
    step_fn = make_host_rl_step(graphdef, tx, task, cfg, records)
    if shared is None:
        shared = (compiled_per_signature(step_fn.sample), compiled_per_signature(step_fn.update))
    return dataclasses.replace(step_fn, sample=shared[0], update=shared[1]), shared, None


def _episode_step(graphdef, tx, task, cfg, records, shared):
    """An environment's step: episodes on the host, the update compiled on its first call."""
    return make_env_rl_step(graphdef, tx, task, cfg, records), shared, None


# the step of each task kind → (step, what runs differing only in the seed share, the sampling
# probe of an in-graph step or None)
STEPS = {GraphTask: _fused_step, HostTask: _host_step, EnvTask: _episode_step}


def step_functions(config: RunConfig, task: BoundTask, graphdef, tx, mesh, records,
                   programs: dict | None = None):
    """(the RL step, the sampling probe or None) of a run. `programs`: a dict shared by the
    runs of one process; a run with the same graphdef, task, mesh and step settings but the
    seed reuses the compiled sampler and update (or fused step) of the first such run."""
    cfg, tcfg = step_config(config, task), config.train
    key = (graphdef, task, mesh,
           dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=0)))
    shared = programs.get(key) if programs is not None else None
    step_fn, shared, probe_fn = for_kind(STEPS, task)(graphdef, tx, task, cfg, records, shared)
    if programs is not None and shared is not None:
        programs[key] = shared
    return step_fn, probe_fn if (tcfg.profile_every or tcfg.sample_every) else None
