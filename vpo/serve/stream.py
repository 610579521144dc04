"""Streamed answers of `vpo serve` (`stream: true`): the engine's `Update`s of a request's rows
turned into OpenAI's chunk objects, sent as server-sent events (`data: {chunk}`, then
`data: [DONE]`).

A chat stream opens each choice with a `{"role": "assistant", "content": ""}` delta, then sends
its text in `content` deltas (completions: `text`) as the engine reads the tokens back, a last
chunk per choice with its `finish_reason` and, with `stream_options.include_usage`, a chunk of
the request's usage with no choices. A choice's text is sent only once later tokens cannot
change it: a tail that could begin a stop string, trailing whitespace (a decoder may join it
to what follows) and an unfinished UTF-8 character wait, so the streamed text is the
non-streamed answer's, never a stop string or what follows one. Log-probs, when asked, go with
the chunk of their tokens, as do the tokens' ids (`token_ids`; a chat stream's first chunk has
the prompt's, `prompt_token_ids`). With tools, text that could be
part of a tool call waits too; a choice's calls come, parsed, in its last delta (`tool_calls`,
each with its `index`, id, name and whole arguments), with `finish_reason: "tool_calls"`.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Sequence

from vpo.serve import protocol
from vpo.serve.engine import Update
from vpo.serve.protocol import Completion, Generation
from vpo.serve.tools import before_calls, parse_tool_calls

DONE = b"data: [DONE]\n\n"


def event(obj: dict) -> bytes:
    """One server-sent event carrying `obj` as JSON."""
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of `text` could be the start of one of `stops`."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return hold


def settled(text: str, stops: Sequence[str]) -> str:
    """The head of a row's text so far that later tokens cannot change: less an unfinished
    UTF-8 character (U+FFFD), trailing whitespace and a tail that could begin a stop string."""
    text = text.rstrip("\ufffd").rstrip()
    return text[:len(text) - held_back(text, stops)].rstrip()


@dataclasses.dataclass
class _Choice:
    ids: list = dataclasses.field(default_factory=list)
    sent: str = ""  # the text sent so far


class Streamer:
    """The chunks of one streamed `Generation`, built from its rows' `Update`s in the order the
    engine reports them (`opening`, `chunks` per update, `closing`)."""

    def __init__(self, gen: Generation, tokenizer, model: str):
        self.gen, self.tokenizer, self.model = gen, tokenizer, model
        chat = gen.kind == "chat"
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.object = "chat.completion.chunk" if chat else "text_completion"
        self.created = int(time.time())
        self.choices = [_Choice() for _ in range(len(gen.prompts) * gen.n)]
        self.completion_tokens = 0

    def _chunk(self, choices: list[dict]) -> dict:
        body = {"id": self.id, "object": self.object, "created": self.created,
                "model": self.model, "choices": choices}
        if self.gen.include_usage:
            body["usage"] = None
        return body

    def _choice(self, j: int, text: str, update: Update | None, finish: str | None) -> dict:
        ids = () if update is None else update.token_ids
        logprobs = None
        if self.gen.logprobs and update is not None:
            n = self.gen.top_logprobs
            if self.gen.kind == "chat":
                logprobs = protocol.chat_logprobs(self.tokenizer, ids, update.logprobs,
                                                  update.top, n)
            else:
                logprobs = protocol.legacy_logprobs(self.tokenizer, ids, update.logprobs,
                                                    update.top, n,
                                                    offset=len(self.choices[j].sent) - len(text))
        choice = {"index": j, "logprobs": logprobs, "finish_reason": finish,
                  "token_ids": list(ids)}
        if self.gen.kind == "chat":
            return {"index": j, "delta": {} if finish else {"content": text}, **choice}
        return {"index": j, "text": text, **choice}

    def opening(self) -> list[dict]:
        """Chat: each choice's role delta, the first with the prompt's token ids
        (`prompt_token_ids`, as a non-streamed answer carries them); completions: nothing."""
        if self.gen.kind != "chat":
            return []
        out = [self._chunk([{"index": j, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None}])
               for j in range(len(self.choices))]
        if out:
            out[0]["prompt_token_ids"] = list(self.gen.prompts[0])
        return out

    def chunks(self, update: Update) -> list[dict]:
        """The chunks of one row's update: its settled new text with its tokens, and when the
        row has ended, the rest of its text and a chunk with its `finish_reason`."""
        c = self.choices[update.j]
        c.ids += update.token_ids
        self.completion_tokens += len(update.token_ids)
        done: Completion | None = update.completion
        fmt, calls = self.gen.tool_calls, []
        if done is None:
            text = before_calls(settled(self.tokenizer.decode(c.ids), self.gen.stop), fmt)
            text = text.rstrip()
        else:
            text, calls = parse_tool_calls(done.text, fmt)
            text = text or ""
        piece = text[len(c.sent):] if text.startswith(c.sent) else ""
        c.sent += piece
        out = []
        if piece or update.token_ids or calls:
            choice = self._choice(update.j, piece, update, None)
            if calls:
                choice["delta"]["tool_calls"] = [{"index": k, **call}
                                                 for k, call in enumerate(calls)]
            out.append(self._chunk([choice]))
        if done is not None:
            finish = "tool_calls" if calls else done.finish_reason
            out.append(self._chunk([self._choice(update.j, "", None, finish)]))
        return out

    def closing(self) -> list[dict]:
        """With `include_usage`: the chunk of the request's usage, with no choices."""
        if not self.gen.include_usage:
            return []
        return [{**self._chunk([]), "usage": protocol.usage(self.gen, self.completion_tokens)}]
