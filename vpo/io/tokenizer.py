"""The one source of special ids: a `tokenizers.Tokenizer` with its pad / bos / stop ids, its chat
template (rendered with jinja2 as transformers renders it) and the byte string of every token.

Every model, the built-in tiny policy included, comes with one of these: a Hugging Face checkpoint
folder's `tokenizer.json` + `tokenizer_config.json` + `generation_config.json`, or a .gguf file's
metadata (`load_tokenizer`), or the word-level vocabulary of the built-in tasks
(`word_tokenizer`), saved beside the tiny policy like any other checkpoint's tokenizer
(`Tokenizer.save`). No other module names a special id: the sampler stops on `stop_ids`, pads
with `pad_id`, and in-graph rewards read generated text through `token_bytes`.

Text of a completion: the concatenated bytes of its tokens (`token_bytes`), special tokens
contributing nothing, decoded as UTF-8 (`completion_text`). For byte-level BPE (Qwen, Llama 3,
SmolLM2) that is exactly `decode(ids, skip_special_tokens=True)`; for a word-level vocabulary
it is the words each preceded by one space.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import pathlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from vpo.errors import CheckpointError
from vpo.io import gguf
from vpo.io.files import read_json_object, reading

# The word-level vocabulary's specials (ids 0..3).
WORD_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")


@functools.lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """char -> byte of the GPT-2 byte-level alphabet (printable bytes map to themselves, the rest
    to code points 256 + i in byte order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def _component_types(node: Any) -> set[str]:
    """Every `type` named in a tokenizer.json component (nested Sequences included)."""
    if isinstance(node, dict):
        out = {node["type"]} if isinstance(node.get("type"), str) else set()
        for v in node.values():
            out |= _component_types(v)
        return out
    if isinstance(node, list):
        return set().union(*(_component_types(v) for v in node)) if node else set()
    return set()


@dataclasses.dataclass(frozen=True, eq=False)
class Tokenizer:
    """A `tokenizers.Tokenizer` and its checkpoint's special tokens and chat template.

    Fields:
      backend: the `tokenizers.Tokenizer`.
      pad_id: fills prompts on the left and completions after their end. It may be an ordinary
        token of the vocabulary (byte-level BPE has no reserved id): masks, never token values,
        say which positions are real.
      stop_ids: generation ends at the first of these (instruct checkpoints list several, e.g.
        `<|im_end|>` and `<|endoftext|>`); the first is what demonstrations end with.
      bos_id: prepended to plain prompts when `add_bos`; None when the family has none (Qwen).
      chat_template: the checkpoint's jinja template; None renders prompts as plain text (base
        models, the word-level tasks).
      special_tokens: template variables such as {"bos_token": "<|begin_of_text|>", ...}.
    """

    backend: Any
    pad_id: int
    stop_ids: tuple[int, ...]
    bos_id: int | None = None
    add_bos: bool = False
    chat_template: str | None = None
    special_tokens: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        V = self.size
        if not self.stop_ids:
            raise ValueError("Tokenizer.stop_ids is empty; name at least one end-of-sequence "
                             "token (eos_token / eos_token_id)")
        for name, ids in (("pad_id", [self.pad_id]), ("stop_ids", self.stop_ids),
                          ("bos_id", [] if self.bos_id is None else [self.bos_id])):
            bad = [i for i in ids if not 0 <= int(i) < V]
            if bad:
                raise ValueError(f"Tokenizer.{name}: id {bad[0]} is outside the vocabulary of "
                                 f"{V} tokens")
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))

    # -- ids and text ------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Number of token ids, added tokens included (a model's V may be larger)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_id(self) -> int:
        """The stop token a demonstration ends with (the first of `stop_ids`)."""
        return self.stop_ids[0]

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in it are matched, none are added."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str) -> int:
        """The id of one token string; a ValueError names an unknown one."""
        i = self.backend.token_to_id(token)
        if i is None:
            raise ValueError(f"token {token!r} is not in this tokenizer's vocabulary")
        return i

    # -- prompts -----------------------------------------------------------------------------

    def render_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool = True,
                    **kwargs) -> str:
        """The chat template rendered as transformers' `apply_chat_template(tokenize=False)`:
        jinja2 sandbox with trim_blocks / lstrip_blocks, the special tokens as variables,
        `raise_exception`, `strftime_now` and `tojson`; `kwargs` are extra template variables
        (e.g. `enable_thinking=False` for Qwen3)."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template; pass plain text instead (a "
                             "base model), or add chat_template to tokenizer_config.json")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ValueError(f"messages[{i}] needs a string 'role'; got {m!r}")
        return _compiled_template(self.chat_template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens, **kwargs})

    def prompt_text(self, content: str | Sequence[dict]) -> str:
        """What the model reads for a user prompt: `content` (text, or a list of chat messages)
        through the chat template with the generation prompt; plain text without a template."""
        if self.chat_template is None:
            if not isinstance(content, str):
                content = "\n".join(str(m.get("content", "")) for m in content)
            return content
        messages = [{"role": "user", "content": content}] if isinstance(content, str) else content
        return self.render_chat(messages, add_generation_prompt=True)

    def prompt_ids(self, content: str | Sequence[dict]) -> list[int]:
        """Token ids of `prompt_text(content)`, with BOS first for plain prompts when `add_bos`."""
        ids = self.encode(self.prompt_text(content))
        if self.chat_template is None and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    def chat_affixes(self) -> tuple[list[int], list[int]]:
        """(prefix_ids, suffix_ids) around the ids of a user message's content, so a prompt can
        be assembled from pieces in the graph: prefix + encode(content) + suffix."""
        marker = "\x00VPO-CONTENT\x00"
        text = self.prompt_text(marker)
        if text.count(marker) != 1:
            raise ValueError("the chat template does not write the user content verbatim once; "
                             "it cannot be split into a prefix and a suffix")
        head, tail = text.split(marker)
        prefix = self.encode(head)
        if self.chat_template is None and self.add_bos and self.bos_id is not None:
            prefix = [self.bos_id, *prefix]
        return prefix, self.encode(tail)

    # -- bytes -------------------------------------------------------------------------------

    def token_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """(bytes_VW uint8, length_V int32): the UTF-8 bytes each token adds to the text.

        Special added tokens add nothing; byte-level BPE tokens are mapped back through the
        GPT-2 byte alphabet; Metaspace vocabularies turn `▁` into a space and `<0xNN>` into
        byte NN; word-level (and any other) tokens add a space and the token.
        """
        return _token_bytes(self)

    def completion_text(self, ids: Iterable[int], *, max_bytes: int | None = None) -> str:
        """The text of generated ids as the in-graph readers see it: the tokens' bytes
        concatenated (first `max_bytes` only, when given), decoded as UTF-8 ("replace")."""
        table, length = self.token_bytes()
        V = table.shape[0]  # ids past the tokenizer (a padded model vocabulary) add no bytes
        out = b"".join(table[i, :length[i]].tobytes() for i in (int(t) for t in ids)
                       if 0 <= i < V)
        return out[:max_bytes].decode("utf-8", errors="replace")

    # -- files -------------------------------------------------------------------------------

    def save(self, folder) -> None:
        """tokenizer.json, tokenizer_config.json (+ chat_template.jinja) and
        generation_config.json in `folder`, readable by `load_tokenizer` and transformers."""
        folder = pathlib.Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(folder / "tokenizer.json"))
        name = self.backend.id_to_token
        cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                               "eos_token": name(self.stop_ids[0]),
                               "pad_token": name(self.pad_id),
                               "bos_token": None if self.bos_id is None else name(self.bos_id),
                               "add_bos_token": self.add_bos}
        for key, token in self.special_tokens.items():  # unk_token, ...: template variables
            cfg.setdefault(key, token)
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
        gen = {"eos_token_id": list(self.stop_ids), "pad_token_id": self.pad_id}
        if self.bos_id is not None:
            gen["bos_token_id"] = self.bos_id
        (folder / "generation_config.json").write_text(json.dumps(gen, indent=1))
        if self.chat_template is not None:
            (folder / "chat_template.jinja").write_text(self.chat_template)


@functools.lru_cache(maxsize=16)
def _compiled_template(source: str):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


@functools.lru_cache(maxsize=8)
def _token_bytes(tok: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    backend = tok.backend
    spec = json.loads(backend.to_str())
    kinds = _component_types(spec.get("decoder")) | _component_types(spec.get("pre_tokenizer"))
    model_type = spec.get("model", {}).get("type")
    added = {a["id"]: a for a in spec.get("added_tokens", [])}
    alphabet = _byte_level_alphabet()
    V = tok.size
    pieces: list[bytes] = []
    for i in range(V):
        token = backend.id_to_token(i)
        if token is None:
            pieces.append(b"")
        elif i in added:
            if added[i].get("special", False):
                pieces.append(b"")
            else:
                word = model_type == "WordLevel"
                pieces.append((" " if word else "").encode() + token.encode("utf-8"))
        elif "ByteLevel" in kinds:
            pieces.append(bytes(alphabet.get(c, 0x3F) for c in token))
        elif "Metaspace" in kinds or "ByteFallback" in kinds or "▁" in token:
            if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                pieces.append(bytes([int(token[3:5], 16)]))
            else:
                pieces.append(token.replace("▁", " ").encode("utf-8"))
        else:
            pieces.append(b" " + token.encode("utf-8"))
    L = max(1, max(len(p) for p in pieces))
    table = np.zeros((V, L), np.uint8)
    length = np.zeros((V,), np.int32)
    for i, p in enumerate(pieces):
        table[i, :len(p)] = np.frombuffer(p, np.uint8)
        length[i] = len(p)
    table.setflags(write=False)
    length.setflags(write=False)
    return table, length


def left_pad(rows: Sequence[Sequence[int]], length: int | None, pad_id: int, *,
             truncate: bool = False, what: str = "prompt") -> tuple[np.ndarray, np.ndarray]:
    """Token lists → (tokens_NP int32, mask_NP bool) left-padded with `pad_id` to `length`
    (default: the longest). The mask, not the pad value, marks real tokens (the pad id may be an
    ordinary token). A row longer than `length` raises, naming it, unless `truncate` keeps its
    last `length` tokens; an empty row raises (the first new token needs a context)."""
    P = max(len(r) for r in rows) if length is None else length
    tokens = np.full((len(rows), P), pad_id, np.int32)
    mask = np.zeros((len(rows), P), bool)
    for i, r in enumerate(rows):
        if len(r) == 0:
            raise ValueError(f"{what} {i} is empty; give it at least one token (e.g. BOS)")
        if len(r) > P:
            if not truncate:
                raise ValueError(f"{what} {i} has {len(r)} tokens, more than the {P} allowed; "
                                 "raise the prompt length or truncate")
            r = r[-P:]
        tokens[i, P - len(r):] = r
        mask[i, P - len(r):] = True
    return tokens, mask


def word_tokenizer(words: Iterable[str], *, added: Sequence[str] = ()) -> Tokenizer:
    """The built-in word-level tokenizer: `WORD_SPECIALS` (pad, bos, eos, unk = ids 0..3), then
    `added` (multi-word tokens such as `<answer 1>`, matched in text before splitting), then the
    distinct `words` in order. Text is split on whitespace; an unknown word encodes as `<unk>`.
    No chat template: a prompt is `<bos>` and its words."""
    from tokenizers import AddedToken, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    vocab: dict[str, int] = {}
    for w in (*WORD_SPECIALS, *added, *words):
        if w not in vocab:
            if not w or (any(c.isspace() for c in w) and w not in added):
                raise ValueError(f"word {w!r}: words must be non-empty and free of whitespace "
                                 "(pass multi-word tokens as `added`)")
            vocab[w] = len(vocab)
    backend = Backend(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens([AddedToken(s, special=True, normalized=False)
                                for s in WORD_SPECIALS])
    backend.add_tokens([AddedToken(a, special=False, normalized=False) for a in added])
    return Tokenizer(backend, pad_id=0, stop_ids=(2,), bos_id=1, add_bos=True,
                     special_tokens={"bos_token": "<bos>", "eos_token": "<eos>",
                                     "pad_token": "<pad>", "unk_token": "<unk>"})


def load_tokenizer(path) -> Tokenizer:
    """The tokenizer of a checkpoint folder: tokenizer.json; special tokens from
    tokenizer_config.json, then generation_config.json, then config.json; every eos id listed
    anywhere is a stop id; the chat template from chat_template.jinja or tokenizer_config.json.
    A .gguf file's tokenizer is rebuilt from its metadata (`vpo.io.gguf.tokenizer_parts`)."""
    from tokenizers import Tokenizer as Backend

    folder = pathlib.Path(path).expanduser()
    if gguf.is_gguf(folder):
        parts = gguf.tokenizer_parts(folder)
        check_template(parts["chat_template"], f"{folder} (tokenizer.chat_template)")
        return Tokenizer(**parts)
    if not (folder / "tokenizer.json").exists():
        raise CheckpointError(f"{folder}: no tokenizer.json (vpo reads fast tokenizers; re-save "
                              "a slow one with transformers' AutoTokenizer.save_pretrained)")
    with reading(folder / "tokenizer.json", "not a readable tokenizer (truncated, or not a "
                 "tokenizers file)", "save the tokenizer again or restore the file"):
        backend = Backend.from_file(str(folder / "tokenizer.json"))
    tcfg = _read_json(folder / "tokenizer_config.json")
    configs = [_read_json(folder / f) for f in ("generation_config.json", "config.json")]

    def token_str(key):  # tokenizer_config.json names tokens: "<|im_end|>" or {"content": ...}
        t = tcfg.get(key)
        return t.get("content") if isinstance(t, dict) else t

    def named(key):
        t = token_str(key)
        if t is None:
            return None
        i = backend.token_to_id(t)
        if i is None:
            raise CheckpointError(f"{folder / 'tokenizer_config.json'}: {key} {t!r} is not in "
                                  "tokenizer.json; fix the token or the vocabulary")
        return i

    def listed(key):  # ids in generation_config.json / config.json: an int or a list
        out = []
        for c in configs:
            v = c.get(key)
            out += [] if v is None else list(v) if isinstance(v, list) else [v]
        return [int(i) for i in out]

    stop_ids = tuple(dict.fromkeys(i for i in [named("eos_token"), *listed("eos_token_id")]
                                   if i is not None))
    if not stop_ids:
        raise CheckpointError(f"{folder}: no end-of-sequence token; set eos_token in "
                              "tokenizer_config.json or eos_token_id in generation_config.json")
    pad = named("pad_token")
    pad = pad if pad is not None else next(iter(listed("pad_token_id")), stop_ids[0])
    # as transformers: a tokenizer_config.json without bos_token means no BOS (Qwen)
    bos = named("bos_token") if tcfg else next(iter(listed("bos_token_id")), None)
    template = tcfg.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named_templates = {t.get("name"): t.get("template") for t in template}
        template = named_templates.get("default") or next(iter(named_templates.values()), None)
    source = folder / "tokenizer_config.json"
    if (folder / "chat_template.jinja").exists():
        source = folder / "chat_template.jinja"
        template = source.read_text()
    check_template(template, source)
    specials = {k: token_str(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    specials = {k: v for k, v in specials.items() if v is not None}
    # as transformers: an explicit add_bos_token wins, else tokenizer.json's post-processor
    add_bos = tcfg["add_bos_token"] if "add_bos_token" in tcfg else _template_adds_bos(backend,
                                                                                        bos)
    return Tokenizer(backend, pad_id=int(pad), stop_ids=stop_ids, bos_id=bos,
                     add_bos=bool(add_bos), chat_template=template, special_tokens=specials)


def _template_adds_bos(backend, bos_id: int | None) -> bool:
    """Whether tokenizer.json's post-processor (a TemplateProcessing, alone or in a Sequence)
    starts a single sequence with the BOS token, as Llama 3's does: transformers' encode with
    add_special_tokens=True then prepends it to a plain prompt."""
    if backend.post_processor is None or bos_id is None:
        return False
    spec = json.loads(backend.post_processor.__getstate__())
    templates = [spec] if spec.get("type") == "TemplateProcessing" else [
        p for p in spec.get("processors") or () if p.get("type") == "TemplateProcessing"]
    for t in templates:
        first = (t.get("single") or [{}])[0]
        if "SpecialToken" in first:
            name = first["SpecialToken"].get("id")
            return (t.get("special_tokens") or {}).get(name, {}).get("ids") == [bos_id]
    return False


def _read_json(path: pathlib.Path) -> dict:
    if not path.exists():
        return {}
    return read_json_object(path, "fix or remove the file")


def check_template(template: str | None, source) -> None:
    """Raise `CheckpointError` naming `source` (and the line) if the chat template does not
    compile; None (no template) passes."""
    if template is None:
        return
    import jinja2

    if not isinstance(template, str):
        raise CheckpointError(f"{source}: the chat template is a {type(template).__name__}, "
                              "not text; fix the chat_template entry")
    try:
        _compiled_template(template)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise CheckpointError(f"{source}: the chat template does not compile (line {e.lineno}: "
                              f"{e.message}); fix the template") from None
