"""Users' reward functions, called as TRL's GRPOTrainer calls them, as the components of a
reward vector.

    def accuracy(completions, solution, **kwargs) -> list[float | None]: ...
    def style(prompts, completions, **kwargs) -> dict[str, list[float]]: ...   # several

Each function is called BY KEYWORD, once per batch of N completions, with:
  prompts          the N prompts: text, or the chat messages of a conversational dataset
  completions      the N completions: text; for a conversational prompt, TRL's message list
                   `[{"role": "assistant", "content": text}]` (so `c[0]["content"]` works)
  completion_ids   the completions' token ids when the caller has them; otherwise a list that
                   says so when read (count tokens from `completions` instead)
  every other dataset column (`solution`, `answer`, ...), a list of N values
  trainer_state, log_extra, log_metric   None, as when a TRL function runs outside a trainer
so `def f(completions, **kwargs)` takes only what it needs. `async def` functions are awaited
(several at once, like TRL). With m answers per generation each parsed answer is one
completion; invalid slots are never passed.

A function returns N floats in [0, 1] (a bool: 1 or 0), or a dict of named lists for several
components, and None where it does not apply to a sample (TRL's multi-task idiom). Each
function is ONE component of the reward vector (TRL sums them into a scalar; here GRPO trains
on w*ᵀr and VPO on the vector), named after the function (or the dict's keys); metrics log
them as `reward/<name>`.

None ("does not apply") is reported in `RewardScorer.score`'s `applies` mask and scored 0 in
the reward vector: TRL's nansum over functions, so w*ᵀr is what TRL trains on. When a whole
group of rollouts (one dataset row) gets None, the component adds nothing to its advantages,
whatever the weights. An answer that no function applies to is unscorable (the dataset task
marks it invalid: zero reward, masked, as TRL zeroes its advantage).

Each call gets deep copies of the prompts, completions and columns: nothing a function does to
its inputs reaches the dataset or the next function. One batched call per function per RL
step. `RewardScorer.load(specs, row, workers=n, timeout=s)` runs the calls, the load-time one
included, in a process pool with a per-call timeout (slow verifiers: code execution); each
worker imports the functions itself from their specs.

Anything wrong (the call does not fit the function's signature; it raises, calls sys.exit, or
its worker dies or times out; it returns the wrong length, a string, NaN or inf, or a value
outside [0, 1]) is a `RewardError` naming the function, the dataset rows and the value: the
run stops before the update, so nothing reaches the parameters. A timed-out or dead worker's
pool is stopped, so the run can exit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import math
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

from vpo.errors import ConfigError, RewardError

# The keywords every call passes besides the dataset's columns; a column may not take one.
KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra",
            "log_metric")


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


def _exec_module(path: str):
    """Import the .py file `path` under a name derived from it (a worker imports the same)."""
    name = "vpo_rewards_" + "".join(c if c.isalnum() else "_" for c in path)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except (Exception, SystemExit) as e:
        del sys.modules[name]
        raise ConfigError(f"--reward: importing {path} failed: {type(e).__name__}: {e}; "
                          "a reward module must import without exiting or raising") from None
    return mod


def _import_module(module: str):
    """A dotted module path, or a path to a `.py` file."""
    if module.endswith(".py") or os.sep in module:
        path = os.path.abspath(os.path.expanduser(module))
        if not os.path.isfile(path):
            raise ConfigError(f"--reward: no file {path}; give MODULE:FUNCTION with MODULE a "
                              "dotted module path or a path to a .py file")
        return _exec_module(path)
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"--reward: cannot import module {module!r} ({e}); give a dotted "
                          "module path on sys.path or a path to a .py file") from e
    except SystemExit as e:
        raise ConfigError(f"--reward: importing {module} called sys.exit({e.code!r}); a "
                          "reward module must import without exiting") from None


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


def load_reward_fns(specs: Sequence[str], probe: dict[str, Any],
                    call: Callable[..., Any] | None = None) -> list[RewardFn]:
    """Load `specs` and find each function's component names.

    A function may declare them (`fn.reward_names = ("a", "b")` for a dict-returning one);
    otherwise it is called once on `probe` (one dataset row, with its `completion` column, or ""
    as the completion; on copies) and a dict's keys name its components. Names must be distinct.
    `call(spec, inputs, rows)` makes the probe call (default: here; `Workers.call`: in a worker,
    under its timeout).
    """
    if not specs:
        raise ConfigError("--reward: give at least one reward function, MODULE:FUNCTION")
    check_columns(probe)
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
            value = (call or _call_by_spec)(spec, call_inputs([probe], [completion]),
                                            [probe.get("_row", 0)])
            names = tuple(value) if isinstance(value, dict) else (spec.rpartition(":")[2],)
        out.append(RewardFn(spec, fn, names))
    names = [n for f in out for n in f.names]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"--reward: component names {dup} appear twice; rename a function "
                          "or a returned dict key")
    return out


# -- the call ---------------------------------------------------------------------------------

def _columns(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """Every column except `prompt` (and keys starting with `_`), as lists over `rows`."""
    keys = [k for k in rows[0] if k != "prompt" and not k.startswith("_")] if rows else []
    return {k: [r.get(k) for r in rows] for k in keys}


def check_columns(row: dict[str, Any]) -> None:
    """A ConfigError when a column takes the name of a keyword every call passes."""
    clash = [k for k in row if k in KEYWORDS]
    if clash:
        raise ConfigError(f"--data: column {clash[0]!r} has the name of a keyword reward "
                          f"functions are called with ({', '.join(KEYWORDS)}); rename the "
                          "column")


class MissingTokenIds(Sequence):
    """`completion_ids` when the caller has no token ids: its length is N; reading an item
    raises an error that says what to do instead."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        raise LookupError("completion_ids: token ids are not available to this reward call "
                          "(vpo scores the answer text); count tokens from `completions` "
                          "with your tokenizer instead")


