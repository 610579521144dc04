"""The HTTP side of `vpo serve`: a Starlette app with OpenAI's `/v1/chat/completions`,
`/v1/completions` and `/v1/models` (and `/health`) in front of an `vpo.serve.engine.Engine`.

A request is read and checked (`vpo.serve.parse`), its rows queued on the engine, and the
answer awaited without blocking the event loop, so many clients wait at once while the engine
batches their rows; `stream: true` answers with server-sent events as the engine reads tokens
back (`vpo.serve.stream`). A client that goes away cancels its request: its rows leave the queue
and its slots are freed before the next chunk. A refused request is answered with OpenAI's error
object and its status (`vpo.errors.RequestError`: 400 / 404 / 413 / 422; 503 when the queue is
full), and the server goes on serving. With `access_log`, each request writes one line there:
method, path, status, tokens and milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
import time

import numpy as np
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from vpo.errors import RequestError
from vpo.serve import parse, protocol, stream
from vpo.serve.engine import Engine, QueueFullError

MAX_BODY_BYTES = 8 << 20  # a request body larger than this is refused (413)
MAX_DEPTH = 64  # a body nested deeper than this is refused (400) before it is parsed
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def _error(message: str, status: int, param=None, code=None) -> JSONResponse:
    return JSONResponse(protocol.error_body(message, status=status, param=param, code=code),
                        status_code=status)


def nesting(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text (strings skipped), counted
    without parsing it."""
    skeleton = np.frombuffer(_STRING.sub(b'""', raw), np.uint8)
    opens = (skeleton == ord("[")) | (skeleton == ord("{"))
    closes = (skeleton == ord("]")) | (skeleton == ord("}"))
    depth = np.cumsum(opens.astype(np.int64) - closes)
    return int(depth.max()) if depth.size else 0


def parse_json(raw: bytes):
    """The request's JSON value; a RequestError (400) when it is not JSON or nested deeper than
    `MAX_DEPTH`."""
    depth = nesting(raw)
    if depth > MAX_DEPTH:
        raise RequestError(f"the body is nested {depth} levels deep, over the {MAX_DEPTH} "
                           "accepted", status=400)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise RequestError(f"the body is not JSON: {e}", status=400) from None


async def _body(request: Request):
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
        raise RequestError(f"the body is {size} bytes, over the {MAX_BODY_BYTES} accepted",
                           status=413)
    chunks, read = [], 0
    async for chunk in request.stream():  # a body sent without its length is cut off, not held
        read += len(chunk)
        if read > MAX_BODY_BYTES:
            raise RequestError(f"the body is over the {MAX_BODY_BYTES} bytes accepted",
                               status=413)
        chunks.append(chunk)
    return parse_json(b"".join(chunks))


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone away (its request body already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, future):
    """The engine's answer to `future`, or None when the client goes away first (the future
    is then cancelled: the engine drops the request's rows)."""
    answer = asyncio.ensure_future(asyncio.wrap_future(future))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not answer.done():
            answer.cancel()  # cancels `future` too
    return None if answer.cancelled() else answer.result()


class EventStream:
    """An ASGI response of server-sent events: `events` (bytes) sent as they come."""

    def __init__(self, events):
        self.events = events

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache")]})
        async for data in self.events:
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _stream_events(request: Request, streamer: stream.Streamer, future, updates):
    """The events of a streamed request: its chunks as the engine reports its rows' updates,
    an error event if the engine fails it, `[DONE]`; the request is cancelled when the client
    goes away."""
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        for chunk in streamer.opening():
            yield stream.event(chunk)
        while True:
            get = asyncio.ensure_future(updates.get())
            await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                return
            update = get.result()
            if update is None:  # the future is done: every row reported, or a failure
                break
            for chunk in streamer.chunks(update):
                yield stream.event(chunk)
        if future.exception() is not None:
            e = future.exception()
            yield stream.event(protocol.error_body(
                f"generation failed: {type(e).__name__}: {e}", status=500))
            return
        for chunk in streamer.closing():
            yield stream.event(chunk)
        request.state.tokens = sum(len(p) for p in streamer.gen.prompts) + \
            streamer.completion_tokens
        yield stream.DONE
    finally:
        gone.cancel()
        future.cancel()  # a no-op once answered; else the engine drops the rows


def _empty(gen: protocol.Generation) -> list[protocol.Completion]:
    """The completions of `max_tokens: 0` (echo only): no tokens."""
    return [protocol.Completion((), (), (), "length", "")] * (len(gen.prompts) * gen.n)


