"""Users' reward functions, TRL-shaped, as the components of a reward vector.

    def correct(prompts, completions, answer, **columns) -> list[float]: ...
    def style(prompts, completions, **columns) -> dict[str, list[float]]: ...   # several

A function gets the N prompts (text, or chat messages), the N completions (with m answers per
generation, each parsed answer is one completion; invalid slots are never passed) and every
other dataset column as a keyword list of N values; it returns N floats in [0, 1], or a dict of
named lists for several components. Each function is ONE component of the reward vector (TRL
sums them into a scalar; here GRPO trains on w*ᵀr and VPO on the vector), named after the
function (or the dict's keys); metrics log them as `reward/<name>`.

One batched call per function per RL step. `RewardScorer(..., workers=n, timeout=s)` runs the
calls in a process pool with a per-call timeout (slow verifiers: code execution); each worker
imports the functions itself from their specs.

Anything wrong with a function's output (it raises, returns the wrong length, a string, NaN or
inf, or a value outside [0, 1]) is a `RewardError` naming the function, the dataset row and the
value: the run stops before the update, so nothing reaches the parameters.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from vpo.errors import ConfigError, RewardError


@dataclasses.dataclass(frozen=True)
class RewardFn:
    """A loaded reward function: its spec (`MODULE:FUNCTION`), the callable, and the names of
    the components it returns (one for a list, the dict's keys for a dict)."""

    spec: str
    fn: Callable[..., Any]
    names: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.spec.rpartition(":")[2]


def _import_module(module: str):
    """A dotted module path, or a path to a `.py` file (imported under a name derived from its
    absolute path, so a worker process imports the same module)."""
    if module.endswith(".py") or os.sep in module:
        path = os.path.abspath(os.path.expanduser(module))
        if not os.path.isfile(path):
            raise ConfigError(f"--reward: no file {path}; give MODULE:FUNCTION with MODULE a "
                              "dotted module path or a path to a .py file")
        name = "vpo_rewards_" + "".join(c if c.isalnum() else "_" for c in path)
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as e:
            del sys.modules[name]
            raise ConfigError(f"--reward: importing {path} failed: {type(e).__name__}: {e}"
                              ) from e
        return mod
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"--reward: cannot import module {module!r} ({e}); give a dotted "
                          "module path on sys.path or a path to a .py file") from e


@functools.cache
def load_callable(spec: str) -> Callable[..., Any]:
    """The function named by `MODULE:FUNCTION` (MODULE dotted, or a .py file path)."""
    module, sep, attr = spec.rpartition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"--reward {spec!r}: expected MODULE:FUNCTION, e.g. "
                          "rewards.py:correct or mypkg.rewards:correct")
    fn = getattr(_import_module(module), attr, None)
    if not callable(fn):
        raise ConfigError(f"--reward {spec!r}: {module} has no function {attr!r}")
    return fn


def load_reward_fns(specs: Sequence[str], probe: dict[str, Any]) -> list[RewardFn]:
    """Load `specs` and find each function's component names.

    A function may declare them (`fn.reward_names = ("a", "b")` for a dict-returning one);
    otherwise it is called once on `probe` (one dataset row, with its `completion` column, or ""
    as the completion) and a dict's keys name its components. Names must be distinct.
    """
    if not specs:
        raise ConfigError("--reward: give at least one reward function, MODULE:FUNCTION")
    out: list[RewardFn] = []
    for spec in specs:
        fn = load_callable(spec)
        declared = getattr(fn, "reward_names", None)
        if declared is not None:
            names = tuple(str(n) for n in declared)
        else:
            completion = probe.get("completion", "")
            if not isinstance(completion, str):
                completion = str(completion[0]) if completion else ""
            value = _call(spec, fn, [probe["prompt"]], [completion], _columns([probe]), [0])
            name = spec.rpartition(":")[2]
            names = tuple(value) if isinstance(value, dict) else (name,)
        out.append(RewardFn(spec, fn, names))
    names = [n for f in out for n in f.names]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"--reward: component names {dup} appear twice; rename a function "
                          "or a returned dict key")
    return out