def call_inputs(records: Sequence[dict[str, Any]], completions: Sequence[str],
                completion_ids: Sequence[Sequence[int]] | None = None) -> dict[str, Any]:
    """The keywords of one call: TRL's (see the module docstring) and the records' columns.
    A record with chat-message prompts gets its completion as TRL's assistant message list."""
    texts = [str(c) for c in completions]
    return {
        "prompts": [r["prompt"] for r in records],
        "completions": [[{"role": "assistant", "content": c}]
                        if isinstance(r["prompt"], list) else c
                        for r, c in zip(records, texts, strict=True)],
        "completion_ids": (MissingTokenIds(len(texts)) if completion_ids is None
                           else [list(ids) for ids in completion_ids]),
        **_columns(records),
        "trainer_state": None, "log_extra": None, "log_metric": None,
    }


def _rows_text(rows: Sequence[int]) -> str:
    rows = sorted(set(int(r) for r in rows))
    return f"{rows[:8]}{'...' if len(rows) > 8 else ''}"


@contextlib.contextmanager
def _guard(spec: str, n: int, rows: Sequence[int]):
    """Turn what a reward call raises, sys.exit included, into a RewardError naming the function
    and the batch's rows (KeyboardInterrupt passes: the user stops the run)."""
    where = f"on a batch of {n} completions from dataset rows {_rows_text(rows)}"
    try:
        yield
    except SystemExit as e:
        raise RewardError(f"reward function {spec} called sys.exit({e.code!r}) {where}; return "
                          "a list of floats (None where it does not apply) instead of "
                          "exiting") from None
    except Exception as e:
        raise RewardError(f"reward function {spec} raised {type(e).__name__}: {e} ({where})"
                          ) from e


