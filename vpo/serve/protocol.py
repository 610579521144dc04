"""The OpenAI wire format of `vpo serve`: a request body checked and read into a `Generation`
(prompt token ids and sampling settings), and the response bodies built from its completions.

Every refusal is a `vpo.errors.RequestError` naming the field: 400 a body that is not a JSON
object or a prompt over the server's context, 404 an unknown model, 422 a value of the wrong
type or out of range. Fields OpenAI clients send with their neutral value (a zero penalty, an
empty `logit_bias`, `stream: false`) are accepted; set to anything else they are refused rather
than ignored. Responses carry, beside OpenAI's fields, the prompt's and each choice's token ids
(`prompt_token_ids`, `token_ids`: what RL against an external environment needs).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence

from vpo.errors import RequestError

MAX_STOP = 4  # stop strings per request (OpenAI's limit)
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs limit (completions' logprobs: 5)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the server holds: its model name, prompt and new-token capacity, the most rows
    (prompts x n) one request may ask for."""

    model: str
    prompt_len: int
    max_new_tokens: int
    max_rows: int


@dataclasses.dataclass(frozen=True)
class Generation:
    """One checked request: `prompts` token ids, `n` samples of each (row j = prompt j // n,
    sample j % n), and how to draw them."""

    kind: str  # "chat" or "completion"
    prompts: tuple[tuple[int, ...], ...]
    n: int
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop: tuple[str, ...]
    seed: int | None
    logprobs: bool
    top_logprobs: int


@dataclasses.dataclass(frozen=True)
class Completion:
    """One generated row: its token ids (the stop token included when it ended on one), their
    temperature-1 log-probs, the top alternatives at each position [(id, logp), ...], why it
    ended ("stop" or "length") and its text (a stop string and what follows it cut off)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top: tuple[tuple[tuple[int, float], ...], ...]
    finish_reason: str
    text: str


def _number(body: dict, name: str, default, *, low=None, high=None, integer=False):
    value = body.get(name, default)
    if value is None:
        value = default
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise RequestError(f"{name}: expected {'an integer' if integer else 'a number'}, got "
                           f"{value!r}", param=name)
    if (low is not None and value < low) or (high is not None and value > high):
        raise RequestError(f"{name}: {value} is outside [{low}, {high}]", param=name)
    return value


def _neutral(body: dict) -> None:
    """Refuse the OpenAI fields this server does not implement when set to a non-neutral value."""
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise RequestError(f"{name}: not supported by vpo serve; send 0 or leave it out",
                               param=name)
    for name, neutral in (("logit_bias", ({}, None)), ("stream", (False, None)),
                          ("echo", (False, None)), ("best_of", (None, 1)),
                          ("tools", (None, [])), ("suffix", (None, ""))):
        if body.get(name) not in neutral:
            raise RequestError(f"{name}: not supported by vpo serve; leave it out", param=name)


def _model(body: dict, limits: Limits) -> None:
    name = body.get("model")
    if name is None:
        return
    if name != limits.model:
        raise RequestError(f"model: {name!r} is not served here; this server serves "
                           f"{limits.model!r} (GET /v1/models)", status=404, param="model",
                           code="model_not_found")


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stop = [stop] if isinstance(stop, str) else stop
    if (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)
            or len(stop) > MAX_STOP):
        raise RequestError(f"stop: expected a non-empty string or a list of at most {MAX_STOP} "
                           f"of them, got {body.get('stop')!r}", param="stop")
    return tuple(stop)


def _sampling(body: dict, limits: Limits, prompts, *, default_max: int, logprobs: bool,
              top_logprobs: int, kind: str) -> Generation:
    _neutral(body)
    _model(body, limits)
    n = _number(body, "n", 1, low=1, integer=True)
    if n * len(prompts) > limits.max_rows:
        raise RequestError(f"n: {n} samples of {len(prompts)} prompt(s) exceed the "
                           f"{limits.max_rows} rows one request may ask for", param="n")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else \
        "max_tokens"
    max_tokens = _number(body, name, default_max, low=1, integer=True)
    if max_tokens > limits.max_new_tokens:
        raise RequestError(f"{name}: {max_tokens} exceeds the {limits.max_new_tokens} new "
                           "tokens this server generates per completion (vpo serve "
                           "--max-tokens)", status=400, param=name,
                           code="context_length_exceeded")
    top_k = _number(body, "top_k", 0, low=-1, integer=True)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"seed: expected an integer, got {seed!r}", param="seed")
    return Generation(
        kind=kind, prompts=tuple(tuple(p) for p in prompts), n=n, max_tokens=max_tokens,
        temperature=float(_number(body, "temperature", 1.0, low=0.0, high=2.0)),
        top_p=float(_number(body, "top_p", 1.0, low=0.0, high=1.0)), top_k=max(top_k, 0),
        stop=_stop(body), seed=None if seed is None else seed % (1 << 32),
        logprobs=logprobs, top_logprobs=top_logprobs)


def _check_prompt(ids: Sequence[int], limits: Limits, vocab: int, where: str) -> list[int]:
    if not ids:
        raise RequestError(f"{where}: the prompt is empty", param=where)
    if len(ids) > limits.prompt_len:
        raise RequestError(f"{where}: the prompt is {len(ids)} tokens, over the {limits.prompt_len}"
                           " this server holds (vpo serve --max-prompt-tokens)", status=400,
                           param=where, code="context_length_exceeded")
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise RequestError(f"{where}: token id {bad[0]} is outside the vocabulary of {vocab}",
                           param=where)
    return list(ids)


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI's content parts: text only
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise RequestError(f"messages[{i}].content: only text parts are supported",
                               param="messages")
        content = "".join(p["text"] for p in content)
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise RequestError(f"messages[{i}].content: expected a string, got {content!r}",
                           param="messages")
    return content


def parse_chat(body, tokenizer, limits: Limits) -> Generation:
    """A `/v1/chat/completions` body → `Generation`: the messages through the checkpoint's chat
    template (with the generation prompt), as `vpo sample` renders a prompt."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object", status=400)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: expected a non-empty list of {role, content} objects",
                           param="messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}]: expected an object with a string role, got "
                               f"{m!r}", param="messages")
        clean.append({"role": m["role"], "content": _content(m, i)})
    try:
        ids = tokenizer.prompt_ids(clean)
    except Exception as e:  # the checkpoint's template refuses these messages
        raise RequestError(f"messages: the chat template cannot render them: {e}",
                           param="messages") from None
    prompt = _check_prompt(ids, limits, tokenizer.size, "messages")
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, bool):
        raise RequestError(f"logprobs: expected true or false, got {logprobs!r}",
                           param="logprobs")
    top = _number(body, "top_logprobs", 0, low=0, high=MAX_TOP_LOGPROBS, integer=True)
    if top and not logprobs:
        raise RequestError("top_logprobs: needs logprobs: true", param="top_logprobs")
    return _sampling(body, limits, [prompt], default_max=limits.max_new_tokens,
                     logprobs=logprobs, top_logprobs=top, kind="chat")