def _columns(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """Every column except `prompt` (and keys starting with `_`), as lists over `rows`."""
    keys = [k for k in rows[0] if k != "prompt" and not k.startswith("_")] if rows else []
    return {k: [r.get(k) for r in rows] for k in keys}


def _check_values(spec: str, name: str, values: Any, rows: Sequence[int]) -> np.ndarray:
    """`values` as float64 [N], or a RewardError naming the function, row and value."""
    n = len(rows)
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise RewardError(f"reward function {spec}: returned {type(values).__name__} "
                          f"{_short(values)}; return a list of {n} floats")
    if len(values) != n:
        raise RewardError(f"reward function {spec}: returned {len(values)} values for {n} "
                          "completions; return one float per completion")
    out = np.zeros(n, np.float64)
    for i, v in enumerate(values):
        # a bool is a pass/fail score (`c == answer`): True → 1.0, False → 0.0
        ok = isinstance(v, (int, float, np.integer, np.floating, np.bool_))
        f = float(v) if ok else math.nan
        if not ok or not math.isfinite(f) or not 0.0 <= f <= 1.0:
            what = ("not a number" if not ok else "not finite" if not math.isfinite(f)
                    else "outside [0, 1]")
            label = spec if name == spec.rpartition(":")[2] else f"{spec} [{name}]"
            raise RewardError(
                f"reward function {label}: value {_short(v)} for dataset row {rows[i]} (call "
                f"item {i}) is {what}; return floats in [0, 1] (VPO weighs components and "
                "scores an empty answer set 0, so rescale negative or unbounded scores)")
        out[i] = f
    return out


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _call(spec: str, fn, prompts, completions, columns, rows) -> Any:
    try:
        return fn(prompts, completions, **columns)
    except Exception as e:
        raise RewardError(f"reward function {spec} raised {type(e).__name__}: {e} (on a batch "
                          f"of {len(completions)} completions from dataset rows "
                          f"{sorted(set(rows))[:8]}...)") from e


def _warm(specs: Sequence[str]) -> None:
    for spec in specs:
        load_callable(spec)


def _call_by_spec(spec: str, prompts, completions, columns, rows) -> Any:
    """Worker side: import the function from its spec, call it (RewardError on a raise)."""
    return _call(spec, load_callable(spec), prompts, completions, columns, rows)


class RewardScorer:
    """Calls the reward functions on batches of (row, completion) pairs → rewards_NR float32.

    `workers` > 0 runs each call in a process pool ("spawn": safe beside JAX's threads), with
    `timeout` seconds per call; 0 calls in this process (no timeout).
    """

    def __init__(self, fns: Sequence[RewardFn], *, workers: int = 0,
                 timeout: float | None = None):
        self.fns = list(fns)
        self.names = tuple(n for f in self.fns for n in f.names)
        self.timeout = timeout
        self._pool = None
        if workers > 0:
            import multiprocessing

            self._pool = concurrent.futures.ProcessPoolExecutor(
                workers, mp_context=multiprocessing.get_context("spawn"))
            specs = [f.spec for f in self.fns]  # start and import in every worker, untimed
            for fut in [self._pool.submit(_warm, specs) for _ in range(workers)]:
                fut.result()

    def __call__(self, records: Sequence[dict[str, Any]], completions: Sequence[str],
                 rows: Sequence[int]) -> np.ndarray:
        """records[i] is the dataset row (`rows[i]` its index) that completions[i] answers."""
        N = len(completions)
        out = np.zeros((N, len(self.names)), np.float32)
        if N == 0:
            return out
        prompts = [r["prompt"] for r in records]
        columns = _columns(records)
        if self._pool is None:
            results = [_call(f.spec, f.fn, prompts, list(completions), columns, rows)
                       for f in self.fns]
        else:
            futures = [self._pool.submit(_call_by_spec, f.spec, prompts, list(completions),
                                         columns, list(rows)) for f in self.fns]
            results = []
            for f, fut in zip(self.fns, futures, strict=True):
                try:
                    results.append(fut.result(timeout=self.timeout))
                except concurrent.futures.TimeoutError:
                    raise RewardError(f"reward function {f.spec}: no result within "
                                      f"{self.timeout} s for {N} completions; raise "
                                      "--reward-timeout or make it faster") from None
        col = 0
        for f, value in zip(self.fns, results, strict=True):
            if isinstance(value, dict):
                if tuple(value) != f.names:
                    raise RewardError(f"reward function {f.spec}: returned components "
                                      f"{list(value)}, expected {list(f.names)} (as on its "
                                      "first call); return the same keys every time")
                parts = list(value.items())
            elif len(f.names) != 1:
                raise RewardError(f"reward function {f.spec}: returned a list, expected a dict "
                                  f"with keys {list(f.names)}")
            else:
                parts = [(f.names[0], value)]
            for name, values in parts:
                out[:, col] = _check_values(f.spec, name, values, rows)
                col += 1
        return out

    def close(self) -> None:
        """Stop the workers (a call that timed out may still be running: it is terminated)."""
        if self._pool is not None:
            procs = list(getattr(self._pool, "_processes", {}).values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            for proc in procs:
                proc.terminate()
            self._pool = None