def _check_signature(spec: str, fn: Callable[..., Any], inputs: dict[str, Any]) -> None:
    """A RewardError when `fn` cannot take the keywords of a call (its signature and what is
    passed, by name), before the call."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: the call will tell
        return
    try:
        sig.bind(**inputs)
    except TypeError as e:
        name = spec.rpartition(":")[2]
        raise RewardError(
            f"reward function {spec}: its signature {name}{sig} does not take the call "
            f"({e}); reward functions are called by keyword, as TRL's GRPOTrainer calls them, "
            f"with {', '.join(inputs)}; name the ones it uses and end with **kwargs, e.g. "
            f"def {name}(completions, **kwargs)") from None


def _start(spec: str, fn: Callable[..., Any], inputs: dict[str, Any], rows: Sequence[int]):
    """fn(**copies of inputs): its value, or the awaitable of an async function."""
    inputs = copy.deepcopy(inputs)
    _check_signature(spec, fn, inputs)
    with _guard(spec, len(inputs["completions"]), rows):
        return fn(**inputs)


def _run(coro):
    """Run `coro` to completion in a fresh event loop (in a thread when one already runs)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()


def _await_all(calls: Sequence[tuple[str, Any, int, Sequence[int]]]) -> list[Any]:
    """Await (spec, awaitable, n, rows) calls concurrently; errors named as `_guard` names them."""
    async def one(spec, awaitable, n, rows):
        with _guard(spec, n, rows):
            return await awaitable

    async def all_():
        return await asyncio.gather(*(one(*c) for c in calls))

    return _run(all_())


def _resolve(spec: str, value: Any, n: int, rows: Sequence[int]) -> Any:
    """`value`, awaited when it is an awaitable."""
    return _await_all([(spec, value, n, rows)])[0] if inspect.isawaitable(value) else value


def _call_by_spec(spec: str, inputs: dict[str, Any], rows: Sequence[int]) -> Any:
    """Import the function from its spec (once per process) and call it on copies of
    `inputs` (RewardError on a failure): a worker's task, and the load-time probe here."""
    value = _start(spec, load_callable(spec), inputs, rows)
    return _resolve(spec, value, len(inputs["completions"]), rows)


def _warm(specs: Sequence[str]) -> None:
    for spec in specs:
        load_callable(spec)


# -- the values -------------------------------------------------------------------------------

