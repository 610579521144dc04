"""The OpenAI wire format of `vpo serve`: what the server holds (`Limits`), a checked request
(`Generation`, read by `vpo.serve.parse`), its rows' `Completion`s, and the response bodies built
from them (a chat choice's tool calls parsed by `vpo.serve.tools` when the request has tools).
Responses carry, beside OpenAI's fields, the prompt's and each choice's token ids
(`prompt_token_ids`, `token_ids`: what RL against an external environment needs).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence

from vpo.serve.tools import ToolFormat, parse_tool_calls

MAX_TOP_LOGPROBS = 20  # chat's top_logprobs limit (completions' logprobs: 5)
MAX_LOGPROBS = 5  # completions' logprobs limit (OpenAI's)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the server holds: its model name, prompt and new-token capacity, the most rows
    (prompts x n) one request may ask for, and its chat template's tool format (read once from
    the template when the tokenizer is loaded: `vpo.serve.tools.tool_format`)."""

    model: str
    prompt_len: int
    max_new_tokens: int
    max_rows: int
    tool_format: ToolFormat = ToolFormat.NONE


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
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    echo: bool = False  # completions: the prompt (and its log-probs) before each completion
    texts: tuple[str | None, ...] = ()  # completions: each prompt's text as sent (None: ids)
    tool_calls: ToolFormat = ToolFormat.NONE  # chat: the format its answers' tool calls are
    # parsed in (NONE: no tools, or tool_choice "none": the text is the content)


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


@dataclasses.dataclass(frozen=True)
class PromptScores:
    """A prompt's own log-probs (`echo`): token t's under the model given tokens < t, the top
    alternatives at each position; position 0 has none (None, as OpenAI and vLLM report)."""

    logprobs: tuple[float | None, ...]
    top: tuple[tuple[tuple[int, float], ...] | None, ...]


def error_body(message: str, *, status: int, param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error object."""
    kind = {404: "not_found_error", 503: "server_overloaded"}.get(status,
                                                                  "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(gen: Generation, completion_tokens: int) -> dict:
    """OpenAI's usage object: the request's prompt tokens (each prompt once) and new tokens."""
    prompt = sum(len(p) for p in gen.prompts)
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens}


def _token_text(tokenizer, i: int) -> str:
    return tokenizer.decode([i], skip_special_tokens=False)


def chat_logprobs(tokenizer, ids: Sequence[int], logps: Sequence[float], top, n: int) -> dict:
    """Chat's `logprobs` object of tokens `ids`: each token's log-prob and its n most likely
    alternatives (`top[t]`: [(id, logp), ...])."""
    content = []
    for t, (i, lp) in enumerate(zip(ids, logps, strict=True)):
        text = _token_text(tokenizer, i)
        content.append({
            "token": text, "logprob": lp, "bytes": list(text.encode()),
            "top_logprobs": [{"token": _token_text(tokenizer, a), "logprob": b,
                              "bytes": list(_token_text(tokenizer, a).encode())}
                             for a, b in (top[t][:n] if n else ())]})
    return {"content": content}


def legacy_logprobs(tokenizer, ids: Sequence[int], logps: Sequence[float | None], top, n: int,
                    *, offset: int = 0) -> dict:
    """Completions' `logprobs` object of tokens `ids`: tokens, token_logprobs, top_logprobs
    ({text: logp} of the n alternatives, None where `top[t]` is: an echoed prompt's first
    token) and text_offset (each token's start in the text, from `offset`)."""
    tokens = [_token_text(tokenizer, i) for i in ids]
    offsets, at = [], offset
    for t in tokens:
        offsets.append(at)
        at += len(t)
    tops = None
    if n:
        tops = [None if alt is None else {_token_text(tokenizer, a): b for a, b in alt[:n]}
                for alt in top]
    return {"tokens": tokens, "token_logprobs": list(logps), "top_logprobs": tops,
            "text_offset": offsets}


def chat_response(gen: Generation, completions: Sequence[Completion], tokenizer,
                  model: str) -> dict:
    """The `chat.completion` object of a chat `Generation`'s completions (one choice each)."""
    choices = []
    for j, c in enumerate(completions):
        logprobs = chat_logprobs(tokenizer, c.token_ids, c.logprobs, c.top, gen.top_logprobs) \
            if gen.logprobs else None
        content, calls = parse_tool_calls(c.text, gen.tool_calls)
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        choices.append({"index": j, "message": message,
                        "finish_reason": "tool_calls" if calls else c.finish_reason,
                        "logprobs": logprobs, "token_ids": list(c.token_ids)})
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": usage(gen, sum(len(c.token_ids) for c in completions)),
            "prompt_token_ids": list(gen.prompts[0])}


def prompt_text(gen: Generation, k: int, tokenizer) -> str:
    """Prompt k's text: as sent, or its token ids decoded (special tokens written out)."""
    text = gen.texts[k] if k < len(gen.texts) else None
    return tokenizer.decode(gen.prompts[k], skip_special_tokens=False) if text is None else text


def _echoed(gen: Generation, k: int, c: Completion, tokenizer,
            scores: PromptScores | None) -> tuple[str, dict | None]:
    """(text, logprobs) of a choice of prompt k with its prompt before it (`echo`)."""
    head = prompt_text(gen, k, tokenizer)
    if not gen.logprobs:
        return head + c.text, None
    prompt = legacy_logprobs(tokenizer, gen.prompts[k], scores.logprobs, scores.top,
                             gen.top_logprobs)
    new = legacy_logprobs(tokenizer, c.token_ids, c.logprobs, c.top, gen.top_logprobs,
                          offset=len(head))
    return head + c.text, {key: None if prompt[key] is None else prompt[key] + new[key]
                           for key in prompt}


def completion_response(gen: Generation, completions: Sequence[Completion], tokenizer,
                        model: str, scores: Sequence[PromptScores] | None = None) -> dict:
    """The `text_completion` object of a completion `Generation` (choice j: prompt j // n);
    with `echo`, each choice is its prompt then its completion, the prompt's log-probs
    `scores[prompt]` when log-probs were asked."""
    choices = []
    for j, c in enumerate(completions):
        k = j // gen.n
        if gen.echo:
            text, logprobs = _echoed(gen, k, c, tokenizer, scores[k] if scores else None)
        else:
            text = c.text
            logprobs = legacy_logprobs(tokenizer, c.token_ids, c.logprobs, c.top,
                                       gen.top_logprobs) if gen.logprobs else None
        choices.append({"index": j, "text": text, "finish_reason": c.finish_reason,
                        "logprobs": logprobs, "token_ids": list(c.token_ids)})
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": usage(gen, sum(len(c.token_ids) for c in completions)),
            "prompt_token_ids": [list(p) for p in gen.prompts]}


def models_response(model: str, created: int) -> dict:
    """The `/v1/models` list: the one model served, `created` the server's start (seconds)."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created,
                                        "owned_by": "vpo"}]}
