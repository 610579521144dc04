"""The HTTP side of `vpo serve`: a Starlette app with OpenAI's `/v1/chat/completions`,
`/v1/completions` and `/v1/models` (and `/health`) in front of an `vpo.serve.engine.Engine`.

A request is read and checked (`vpo.serve.protocol`), its rows queued on the engine, and the
answer awaited without blocking the event loop, so many clients wait at once while the engine
batches their rows. A refused request is answered with OpenAI's error object and its status
(`vpo.errors.RequestError`: 400 / 404 / 413 / 422; 503 when the queue is full), and the server
goes on serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from vpo.errors import RequestError
from vpo.serve import protocol
from vpo.serve.engine import Engine, QueueFullError

MAX_BODY_BYTES = 8 << 20  # a request body larger than this is refused (413)


def _error(message: str, status: int, param=None, code=None) -> JSONResponse:
    return JSONResponse(protocol.error_body(message, status=status, param=param, code=code),
                        status_code=status)


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
    raw = b"".join(chunks)
    try:
        return json.loads(raw)
    except ValueError as e:
        raise RequestError(f"the body is not JSON: {e}", status=400) from None


def make_app(engine: Engine, limits: protocol.Limits) -> Starlette:
    """The app serving `engine` under the name `limits.model`."""
    tokenizer = engine.tokenizer

    def endpoint(parse, respond):
        async def handle(request: Request):
            try:
                gen = parse(await _body(request), tokenizer, limits)
                completions = await asyncio.wrap_future(engine.submit(gen))
            except RequestError as e:
                return _error(str(e), e.status, e.param, e.code)
            except QueueFullError as e:
                return _error(str(e), 503)
            except Exception as e:  # the engine failed this request; it serves the next ones
                return _error(f"generation failed: {type(e).__name__}: {e}", 500)
            return JSONResponse(respond(gen, completions, tokenizer, limits.model))

        return handle

    async def models(_: Request):
        return JSONResponse(protocol.models_response(limits.model))

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

    return Starlette(routes=[
        Route("/v1/chat/completions", endpoint(protocol.parse_chat, protocol.chat_response),
              methods=["POST"]),
        Route("/v1/completions", endpoint(protocol.parse_completion,
                                          protocol.completion_response), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ], exception_handlers={404: not_found, 405: not_found}, lifespan=lifespan)
