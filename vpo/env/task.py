"""An environment as a task: its rows, their first messages as prompts, its reward names and w*.

`make_env_task(env="my_env.py:make_env", path=None, ...)` is what `vpo train --env` trains on:
the rows of `path` (JSONL / Parquet, as `--data` reads them) or, without a file, the
environment's own `problems(seed, num)`; each row's prompt is the first messages of `reset`
(`statement`), rendered through the checkpoint's chat template. Scoring happens in the episode
(`vpo.env.episode`), not on a completion's text: the task's `score` refuses to be called.
Bound to a tokenizer (`vpo.tasks.bound.bind`) it is an `EnvTask`: a host task with its
`EnvSettings`, whose type the callers of other task kinds dispatch on.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from vpo.env import base as env_base
from vpo.env.base import call_env, check_environment, check_messages, load_env_factory
from vpo.errors import ConfigError
from vpo.tasks.base import ROW, Task
from vpo.tasks.bound import HostTask

# ROW: a row's index in its file or in the environment's problems, whose rows also carry
# `vpo.env.base.SEED` (errors name them as "problem i of problems(seed=s)")


@dataclasses.dataclass(frozen=True)
class EnvSettings:
    """How episodes run: `max_turns` assistant messages, `timeout` seconds per environment
    call (None: none), `episodes_per_set` m: VPO's set of m answers is a set of m episodes of
    the same row (the G episodes of a group form G/m sets), `workers`: the environments live
    in this many worker processes (0: in this one; `vpo.env.workers`); a row's prompt, its first
    messages, still comes from one `reset` in this process (`statement`)."""

    spec: str
    max_turns: int = 4
    timeout: float | None = None
    episodes_per_set: int = 1
    workers: int = 0


@dataclasses.dataclass(frozen=True, eq=False)
class EnvTask(HostTask):
    """An environment task bound to a tokenizer (`bind` of a `make_env_task` task): a host task
    whose candidates are episodes, run with `settings`. What the callers of other kinds do
    differently (the RL step, the evaluation pool, the search proposer, the AOT build) they look
    up by this type (`vpo.tasks.bound.for_kind`)."""

    settings: EnvSettings

    writes_own_prompts = False  # a row's first messages are what the environment writes

    def sample_problems(self, seed: int, num: int) -> list[dict[str, Any]]:
        """The first `num` rows of its --data file or of its `problems(seed, num)`, in order."""
        return self.make_problems(seed, num)

    def check_run(self, run: Any) -> None:
        check_env_run(run, self.settings.episodes_per_set)


def check_env_run(run, m: int) -> None:
    """A run's (or a step's) config against its sets of m episodes (`vpo.rl.env_step`): G a
    multiple of m, and an estimator over sets of answers (VPO, Multi-RLVR) only with m >= 2."""
    G = run.sampler.num_samples
    if G % m:
        raise ConfigError(f"sampler.num_samples: {G} episodes per row do not split into sets "
                          f"of episodes_per_set={m} (--env-set); use a multiple of {m}")
    if m < 2 and run.objective.advantage in ("vpo", "multi_rlvr"):
        raise ConfigError(f"objective.advantage={run.objective.advantage} scores sets of "
                          "answers: give --env-set m >= 2 (task_kwargs.episodes_per_set: VPO's "
                          "m over the episodes of one row), or a single-answer estimator (grpo)")


_POOLS: dict[tuple, Any] = {}


def env_factory(task: EnvTask) -> Callable[[], env_base.Environment]:
    """The environment factory of an environment task: in this process, or, with `workers`,
    the factory of its `EnvWorkers` pool (started once per settings, stopped at exit)."""
    settings = task.settings
    if not settings.workers:
        return load_env_factory(settings.spec)
    key = (settings.spec, settings.workers, settings.timeout)
    if key not in _POOLS or _POOLS[key]._stopped:
        import atexit

        if key in _POOLS:  # stopped by a failure: its processes are gone, its pipes not yet
            _POOLS[key].close()

        from vpo.env.workers import EnvWorkers

        pool = EnvWorkers(settings.spec, settings.workers, settings.timeout)
        atexit.register(pool.close)
        _POOLS[key] = pool
    return _POOLS[key].factory


def _rows(path: str | None, factory, spec: str, seed: int, num: int) -> list[dict[str, Any]]:
    if path is not None:
        from vpo.tasks.dataset import read_rows

        rows = read_rows(path)
        return [{**r, ROW: i} for i, r in enumerate(rows[:num])]
    env = factory()
    problems = getattr(env, "problems", None)
    if not callable(problems):
        raise ConfigError(f"--env {spec}: give the rows to train on with --data FILE, or give "
                          "the environment a problems(seed, num) -> list of dicts method")
    rows = call_env(spec, "problems", problems, seed, num)
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ConfigError(f"--env {spec}: problems(seed, num) must return a non-empty list of "
                          f"dicts, got {str(rows)[:80]}")
    return [{**r, ROW: i, env_base.SEED: seed} for i, r in enumerate(rows[:num])]


def make_env_task(env: str, path: str | None = None, max_turns: int = 4,
                  timeout: float | None = None, episodes_per_set: int = 1,
                  workers: int = 0) -> Task:
    """The task of environment `env` (`MODULE:FACTORY`) over the rows of `path` (or its own
    problems). The keyword arguments are `EnvSettings`."""
    if not isinstance(max_turns, int) or max_turns < 1:
        raise ConfigError(f"task_kwargs.max_turns: must be an integer >= 1, got {max_turns!r}")
    if timeout is not None and not timeout > 0:
        raise ConfigError(f"task_kwargs.timeout: must be > 0 seconds (or left out), got "
                          f"{timeout!r}")
    if not isinstance(episodes_per_set, int) or not 1 <= episodes_per_set <= 9:
        raise ConfigError(f"task_kwargs.episodes_per_set: must be an integer in 1..9, got "
                          f"{episodes_per_set!r}")
    if not isinstance(workers, int) or workers < 0:
        raise ConfigError(f"task_kwargs.workers: must be an integer >= 0, got {workers!r}")
    factory = load_env_factory(env)
    names, weights = check_environment(call_env(env, "make_env", factory), env)
    w_R = np.asarray(weights, np.float32) / np.float32(sum(weights))
    settings = EnvSettings(env, max_turns, timeout, episodes_per_set, workers)
    firsts: dict[int, list] = {}

    def statement(record):
        """The row's first messages (`reset` on a new environment, once per row)."""
        i = record[ROW]
        if i not in firsts:
            label = env_base.row_label(record, i)
            firsts[i] = check_messages(call_env(env, "reset", factory().reset, dict(record),
                                                timeout=timeout, row=label), env, "reset", label,
                                       False)
        return firsts[i]

    def make_problems(seed: int, num: int):
        return _rows(path, factory, env, seed, num)

    def score(records, answers, answer_ids=None):
        raise ConfigError(f"--env {env}: an environment scores whole episodes (vpo train "
                          "--env); its completions are not scored as answers of a dataset")

    def demonstrations(record, rng, num_answers):
        raise ConfigError(f"--env {env}: SFT needs demonstrations; an environment has none "
                          "(warm-start the policy with vpo sft --data first)")

    module = env.rpartition(":")[0]  # a .py path (its file name) or a dotted module (its last)
    name = (os.path.splitext(os.path.basename(module))[0] if module.endswith(".py")
            else module.rpartition(".")[2])
    return Task(
        name=name.replace(".", "_") or "env",
        reward_names=names, eval_weights_R=w_R, make_problems=make_problems,
        statement=statement, answer_hint="", score=score,
        solved=lambda r: jnp.dot(jnp.asarray(r, jnp.float32), jnp.asarray(w_R)) >= 1.0 - 1e-6,
        demonstrations=demonstrations, tagless_single=True, max_answers=1,
        bound_type=functools.partial(EnvTask, settings=settings))
