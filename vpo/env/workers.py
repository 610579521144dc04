"""Environments in worker processes (`vpo train --env-workers N`).

An environment's calls (a sandboxed program, a search index, a slow simulator) can block,
hang or crash the interpreter. With workers, every episode's environment lives in one of N
processes ("spawn": safe beside JAX's threads), pinned there for its life (its state is on the
instance). A batch of calls (a turn's `step`s, the resets, the scores) keeps one call in
flight on every worker, the next sent when its answer arrives, so the episodes waiting on the
environment advance in parallel and no pipe fills up, whatever the size of the messages.

A call past `timeout` seconds (counted from when it was sent) kills the workers (a hung call
is stopped, not left running as an in-process timeout's thread is), so does a worker that
dies; either is an `EnvError` naming the environment, the call and the dataset row, and every
later call fails. An exception inside the environment is the `EnvError` an in-process call
gives, with the line it was raised at, and stops the workers too (the run ends with it, as it
does in-process); so does anything that interrupts a batch (Ctrl-C), leaving no answer queued.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from vpo.env.base import call_env, env_method, on_row
from vpo.errors import EnvError

STARTUP_SECONDS = 600.0  # importing the environment's module and building one, per worker


def _serve(spec: str, conn) -> None:
    """A worker's loop. Messages: (tag, op, key, args); "new" and "drop" get no answer, every
    other op one (tag, ok, value, what): `what` names the call that failed ("make_env" when
    the episode's environment could not be built)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the workers itself
    from vpo.env.base import describe_failure, env_method, load_env_factory

    def send(msg) -> bool:
        try:
            conn.send(msg)
            return True
        except (OSError, ValueError):
            return False  # the parent is gone
        except Exception as e:  # noqa: BLE001 -- e.g. an unpicklable return value
            return send((msg[0], False, f"its return value could not be sent back: "
                                        f"{type(e).__name__}: {e}", ""))

    try:
        factory = load_env_factory(spec)
        probe = factory()
        first = (tuple(probe.reward_names), tuple(probe.weights))
    except BaseException as e:  # noqa: BLE001 -- reported to the parent, which names it
        send((0, False, describe_failure(e), "make_env"))
        return
    if not send((0, True, first, "")):
        return
    envs: dict[int, Any] = {}
    broken: dict[int, str] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        tag, op, key, args = msg
        if op == "new":
            try:
                envs[key] = factory()
            except BaseException as e:  # noqa: BLE001
                broken[key] = describe_failure(e)
            continue
        if op == "drop":
            envs.pop(key, None)
            broken.pop(key, None)
            continue
        if key in broken:
            answer = (tag, False, broken[key], "make_env")
        else:
            try:
                answer = (tag, True, env_method(envs[key], op)(*args), "")
            except BaseException as e:  # noqa: BLE001 -- the user's code: any failure is named
                answer = (tag, False, describe_failure(e), "")
        if not send(answer):
            return


class RemoteEnv:
    """An environment held by a worker process: reset / step / score forwarded there."""

    def __init__(self, pool: EnvWorkers, key: int, names: tuple, weights: tuple):
        self._pool, self._key = pool, key
        self.reward_names, self.weights = names, weights
        weakref.finalize(self, pool._dropped.append, key)

    def reset(self, row):
        return self._pool.call_many("reset", [(self, (row,))])[0]

    def step(self, messages):
        return self._pool.call_many("step", [(self, (messages,))])[0]

    def score(self, messages, truncated=None):
        return self._pool.call_many("score", [(self, (messages, truncated))])[0]


class EnvWorkers:
    """N processes holding environments of `spec` (`MODULE:FACTORY`); `factory()` gives a
    `RemoteEnv`, placed on the next worker in turn (built there without a round trip: a
    factory failure is named at the environment's first call)."""

    def __init__(self, spec: str, workers: int, timeout: float | None):
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"env workers: must be an integer >= 1, got {workers!r}")
        self.spec, self.timeout = spec, timeout
        self._dropped: collections.deque[int] = collections.deque()
        self._stopped: str | None = None
        self._lock = threading.Lock()
        self._keys = itertools.count(1)
        self._tags = itertools.count(1)
        self._home: dict[int, int] = {}
        ctx = multiprocessing.get_context("spawn")
        self._conns, self._procs = [], []
        for _ in range(workers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(spec, child), daemon=True,
                               name="vpo-env-worker")
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        with self._lock:
            firsts = self._exchange([(w, 0, None) for w in range(workers)], "make_env",
                                    [None] * workers, max(timeout or 0.0, STARTUP_SECONDS))
        self.reward_names, self.weights = firsts[0]

    def factory(self) -> RemoteEnv:
        """A new environment on the next worker (the `make_env` of episodes with workers)."""
        with self._lock:
            self._check()
            key = next(self._keys)
            worker = key % len(self._conns)
            self._home[key] = worker
            self._guard(lambda: self._send(worker, (0, "new", key, ())))
        return RemoteEnv(self, key, self.reward_names, self.weights)

    def call_many(self, call: str, calls: Sequence[tuple[RemoteEnv, tuple]],
                  rows: Sequence[int | str | None] | None = None) -> list[Any]:
        """`env.<call>(*args)` for each (env, args), one call in flight per worker; the
        results in the order given. `rows`: the dataset row of each call, for errors."""
        rows = list(rows) if rows is not None else [None] * len(calls)
        if len(rows) != len(calls):
            raise ValueError(f"call_many: {len(calls)} calls but {len(rows)} rows")
        with self._lock:
            self._check()

            def run():
                while self._dropped:
                    key = self._dropped.popleft()
                    worker = self._home.pop(key, None)
                    if worker is not None:
                        self._send(worker, (0, "drop", key, ()))
                jobs = [(self._home[env._key], env._key, args) for env, args in calls]
                return self._exchange(jobs, call, rows, self.timeout)

            return self._guard(run)

    def close(self) -> None:
        """Stop the workers (a running call is killed); later calls are refused by name."""
        if not self._stopped:
            for conn in self._conns:
                with contextlib.suppress(OSError, ValueError):
                    os.set_blocking(conn.fileno(), False)  # never wait on a full pipe
                    conn.send(None)
            for proc in self._procs:
                proc.join(1.0)
        self._kill()
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []
        self._stopped = self._stopped or "they were closed"

    # -- internals -------------------------------------------------------------------------

    def _check(self) -> None:
        if self._stopped:
            raise EnvError(f"{self.spec}: the environment workers were stopped: {self._stopped}")

    def _guard(self, fn):
        """`fn()`; anything but a named failure (an interrupt, a message that cannot be sent
        or read) stops the workers before it goes on: no answer is left queued."""
        try:
            return fn()
        except EnvError:
            raise
        except BaseException as e:
            self._stopped = f"an earlier call was interrupted ({type(e).__name__})"
            self._kill()
            raise

    def _exchange(self, jobs: Sequence[tuple[int, int, tuple | None]], call: str,
                  rows: Sequence[int | str | None], timeout: float | None) -> list[Any]:
        """Run `jobs` (worker, key, args; args None: read the worker's start-up answer), one in
        flight per worker, each within `timeout` seconds of being sent → their values."""
        queues: dict[int, collections.deque[int]] = collections.defaultdict(collections.deque)
        for i, (worker, _, _) in enumerate(jobs):
            queues[worker].append(i)
        results: list[Any] = [None] * len(jobs)
        flight: dict[int, tuple[int, int, float | None]] = {}  # worker → (job, tag, deadline)

        def start(worker: int) -> None:
            if queues[worker]:
                i = queues[worker].popleft()
                _, key, args = jobs[i]
                tag = 0 if args is None else next(self._tags)
                if args is not None:
                    self._send(worker, (tag, call, key, args))
                flight[worker] = (i, tag, None if timeout is None else time.monotonic() + timeout)

        for worker in list(queues):
            start(worker)
        while flight:
            deadlines = [d for _, _, d in flight.values() if d is not None]
            wait = None if not deadlines else max(0.0, min(deadlines) - time.monotonic())
            ready = multiprocessing.connection.wait([self._conns[w] for w in flight], wait)
            for conn in ready:
                worker = self._conns.index(conn)
                i, tag, _ = flight.pop(worker)
                results[i] = self._read(worker, tag, call, rows[i])
                start(worker)
            now = time.monotonic()
            for i, _, deadline in flight.values():
                if deadline is not None and now >= deadline:
                    at = on_row(rows[i])
                    self._fail(f"{call}{at} took longer than {timeout:g} s (--env-timeout); "
                               "its worker was stopped. Make it faster or raise the timeout")
        return results

    def _send(self, worker: int, msg) -> None:
        try:
            self._conns[worker].send(msg)
        except (OSError, ValueError):
            self._fail(f"{msg[1]}: its worker process is gone (it died earlier)")

    def _read(self, worker: int, tag: int, call: str, row: int | str | None) -> Any:
        at = on_row(row)
        try:
            got, ok, value, what = self._conns[worker].recv()
        except (EOFError, OSError):
            self._fail(f"{call}{at}: its worker process died (os._exit, a signal, or a crash "
                       "such as running out of memory); run without --env-workers to see why")
        except Exception as e:  # noqa: BLE001 -- an answer that cannot be unpickled here
            self._fail(f"{call}{at}: its answer could not be read ({type(e).__name__}: {e})")
        if got != tag:
            self._fail(f"{call}{at}: the worker answered call {got}, not {tag}")
        if not ok:
            self._fail(f"{what or call}{at} raised {value}")
        return value

    def _fail(self, what: str) -> None:
        """Stop the workers (answers still queued would be read out of turn), then raise."""
        self._stopped = what
        self._kill()
        raise EnvError(f"{self.spec}: {what}")

    def _kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(2.0)


def call_envs(where: str, call: str, envs: Sequence[Any], args: Sequence[tuple], *,
              timeout: float | None = None, rows: Sequence[int | str | None]) -> list[Any]:
    """`env.<call>(*a)` for each env and its arguments (`call_env` for each, in turn); the
    environments of one `EnvWorkers` pool are called in parallel there."""
    pools = {id(e._pool) for e in envs if isinstance(e, RemoteEnv)}
    if envs and len(pools) == 1 and all(isinstance(e, RemoteEnv) for e in envs):
        return envs[0]._pool.call_many(call, list(zip(envs, args, strict=True)), rows)
    return [call_env(where, call, env_method(env, call), *a, timeout=timeout, row=row)
            for env, a, row in zip(envs, args, rows, strict=True)]
