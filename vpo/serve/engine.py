"""Continuous batching for `vpo serve`: requests' rows decoded in a fixed number of slots, a
finished row's slot handed to the next waiting row between compiled chunks of decode steps.

One thread owns the device state (`vpo.rollout.live.LiveSlots`) and loops: admit waiting rows
into free slots (one prefill of the new prompts, `vpo.rollout.live.admit`), run a chunk of up to
`chunk` decode steps of every live slot (`vpo.rollout.live.decode_chunk`, which asks this thread
before every step whether rows wait and returns as soon as one can take a free slot), read the
chunk's tokens back, end rows on a stop string, and answer a request once all its rows have
ended. The decode program is compiled once per number of leading slots in use (a new row takes
the lowest free slot, and a step's work follows the slots in use, not all of them), the
prefill once per (rows admitted, prompt length), each rounded up to a power of two; `warmup`
compiles them all before serving. Row j of a
request with seed s decodes with key j of `jax.random.split(jax.random.key(s), rows)`: the keys
`vpo sample` gives its prompts x samples, so the same seed draws the same tokens.

The waiting queue is bounded (`queue` rows): `submit` raises `QueueFullError` (HTTP 503) past it.

A request submitted with a `listener` is told, from the engine thread after every chunk read
back, each row's new tokens (`Update`; the last one carries the row's `Completion`): what a
streamed response sends as it goes. Cancelling a request's future (its client went away) takes
its waiting rows off the queue at once and frees its decoding rows' slots before the next chunk.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import threading
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vpo.rollout import live as live_lib
from vpo.serve.protocol import MAX_LOGPROBS, Completion, Generation, PromptScores

MIN_PROMPT_BUCKET = 16


@dataclasses.dataclass(frozen=True)
class Update:
    """What row `j` of a request added in a chunk: its new token ids, their log-probs and top
    alternatives; `completion` once the row has ended (the tokens then stop where it does: a
    stop string's cut drops the tokens after it)."""

    j: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top: tuple[tuple[tuple[int, float], ...], ...]
    completion: Completion | None = None


class QueueFullError(RuntimeError):
    """The server's waiting queue is full (HTTP 503: try again later)."""


@dataclasses.dataclass
class _Request:
    gen: Generation
    future: concurrent.futures.Future
    seed: int
    done: list  # Completion per row, None while decoding
    left: int
    keys_J2: np.ndarray | None = None  # made by the engine thread on first admission
    listener: Callable[[Update], None] | None = None
    cancelled: bool = False


@dataclasses.dataclass
class _Row:
    request: _Request
    j: int  # the row of its request: prompt j // n, sample j % n
    tokens: list = dataclasses.field(default_factory=list)
    logps: list = dataclasses.field(default_factory=list)
    top: list = dataclasses.field(default_factory=list)
    reported: int = 0  # tokens told to the request's listener

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.request.gen.prompts[self.j // self.request.gen.n]


def bucket(n: int, low: int, high: int) -> int:
    """n rounded up to a power of two, at least `low`, at most `high`: the shapes a prefill is
    compiled for."""
    b = low
    while b < n:
        b *= 2
    return min(b, high)


def key_rows(rows: int) -> int:
    """How many keys `request_keys` splits for `rows`: a power of two (one compiled split per
    bucket), as jax's partitionable threefry gives the first `rows` keys of a larger split the
    keys of a split into `rows`; `rows` itself otherwise."""
    return bucket(rows, 1, 1 << 62) if jax.config.jax_threefry_partitionable else rows


def request_keys(seed: int, rows: int) -> np.ndarray:
    """uint32 [rows, 2]: the key data of `jax.random.split(jax.random.key(seed), rows)`, the
    keys `vpo sample` splits for its prompts x samples from --seed. A seed of 2**32 or more
    keeps its high 32 bits (the key jax makes of it with 64-bit integers on), not wrapped."""
    key = jax.random.wrap_key_data(np.asarray([seed >> 32, seed & 0xFFFFFFFF], np.uint32))
    return np.asarray(jax.random.key_data(jax.random.split(key, key_rows(rows))))[:rows]


@functools.partial(jax.jit, static_argnames=("graphdef",))
def prompt_logp_jit(graphdef, state, tokens_BP, mask_BP):
    """The log-prob of each prompt token given those before it, from one prefill of the
    (left-padded) prompts → (logp_BP, top_ids_BPJ, top_logp_BPJ): position p scores token p
    (position 0, with nothing before it, is 0); J = `MAX_LOGPROBS` alternatives."""
    model = nnx.merge(graphdef, state)
    hidden_BPD, _ = model.prefill(tokens_BP, mask_BP)
    logp_BPV = jax.nn.log_softmax(model.logits(hidden_BPD).astype(jnp.float32)[:, :-1], axis=-1)
    logp_BP = jnp.take_along_axis(logp_BPV, tokens_BP[:, 1:, None], axis=-1)[..., 0]
    top_logp_BPJ, top_ids_BPJ = jax.lax.top_k(logp_BPV, MAX_LOGPROBS)
    pad = ((0, 0), (1, 0))
    return (jnp.pad(logp_BP, pad), jnp.pad(top_ids_BPJ, (*pad, (0, 0))),
            jnp.pad(top_logp_BPJ, (*pad, (0, 0))))


class Engine:
    """The slots, the waiting queue and the thread that decodes (`start`, `submit`, `close`)."""

    def __init__(self, model, tokenizer, *, slots: int = 8, prompt_len: int = 256,
                 max_new_tokens: int = 256, chunk: int = 32, queue: int = 256, seed: int = 0):
        max_len = getattr(model.cfg, "max_seq_len", None)
        if max_len is not None and prompt_len + max_new_tokens > max_len:
            raise ValueError(f"--max-prompt-tokens {prompt_len} + --max-tokens "
                             f"{max_new_tokens} exceed the model's {max_len} positions; lower "
                             "one of them")
        self.model, self.tokenizer = model, tokenizer
        self.slots, self.prompt_len, self.max_new_tokens = slots, prompt_len, max_new_tokens
        self.chunk, self.queue = chunk, queue
        self._graphdef, self._state = nnx.split(model)
        self._live = live_lib.init_live(model, slots, prompt_len, max_new_tokens)
        self._rows: list[_Row | None] = [None] * slots
        self._waiting: collections.deque[_Row] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self.cancelled_rows = 0  # rows dropped because their request was cancelled
        self._rng = np.random.default_rng(seed)
        self._kw = dict(steps=chunk, stop_ids=tokenizer.stop_ids, pad_id=tokenizer.pad_id,
                        waiting=self._has_waiting)
        self._thread = threading.Thread(target=self._loop, name="vpo-serve-engine", daemon=True)

    # -- the callers' side ---------------------------------------------------------------------

    def start(self) -> Engine:
        self._thread.start()
        return self

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            if not self._thread.is_alive():  # never started: fail what waits here
                self._fail_all(QueueFullError("the server is shutting down"))
        if self._thread.is_alive():
            self._thread.join()

    def submit(self, gen: Generation,
               listener: Callable[[Update], None] | None = None) -> concurrent.futures.Future:
        """Queue a request's rows; the future's result is its `Completion`s in row order, and
        `listener` (called on the engine thread; it must not block) gets each row's `Update`s.
        Cancelling the future drops the request's rows. Raises `QueueFullError` when its rows
        do not fit the waiting queue."""
        rows = len(gen.prompts) * gen.n
        seed = gen.seed if gen.seed is not None else int(self._rng.integers(1 << 31))
        req = _Request(gen, concurrent.futures.Future(), seed, [None] * rows, rows,
                       listener=listener)
        with self._cv:
            if self._closed:
                raise QueueFullError("the server is shutting down")
            if len(self._waiting) + rows > self.queue:
                raise QueueFullError(f"the queue is full ({len(self._waiting)} of {self.queue} "
                                     "rows waiting); retry later")
            self._waiting.extend(_Row(req, j) for j in range(rows))
            self._cv.notify_all()
        req.future.add_done_callback(functools.partial(self._on_done, req))
        return req.future

    def _on_done(self, req: _Request, future: concurrent.futures.Future) -> None:
        """A cancelled request's waiting rows leave the queue now; its decoding rows' slots
        are freed by the engine thread before its next chunk."""
        if not future.cancelled():
            return
        with self._cv:
            req.cancelled = True
            kept = [r for r in self._waiting if r.request is not req]
            self.cancelled_rows += len(self._waiting) - len(kept)
            self._waiting = collections.deque(kept)
            self._cv.notify_all()

    def score(self, prompt: tuple[int, ...]) -> PromptScores:
        """The prompt's own log-probs and top `MAX_LOGPROBS` alternatives (one prefill; any
        thread may call it: the model's weights are read, not the slots)."""
        P = bucket(len(prompt), MIN_PROMPT_BUCKET, self.prompt_len)
        tokens = np.full((1, P), self.tokenizer.pad_id, np.int32)
        mask = np.zeros((1, P), bool)
        tokens[0, P - len(prompt):], mask[0, P - len(prompt):] = prompt, True
        logp, ids, top = jax.device_get(prompt_logp_jit(self._graphdef, self._state, tokens,
                                                        mask))
        real = slice(P - len(prompt), P)
        alts = [tuple(zip(i.tolist(), v.tolist(), strict=True))
                for i, v in zip(ids[0, real], top[0, real], strict=True)]
        return PromptScores((None, *logp[0, real][1:].tolist()), (None, *alts[1:]))

    def prompt_buckets(self) -> list[int]:
        """The prompt lengths a prefill is compiled for: 16, 32, ... up to the capacity."""
        return sorted({bucket(n, MIN_PROMPT_BUCKET, self.prompt_len)
                       for n in range(1, self.prompt_len + 1)})

    def warmup(self, *, scores: bool = True) -> None:
        """Compile before serving (call before `start`), so that no request compiles: the
        prefill of every (rows admitted, prompt length) bucket, the decode chunk over every
        bucket of slots in use, the release of slots, the keys of every request size the queue
        holds and, with `scores`, the prompt scoring of every prompt bucket (`echo`)."""
        sizes = sorted({bucket(a, 1, self.slots) for a in range(1, self.slots + 1)})
        for A in sizes:
            rows = np.full((A,), self.slots, np.int32)  # every row padding: nothing written
            z = np.zeros((A,), np.int32)
            for P in self.prompt_buckets():
                self._live = live_lib.admit_jit(
                    self._graphdef, self._state, self._live,
                    np.full((A, P), self.tokenizer.pad_id, np.int32), np.ones((A, P), bool),
                    rows, np.zeros((A, 2), np.uint32), np.ones((A,), np.float32),
                    np.ones((A,), np.float32), z, z, z)
            self._live, _ = live_lib.decode_chunk_jit(
                self._graphdef, self._state, self._live, np.bool_(False), rows=A, **self._kw)
        self._live = live_lib.release(self._live, np.zeros((self.slots,), bool))
        for rows in sorted({key_rows(r) for r in range(1, self.queue + 1)}):
            request_keys(0, rows)
        if scores:
            for P in self.prompt_buckets():
                self.score((self.tokenizer.pad_id,) * P)

    def load(self) -> dict:
        """Rows decoding and waiting, and rows dropped by cancelled requests (for /health)."""
        with self._cv:
            return {"decoding": sum(r is not None for r in self._rows),
                    "waiting": len(self._waiting), "slots": self.slots, "queue": self.queue,
                    "cancelled_rows": self.cancelled_rows}

    # -- the engine thread ---------------------------------------------------------------------

    def _has_waiting(self) -> np.bool_:
        """Whether rows wait for a slot: asked by the decode loop before every step (a chunk
        ends for them as soon as a slot is free)."""
        return np.bool_(bool(self._waiting))

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._waiting and not any(self._rows):
                    self._cv.wait()
                if self._closed:
                    self._fail_all(QueueFullError("the server is shutting down"))
                    return
                dropped = self._drop_cancelled()
                free = [s for s, r in enumerate(self._rows) if r is None]
                new = [(s, self._waiting.popleft()) for s in free[:len(self._waiting)]]
                for s, row in new:
                    self._rows[s] = row
                waiting = bool(self._waiting)
            try:
                if dropped.any():
                    self._live = live_lib.release(self._live, dropped)
                if new:
                    self._admit(new)
                if any(self._rows):
                    self._decode(waiting)
            except Exception as e:  # a device error fails the requests in flight, not the server
                with self._cv:
                    self._fail_all(e)

    def _drop_cancelled(self) -> np.ndarray:
        """Free the slots of cancelled requests' rows (under the lock) → bool [slots]: the
        slots the device must stop decoding."""
        dropped = np.zeros((self.slots,), bool)
        for s, row in enumerate(self._rows):
            if row is not None and row.request.cancelled:
                self._rows[s], dropped[s] = None, True
        self.cancelled_rows += int(dropped.sum())
        return dropped

    def _fail_all(self, error: Exception) -> None:
        """Fail every request decoding or waiting (under the lock) and free the slots."""
        for row in [*filter(None, self._rows), *self._waiting]:
            if not row.request.future.done():
                row.request.future.set_exception(error)
        self._rows = [None] * self.slots
        self._waiting.clear()
        self._live = live_lib.init_live(nnx.merge(self._graphdef, self._state), self.slots,
                                        self.prompt_len, self.max_new_tokens)

    def _admit(self, new: list[tuple[int, _Row]]) -> None:
        A = bucket(len(new), 1, self.slots)
        P = bucket(max(len(r.prompt) for _, r in new), MIN_PROMPT_BUCKET, self.prompt_len)
        tokens = np.full((A, P), self.tokenizer.pad_id, np.int32)
        mask = np.zeros((A, P), bool)
        slot = np.full((A,), self.slots, np.int32)  # padding rows write nowhere
        keys = np.zeros((A, 2), np.uint32)
        temperature, top_p = np.ones((A,), np.float32), np.ones((A,), np.float32)
        top_k, budget, top_n = (np.zeros((A,), np.int32) for _ in range(3))
        for a, (s, row) in enumerate(new):
            g = row.request.gen
            if row.request.keys_J2 is None:  # here, not in submit: the caller's thread (the
                # HTTP event loop) must not wait for the device behind a decode chunk
                row.request.keys_J2 = request_keys(row.request.seed, len(row.request.done))
            tokens[a, P - len(row.prompt):] = row.prompt
            mask[a, P - len(row.prompt):] = True
            slot[a], keys[a] = s, row.request.keys_J2[row.j]
            temperature[a], top_p[a], top_k[a] = g.temperature, g.top_p, g.top_k
            budget[a], top_n[a] = g.max_tokens, g.top_logprobs
        self._live = live_lib.admit_jit(self._graphdef, self._state, self._live, tokens, mask,
                                        slot, keys, temperature, top_p, top_k, budget, top_n)

    def _decode(self, waiting: bool) -> None:
        used = max((s + 1 for s, r in enumerate(self._rows) if r is not None), default=1)
        rows = bucket(used, 1, self.slots)  # the decode runs on the first rows only
        self._live, chunk = live_lib.decode_chunk_jit(self._graphdef, self._state, self._live,
                                                      np.bool_(waiting), rows=rows, **self._kw)
        wants_top = any(r is not None and r.request.gen.top_logprobs for r in self._rows)
        chunk = jax.device_get(chunk if wants_top else chunk._replace(top_ids_STJ=None,
                                                                      top_logp_STJ=None))
        released = np.zeros((self.slots,), bool)
        ended = []
        for s, row in enumerate(self._rows[:rows]):
            if row is None:
                continue
            k = chunk.mask_ST[s]
            row.tokens += chunk.tokens_ST[s][k].tolist()
            row.logps += chunk.logp_ST[s][k].tolist()
            if row.request.gen.top_logprobs:
                n = row.request.gen.top_logprobs
                row.top += [tuple(zip(i[:n].tolist(), p[:n].tolist(), strict=True))
                            for i, p in zip(chunk.top_ids_STJ[s][k], chunk.top_logp_STJ[s][k],
                                            strict=True)]
            cut = self._stop_string(row)
            if cut is not None:
                released[s] = not chunk.ended_S[s]
                ended.append((s, self._finish(row, "stop", cut)))
            elif chunk.ended_S[s]:
                reason = "stop" if chunk.stopped_S[s] else "length"
                ended.append((s, self._finish(row, reason)))
            self._report(row)
        if released.any():
            self._live = live_lib.release(self._live, released)
        with self._cv:
            for s, _ in ended:
                self._rows[s] = None
        for _, req in ended:
            if req is not None and not req.future.done():
                req.future.set_result(list(req.done))

    @staticmethod
    def _report(row: _Row) -> None:
        """Tell the row's listener its tokens since the last report (its `Completion` when it
        has ended)."""
        req = row.request
        if req.listener is None or req.cancelled:
            return
        done = req.done[row.j]
        m = len(row.tokens) if done is None else len(done.token_ids)
        a = row.reported
        row.reported = m
        req.listener(Update(row.j, tuple(row.tokens[a:m]), tuple(row.logps[a:m]),
                            tuple(row.top[a:m]), done))

    def _stop_string(self, row: _Row) -> tuple[int, str] | None:
        """(tokens kept, text) when a stop string of the row's request appears in its text:
        the tokens up to the one that completes the first stop string, the text before it."""
        stops = row.request.gen.stop
        if not stops:
            return None
        text = self.tokenizer.decode(row.tokens)
        if not any(s in text for s in stops):
            return None
        for m in range(1, len(row.tokens) + 1):
            text = self.tokenizer.decode(row.tokens[:m])
            at = [text.find(s) for s in stops if s in text]
            if at:
                return m, text[:min(at)]
        return None

    def _finish(self, row: _Row, reason: str, cut: tuple[int, str] | None = None):
        """Record the row's `Completion`; its request when that was the last row, else None."""
        m = len(row.tokens) if cut is None else cut[0]
        text = self.tokenizer.decode(row.tokens[:m]) if cut is None else cut[1]
        req = row.request
        req.done[row.j] = Completion(tuple(row.tokens[:m]), tuple(row.logps[:m]),
                                     tuple(row.top[:m]), reason, text)
        req.left -= 1
        return req if req.left == 0 else None
