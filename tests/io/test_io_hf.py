"""vpo.io.hf against transformers: logits, greedy generation, save/load, sharded load, the
checkpoint's tokenizer loaded and copied beside saved weights.

The fixtures in tests/fixtures/hf/ are tiny random checkpoints written by transformers, with the
logits, generations and tokenizations transformers produced on them (see make_hf_fixtures.py), so
these tests need neither torch nor transformers. The `live` tests at the end run only where both
are importable. The tokenizer itself (chat templates, encode/decode, special ids against
transformers) is tested in test_io_tokenizer.py.
"""

import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from vpo.config import SamplerConfig
from vpo.io import hf
from vpo.io.tokenizer import Tokenizer, left_pad
from vpo.model import sharding
from vpo.rollout import slots

# compares numbers with values recorded on another machine: CI runs it again under a lower
# XLA CPU target (.ci/run, XLA_FLAGS=--xla_cpu_max_isa=SSE4_2)
pytestmark = pytest.mark.numerics

FIXTURES = pathlib.Path(__file__).parent.parent / "fixtures" / "hf"
NAMES = ["qwen2_tied", "qwen2_untied", "qwen3_tied", "qwen3_untied", "llama3_tied",
         "llama3_untied"]


def _expected(name):
    return json.loads((FIXTURES / name / "expected.json").read_text())


@nnx.jit
def _forward(model, tokens, mask):
    return model(tokens, mask)


def _params(model) -> dict:
    return {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(model))}


@pytest.fixture(scope="module")
def f32_models():
    return {name: hf.from_pretrained(FIXTURES / name, dtype="float32") for name in NAMES}


def _logit_error(model, name) -> float:
    e = _expected(name)
    mask = np.array(e["mask"])
    got = np.asarray(_forward(model, jnp.array(e["tokens"]), jnp.array(mask)))
    return float(np.abs(got - np.load(FIXTURES / name / "logits.npy"))[mask].max())


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_transformers(f32_models, name):
    assert _logit_error(f32_models[name], name) <= 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_greedy_generation_matches_transformers(f32_models, name):
    g = _expected(name)["greedy"]
    assert g["min_top2_margin"] > 1e-3  # no near-tie that float noise could flip
    P = max(map(len, g["prompts"]))
    tokens, mask = left_pad(g["prompts"], P, g["pad_id"])
    cfg = SamplerConfig(max_new_tokens=8, num_samples=1, temperature=0.0)
    stop_ids = tuple(np.atleast_1d(g["eos_id"]).tolist())  # generation_config's eos ids
    out = slots.sample(f32_models[name], tokens, mask, jax.random.key(0), cfg,
                         stop_ids=stop_ids, pad_id=g["pad_id"])
    want = np.array(g["new_tokens"])
    np.testing.assert_array_equal(np.asarray(out.tokens_BGT)[:, 0, :want.shape[1]], want)


def test_config_spellings_and_dtypes():
    old, new = (hf.model_config(json.loads((FIXTURES / n / "config.json").read_text()))
                for n in ("llama3_untied", "llama3_tied"))
    assert old.rope_scaling == new.rope_scaling  # rope_scaling (4.x) == rope_parameters (5.x)
    assert (old.rope_scaling.factor, old.rope_scaling.original_max_position) == (8.0, 64)
    qwen3 = hf.from_pretrained(FIXTURES / "qwen3_untied")  # torch_dtype bfloat16 on disk
    assert qwen3.cfg.param_dtype == qwen3.cfg.dtype == "bfloat16"
    assert qwen3.embed[...].dtype == jnp.bfloat16 and qwen3.cfg.rope_theta == 1e6
    mixed = hf.from_pretrained(FIXTURES / "qwen2_tied", dtype="bfloat16", param_dtype="float32")
    assert (mixed.cfg.param_dtype, mixed.cfg.dtype, mixed.cfg.qkv_bias) == (
        "float32", "bfloat16", True)


@pytest.mark.parametrize("name", NAMES)
def test_save_load_round_trip_is_bit_exact(tmp_path, name):
    src = FIXTURES / name
    model = hf.from_pretrained(src)  # the checkpoint's own dtype
    hf.save_pretrained(model, tmp_path, source=src)
    again = hf.from_pretrained(tmp_path)
    assert again.cfg == model.cfg
    a, b = _params(model), _params(again)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k], equal_nan=True), k
    original = {}
    for f in src.glob("*.safetensors"):
        original.update(load_file(f))
    saved = load_file(tmp_path / "model.safetensors")
    if model.cfg.tie_embeddings:
        original.pop("lm_head.weight", None)
    assert saved.keys() == original.keys()
    for k, v in saved.items():  # the file we write holds the very bytes transformers wrote
        assert v.dtype == original[k].dtype and v.tobytes() == original[k].tobytes(), k
    # the tokenizer files are copied verbatim, so the saved folder reads as the source does
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
              "generation_config.json"):
        assert (tmp_path / f).read_bytes() == (src / f).read_bytes(), f
    a, b = hf.load_tokenizer(src), hf.load_tokenizer(tmp_path)
    assert a.encode("hello world") == b.encode("hello world")
    assert (a.stop_ids, a.pad_id, a.bos_id, a.chat_template) == (
        b.stop_ids, b.pad_id, b.bos_id, b.chat_template)


