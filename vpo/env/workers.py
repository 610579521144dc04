"""Environments in worker processes (`vpo train --env-workers N`).

An environment's calls (a sandboxed program, a search index, a slow simulator) can block,
hang or crash the interpreter. With workers, every episode's environment lives in one of N
processes ("spawn": safe beside JAX's threads), pinned there for its life (its state is on the
instance). The calls of one turn are sent to every worker before any answer is read, so the
episodes waiting on the environment advance in parallel, one call per worker at a time.

A call past `timeout` seconds kills the workers (a hung call is stopped, not left running as
an in-process timeout's thread is), so does a worker that dies; either is an `EnvError` naming
the environment, the call and the dataset row, and every later call fails. An exception
inside the environment is the `EnvError` an in-process call gives (and stops the workers too:
the run ends with it, as it does in-process).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from vpo.errors import EnvError


def _serve(spec: str, conn) -> None:
    """A worker's loop: build environments by `spec`'s factory, answer (tag, op, key, args)."""
    from vpo.env.base import load_env_factory

    try:
        factory = load_env_factory(spec)
        probe = factory()
        conn.send((0, True, (tuple(probe.reward_names), tuple(probe.weights))))
    except BaseException as e:  # noqa: BLE001 -- reported to the parent, which names it
        conn.send((0, False, f"{type(e).__name__}: {e}"))
        return
    envs: dict[int, Any] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        tag, op, key, args = msg
        try:
            if op == "new":
                envs[key], out = factory(), None
            elif op == "drop":
                envs.pop(key, None)
                continue
            else:
                out = getattr(envs[key], op)(*args)
            conn.send((tag, True, out))
        except BaseException as e:  # noqa: BLE001 -- the user's code: any failure is named
            try:
                conn.send((tag, False, f"{type(e).__name__}: {e}"))
            except Exception:  # noqa: BLE001 -- e.g. an unpicklable exception text
                conn.send((tag, False, f"{type(e).__name__}"))


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

    def score(self, messages):
        return self._pool.call_many("score", [(self, (messages,))])[0]


class EnvWorkers:
    """N processes holding environments of `spec` (`MODULE:FACTORY`); `factory()` gives a
    `RemoteEnv`, placed on the next worker in turn."""

    def __init__(self, spec: str, workers: int, timeout: float | None):
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"env workers: must be an integer >= 1, got {workers!r}")
        self.spec, self.timeout = spec, timeout
        self._dropped: list[int] = []
        self._stopped: str | None = None
        self._lock = threading.Lock()
        self._keys = itertools.count(1)
        self._tags = itertools.count(1)
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
        self._home: dict[int, int] = {}
        firsts = [self._receive(i, 0, "make_env", None, None) for i in range(workers)]
        self.reward_names, self.weights = firsts[0]

    def factory(self) -> RemoteEnv:
        """A new environment on the next worker (the `make_env` of episodes with workers)."""
        with self._lock:
            self._check()
            key = next(self._keys)
            worker = key % len(self._conns)
            self._home[key] = worker
            tag = next(self._tags)
            self._send(worker, (tag, "new", key, ()))
            self._receive(worker, tag, "make_env", None, self.timeout)
        return RemoteEnv(self, key, self.reward_names, self.weights)

    def call_many(self, call: str, calls: Sequence[tuple[RemoteEnv, tuple]],
                  rows: Sequence[int | None] | None = None) -> list[Any]:
        """`env.<call>(*args)` for each (env, args), every request sent before any answer is
        read (each worker answers its own in order); the results in the order given."""
        rows = list(rows) if rows is not None else [None] * len(calls)
        with self._lock:
            self._check()
            self._flush_drops()
            sent = []
            for (env, args), row in zip(calls, rows, strict=True):
                worker, tag = self._home[env._key], next(self._tags)
                self._send(worker, (tag, call, env._key, args))
                sent.append((worker, tag, row))
            return [self._receive(worker, tag, call, row, self.timeout)
                    for worker, tag, row in sent]

    def close(self) -> None:
        """Stop the workers (a running call is killed)."""
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        for proc in self._procs:
            proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []

    # -- internals -------------------------------------------------------------------------

    def _check(self) -> None:
        if self._stopped:
            raise EnvError(f"{self.spec}: the environment workers were stopped after an "
                           f"earlier failure: {self._stopped}")

    def _flush_drops(self) -> None:
        while self._dropped:
            key = self._dropped.pop()
            worker = self._home.pop(key, None)
            if worker is not None:
                self._send(worker, (0, "drop", key, ()))

    def _send(self, worker: int, msg) -> None:
        try:
            self._conns[worker].send(msg)
        except (OSError, ValueError, BrokenPipeError):
            self._fail(f"{msg[1]}: its worker process is gone (it died earlier)")

    def _receive(self, worker: int, tag: int, call: str, row: int | None,
                 timeout: float | None) -> Any:
        at = f" on dataset row {row}" if row is not None else ""
        conn = self._conns[worker]
        try:
            ready = conn.poll(timeout)
        except (OSError, ValueError):
            ready = True
        if not ready:
            self._fail(f"{call}{at} took longer than {timeout:g} s (--env-timeout); its worker "
                       "was stopped. Make it faster or raise the timeout")
        try:
            got, ok, value = conn.recv()
        except (EOFError, OSError):
            self._fail(f"{call}{at}: its worker process died (os._exit, a signal, or a crash "
                       "such as running out of memory); run without --env-workers to see why")
        if got != tag:
            self._fail(f"{call}{at}: the worker answered out of turn")
        if not ok:
            self._fail(f"{call}{at} raised {value}")
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
