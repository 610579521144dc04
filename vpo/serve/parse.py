"""Requests of `vpo serve` read and checked: an OpenAI `/v1/chat/completions` or
`/v1/completions` body into a `vpo.serve.protocol.Generation` (prompt token ids and sampling
settings), or a `vpo.errors.RequestError` naming the field.

400 a body that is not a JSON object, a prompt over the server's context, a number that is not
finite or a seed out of range; 404 an unknown model; 422 a field this server does not know or
implement, or a value of the wrong type or out of range. Fields OpenAI clients send with their
neutral value (a zero penalty, an empty `logit_bias`, `response_format: {"type": "text"}`) are
accepted; set to anything else they are refused rather than ignored; `IGNORED` lists the fields
accepted that change nothing. Tools (`vpo.serve.tools`) are rendered through the chat template
when the checkpoint's template has a tool format, and refused by name when it has none.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from vpo.errors import RequestError
from vpo.serve import tools as tools_lib
from vpo.serve.protocol import MAX_LOGPROBS, MAX_TOP_LOGPROBS, Generation, Limits

MAX_STOP = 4  # stop strings per request (OpenAI's limit)
MAX_SEED = 1 << 63  # seeds are in [0, 2**63): all 64 bits of the key, none wrapped
CHARS_SLACK = 4  # a normaliser may fold this many characters of a prompt into one

# Accepted and meaningless here: the field, and why it changes nothing.
IGNORED = {"user": "an end-user id OpenAI keeps for abuse monitoring; no output depends on it"}
_COMMON = frozenset({"model", "n", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed",
                     "stream", "stream_options", "logprobs", "presence_penalty",
                     "frequency_penalty", "logit_bias", *IGNORED})
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "response_format",
                         "tools", "tool_choice", "parallel_tool_calls"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "best_of", "suffix"}
TOOL_KEYS = ("tool_calls", "tool_call_id", "name")  # message fields with a tool format


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


def _non_finite(value, path: str) -> str | None:
    """The path of the first NaN or infinite number in a parsed body (Python's json reads
    NaN, Infinity and 1e999), else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, v in items:
        if isinstance(v, dict | list | float):
            found = _non_finite(v, f"{path}[{key!r}]" if isinstance(key, str) else
                                f"{path}[{key}]")
            if found is not None:
                return found
    return None


def _fields(body, allowed: frozenset) -> dict:
    """The body as a dict of known fields with finite numbers, else the named refusal."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object", status=400)
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        raise RequestError(f"{unknown[0]}: not a field vpo serve implements (it accepts "
                           f"{', '.join(sorted(allowed))})", param=unknown[0],
                           code="unsupported_parameter")
    for name, value in body.items():
        found = _non_finite(value, name)
        if found is not None:
            raise RequestError(f"{found}: numbers must be finite (NaN and Infinity are not "
                               "accepted)", status=400, param=name)
    return body


def _neutral(body: dict) -> None:
    """Refuse the OpenAI fields this server does not implement when set to a non-neutral value."""
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise RequestError(f"{name}: not supported by vpo serve; send 0 or leave it out",
                               param=name, code="unsupported_parameter")
    for name, neutral in (("logit_bias", ({}, None)), ("best_of", (None, 1)),
                          ("suffix", (None, ""))):
        if body.get(name) not in neutral:
            raise RequestError(f"{name}: not supported by vpo serve (no suffixes or biases "
                               "yet); leave it out", param=name, code="unsupported_parameter")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise RequestError(f"response_format: {fmt!r} asks for constrained output (JSON mode or "
                           "a schema), which vpo serve does not support; send {\"type\": \"text\"} "
                           "or leave it out", param="response_format",
                           code="unsupported_parameter")


def _stream(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage) of `stream` and `stream_options`."""
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise RequestError(f"stream: expected true or false, got {stream!r}", param="stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise RequestError("stream_options: only with stream: true", param="stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"} or not isinstance(
            options.get("include_usage", False), bool):
        raise RequestError(f"stream_options: expected {{\"include_usage\": true|false}}, got "
                           f"{options!r}", param="stream_options")
    return True, options.get("include_usage", False)