def make_app(engine: Engine, limits: protocol.Limits, *, access_log=None) -> Starlette:
    """The app serving `engine` under the name `limits.model`; `access_log`: a text stream
    that gets a line per request (None: no log)."""
    tokenizer = engine.tokenizer
    started = int(time.time())

    def streamed(request: Request, gen: protocol.Generation) -> EventStream:
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue = asyncio.Queue()

        def tell(item):  # on the engine thread
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody listens
                loop.call_soon_threadsafe(updates.put_nowait, item)

        future = engine.submit(gen, listener=tell)
        future.add_done_callback(lambda _: tell(None))  # after the rows' last updates
        return EventStream(_stream_events(request, stream.Streamer(gen, tokenizer, limits.model),
                                          future, updates))

    async def answered(request: Request, gen: protocol.Generation, respond):
        if gen.max_tokens == 0:
            completions = _empty(gen)
        else:
            completions = await _unless_disconnected(request, engine.submit(gen))
            if completions is None:
                return None
        if gen.echo and gen.logprobs:
            scores = [await asyncio.to_thread(engine.score, p) for p in gen.prompts]
            body = respond(gen, completions, tokenizer, limits.model, scores)
        else:
            body = respond(gen, completions, tokenizer, limits.model)
        request.state.tokens = body["usage"]["total_tokens"]
        return JSONResponse(body)

    def endpoint(parse, respond):
        async def handle(request: Request):
            try:
                gen = parse(await _body(request), tokenizer, limits)
                if gen.stream:
                    return streamed(request, gen)
                response = await answered(request, gen, respond)
                return response if response is not None else _error(
                    "the client went away", 499)
            except RequestError as e:
                return _error(str(e), e.status, e.param, e.code)
            except QueueFullError as e:
                return _error(str(e), 503)
            except ClientDisconnect:  # gone before its body arrived: nothing was queued
                return _error("the client went away", 499)
            except Exception as e:  # the engine failed this request; it serves the next ones
                return _error(f"generation failed: {type(e).__name__}: {e}", 500)

        return handle

    async def models(_: Request):
        return JSONResponse(protocol.models_response(limits.model, started))

    async def health(_: Request):
        return JSONResponse({"status": "ok", "model": limits.model, **engine.load()})

    async def not_found(request: Request, exc):
        return _error(f"no route {request.method} {request.url.path}; this server has POST "
                      "/v1/chat/completions, POST /v1/completions, GET /v1/models",
                      getattr(exc, "status_code", 404))

    @contextlib.asynccontextmanager
    async def lifespan(_):
        yield
        engine.close()  # on shutdown: requests still waiting get an error, not a hang

    app = Starlette(routes=[
        Route("/v1/chat/completions", endpoint(parse.parse_chat, protocol.chat_response),
              methods=["POST"]),
        Route("/v1/completions", endpoint(parse.parse_completion,
                                          protocol.completion_response), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ], exception_handlers={404: not_found, 405: not_found}, lifespan=lifespan)
    if access_log is not None:
        app.add_middleware(AccessLog, out=access_log)
    return app


def access_line(method: str, path: str, status: int, tokens: int | None, ms: float) -> str:
    """One access-log line: `POST /v1/completions 200 tokens=42 118ms`."""
    return f"{method} {path} {status} tokens={'-' if tokens is None else tokens} {ms:.0f}ms"


class AccessLog:
    """ASGI middleware writing `access_line` of every HTTP request to `out` once answered
    (a stream's once it has ended); tokens: the request's prompt and new tokens."""

    def __init__(self, app, out):
        self.app, self.out = app, out

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0, status = time.perf_counter(), [0]
        scope.setdefault("state", {})

        async def keep(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, keep)
        finally:
            print(access_line(scope["method"], scope["path"], status[0],
                              scope["state"].get("tokens"), 1e3 * (time.perf_counter() - t0)),
                  file=self.out, flush=True)


class ServerStartError(RuntimeError):
    """`serving` could not start its server."""


@contextlib.contextmanager
def serving(app, *, name: str = "vpo-serve", wait_s: float = 30.0):
    """uvicorn serving `app` on a free local port on a daemon thread: yields the port once the
    server listens (`ServerStartError` if it does not within `wait_s`) and stops it on exit."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + wait_s
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not server.started:
            raise ServerStartError(f"could not serve on 127.0.0.1:{port}")
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)
