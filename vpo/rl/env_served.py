"""Episodes of a verifiers 0.4 environment through vpo's own endpoint (`vpo.env.from_verifiers_v1`).

`run_served_episodes` is what the environment step samples with when the `--env` factory gives
a `verifiers.v1` Env: it serves the policy of the current state on a local port (the engine and
the app of `vpo serve`: `vpo.serve.engine.Engine`, `vpo.serve.app.make_app`, under uvicorn on a
thread), runs the B rows × G episodes of the environment against it (its harness calls
`http://127.0.0.1:PORT/v1` through verifiers' interception server), keeps every chat completion
the server answered, by the `X-Session-ID` (the trace id) of its request, and builds the
`vpo.env.episode.Episodes` the update trains on from those records: token ids and log-probs as
the server sampled them, masks on the completions (`episode_tokens`), rewards from the
environment's scoring (`trace_rewards`). The server is stopped when the episodes are over; the
next step serves the updated policy (the compiled programs are kept: same shapes).

Every request carries the step's sampling (temperature, top_p, top_k) with `logprobs: true`;
its `max_tokens` (the harness's, else the server's T) is capped by what is left of the
episode's budget T (`sampler.max_new_tokens`) after the row's prompt (`Recorder`). Each slot of
the server holds C positions (`served_capacity`): `sampler.served_context`, by default the rows'
prompt length + 2 T (the budget, and as much again for what the turns add to the prompt), not
the model's positions (SmolLM2's 8192 would make a KV cache of gigabytes); prompts up to C - T
tokens are served, and a request whose prompt outgrows them is refused by the server and ends
the run with a `ConfigError` naming `sampler.served_context`. The log-probs the server reports
are the model's at temperature 1 (the trainer's): `logp_BGT`, and `sample_logp_BGT` too (equal
at temperature 1 without top-p / top-k filtering). The server does not report token entropies:
`entropy_BGT` is the model's temperature-1 entropy at each token, from one forward pass of the
policy over the episodes (`token_logp_entropy_jit`), as the sampler reports it on other tasks.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vpo.env.episode import Episodes
from vpo.errors import ConfigError, EnvError
from vpo.rl.step import completion_logp
from vpo.tasks.base import ROW
from vpo.types import Rollout

SERVED_NAME = "vpo-policy"  # the model name the environment's requests are sent for


class Recorder:
    """An ASGI app in front of vpo's: every 200 answer to /v1/chat/completions, its JSON
    body (a streamed one's chunks added up: `streamed_answer`) kept under the request's
    X-Session-ID, in the order answered. Each request's
    `max_tokens` is capped by what is left of the episode's budget `T` after its first
    request's prompt (`measure(body)`: the prompt's tokens as the server reads them; at least
    1): tokens past T are not trained on, so they are not sampled at length."""

    def __init__(self, app, T: int, measure: Callable[[dict], int | None],
                 prompt_len: int | None = None):
        self.app, self.T, self.measure, self.prompt_len = app, T, measure, prompt_len
        self.calls: dict[str, list[dict[str, Any]]] = {}
        self.first: dict[str, int] = {}  # each episode's first prompt length
        self.outgrown: list[int] = []  # prompts longer than the server's `prompt_len`
        self.lock = threading.Lock()

    def _room(self, session: str, body: dict) -> int:
        n = self.measure(body)
        if n is None:  # a bad request: the server answers it
            return self.T
        with self.lock:
            first = self.first.setdefault(session, n)
            if self.prompt_len is not None and n > self.prompt_len:
                self.outgrown.append(n)
        return max(1, self.T - (n - first))

    async def _body(self, receive, session: str):
        """The request's body with `max_tokens` capped by the episode's room, replayed."""
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if isinstance(body, dict):
            room = self._room(session, body)
            asked = body.get("max_completion_tokens", body.get("max_tokens"))
            body.pop("max_completion_tokens", None)
            body["max_tokens"] = min(asked, room) if isinstance(asked, int) and asked > 0 \
                else room
            raw = json.dumps(body).encode()
        sent = [False]

        async def replay():
            if sent[0]:
                return await receive()
            sent[0] = True
            return {"type": "http.request", "body": raw, "more_body": False}

        return raw, replay

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return
        session = dict(scope.get("headers") or []).get(b"x-session-id", b"").decode()
        raw, receive = await self._body(receive, session)
        scope = {**scope, "headers": [(k, v) for k, v in scope.get("headers") or []
                                      if k != b"content-length"]
                 + [(b"content-length", str(len(raw)).encode())]}
        status, body = [0], []

        async def keep(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body":
                body.append(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, keep)
        if status[0] != 200:
            return
        raw = b"".join(body)
        answer = streamed_answer(raw) if raw.startswith(b"data:") else json.loads(raw)
        if answer is not None:
            with self.lock:
                self.calls.setdefault(session, []).append(answer)


def streamed_answer(raw: bytes) -> dict | None:
    """The chat completion a streamed answer (server-sent events of vpo serve's chunks) adds up
    to, as much as an episode's record reads: prompt_token_ids, and per choice its token_ids
    and log-probs (`logprobs.content`); None when the stream carried an error."""
    prompt, choices = None, {}
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            return None
        prompt = chunk.get("prompt_token_ids", prompt)
        for c in chunk.get("choices") or []:
            into = choices.setdefault(c["index"], {"index": c["index"], "token_ids": [],
                                                   "logprobs": None})
            into["token_ids"] += c.get("token_ids") or []
            content = (c.get("logprobs") or {}).get("content")
            if content:
                into["logprobs"] = {"content": (into["logprobs"] or {"content": []})["content"]
                                    + content}
    return {"prompt_token_ids": prompt, "choices": [choices[j] for j in sorted(choices)]}


@functools.partial(jax.jit, static_argnames=("graphdef",))
def token_logp_entropy_jit(graphdef, state, prompt_BP, mask_BP, tokens_BGT):
    """The policy's temperature-1 log-prob and entropy at each of `tokens_BGT` after its prompt
    → (logp_BGT, entropy_BGT) (`vpo.rl.step.completion_logp`)."""
    return completion_logp(nnx.merge(graphdef, state), prompt_BP, mask_BP, tokens_BGT)


def served_capacity(prompt_len: int, T: int, context: int, positions: int) -> tuple[int, int]:
    """(prompts P, new tokens T) of each slot of the policy served to the episodes: C = P + T
    positions, C = `context` (`sampler.served_context`) or, when 0, the rows' `prompt_len` + 2 T
    within the model's `positions`; a ConfigError when C does not hold the rows' prompts and
    the budget T, or exceeds the model's positions."""
    slot = context or min(positions, prompt_len + 2 * T)
    if slot > positions:
        raise ConfigError(f"sampler.served_context {slot}: the model has {positions} positions; "
                          "lower it (0: the rows' prompt length + 2 x sampler.max_new_tokens)")
    if prompt_len + T > slot:
        raise ConfigError(f"sampler.served_context {slot}: the rows' prompts ({prompt_len} tokens) "
                          f"and the episode's budget sampler.max_new_tokens {T} need "
                          f"{prompt_len + T} positions (the model has {positions}); raise it or "
                          "lower sampler.max_new_tokens")
    return slot - T, T


def _outgrown_error(recorder: Recorder, P: int, T: int, where: str) -> ConfigError:
    return ConfigError(f"{where}: an episode's request has a prompt of {max(recorder.outgrown)} "
                       f"tokens, over the {P} the served policy holds (sampler.served_context "
                       f"{P + T} less sampler.max_new_tokens {T}); raise "
                       "sampler.served_context (within the model's positions) or make the "
                       "episodes' conversations shorter")


def run_served_episodes(model, tokenizer, make: Callable[[], Any],
                        rows: Sequence[dict[str, Any]], G: int, *,
                        prompts: tuple[np.ndarray, np.ndarray], max_tokens: int,
                        temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                        seed: int = 0, where: str = "--env", slots: int = 16,
                        context: int = 0) -> tuple[Episodes, np.ndarray]:
    """B = len(rows) rows × G episodes of the verifiers.v1 environment of `make` (the
    factory `vpo.env.from_verifiers_v1.from_verifiers_v1` gives), the policy `model` served
    for them → (`Episodes`, trained_BG: the completions of each episode trained on; see the
    module docstring). prompts: the rows' rendered prompts
    (prompt_BP, mask_BP) of the step's batch; max_tokens: T, the episode's token budget;
    context: the served slots' positions (`sampler.served_context`; 0: `served_capacity`'s)."""
    try:
        from vpo.serve.app import ServerStartError, make_app, serving
    except ImportError as e:
        raise ConfigError(f"a verifiers.v1 environment runs through vpo's endpoint, which needs "
                          f"Starlette and uvicorn ({e}): pip install -e '.[serve]'") from None
    from vpo.env import from_verifiers_v1 as v1
    from vpo.serve.engine import Engine
    from vpo.serve.parse import parse_chat
    from vpo.serve.protocol import Limits
    from vpo.serve.tools import tool_format

    adapter = make()
    B, T = len(rows), max_tokens
    prompt_BP, mask_BP = prompts
    P, _ = served_capacity(int(np.shape(prompt_BP)[1]), T, context, model.cfg.max_seq_len)
    tasks = [adapter.task(row) for row in rows for _ in range(G)]
    engine = Engine(model, tokenizer, slots=slots, prompt_len=P, max_new_tokens=T, chunk=16,
                    queue=max(256, 4 * B * G), seed=seed).start()
    limits = Limits(SERVED_NAME, P, T, max_rows=1,
                    tool_format=tool_format(tokenizer.chat_template))
    unbounded = dataclasses.replace(limits, prompt_len=1 << 30, max_new_tokens=1 << 30)

    def measure(body: dict) -> int | None:
        try:
            return len(parse_chat(body, tokenizer, unbounded).prompts[0])
        except Exception:  # noqa: BLE001 -- the server refuses it with its named error
            return None

    recorder = Recorder(make_app(engine, limits), T, measure, prompt_len=P)
    sampling = {"temperature": float(temperature), "top_p": float(top_p),
                "top_k": int(top_k), "logprobs": True}  # max_tokens: the Recorder's
    try:
        with serving(recorder, name="vpo-env-serve", wait_s=30.0) as port:
            traces = v1.run_v1_episodes(adapter.env, tasks, f"http://127.0.0.1:{port}/v1",
                                        SERVED_NAME, sampling, where)
    except ServerStartError as e:
        raise EnvError(f"vpo could not serve the policy for the verifiers environment ({e})"
                       ) from None
    except EnvError as e:
        if recorder.outgrown:
            raise _outgrown_error(recorder, P, T, where) from e
        raise
    finally:
        engine.close()
    if recorder.outgrown:
        raise _outgrown_error(recorder, P, T, where)
    R = len(adapter.reward_names)
    tokens = np.full((B, G, T), int(tokenizer.pad_id), np.int32)
    mask = np.zeros((B, G, T), bool)
    logp = np.zeros((B, G, T), np.float32)
    finished = np.zeros((B, G), bool)
    turns, trained, obs = (np.zeros((B, G), np.int32) for _ in range(3))
    rewards = np.zeros((B, G, R), np.float32)
    messages: list[list[list[dict[str, str]]]] = [[[] for _ in range(G)] for _ in range(B)]
    for i, trace in enumerate(traces):
        b, g = divmod(i, G)
        row = rows[b].get(ROW, b)
        calls = v1.chat_calls(recorder.calls.get(trace.id, []))
        prompt = np.asarray(prompt_BP[b])[np.asarray(mask_BP[b], bool)].tolist()
        ep = v1.episode_tokens(calls, prompt, T, where, row)
        n = ep["length"]
        tokens[b, g, :n] = ep["tokens"][:n]
        mask[b, g], logp[b, g], finished[b, g] = ep["mask"], ep["logp"], ep["finished"]
        turns[b, g], trained[b, g] = len(calls), ep["trained"]
        obs[b, g] = n - int(ep["mask"].sum())
        rewards[b, g] = v1.trace_rewards(trace, adapter.reward_names, where, row)
        messages[b][g] = v1.trace_messages(trace)
    graphdef, state = nnx.split(model)
    _, entropy = token_logp_entropy_jit(graphdef, state, jnp.asarray(prompt_BP),
                                        jnp.asarray(mask_BP), jnp.asarray(tokens))
    rollout = Rollout(jnp.asarray(tokens), jnp.asarray(logp), jnp.asarray(logp),
                      jnp.where(jnp.asarray(mask), entropy, 0.0), jnp.asarray(mask),
                      jnp.asarray(mask.sum(-1), jnp.int32), jnp.asarray(finished))
    return Episodes(rollout, prompt_BP, mask_BP, messages, rewards, np.ones((B, G, R), bool),
                    turns, obs, prefills=int(turns.sum())), trained