def _seed(body: dict) -> int | None:
    seed = body.get("seed")
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise RequestError(f"seed: expected an integer, got {seed!r}", param="seed")
    if not 0 <= seed < MAX_SEED:
        raise RequestError(f"seed: {seed} is outside [0, 2**63); seeds are not wrapped",
                           status=400, param="seed")
    return seed


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
              top_logprobs: int, kind: str, echo: bool = False,
              texts: tuple[str | None, ...] = (),
              tool_calls: tools_lib.ToolFormat = tools_lib.ToolFormat.NONE) -> Generation:
    _neutral(body)
    _model(body, limits)
    stream, include_usage = _stream(body)
    n = _number(body, "n", 1, low=1, integer=True)
    if n * len(prompts) > limits.max_rows:
        raise RequestError(f"n: {n} samples of {len(prompts)} prompt(s) exceed the "
                           f"{limits.max_rows} rows one request may ask for", param="n")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else \
        "max_tokens"
    max_tokens = _number(body, name, default_max, low=0 if echo else 1, integer=True)
    if max_tokens > limits.max_new_tokens:
        raise RequestError(f"{name}: {max_tokens} exceeds the {limits.max_new_tokens} new "
                           "tokens this server generates per completion (vpo serve "
                           "--max-tokens)", status=400, param=name,
                           code="context_length_exceeded")
    top_k = _number(body, "top_k", 0, low=-1, high=1 << 30, integer=True)
    return Generation(
        kind=kind, prompts=tuple(tuple(p) for p in prompts), n=n, max_tokens=max_tokens,
        temperature=float(_number(body, "temperature", 1.0, low=0.0, high=2.0)),
        top_p=float(_number(body, "top_p", 1.0, low=0.0, high=1.0)), top_k=max(top_k, 0),
        stop=_stop(body), seed=_seed(body), logprobs=logprobs, top_logprobs=top_logprobs,
        stream=stream, include_usage=include_usage, echo=echo, texts=texts,
        tool_calls=tool_calls)


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


@functools.lru_cache(maxsize=8)
def longest_token(tokenizer) -> int:
    """The most characters one token of `tokenizer` stands for (its longest vocabulary entry,
    plus a separating space)."""
    backend = tokenizer.backend
    return 1 + max(len(backend.id_to_token(i) or "") for i in range(tokenizer.size))


def _check_chars(chars: int, tokenizer, limits: Limits, where: str) -> None:
    """Refuse, before tokenising it, a text too long to fit the prompt capacity whatever its
    tokens (a 5 MB prompt is refused at once, not after seconds of tokenising)."""
    bound = limits.prompt_len * longest_token(tokenizer) * CHARS_SLACK
    if chars > bound:
        raise RequestError(f"{where}: the prompt's {chars} characters cannot fit the "
                           f"{limits.prompt_len} tokens this server holds (vpo serve "
                           "--max-prompt-tokens)", status=400, param=where,
                           code="context_length_exceeded")


def _encode(tokenizer, text: str, where: str) -> list[int]:
    try:
        return tokenizer.encode(text)
    except Exception as e:  # e.g. a lone surrogate, which JSON can spell and UTF-8 cannot
        raise RequestError(f"{where}: the text cannot be tokenised: {e}", param=where) from None


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


def _message(m, i: int, fmt: tools_lib.ToolFormat) -> dict:
    """One message as {role, content} and, when the template has a tool format, its tool
    fields (`vpo.serve.tools.tool_fields`); another field (a name, audio) is refused by name
    unless empty, as clients echo an answer's message back."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise RequestError(f"messages[{i}]: expected an object with a string role, got "
                           f"{m!r}", param="messages")
    allowed = ("role", "content") if fmt is tools_lib.ToolFormat.NONE else (
        "role", "content", *TOOL_KEYS)
    extra = sorted(k for k, v in m.items() if k not in allowed and v not in (None, [], ""))
    if extra:
        why = "this checkpoint's chat template has no tool format" if extra[0] in TOOL_KEYS \
            else "messages are a role and text content"
        raise RequestError(f"messages[{i}].{extra[0]}: not supported by vpo serve ({why})",
                           param="messages", code="unsupported_parameter")
    fields = {} if fmt is tools_lib.ToolFormat.NONE else tools_lib.tool_fields(m, i)
    return {"role": m["role"], "content": _content(m, i), **fields}


def _render(tokenizer, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """The messages' prompt ids through the chat template (with `tools` when given)."""
    try:
        if tools is None:
            return tokenizer.prompt_ids(messages)
        return tokenizer.encode(tokenizer.render_chat(messages, tools=tools))
    except Exception as e:  # the checkpoint's template refuses these messages
        raise RequestError(f"messages: the chat template cannot render them: {e}",
                           param="messages") from None


