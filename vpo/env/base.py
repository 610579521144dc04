"""The environment interface: multi-turn episodes scored with a reward vector.

An episode is a chat. `reset(row)` gives its first messages; after each assistant message
`step(messages)` answers with the observation messages (a tool's output, a user's reply) or
`None` when the episode is over; `score(messages)` gives the episode's reward components in
[0, 1] (`reward_names`, one value each, `None` where a component does not apply), whose
weights `weights` are w*. One instance serves one episode at a time, created by the user's
factory `make_env()` (as TRL's `environment_factory` creates one per rollout); its state
lives on the instance.

The shape follows what users already write: OpenEnv's reset/step API (reset → first
observation, step(action) → observation or done), `verifiers`' MultiTurnEnv (an
`env_response` after each assistant message, `is_completed` to end) with a Rubric of weighted
reward functions (here the components and w*), and TRL's `environment_factory`. Every call is
checked (`call_env`): an exception, a call past its timeout, or a return of the wrong shape
or a non-finite reward is an `EnvError` naming the environment, the call and the dataset row.
"""

from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from vpo.errors import ConfigError, EnvError

Message = dict[str, Any]  # {"role": ..., "content": ...} as chat templates read them


@runtime_checkable
class Environment(Protocol):
    """What `vpo train --env module.py:make_env` needs from `make_env()`'s return value.

    Optional: `problems(seed, num) -> list[dict]`, the rows to run without `--data`: up to
    `num` JSON-able dicts, deterministic in `seed` (docs/usage.md, Environments). Each row
    reaches `reset` with vpo's keys `_row` (its index) and `_seed` added."""

    reward_names: Sequence[str]  # R component names
    weights: Sequence[float]  # w*, R non-negative weights (normalised by vpo)

    def reset(self, row: dict[str, Any]) -> list[Message]:
        """Start an episode on a dataset row → its first messages (system / user)."""

    def step(self, messages: list[Message]) -> list[Message] | None:
        """The conversation so far, ending with the assistant's message → the observation
        messages to append (role "tool" or "user"), or None when the episode is over."""

    def score(self, messages: list[Message]) -> Sequence[float | None]:
        """The finished conversation → R reward components in [0, 1] (None: does not apply).
        A score that takes a `truncated` keyword (`def score(self, messages, truncated=False)`)
        is told whether the token budget cut the episode off (`score_episode`)."""


ENV_METHODS = ("reset", "step", "score")


def takes_truncated(score: Callable[..., Any]) -> bool:
    """True when `score` accepts the `truncated=` keyword (a parameter of that name, or
    `**kwargs`)."""
    try:
        params = inspect.signature(score).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind == p.VAR_KEYWORD or (p.name == "truncated" and p.kind in (
        p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) for p in params)


def score_episode(env: Any, messages: list[Message], truncated: bool | None = None) -> Any:
    """`env.score(messages)`, with `truncated=` when given and the environment's score takes
    it (`takes_truncated`): True when the token budget (or the cache slots) cut the episode off
    before the environment or the turn limit ended it. Other environments are called as
    before."""
    if truncated is not None and takes_truncated(env.score):
        return env.score(messages, truncated=bool(truncated))
    return env.score(messages)


def env_method(env: Any, call: str) -> Callable[..., Any]:
    """What `env.<call>(*args)` runs: `score` through `score_episode`, the rest as they are."""
    if call == "score":
        return lambda *args: score_episode(env, *args)
    return getattr(env, call)


SEED = "_seed"  # set on rows from an environment's problems(seed, num): which seed drew them


def row_label(record: dict[str, Any], row: int) -> int | str:
    """How errors name the row `record` (index `row`): the int of a `--data` row, or, for a row
    drawn by the environment's `problems(seed, num)`, that origin and the row itself."""
    if SEED not in record:
        return row
    shown = {k: v for k, v in record.items() if not k.startswith("_")}
    text = repr(shown)
    text = text if len(text) <= 120 else text[:120] + "..."
    return f"problem {row} of the environment's problems(seed={record[SEED]}), {text}"


def on_row(row: int | str | None) -> str:
    """" on dataset row N" for a `--data` row, " on <label>" for a `row_label`, "" for none."""
    if row is None:
        return ""
    return f" on dataset row {row}" if isinstance(row, int) else f" on {row}"


