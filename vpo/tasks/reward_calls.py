"""One call of a user's reward function, as TRL's GRPOTrainer makes it: importing it by spec,
its keywords (`call_inputs`), copies of its inputs, its failures as RewardErrors naming it,
async functions awaited, and the process pool (`Workers`) that runs calls under a timeout.
The contract a function meets is in `vpo.tasks.reward_fns`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import functools
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from vpo.errors import ConfigError, RewardError

# The keywords every call passes besides the dataset's columns; a column may not take one.
KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra",
            "log_metric")


def _exec_module(path: str):
    """Import the .py file `path` under a name derived from it (a worker imports the same),
    its folder on sys.path first, as Python runs a script: it may import the modules beside
    it."""
    name = "vpo_rewards_" + "".join(c if c.isalnum() else "_" for c in path)
    if name in sys.modules:
        return sys.modules[name]
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except (Exception, SystemExit) as e:
        del sys.modules[name]
        raise ConfigError(f"--reward: importing {path} failed: {type(e).__name__}: {e}; "
                          "the module must import without exiting or raising") from None
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
        raise ConfigError(f"--reward: importing {module} called sys.exit({e.code!r}); the "
                          "module must import without exiting") from None


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


def rows_text(rows: Sequence[int]) -> str:
    rows = sorted(set(int(r) for r in rows))
    return f"{rows[:8]}{'...' if len(rows) > 8 else ''}"


@contextlib.contextmanager
def guard(spec: str, n: int, rows: Sequence[int]):
    """Turn what a reward call raises, sys.exit included, into a RewardError naming the function
    and the batch's rows (KeyboardInterrupt passes: the user stops the run)."""
    where = f"on a batch of {n} completions from dataset rows {rows_text(rows)}"
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


def start_call(spec: str, fn: Callable[..., Any], inputs: dict[str, Any], rows: Sequence[int]):
    """fn(**copies of inputs): its value, or the awaitable of an async function."""
    inputs = copy.deepcopy(inputs)
    _check_signature(spec, fn, inputs)
    with guard(spec, len(inputs["completions"]), rows):
        return fn(**inputs)


def _run(coro):
    """Run `coro` to completion in a fresh event loop (in a thread when one already runs)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()


def await_all(calls: Sequence[tuple[str, Any, int, Sequence[int]]]) -> list[Any]:
    """Await (spec, awaitable, n, rows) calls concurrently; errors named as `guard` names them."""
    async def one(spec, awaitable, n, rows):
        with guard(spec, n, rows):
            return await awaitable

    async def all_():
        return await asyncio.gather(*(one(*c) for c in calls))

    return _run(all_())


def resolve(spec: str, value: Any, n: int, rows: Sequence[int]) -> Any:
    """`value`, awaited when it is an awaitable."""
    return await_all([(spec, value, n, rows)])[0] if inspect.isawaitable(value) else value


def call_by_spec(spec: str, inputs: dict[str, Any], rows: Sequence[int]) -> Any:
    """Import the function from its spec (once per process) and call it on copies of
    `inputs` (RewardError on a failure): a worker's task, and the load-time probe here."""
    value = start_call(spec, load_callable(spec), inputs, rows)
    return resolve(spec, value, len(inputs["completions"]), rows)


def warm(specs: Sequence[str]) -> None:
    for spec in specs:
        load_callable(spec)


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
        self._collect([self._pool.submit(warm, specs) for _ in range(workers)],
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
        futures = [self._pool.submit(call_by_spec, spec, inputs, list(rows)) for spec in specs]
        where = (f"on a batch of {len(inputs['completions'])} completions from dataset rows "
                 f"{rows_text(rows)}")
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
