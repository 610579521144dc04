"""An environment as a task: its rows, their first messages as prompts, its reward names and w*.

`make_env_task(env="my_env.py:make_env", path=None, ...)` is what `vpo train --env` trains on:
the rows of `path` (JSONL / Parquet, as `--data` reads them) or, without a file, the
environment's own `problems(seed, num)`; each row's prompt is the first messages of `reset`
(`statement`), rendered through the checkpoint's chat template. Scoring happens in the episode
(`vpo.env.episode`), not on a completion's text: the task's `score` refuses to be called.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from vpo.env import base as env_base
from vpo.env.base import call_env, check_environment, check_messages, load_env_factory
from vpo.errors import ConfigError
from vpo.tasks.base import Task

ROW = "_row"  # a row's index in its file (or in the environment's problems, whose rows also
#               carry `vpo.env.base.SEED`: errors name them as "problem i of problems(seed=s)")


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


def env_settings(task: Task) -> EnvSettings:
    """The settings an environment task was made with (`make_env_task`)."""
    settings = getattr(task.statement, "env_settings", None)
    if settings is None:
        raise ConfigError(f"task {task.name!r} is not an environment (vpo train --env)")
    return settings


def is_env_task(task: Any) -> bool:
    """Whether `task` (a Task or a BoundTask) came from `make_env_task`."""
    task = getattr(task, "task", task)
    return getattr(task.statement, "env_settings", None) is not None


_POOLS: dict[tuple, Any] = {}


def env_factory(task: Any) -> Callable[[], env_base.Environment]:
    """The environment factory of an environment task: in this process, or, with `workers`,
    the factory of its `EnvWorkers` pool (started once per settings, stopped at exit)."""
    task = getattr(task, "task", task)
    settings = env_settings(task)
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

    statement.env_settings = settings

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
        demonstrations=demonstrations, tagless_single=True, max_answers=1)
