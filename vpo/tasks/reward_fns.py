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
components, and None where it does not apply to a sample (TRL's multi-task idiom). A function
written for TRL with another scale (TRL's `-abs(20 - len(c))`, a raw length) runs unchanged
with its range declared (`ranges={name: (lo, hi)}`, `--reward-range NAME=LO:HI`): a value v
scores (v - lo) / (hi - lo), clipped to [0, 1] (one warning per component when it clips), so an
empty answer set's 0 is the worst score, as VPO needs. Each
function is ONE component of the reward vector (TRL sums them into a scalar; here GRPO trains
on w*ᵀr and VPO on the vector), named after the function (or the dict's keys); metrics log
them as `reward/<name>` (the mean over the answers the function applied to).

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

import dataclasses
import inspect
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from vpo.errors import ConfigError, RewardError
from vpo.tasks.base import ROW
from vpo.tasks.reward_calls import (
    Workers,
    await_all,
    call_by_spec,
    call_inputs,
    check_columns,
    load_callable,
    start_call,
)


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
            value = (call or call_by_spec)(spec, call_inputs([probe], [completion]),
                                            [probe.get(ROW, 0)])
            names = tuple(value) if isinstance(value, dict) else (spec.rpartition(":")[2],)
        out.append(RewardFn(spec, fn, names))
    names = [n for f in out for n in f.names]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"--reward: component names {dup} appear twice; rename a function "
                          "or a returned dict key")
    return out


# -- the values -------------------------------------------------------------------------------

def _check_values(spec: str, name: str, values: Any, rows: Sequence[int],
                  bounds: tuple[float, float] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, bool]:
    """(values float64 [N], None → 0; applies bool [N], False where None; whether a value was
    clipped to the declared range), or a RewardError
    naming the function, row and value. `bounds` (lo, hi): the component's declared range,
    values mapped to (v - lo) / (hi - lo) and clipped to [0, 1]; without it a value outside
    [0, 1] is an error."""
    n = len(rows)
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise RewardError(f"reward function {spec}: returned {type(values).__name__} "
                          f"{_short(values)}; return a list of {n} floats")
    if len(values) != n:
        raise RewardError(f"reward function {spec}: returned {len(values)} values for {n} "
                          "completions; return one float per completion")
    out = np.zeros(n, np.float64)
    applies = np.ones(n, bool)
    lo, hi = bounds if bounds is not None else (0.0, 1.0)
    for i, v in enumerate(values):
        if v is None:  # the function does not apply to this sample
            applies[i] = False
            continue
        # a bool is a pass/fail score (`c == answer`): True → 1.0, False → 0.0
        ok = isinstance(v, (int, float, np.integer, np.floating, np.bool_))
        f = float(v) if ok else math.nan
        if not ok or not math.isfinite(f) or (bounds is None and not 0.0 <= f <= 1.0):
            what = ("not a number" if not ok else "not finite" if not math.isfinite(f)
                    else "outside [0, 1]")
            label = spec if name == spec.rpartition(":")[2] else f"{spec} [{name}]"
            raise RewardError(
                f"reward function {label}: value {_short(v)} for dataset row {rows[i]} (call "
                f"item {i}) is {what}; return floats in [0, 1], or None where the function "
                "does not apply (VPO weighs components and scores an empty answer set 0), or "
                f"declare the function's range: --reward-range {name}=LO:HI (its values are "
                "mapped to [0, 1])")
        out[i] = (f - lo) / (hi - lo)
    clipped = bool(np.any((out < 0) | (out > 1)))
    return np.clip(out, 0.0, 1.0), applies, clipped


def check_ranges(ranges: dict[str, Sequence[float]], names: Sequence[str]
                 ) -> dict[str, tuple[float, float]]:
    """{component: (lo, hi)} with every name a component and lo < hi finite, else ConfigError."""
    out = {}
    for name, bounds in ranges.items():
        if name not in names:
            raise ConfigError(f"--reward-range {name}=...: no reward component is called "
                              f"{name!r}; the components are {', '.join(names)}")
        lo, hi = (float(b) for b in bounds)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ConfigError(f"--reward-range {name}={lo:g}:{hi:g}: give LO < HI, both finite "
                              "(the values the function returns at worst and at best)")
        out[name] = (lo, hi)
    return out


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


class RewardScorer:
    """Calls the reward functions on batches of (row, completion) pairs → rewards_NR float32.

    `workers` > 0 runs each call in a process pool (`Workers`) with `timeout` seconds per call;
    0 calls in this process (no timeout; async functions awaited together).
    """

    def __init__(self, fns: Sequence[RewardFn], *, workers: int = 0,
                 timeout: float | None = None, pool: Workers | None = None,
                 ranges: dict[str, Sequence[float]] | None = None):
        self.fns = list(fns)
        self.names = tuple(n for f in self.fns for n in f.names)
        self.ranges = check_ranges(ranges or {}, self.names)
        self._warned_clip: set[str] = set()
        self.timeout = timeout
        self._pool = pool
        if pool is None and workers > 0:
            self._pool = Workers([f.spec for f in self.fns], workers, timeout)
        self._warned_unscorable = False

    @classmethod
    def load(cls, specs: Sequence[str], probe: dict[str, Any], *, workers: int = 0,
             timeout: float | None = None, ranges: dict[str, Sequence[float]] | None = None
             ) -> RewardScorer:
        """The scorer of `specs` (`load_reward_fns` on `probe`); with workers, the probe call
        runs in one, under the timeout. `ranges`: {component: (lo, hi)} declared scales."""
        pool = Workers(specs, workers, timeout) if workers > 0 else None
        try:
            fns = load_reward_fns(specs, probe, call=pool.call if pool else None)
        except BaseException:
            if pool is not None:
                pool.close()
            raise
        try:
            return cls(fns, timeout=timeout, pool=pool, ranges=ranges)
        except BaseException:
            if pool is not None:
                pool.close()
            raise

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
                out[:, col], applies[:, col], clipped = _check_values(
                    f.spec, name, values, rows, self.ranges.get(name))
                if clipped and name not in self._warned_clip:
                    self._warned_clip.add(name)
                    lo, hi = self.ranges[name]
                    warnings.warn(f"reward {name}: values outside its declared range "
                                  f"[{lo:g}, {hi:g}] were clipped to it (rows {_short(rows)}); "
                                  f"widen --reward-range {name}=LO:HI to tell them apart",
                                  stacklevel=2)
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
                values.append(start_call(f.spec, f.fn, inputs, rows))
        except BaseException:
            for v in values:  # async functions started but never awaited
                if inspect.iscoroutine(v):
                    v.close()
            raise
        waits = [i for i, v in enumerate(values) if inspect.isawaitable(v)]
        if waits:
            n = len(inputs["completions"])
            done = await_all([(self.fns[i].spec, values[i], n, rows) for i in waits])
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
