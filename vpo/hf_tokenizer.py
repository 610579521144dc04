"""Hugging Face tokenizers (tokenizer.json via `tokenizers`) with special ids and chat formats.

ChatML for the Qwen families and the Llama-3 header format for Llama, rendered without jinja.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Sequence
from typing import Any

from vpo.hf import CheckpointError, _read_json


@dataclasses.dataclass(frozen=True)
class HFTokenizer:
    """A `tokenizers.Tokenizer` with its checkpoint's special ids and chat format.

    `eos_id` is the token that ends a turn (tokenizer_config's eos_token when set, e.g.
    `<|im_end|>` / `<|eot_id|>` for instruct models); `eos_ids` every stop id the checkpoint
    names. `pad_id` falls back to `eos_id`. `bos_id` is None when the family has none (Qwen).
    """

    tokenizer: Any  # tokenizers.Tokenizer
    eos_id: int
    pad_id: int
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    chat_format: str | None = None  # "chatml" (Qwen) | "llama3" | None
    default_system: str | None = None  # the system prompt the template adds when none is given

    @property
    def size(self) -> int:
        """Number of token ids, added tokens included (the model's V may be larger)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, *, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            *, tokenize: bool = False, enable_thinking: bool | None = None):
        """Render `[{"role", "content"}, ...]` as the checkpoint's chat template does.

        ChatML for Qwen (`<|im_start|>role\\ncontent<|im_end|>\\n`, with the template's default
        system prompt when the first message is not a system one; `enable_thinking=False` adds
        Qwen3's empty think block), Llama-3 headers for Llama (contents stripped, BOS first).
        Tools, Qwen3 reasoning-content splitting and Llama 3.1's date preamble are not rendered.
        `tokenize=True` returns ids (no extra special tokens added).
        """
        for i, m in enumerate(messages):
            if not (isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise ValueError(f"messages[{i}] needs string 'role' and 'content'; got {m!r}")
        if enable_thinking is not None and self.chat_format != "chatml":
            raise ValueError("enable_thinking applies to Qwen3 (ChatML) templates only")
        if self.chat_format == "chatml":
            turns = list(messages)
            if self.default_system and (not turns or turns[0]["role"] != "system"):
                turns.insert(0, {"role": "system", "content": self.default_system})
            text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in turns)
            if add_generation_prompt:
                text += "<|im_start|>assistant\n"
                text += "<think>\n\n</think>\n\n" if enable_thinking is False else ""
        elif self.chat_format == "llama3":
            head = "<|start_header_id|>{}<|end_header_id|>\n\n"
            text = "" if self.bos_id is None else self.tokenizer.id_to_token(self.bos_id)
            text += "".join(head.format(m["role"]) + m["content"].strip() + "<|eot_id|>"
                            for m in messages)
            text += head.format("assistant") if add_generation_prompt else ""
        else:
            raise ValueError("this tokenizer has neither ChatML (<|im_start|>) nor Llama-3 "
                             "header tokens; render the prompt text yourself")
        return self.encode(text, add_special_tokens=False) if tokenize else text


def load_tokenizer(path) -> HFTokenizer:
    """`HFTokenizer` of a folder's tokenizer.json; special ids from tokenizer_config.json, then
    generation_config.json, then config.json."""
    from tokenizers import Tokenizer

    folder = pathlib.Path(path).expanduser()
    if not (folder / "tokenizer.json").exists():
        raise CheckpointError(f"{folder}: no tokenizer.json (vpo.hf reads fast tokenizers; "
                              "re-save a slow one with transformers' AutoTokenizer)")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tcfg = _read_json(folder / "tokenizer_config.json", {})
    configs = [_read_json(folder / f, {}) for f in ("generation_config.json", "config.json")]

    def named(key):  # tokenizer_config.json names tokens: "<|im_end|>" or {"content": ...}
        t = tcfg.get(key)
        t = t.get("content") if isinstance(t, dict) else t
        if t is None:
            return None
        if tok.token_to_id(t) is None:
            raise CheckpointError(f"{folder / 'tokenizer_config.json'}: {key} {t!r} is not in "
                                  "tokenizer.json")
        return tok.token_to_id(t)

    def listed(key):  # ids in generation_config.json / config.json, an int or a list
        out = []
        for c in configs:
            v = c.get(key)
            out += [] if v is None else list(v) if isinstance(v, list) else [v]
        return out

    eos_ids = tuple(dict.fromkeys(i for i in [named("eos_token"), *listed("eos_token_id")]
                                  if i is not None))
    if not eos_ids:
        raise CheckpointError(f"{folder}: no end-of-sequence token; set eos_token in "
                              "tokenizer_config.json or eos_token_id in config.json")
    pad = named("pad_token")
    pad = pad if pad is not None else next(iter(listed("pad_token_id")), eos_ids[0])
    # as transformers: a tokenizer_config.json without bos_token means no BOS (Qwen)
    bos = named("bos_token") if tcfg else next(iter(listed("bos_token_id")), None)
    vocab = tok.get_vocab(with_added_tokens=True)
    fmt = "chatml" if "<|im_start|>" in vocab else "llama3" if "<|start_header_id|>" in vocab \
        else None
    template = tcfg.get("chat_template") or ""
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        template = " ".join(t.get("template", "") for t in template)
    if (folder / "chat_template.jinja").exists():
        template += (folder / "chat_template.jinja").read_text()
    system = re.search(r"<\|im_start\|>system\\n([^{}'\"<\\]+)<\|im_end\|>", template)
    return HFTokenizer(tok, eos_id=eos_ids[0], pad_id=int(pad), bos_id=bos, eos_ids=eos_ids,
                       chat_format=fmt, default_system=system.group(1) if system else None)