def test_save_without_source_infers_model_type(tmp_path, f32_models):
    for name, model_type in (("qwen3_tied", "qwen3"), ("qwen2_untied", "qwen2"),
                             ("llama3_untied", "llama")):
        hf.save_pretrained(f32_models[name], tmp_path / name)
        config = json.loads((tmp_path / name / "config.json").read_text())
        assert config["model_type"] == model_type
        assert hf.model_config(config) == f32_models[name].cfg
    with pytest.raises(hf.CheckpointError, match="qwen2"):
        hf.save_pretrained(f32_models["llama3_tied"], tmp_path / "bad", model_type="qwen2")


@pytest.mark.parametrize("name", ["qwen2_untied", "qwen3_tied", "llama3_untied"])
def test_sharded_load_places_each_block_directly(monkeypatch, f32_models, name):
    reads = []
    read = hf._Layout.read

    def spy(self, tensor, shape, index):
        block = read(self, tensor, shape, index)
        reads.append((tuple(shape), block.shape))
        return block

    monkeypatch.setattr(hf._Layout, "read", spy)
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    model = hf.from_pretrained(FIXTURES / name, dtype="float32", mesh=mesh)
    targets = {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(
        sharding.param_shardings(nnx.state(model), mesh))}
    n_sharded = 0
    for key, x in _params(model).items():
        assert x.sharding.is_equivalent_to(targets[key], x.ndim), key
        shard = targets[key].shard_shape(x.shape)
        n_sharded += shard != x.shape
        # every device got (and every read produced) only its own block
        assert all(s.data.shape == shard for s in x.addressable_shards), key
        assert all(b == shard for s, b in reads if s == x.shape), key
    assert n_sharded >= len(targets) - 4  # all but the few tiny replicated tensors
    assert _logit_error(model, name) <= 1e-4
    ref = _forward(f32_models[name], jnp.array(_expected(name)["tokens"]), None)
    np.testing.assert_allclose(_forward(model, jnp.array(_expected(name)["tokens"]), None), ref,
                               atol=1e-5, rtol=0)


# -- errors -------------------------------------------------------------------------------------

def _copy(tmp_path, name="qwen2_tied") -> pathlib.Path:
    return pathlib.Path(shutil.copytree(FIXTURES / name, tmp_path / name))


def _edit_weights(folder, edit):
    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_missing_tensor_is_named(tmp_path):
    folder = _copy(tmp_path)
    _edit_weights(folder, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
    with pytest.raises(hf.CheckpointError, match=r"missing: model\.layers\.1\.self_attn\.k_proj"):
        hf.from_pretrained(folder)


def test_wrong_shape_is_named_with_its_file(tmp_path):
    folder = _copy(tmp_path)
    _edit_weights(folder, lambda t: t.update({"model.layers.0.mlp.up_proj.weight": np.zeros(
        (32, 64), np.float32)}))
    with pytest.raises(hf.CheckpointError, match=r"model\.safetensors: tensor model\.layers\.0\."
                       r"mlp\.up_proj\.weight has shape \[32, 64\], but config.json implies "
                       r"\[64, 32\]"):
        hf.from_pretrained(folder)


def test_unexpected_tensor_is_named(tmp_path):
    folder = _copy(tmp_path, "llama3_tied")
    _edit_weights(folder, lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": np.zeros(
        32, np.float32)}))
    with pytest.raises(hf.CheckpointError, match=r"o_proj\.bias \(in model\.safetensors\)"):
        hf.from_pretrained(folder)


def test_tied_checkpoint_may_carry_a_copy_of_the_head(tmp_path):
    folder = _copy(tmp_path, "qwen3_tied")  # as some exporters write it; transformers re-ties
    _edit_weights(folder, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"]}))
    assert _logit_error(hf.from_pretrained(folder, dtype="float32"), "qwen3_tied") <= 1e-4


def test_save_back_into_the_source_folder(tmp_path):
    folder = _copy(tmp_path, "qwen3_untied")
    model = hf.from_pretrained(folder)
    hf.save_pretrained(model, folder, source=folder)
    assert _params(hf.from_pretrained(folder)).keys() == _params(model).keys()
    assert hf.load_tokenizer(folder).stop_ids == (72, 70)


def test_missing_shard_and_missing_weights_are_named(tmp_path):
    folder = _copy(tmp_path, "llama3_untied")
    (folder / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(hf.CheckpointError, match="lists model-00002-of-00003.safetensors"):
        hf.from_pretrained(folder)
    for f in folder.glob("model*"):
        f.unlink()
    with pytest.raises(hf.CheckpointError, match="no model.safetensors"):
        hf.from_pretrained(folder)


@pytest.mark.parametrize("edit, match", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"attention_bias": True, "model_type": "llama"}, "attention_bias=True"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn'"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}, "lack 'factor'"),
])
def test_unsupported_configs_are_named(edit, match):
    config = json.loads((FIXTURES / "qwen2_tied" / "config.json").read_text())
    with pytest.raises(hf.CheckpointError, match=match):
        hf.model_config({**config, **edit})