def parse_completion(body, tokenizer, limits: Limits) -> Generation:
    """A `/v1/completions` body → `Generation`: `prompt` is text (tokenised as is, BOS first
    when the tokenizer adds one), token ids, or a list of either (one choice per prompt and
    sample, in that order)."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object", status=400)
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                   and all(isinstance(i, int) for i in prompt)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise RequestError("prompt: expected text, token ids or a non-empty list of them",
                           param="prompt")
    prompts = []
    for p in prompt:
        if isinstance(p, str):
            ids = tokenizer.encode(p)
            if tokenizer.add_bos and tokenizer.bos_id is not None:
                ids = [tokenizer.bos_id, *ids]
        elif (isinstance(p, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                          for i in p)):
            ids = p
        else:
            raise RequestError(f"prompt: expected text or a list of token ids, got {p!r}",
                               param="prompt")
        prompts.append(_check_prompt(ids, limits, tokenizer.size, "prompt"))
    top = _number(body, "logprobs", None, low=0, high=5, integer=True) \
        if body.get("logprobs") is not None else None
    return _sampling(body, limits, prompts, default_max=min(16, limits.max_new_tokens),
                     logprobs=top is not None, top_logprobs=top or 0, kind="completion")


def error_body(message: str, *, status: int, param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error object."""
    kind = {404: "not_found_error", 503: "server_overloaded"}.get(status,
                                                                  "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _usage(gen: Generation, completions: Sequence[Completion]) -> dict:
    prompt = sum(len(p) for p in gen.prompts)
    completion = sum(len(c.token_ids) for c in completions)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _token_text(tokenizer, i: int) -> str:
    return tokenizer.decode([i], skip_special_tokens=False)


def chat_response(gen: Generation, completions: Sequence[Completion], tokenizer,
                  model: str) -> dict:
    """The `chat.completion` object of a chat `Generation`'s completions (one choice each)."""
    choices = []
    for j, c in enumerate(completions):
        logprobs = None
        if gen.logprobs:
            content = []
            for t, (i, lp) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
                text = _token_text(tokenizer, i)
                content.append({
                    "token": text, "logprob": lp, "bytes": list(text.encode()),
                    "top_logprobs": [{"token": _token_text(tokenizer, a), "logprob": b,
                                      "bytes": list(_token_text(tokenizer, a).encode())}
                                     for a, b in (c.top[t][:gen.top_logprobs]
                                                  if gen.top_logprobs else ())]})
            logprobs = {"content": content}
        choices.append({"index": j, "message": {"role": "assistant", "content": c.text},
                        "finish_reason": c.finish_reason, "logprobs": logprobs,
                        "token_ids": list(c.token_ids)})
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": _usage(gen, completions), "prompt_token_ids": list(gen.prompts[0])}


def completion_response(gen: Generation, completions: Sequence[Completion], tokenizer,
                        model: str) -> dict:
    """The `text_completion` object of a completion `Generation` (choice j: prompt j // n)."""
    choices = []
    for j, c in enumerate(completions):
        logprobs = None
        if gen.logprobs:
            tokens = [_token_text(tokenizer, i) for i in c.token_ids]
            offsets, at = [], 0
            for t in tokens:
                offsets.append(at)
                at += len(t)
            logprobs = {"tokens": tokens, "token_logprobs": list(c.logprobs),
                        "top_logprobs": [{_token_text(tokenizer, a): b
                                          for a, b in top[:gen.top_logprobs]}
                                         for top in c.top] if gen.top_logprobs else None,
                        "text_offset": offsets}
        choices.append({"index": j, "text": c.text, "finish_reason": c.finish_reason,
                        "logprobs": logprobs, "token_ids": list(c.token_ids)})
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": _usage(gen, completions),
            "prompt_token_ids": [list(p) for p in gen.prompts]}


def models_response(model: str) -> dict:
    """The `/v1/models` list: the one model served."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0,
                                        "owned_by": "vpo"}]}