def parse_chat(body, tokenizer, limits: Limits) -> Generation:
    """A `/v1/chat/completions` body → `Generation`: the messages (and tools) through the
    checkpoint's chat template (with the generation prompt), as `vpo sample` renders a prompt."""
    body = _fields(body, CHAT_FIELDS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: expected a non-empty list of {role, content} objects",
                           param="messages")
    tools, parsed = tools_lib.check_tools(body, limits.tool_format)
    clean = [_message(m, i, limits.tool_format) for i, m in enumerate(messages)]
    _check_chars(sum(len(m["content"]) for m in clean) + len(repr(tools or "")), tokenizer,
                 limits, "messages")
    prompt = _check_prompt(_render(tokenizer, clean, tools), limits, tokenizer.size,
                           "messages")
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, bool):
        raise RequestError(f"logprobs: expected true or false, got {logprobs!r}",
                           param="logprobs")
    top = _number(body, "top_logprobs", 0, low=0, high=MAX_TOP_LOGPROBS, integer=True)
    if top and not logprobs:
        raise RequestError("top_logprobs: needs logprobs: true", param="top_logprobs")
    return _sampling(body, limits, [prompt], default_max=limits.max_new_tokens,
                     logprobs=logprobs, top_logprobs=top, kind="chat",
                     tool_calls=limits.tool_format if parsed else tools_lib.ToolFormat.NONE)


def _echo(body: dict) -> bool:
    echo = body.get("echo") or False
    if not isinstance(echo, bool):
        raise RequestError(f"echo: expected true or false, got {echo!r}", param="echo")
    if echo and body.get("stream"):
        raise RequestError("echo: not supported with stream: true; send one or the other",
                           param="echo", code="unsupported_parameter")
    return echo


def parse_completion(body, tokenizer, limits: Limits) -> Generation:
    """A `/v1/completions` body → `Generation`: `prompt` is text (tokenised as is, BOS first
    when the tokenizer adds one), token ids, or a list of either (one choice per prompt and
    sample, in that order). `echo` may come with `max_tokens: 0` (the prompt only)."""
    body = _fields(body, COMPLETION_FIELDS)
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                   and all(isinstance(i, int) for i in prompt)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise RequestError("prompt: expected text, token ids or a non-empty list of them",
                           param="prompt")
    _check_chars(max(len(p) if isinstance(p, str) else 0 for p in prompt), tokenizer, limits,
                 "prompt")
    prompts = []
    for p in prompt:
        if isinstance(p, str):
            ids = _encode(tokenizer, p, "prompt")
            if tokenizer.add_bos and tokenizer.bos_id is not None:
                ids = [tokenizer.bos_id, *ids]
        elif (isinstance(p, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                          for i in p)):
            ids = p
        else:
            raise RequestError(f"prompt: expected text or a list of token ids, got {p!r}",
                               param="prompt")
        prompts.append(_check_prompt(ids, limits, tokenizer.size, "prompt"))
    top = _number(body, "logprobs", None, low=0, high=MAX_LOGPROBS, integer=True) \
        if body.get("logprobs") is not None else None
    return _sampling(body, limits, prompts, default_max=min(16, limits.max_new_tokens),
                     logprobs=top is not None, top_logprobs=top or 0, kind="completion",
                     echo=_echo(body),
                     texts=tuple(p if isinstance(p, str) else None for p in prompt))