# -- tokenizer and CLI spec ---------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_load_tokenizer_reads_the_checkpoint(name):
    """hf.load_tokenizer is `vpo.io.tokenizer.load_tokenizer`: the checkpoint's special ids, every
    eos id generation stops on, and its vocabulary."""
    e = _expected(name)
    tok = hf.load_tokenizer(FIXTURES / name)
    assert isinstance(tok, Tokenizer)
    assert (tok.bos_id, tok.eos_id) == (e["special"]["bos_id"], e["special"]["eos_id"])
    assert tok.pad_id == (e["special"]["pad_id"] if e["special"]["pad_id"] is not None
                          else tok.eos_id)  # no pad token: pad with eos
    assert set(tok.stop_ids) >= set(np.atleast_1d(e["greedy"]["eos_id"]).tolist())
    assert tok.stop_ids[0] == tok.eos_id and tok.chat_template is not None
    for case in e["encode"]:
        if not case["add_special_tokens"]:  # vpo's encode adds no special tokens
            assert tok.encode(case["text"]) == case["ids"], case
    for case in e["decode"]:  # transformers' decode keeps special tokens by default
        assert tok.decode(case["ids"], skip_special_tokens=False) == case["text"]


def test_tokenizer_errors(tmp_path):
    with pytest.raises(hf.CheckpointError, match="no tokenizer.json"):
        hf.load_tokenizer(tmp_path)
    folder = _copy(tmp_path, "llama3_tied")
    (folder / "tokenizer_config.json").write_text('{"eos_token": "<nope>"}')
    with pytest.raises(hf.CheckpointError, match="eos_token '<nope>' is not in tokenizer.json"):
        hf.load_tokenizer(folder)


def test_hf_spec():
    assert hf.is_hf_spec("hf:/ckpt/Qwen2.5-0.5B") and not hf.is_hf_spec("qwen2.5-0.5b")
    assert not hf.is_hf_spec(None)
    assert hf.hf_spec_path("hf:/ckpt/Qwen2.5-0.5B") == "/ckpt/Qwen2.5-0.5B"
    with pytest.raises(ValueError, match="hf:/path"):
        hf.hf_spec_path("hf:")


# -- live checks against transformers (optional) ------------------------------------------------

LIVE_SHAPES = {
    "qwen2_gqa_bf16": ("qwen2", dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                                     tie_word_embeddings=True), "bfloat16"),
    "llama3_untied": ("llama", dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=3,
                                    head_dim=16, tie_word_embeddings=False, rope_parameters=dict(
                                        rope_type="llama3", rope_theta=5e5, factor=32.0,
                                        low_freq_factor=1.0, high_freq_factor=4.0,
                                        original_max_position_embeddings=32)), "float32"),
    "qwen3": ("qwen3", dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=1,
                            head_dim=32, tie_word_embeddings=False), "float32"),
}


@pytest.mark.parametrize("shape", list(LIVE_SHAPES))
def test_live_transformers_round_trip(tmp_path, shape):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model_type, kw, dtype = LIVE_SHAPES[shape]
    config = transformers.CONFIG_MAPPING[model_type](
        vocab_size=96, intermediate_size=80, num_hidden_layers=3, max_position_embeddings=64,
        **kw)
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for n, p in ref.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in n else 0.15 * torch.randn_like(p))
    ref.to(getattr(torch, dtype)).save_pretrained(tmp_path / "hf")
    tokens = np.random.default_rng(0).integers(0, 96, (2, 12))

    def hf_logits(folder):
        m = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager").eval()
        with torch.no_grad():
            return m(torch.tensor(tokens)).logits.numpy()

    ours = hf.from_pretrained(tmp_path / "hf", dtype="float32")
    got = np.asarray(_forward(ours, jnp.array(tokens), None))
    np.testing.assert_allclose(got, hf_logits(tmp_path / "hf"), atol=1e-4, rtol=0)
    hf.save_pretrained(hf.from_pretrained(tmp_path / "hf"), tmp_path / "ours")  # own dtype
    np.testing.assert_allclose(hf_logits(tmp_path / "ours"), got, atol=1e-4, rtol=0)