def _check_values(spec: str, name: str, values: Any, rows: Sequence[int]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(values float64 [N], None → 0; applies bool [N], False where None), or a RewardError
    naming the function, row and value."""
    n = len(rows)
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise RewardError(f"reward function {spec}: returned {type(values).__name__} "
                          f"{_short(values)}; return a list of {n} floats")
    if len(values) != n:
        raise RewardError(f"reward function {spec}: returned {len(values)} values for {n} "
                          "completions; return one float per completion")
    out = np.zeros(n, np.float64)
    applies = np.ones(n, bool)
    for i, v in enumerate(values):
        if v is None:  # the function does not apply to this sample
            applies[i] = False
            continue
        # a bool is a pass/fail score (`c == answer`): True → 1.0, False → 0.0
        ok = isinstance(v, (int, float, np.integer, np.floating, np.bool_))
        f = float(v) if ok else math.nan
        if not ok or not math.isfinite(f) or not 0.0 <= f <= 1.0:
            what = ("not a number" if not ok else "not finite" if not math.isfinite(f)
                    else "outside [0, 1]")
            label = spec if name == spec.rpartition(":")[2] else f"{spec} [{name}]"
            raise RewardError(
                f"reward function {label}: value {_short(v)} for dataset row {rows[i]} (call "
                f"item {i}) is {what}; return floats in [0, 1], or None where the function "
                "does not apply (VPO weighs components and scores an empty answer set 0, so "
                "rescale negative or unbounded scores)")
        out[i] = f
    return out, applies


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _parts(f: RewardFn, value: Any) -> list[tuple[str, Any]]:
    """(component name, values) of one function's result."""
    if isinstance(value, dict):
        if tuple(value) != f.names:
            raise RewardError(f"reward function {f.spec}: returned components {list(value)}, "
                              f"expected {list(f.names)} (as on its first call); return the "
                              "same keys every time")
        return list(value.items())
    if len(f.names) != 1:
        raise RewardError(f"reward function {f.spec}: returned a list, expected a dict with "
                          f"keys {list(f.names)}")
    return [(f.names[0], value)]


class Workers:
    """A process pool ("spawn": safe beside JAX's threads) that calls reward functions by spec,
    `timeout` seconds per call. A call that fails in any way (above all one that times out, or
    whose worker dies) stops the pool, killing its processes so the run can exit, and every
    later call fails."""

    def __init__(self, specs: Sequence[str], workers: int, timeout: float | None):
        import multiprocessing

        self.timeout = timeout
        self._stopped: str | None = None
        self._pool = concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"))
        specs = list(specs)  # start and import in every worker, untimed
        self._collect([self._pool.submit(_warm, specs) for _ in range(workers)],
                      ["importing the reward functions"] * workers, "at start-up", None)

    def call(self, spec: str, inputs: dict[str, Any], rows: Sequence[int]) -> Any:
        """One function's value on `inputs`, from a worker."""
        return self.map([spec], inputs, rows)[0]

    def map(self, specs: Sequence[str], inputs: dict[str, Any], rows: Sequence[int]
            ) -> list[Any]:
        """Each function's value on `inputs`, the calls spread over the workers."""
        if self._stopped:
            raise RewardError(f"reward workers were stopped after an earlier failure: "
                              f"{self._stopped}")
        futures = [self._pool.submit(_call_by_spec, spec, inputs, list(rows)) for spec in specs]
        where = (f"on a batch of {len(inputs['completions'])} completions from dataset rows "
                 f"{_rows_text(rows)}")
        return self._collect(futures, [f"reward function {spec}" for spec in specs], where,
                             self.timeout)

    def _collect(self, futures, labels: Sequence[str], where: str,
                 timeout: float | None) -> list[Any]:
        """The futures' results (`labels[i]` names future i in errors, `where` the work); on any
        failure the pool is stopped before the error goes on."""
        try:
            return [self._result(fut, label, where, timeout)
                    for fut, label in zip(futures, labels, strict=True)]
        except BrokenProcessPool:
            lost = [label for fut, label in zip(futures, labels, strict=True)
                    if fut.done() and isinstance(fut.exception(), BrokenProcessPool)]
            self._stop("a worker process died")
            lost = list(dict.fromkeys(lost))
            what = (f"{lost[0]}: its worker process died" if len(lost) == 1 else
                    f"a reward worker process died running one of: {'; '.join(lost)}")
            raise RewardError(f"{what} ({where}): os._exit, a signal, or a crash such as "
                              "running out of memory; call the function without "
                              "--reward-workers to see why") from None
        except BaseException as e:
            self._stop(str(e) or type(e).__name__)
            raise

    @staticmethod
    def _result(fut, label: str, where: str, timeout: float | None) -> Any:
        try:
            return fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise RewardError(f"{label}: no result within {timeout} s ({where}); its worker "
                              "was stopped. Raise --reward-timeout or make it faster") from None
        except SystemExit as e:
            raise RewardError(f"{label} called sys.exit({e.code!r}) ({where}); return a list "
                              "of floats instead of exiting") from None

    def _stop(self, reason: str) -> None:
        self._stopped = reason
        self.close()

    def close(self) -> None:
        """Stop the workers; a running call (e.g. one that timed out) is killed."""
        if self._pool is None:
            return
        procs = list((getattr(self._pool, "_processes", None) or {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        self._pool = None


class RewardScorer:
    """Calls the reward functions on batches of (row, completion) pairs → rewards_NR float32.

    `workers` > 0 runs each call in a process pool (`Workers`) with `timeout` seconds per call;
    0 calls in this process (no timeout; async functions awaited together).
    """

    def __init__(self, fns: Sequence[RewardFn], *, workers: int = 0,
                 timeout: float | None = None, pool: Workers | None = None):
        self.fns = list(fns)
        self.names = tuple(n for f in self.fns for n in f.names)
        self.timeout = timeout
        self._pool = pool
        if pool is None and workers > 0:
            self._pool = Workers([f.spec for f in self.fns], workers, timeout)
        self._warned_unscorable = False

    @classmethod
    def load(cls, specs: Sequence[str], probe: dict[str, Any], *, workers: int = 0,
             timeout: float | None = None) -> RewardScorer:
        """The scorer of `specs` (`load_reward_fns` on `probe`); with workers, the probe call
        runs in one, under the timeout."""
        pool = Workers(specs, workers, timeout) if workers > 0 else None
        try:
            fns = load_reward_fns(specs, probe, call=pool.call if pool else None)
        except BaseException:
            if pool is not None:
                pool.close()
            raise
        return cls(fns, timeout=timeout, pool=pool)

    def __call__(self, records: Sequence[dict[str, Any]], completions: Sequence[str],
                 rows: Sequence[int]) -> np.ndarray:
        """records[i] is the dataset row (`rows[i]` its index) that completions[i] answers;
        None values score 0 (see `score` for where they were None)."""
        return self.score(records, completions, rows)[0]

    def score(self, records: Sequence[dict[str, Any]], completions: Sequence[str],
              rows: Sequence[int], completion_ids: Sequence[Sequence[int]] | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """(rewards_NR float32, None → 0; applies_NR bool, False where a function returned
        None). `completion_ids`: the completions' token ids, when the caller has them."""
        N, R = len(completions), len(self.names)
        out, applies = np.zeros((N, R), np.float32), np.zeros((N, R), bool)
        if N == 0:
            return out, applies
        inputs = call_inputs(records, completions, completion_ids)
        results = self._results(inputs, list(rows))
        col = 0
        for f, value in zip(self.fns, results, strict=True):
            for name, values in _parts(f, value):
                out[:, col], applies[:, col] = _check_values(f.spec, name, values, rows)
                col += 1
        self._warn_unscorable(applies, rows)
        return out, applies

    def _results(self, inputs: dict[str, Any], rows: list[int]) -> list[Any]:
        """Each function's value on `inputs` (in workers, or here with async ones awaited
        together)."""
        if self._pool is not None:
            return self._pool.map([f.spec for f in self.fns], inputs, rows)
        values: list[Any] = []
        try:
            for f in self.fns:
                values.append(_start(f.spec, f.fn, inputs, rows))
        except BaseException:
            for v in values:  # async functions started but never awaited
                if inspect.iscoroutine(v):
                    v.close()
            raise
        waits = [i for i, v in enumerate(values) if inspect.isawaitable(v)]
        if waits:
            n = len(inputs["completions"])
            done = _await_all([(self.fns[i].spec, values[i], n, rows) for i in waits])
            for i, v in zip(waits, done, strict=True):
                values[i] = v
        return values

    def _warn_unscorable(self, applies: np.ndarray, rows: Sequence[int]) -> None:
        """Warn once when no function applies to some completion (TRL warns likewise)."""
        none = ~applies.any(axis=1)
        if none.any() and not self._warned_unscorable:
            self._warned_unscorable = True
            warnings.warn(f"every reward function returned None for a completion of dataset "
                          f"row {rows[int(np.argmax(none))]}: such an answer is unscorable "
                          "(invalid, zero reward); make some function apply to every row",
                          stacklevel=3)

    def close(self) -> None:
        """Stop the workers, if any; a running call (e.g. one that timed out) is killed."""
        if self._pool is not None:
            self._pool.close()
