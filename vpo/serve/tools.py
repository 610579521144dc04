"""Tool calls of `vpo serve`'s chat endpoint: the checkpoint's tool format, read once from its
chat template, the request's `tools`, `tool_choice` and tool messages checked, and the model's
tool calls parsed back out of a completion's text.

A template has a tool format when it renders `tools` and writes how the model calls one:
`ToolFormat.HERMES` (Qwen2.5, Qwen3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
one block per call) or `ToolFormat.LLAMA_JSON` (Llama 3.1+: the answer is the JSON object
`{"name": ..., "parameters": {...}}`, several joined by `;`). Without one (`ToolFormat.NONE`)
tools, tool messages and assistant tool calls are refused by name. An assistant message's
`function.arguments` (OpenAI's JSON text) goes to the template as the object it spells, as
templates expect (`tojson`), so a call the server parsed renders back as the model wrote it.
"""

from __future__ import annotations

import enum
import json
import re
import uuid

from vpo.errors import RequestError

_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
PYTHON_TAG = "<|python_tag|>"  # Llama 3.1's prefix of a tool call (a special token)


class ToolFormat(enum.Enum):
    """How the checkpoint's chat template writes a tool call (see the module docstring)."""

    NONE = "none"
    HERMES = "hermes"
    LLAMA_JSON = "llama3_json"


def tool_format(template: str | None) -> ToolFormat:
    """The tool format of a chat template's source: one that renders `tools` and writes
    `<tool_call>` is Hermes-style, one that asks for `"parameters"` is Llama 3.1's JSON."""
    if not template or "tools" not in template:
        return ToolFormat.NONE
    if "<tool_call>" in template:
        return ToolFormat.HERMES
    if '"parameters"' in template:
        return ToolFormat.LLAMA_JSON
    return ToolFormat.NONE


def check_tools(body: dict, fmt: ToolFormat) -> tuple[list[dict] | None, bool]:
    """(tools to render, None when there are none; whether to parse tool calls) of the
    request's `tools` and `tool_choice`: "auto" (the default with tools) parses, "none" renders
    the tools and parses none; "required" and a named function (which need constrained
    decoding) are refused by name, as are tools when the template has no tool format, and
    `parallel_tool_calls: false` (true, the default, is what is done: every call is returned)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if body.get("parallel_tool_calls") not in (None, True):
        raise RequestError("parallel_tool_calls: only true (every call the model writes is "
                           "returned); false would need constrained decoding",
                           param="parallel_tool_calls", code="unsupported_parameter")
    if tools in (None, []):
        if choice not in (None, "none", "auto"):
            raise RequestError(f"tool_choice: {choice!r} without tools", param="tool_choice")
        return None, False
    if fmt is ToolFormat.NONE:
        raise RequestError("tools: this checkpoint's chat template has no tool format (vpo "
                           "serve parses Qwen2.5/Qwen3 <tool_call> blocks and Llama 3.1 JSON "
                           "calls); leave it out", param="tools", code="unsupported_parameter")
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function"
            and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) and t["function"]["name"]
            and isinstance(t["function"].get("parameters", {}), dict) for t in tools):
        raise RequestError("tools: expected a list of {\"type\": \"function\", \"function\": "
                           "{\"name\": ..., \"parameters\": {...}}}", param="tools")
    if choice in (None, "auto"):
        return tools, True
    if choice == "none":
        return tools, False
    raise RequestError(f"tool_choice: {choice!r} forces a call, which needs constrained decoding "
                       "vpo serve does not do; send \"auto\" or \"none\"", param="tool_choice",
                       code="unsupported_parameter")


def _arguments(call, where: str) -> dict:
    """One assistant tool call's function as the template reads it: {name, arguments: the
    object its JSON text spells}."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError(f"{where}: expected {{\"type\": \"function\", \"function\": "
                           "{\"name\": ..., \"arguments\": \"{...}\"}}", param="messages")
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except ValueError:
            raise RequestError(f"{where}.function.arguments: not JSON: {args[:80]!r}",
                               param="messages") from None
    if not isinstance(args, dict):
        raise RequestError(f"{where}.function.arguments: expected a JSON object",
                           param="messages")
    return {"name": fn["name"], "arguments": args}


def tool_fields(m: dict, i: int) -> dict:
    """The tool fields of message i as a template with a tool format reads them: an
    assistant's `tool_calls` (each {id, type, function: {name, arguments: object}}) or a tool
    message's `tool_call_id` and `name` (the function's; verifiers adds it) ({} when it carries
    none)."""
    calls = m.get("tool_calls")
    out: dict = {}
    if calls not in (None, []):
        if m.get("role") != "assistant" or not isinstance(calls, list):
            raise RequestError(f"messages[{i}].tool_calls: only an assistant message carries "
                               "a list of tool calls", param="messages")
        out["tool_calls"] = [{"id": c.get("id") if isinstance(c, dict) else None,
                              "type": "function",
                              "function": _arguments(c, f"messages[{i}].tool_calls[{k}]")}
                             for k, c in enumerate(calls)]
    for key in ("tool_call_id", "name"):  # a tool message's call and function name
        value = m.get(key)
        if value in (None, ""):
            continue
        if m.get("role") != "tool" or not isinstance(value, str):
            raise RequestError(f"messages[{i}].{key}: a string, on a tool message only",
                               param="messages")
        out[key] = value
    return out


def _call(obj) -> dict | None:
    """An OpenAI tool call of a parsed {name, arguments | parameters} object, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def _loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse_tool_calls(text: str, fmt: ToolFormat) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a completion's text: with calls, the text before the first one
    (None when blank) and each call {id, type: "function", function: {name, arguments: JSON
    text}}; when any call does not parse (or there is none), the whole text and no calls."""
    if fmt is ToolFormat.HERMES:
        blocks = _HERMES_CALL.findall(text)
        calls = [_call(_loads(b)) for b in blocks]
        if not blocks or None in calls:
            return text, []
        head = text[:text.index("<tool_call>")].rstrip()
        return head if head.strip() else None, calls
    if fmt is ToolFormat.LLAMA_JSON:
        body = text.strip().removeprefix(PYTHON_TAG).strip()
        if not body.startswith("{"):
            return text, []
        whole = _loads(body)
        parts = [whole] if whole is not None else [_loads(p) for p in body.split(";")]
        calls = [_call(p) for p in parts]
        if not calls or None in calls:
            return text, []
        return None, calls
    return text, []


def before_calls(text: str, fmt: ToolFormat) -> str:
    """The head of a streamed answer's text so far that no tool call can be part of: (Hermes)
    the text before a `<tool_call>`, less a tail that could begin one; (Llama JSON) none while
    the answer could be a call (blank, or opening with `{`); the whole text without a format."""
    if fmt is ToolFormat.HERMES:
        text = text.split("<tool_call>", 1)[0]
        for k in range(min(len("<tool_call>") - 1, len(text)), 0, -1):
            if text.endswith("<tool_call>"[:k]):
                return text[:-k]
        return text
    if fmt is ToolFormat.LLAMA_JSON:
        body = text.lstrip().removeprefix(PYTHON_TAG).lstrip()
        return "" if not body or body.startswith("{") else text
    return text