def describe_failure(e: BaseException) -> str:
    """`Type: message (at file:line)`, the line the environment's code raised at (the last
    frame of its traceback)."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {e}{at}"


def load_env_factory(spec: str) -> Callable[[], Environment]:
    """`MODULE:FACTORY` (MODULE dotted or a .py path) → the factory, after building one
    environment and checking that it has reset / step / score, reward_names and weights. A
    factory that returns a `verifiers` environment (a hub module's `load_environment`) gives
    `vpo.env.from_verifiers.from_verifiers` of the one it returned (a verifiers 0.4
    `verifiers.v1` Env: `vpo.env.from_verifiers_v1.from_verifiers_v1`, run through vpo's
    endpoint); one that returns an OpenEnv
    Environment gives `vpo.env.from_openenv.from_openenv(factory)` (one per episode)."""
    from vpo.tasks.reward_calls import load_callable  # the same module loading as --reward

    module, sep, attr = spec.rpartition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"--env {spec!r}: expected MODULE:FACTORY, e.g. my_env.py:make_env")
    try:
        factory = load_callable(spec)
    except ConfigError as e:
        raise ConfigError(str(e).replace("--reward", "--env")) from None
    env = call_env(spec, "make_env", factory)
    if any(c.__module__.startswith("verifiers.v1.") for c in type(env).__mro__):
        factory = call_env(spec, "from_verifiers_v1", _from_verifiers_v1, env)
        env = factory()
    elif any(c.__module__.startswith("verifiers.") for c in type(env).__mro__):
        factory = call_env(spec, "from_verifiers", _from_verifiers, env)
        env = factory()
    elif any(c.__module__.startswith("openenv.") for c in type(env).__mro__):
        factory = call_env(spec, "from_openenv", _from_openenv, factory)
        env = factory()
    check_environment(env, spec)
    return factory


def _from_verifiers(env: Any) -> Callable[[], Environment]:
    from vpo.env.from_verifiers import from_verifiers  # imports verifiers

    return from_verifiers(env)


def _from_verifiers_v1(env: Any) -> Callable[[], Environment]:
    from vpo.env.from_verifiers_v1 import from_verifiers_v1  # imports verifiers.v1

    return from_verifiers_v1(env)


def _from_openenv(make: Callable[[], Any]) -> Callable[[], Environment]:
    from vpo.env.from_openenv import from_openenv  # imports openenv

    return from_openenv(make)


def check_environment(env: Any, where: str) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """(reward_names, weights) of `env`, or `EnvError` naming what it lacks."""
    missing = [m for m in ENV_METHODS if not callable(getattr(env, m, None))]
    if missing:
        raise EnvError(f"{where}: the environment {type(env).__name__} lacks "
                       f"{', '.join(missing)} (see vpo.env.base.Environment)")
    names = tuple(getattr(env, "reward_names", ()) or ())
    weights = tuple(getattr(env, "weights", ()) or ())
    if not names or not all(isinstance(n, str) and n for n in names):
        raise EnvError(f"{where}: reward_names must be a non-empty list of names, got "
                       f"{names!r}")
    if len(set(names)) != len(names):
        raise EnvError(f"{where}: reward_names repeat a name: {names!r}")
    if len(weights) != len(names) or not all(
            isinstance(w, (int, float)) and math.isfinite(w) and w >= 0 for w in weights) or (
            sum(weights) <= 0):
        raise EnvError(f"{where}: weights must be {len(names)} finite non-negative numbers "
                       f"(one per reward name, not all 0), got {weights!r}")
    return names, tuple(float(w) for w in weights)


class _TimedOutError(Exception):
    """A call past its timeout (not the environment's own TimeoutError)."""


def _within(timeout: float, fn: Callable[..., Any], *args) -> Any:
    """`fn(*args)` on a daemon thread, `_TimedOutError` when it has not returned in `timeout`
    seconds: the thread cannot be stopped, but as a daemon it does not keep the process alive
    after the run ends with the error (`--env-workers` kills a hung call outright)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 -- re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, name="vpo-env-call", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise _TimedOutError
    if "error" in box:
        raise box["error"]
    return box["value"]


def call_env(where: str, call: str, fn: Callable[..., Any], *args,
             timeout: float | None = None, row: int | str | None = None) -> Any:
    """`fn(*args)`, with its failure as an `EnvError` naming `where` (the --env spec), the call
    and the dataset row. With `timeout` (seconds) the call runs on a daemon thread and a call
    past it is an `EnvError` (the run ends with it; the thread is left behind, not stopped)."""
    at = on_row(row)
    try:
        if timeout is None:
            return fn(*args)
        return _within(timeout, fn, *args)
    except _TimedOutError:
        raise EnvError(f"{where}: {call}{at} took longer than {timeout:g} s (--env-timeout); "
                       "make it faster or raise the timeout, or hold the environments in "
                       "worker processes (--env-workers N), where a hung call is killed") from None
    except EnvError:
        raise
    except Exception as e:  # noqa: BLE001 -- the user's code: any failure is named
        raise EnvError(f"{where}: {call}{at} raised {describe_failure(e)}") from e


def check_messages(value: Any, where: str, call: str, row: int | str | None,
                   allow_none: bool) -> list[Message] | None:
    """`value` as a list of {"role", "content"} messages (None when `allow_none`), or an
    `EnvError` naming the first bad item."""
    at = on_row(row)
    if value is None and allow_none:
        return None
    if not isinstance(value, (list, tuple)) or not value:
        raise EnvError(f"{where}: {call}{at} must return a non-empty list of messages "
                       f"({{'role': ..., 'content': ...}}){' or None' if allow_none else ''}, "
                       f"got {type(value).__name__}: {str(value)[:80]}")
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):
            raise EnvError(f"{where}: {call}{at}: message {i} must be a dict with string "
                           f"'role' and 'content', got {str(m)[:80]}")
    return [dict(m) for m in value]


def check_scores(value: Any, names: Sequence[str], where: str, row: int | str | None
                 ) -> list[float | None]:
    """`score`'s return as R values in [0, 1] or None, or an `EnvError` naming the component."""
    at = on_row(row)
    if isinstance(value, dict):
        value = [value.get(n) for n in names]
    if not isinstance(value, (list, tuple)) or len(value) != len(names):
        raise EnvError(f"{where}: score{at} must return {len(names)} values ({', '.join(names)})"
                       f", got {str(value)[:80]}")
    out: list[float | None] = []
    for name, v in zip(names, value, strict=True):
        if v is None:
            out.append(None)
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (
                not 0.0 <= v <= 1.0):
            raise EnvError(f"{where}: score{at}: component {name!r} is {v!r}; each component "
                           "must be a finite number in [0, 1] or None")
        out.append(float(v))
    return out
