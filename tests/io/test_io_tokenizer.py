"""vpo.io.tokenizer: HF checkpoint tokenizers against what transformers computed (chat templates,
special ids, encode/decode), save/load round trips, the word-level tokenizer, token bytes and
completion text on a real byte-level BPE, chat affixes, clear errors, and no special id
hard-coded anywhere else in vpo/."""

import io
import json
import pathlib
import re
import shutil
import tokenize

import numpy as np
import pytest

from vpo.errors import CheckpointError
from vpo.io.tokenizer import WORD_SPECIALS, Tokenizer, load_tokenizer, word_tokenizer

HF = pathlib.Path(__file__).parent.parent / "fixtures" / "hf"
WORD_FIXTURES = ("qwen2_tied", "qwen2_untied", "qwen3_tied", "qwen3_untied", "llama3_tied",
                 "llama3_untied")
BPE = HF / "qwen2_bpe"
CHATML_HI = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
             "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
TEXTS = ["hello world", "  two  spaces\tand a tab\n", "<answer 1> U R </answer 1>\n",
         "Café naïve — “quoted” 日本語 🙂🚀 ∑", "x 3 + dup * swap ; 0.5 | scores:", "",
         "<|im_start|>user\nhi<|im_end|>"]


def _expected(name):
    return json.loads((HF / name / "expected.json").read_text())


@pytest.fixture(scope="module")
def bpe():
    return load_tokenizer(BPE)


# -- the word-level HF fixtures against transformers -------------------------------------------

@pytest.mark.parametrize("name", WORD_FIXTURES)
def test_chat_template_renders_as_transformers(name):
    tok = load_tokenizer(HF / name)
    chats = _expected(name)["chat"]
    assert chats
    for c in chats:
        text = tok.render_chat(c["messages"], add_generation_prompt=c["add_generation_prompt"],
                               **c["kwargs"])
        assert text == c["text"], c


@pytest.mark.parametrize("name", WORD_FIXTURES)
def test_special_ids_match_transformers(name):
    tok = load_tokenizer(HF / name)
    special = _expected(name)["special"]
    assert tok.bos_id == special["bos_id"]
    assert tok.eos_id == special["eos_id"] == tok.stop_ids[0]
    if special["pad_id"] is not None:
        assert tok.pad_id == special["pad_id"]
    gen = json.loads((HF / name / "generation_config.json").read_text())
    listed = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [
        gen["eos_token_id"]]
    assert set(listed) <= set(tok.stop_ids)  # every eos anywhere stops generation


@pytest.mark.parametrize("name", WORD_FIXTURES)
def test_encode_decode_match_transformers(name):
    tok = load_tokenizer(HF / name)
    e = _expected(name)
    plain = [x for x in e["encode"] if not x["add_special_tokens"]]
    assert plain
    for x in plain:
        assert tok.encode(x["text"]) == x["ids"], x
    for x in e["decode"]:  # transformers' decode keeps special tokens by default
        assert tok.decode(x["ids"], skip_special_tokens=False) == x["text"], x


def test_plain_llama_prompt_starts_with_bos_like_transformers(tmp_path):
    """tokenizer.json's TemplateProcessing post-processor prepends <|begin_of_text|>, as
    transformers' encode(add_special_tokens=True) does; an explicit add_bos_token wins."""
    folder = tmp_path / "llama_base"
    shutil.copytree(HF / "llama3_tied", folder)
    (folder / "chat_template.jinja").unlink()  # a base model: plain prompts
    tok = load_tokenizer(folder)
    assert tok.add_bos and tok.bos_id == tok.token_id("<|begin_of_text|>")
    with_bos = [x for x in _expected("llama3_tied")["encode"] if x["add_special_tokens"]]
    assert with_bos
    for x in with_bos:
        assert tok.prompt_ids(x["text"]) == x["ids"], x
    tok.save(tmp_path / "saved")
    assert load_tokenizer(tmp_path / "saved").prompt_ids("hello world") == with_bos[0]["ids"]
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": False}))
    assert not load_tokenizer(folder).add_bos
    assert not load_tokenizer(BPE).add_bos and not load_tokenizer(HF / "qwen2_tied").add_bos


def test_bpe_fixture_chatml_template(bpe):
    assert bpe.prompt_text("hi") == CHATML_HI
    assert bpe.render_chat([{"role": "user", "content": "hi"}],
                           add_generation_prompt=False) == CHATML_HI[:-len(
                               "<|im_start|>assistant\n")]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    assert bpe.render_chat(chat) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert bpe.prompt_text(chat[:2]) == bpe.render_chat(chat[:2])
    with pytest.raises(ValueError, match="role"):
        bpe.render_chat([{"content": "no role"}])


def test_bpe_fixture_specials_and_model(bpe):
    from vpo.io import hf

    end, start, im_end = (bpe.token_id(s) for s in ("<|endoftext|>", "<|im_start|>",
                                                     "<|im_end|>"))
    assert bpe.stop_ids == (im_end, end) and bpe.eos_id == im_end and bpe.pad_id == end
    assert bpe.bos_id is None and not bpe.add_bos and bpe.size == 512
    assert {end, start, im_end} == {bpe.size - 3, bpe.size - 2, bpe.size - 1}  # not id 0
    assert bpe.prompt_ids("hi")[:1] == [start]
    model = hf.from_pretrained(BPE)
    assert model.cfg.vocab_size == bpe.size and model.cfg.qkv_bias and model.cfg.tie_embeddings
    assert model.cfg.max_seq_len == 1024
    assert sum(f.stat().st_size for f in BPE.iterdir()) < 1 << 20
    with pytest.raises(ValueError, match="not in this tokenizer"):
        bpe.token_id("<|no such token|>")


# -- save / load -------------------------------------------------------------------------------

def _same_tokenizer(a: Tokenizer, b: Tokenizer) -> None:
    assert (a.pad_id, a.stop_ids, a.bos_id, a.add_bos, a.size) == (
        b.pad_id, b.stop_ids, b.bos_id, b.add_bos, b.size)
    assert a.chat_template == b.chat_template
    for k, v in b.special_tokens.items():  # what the template can name survives
        assert a.special_tokens.get(k) == v
    for text in TEXTS:
        assert a.encode(text) == b.encode(text)
        assert a.prompt_ids(text) == b.prompt_ids(text)
        assert a.prompt_text(text) == b.prompt_text(text)
    for t in (a, b):
        t.token_bytes()
    np.testing.assert_array_equal(a.token_bytes()[1], b.token_bytes()[1])
    np.testing.assert_array_equal(a.token_bytes()[0], b.token_bytes()[0])


@pytest.mark.parametrize("name", [*WORD_FIXTURES, "qwen2_bpe", "word"])
def test_save_load_round_trip(name, tmp_path):
    if name == "word":
        tok = word_tokenizer(["hello", "world", "U", "R"], added=["<answer 1>", "</answer 1>"])
    else:
        tok = load_tokenizer(HF / name)
    tok.save(tmp_path / "saved")
    again = load_tokenizer(tmp_path / "saved")
    _same_tokenizer(again, tok)
    again.save(tmp_path / "twice")  # a fixed point
    for f in ("tokenizer_config.json", "generation_config.json"):
        assert (tmp_path / "saved" / f).read_text() == (tmp_path / "twice" / f).read_text()


# -- the built-in word-level tokenizer ---------------------------------------------------------

def test_word_tokenizer_layout():
    tags = ("<answer 1>", "</answer 1>", "<answer 2>", "</answer 2>")
    tok = word_tokenizer(["U", "R", "U", "go"], added=tags)
    assert [tok.backend.id_to_token(i) for i in range(4)] == list(WORD_SPECIALS)
    assert WORD_SPECIALS == ("<pad>", "<bos>", "<eos>", "<unk>")
    assert (tok.pad_id, tok.bos_id, tok.stop_ids, tok.eos_id) == (0, 1, (2,), 2)
    assert tok.size == 4 + len(tags) + 3  # distinct words only
    ids = tok.encode("go <answer 1> U R </answer 1>\n<answer 2>U</answer 2>")
    assert [tok.backend.id_to_token(i) for i in ids] == [
        "go", "<answer 1>", "U", "R", "</answer 1>", "<answer 2>", "U", "</answer 2>"]
    assert all(len(tok.encode(t)) == 1 for t in tags)
    assert tok.encode("U nope") == [tok.token_id("U"), 3]  # unknown word -> <unk>
    assert tok.chat_template is None
    assert tok.prompt_ids("go U") == [1, tok.token_id("go"), tok.token_id("U")]
    assert tok.prompt_text("go U") == "go U"
    prefix, suffix = tok.chat_affixes()
    assert prefix == [1] and suffix == []
    with pytest.raises(ValueError, match="whitespace"):
        word_tokenizer(["two words"])
    with pytest.raises(ValueError, match="non-empty"):
        word_tokenizer([""])


def test_word_tokenizer_bytes():
    tok = word_tokenizer(["U", "R", "é"], added=["<answer 1>"])
    table, length = tok.token_bytes()
    pieces = [bytes(table[i, :length[i]]) for i in range(tok.size)]
    assert pieces[:4] == [b""] * 4  # specials add nothing
    assert pieces[4:] == [b" <answer 1>", b" U", b" R", " é".encode()]
    ids = [1, 4, 5, 6, 2, 0, 3, 7]
    assert tok.completion_text(ids) == " <answer 1> U R é"
    assert tok.completion_text(ids, max_bytes=13) == " <answer 1> U"
    assert tok.completion_text(ids).split() == tok.decode(ids).split()


# -- token bytes and completion text on byte-level BPE ----------------------------------------

def test_bpe_completion_text_is_decode(bpe):
    rng = np.random.default_rng(0)
    V = bpe.size
    table, length = bpe.token_bytes()
    assert table.shape[0] == V and table.dtype == np.uint8 and not table.flags.writeable
    specials = [bpe.token_id(s) for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    assert np.all(length[specials] == 0) and np.all(length[:V - 3] >= 1)
    assert set(range(256)) <= {bytes(table[i, :length[i]])[0] for i in range(V)
                               if length[i] == 1}  # every single byte is a token

    def check(ids):
        ids = [int(i) for i in ids]
        assert bpe.completion_text(ids) == bpe.decode(ids, skip_special_tokens=True), ids

    for _ in range(300):  # uniform ids, specials included (often invalid UTF-8)
        check(rng.integers(0, V, size=int(rng.integers(0, 40))))
    for text in TEXTS:  # multi-byte text, whole and cut at every token boundary
        ids = bpe.encode(text)
        assert bpe.completion_text(ids) == text.replace("<|im_start|>", "").replace(
            "<|im_end|>", "")
        for a in range(len(ids)):
            check(ids[a:])
            check(ids[:a])
        check(ids + specials + ids)
        whole = bpe.completion_text(ids).encode()
        for k in range(len(whole) + 2):  # max_bytes cuts the byte string, then decodes
            assert bpe.completion_text(ids, max_bytes=k) == whole[:k].decode("utf-8", "replace")
    shuffled = [int(i) for i in rng.permutation(bpe.encode("".join(TEXTS)))]
    for n in range(0, len(shuffled), 7):
        check(shuffled[:n])


def test_special_tokens_add_no_bytes(bpe):
    ids = bpe.encode("<answer 1> U </answer 1>")
    noisy = [bpe.stop_ids[0], *ids[:2], bpe.pad_id, *ids[2:], bpe.stop_ids[1]]
    assert bpe.completion_text(noisy) == bpe.completion_text(ids) == "<answer 1> U </answer 1>"


@pytest.mark.parametrize("name", [*WORD_FIXTURES, "qwen2_bpe"])
def test_chat_affixes_assemble_the_prompt(name):
    tok = load_tokenizer(HF / name)
    prefix, suffix = tok.chat_affixes()
    for content in ("hello world", "what is two plus three ?", "x 3 + dup * swap\nExamples:",
                    "Café 日本語"):
        ids = prefix + tok.encode(content) + suffix
        want = tok.prompt_text(content)
        if name == "qwen2_bpe":
            assert tok.decode(ids, skip_special_tokens=False) == want
            assert tok.completion_text(ids) == tok.completion_text(tok.prompt_ids(content))
        else:  # word-level: the tokens of the prompt, unknown words as <unk>
            assert ids == tok.prompt_ids(content)


# -- errors ----------------------------------------------------------------------------------

def test_no_eos_anywhere_is_a_checkpoint_error(tmp_path):
    folder = tmp_path / "no_eos"
    folder.mkdir()
    shutil.copyfile(BPE / "tokenizer.json", folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"pad_token": "<|endoftext|>"}))
    (folder / "generation_config.json").write_text(json.dumps({"pad_token_id": 509}))
    with pytest.raises(CheckpointError, match="end-of-sequence") as e:
        load_tokenizer(folder)
    assert str(folder) in str(e.value) and "tokenizer_config.json" in str(e.value)


def test_broken_checkpoint_files_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    shutil.copyfile(BPE / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eos|>"}))
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json.*'<\|eos\|>'"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json: not valid JSON"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5000]}))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        load_tokenizer(tmp_path)


def test_eos_from_token_ids_only_and_named_templates(tmp_path):
    """No tokenizer_config.json eos: generation_config.json's ids; a list of named templates."""
    shutil.copyfile(BPE / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "{{ messages[0]['content'] }}!"}]}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 511, "pad_token_id": 509}))
    tok = load_tokenizer(tmp_path)
    assert tok.stop_ids == (511,) and tok.pad_id == 509 and tok.bos_id is None
    assert tok.prompt_text("hi") == "hi!"


# -- no special id hard-coded outside vpo/io/tokenizer.py -----------------------------------------

_ID = r"(?:[A-Za-z_]*_)?(?:eos|pad|bos|sep|eot|stop)(?:_token)?_ids?"  # eos_id, pad_token_id
_BARE = r"(?:eos|pad|bos|sep|eot)"  # a whole name
_PATTERNS = {
    "special id given an integer literal": re.compile(
        rf"\b{_ID}\s*(?::[^=\n]+)?=(?!=)\s*[\(\[]?\s*-?\d", re.IGNORECASE),
    "comparison of a special id with an integer literal": re.compile(
        rf"\b(?:{_ID}|{_BARE})\s*[!=]=\s*-?\d|\b\d+\s*[!=]=\s*(?:\w+\.)*(?:{_ID}|{_BARE})\b",
        re.IGNORECASE),
    "module constant named for a special token": re.compile(
        r"^(?:EOS|PAD|SEP|BOS|EOT|UNK)(?:_ID|_IDS|_TOKEN|_TOKEN_ID)?\s*(?::[^=\n]+)?=(?!=)",
        re.MULTILINE),
}


def _code_without_comments_and_strings(source: str) -> str:
    """The source with comments and string literals blanked (docstrings may show examples)."""
    lines = source.splitlines(keepends=True)
    out = [list(line) for line in lines]
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING) or tok.type == getattr(
                tokenize, "FSTRING_MIDDLE", -1):
            (r0, c0), (r1, c1) = tok.start, tok.end
            for r in range(r0, r1 + 1):
                a = c0 if r == r0 else 0
                b = c1 if r == r1 else len(out[r - 1])
                for c in range(a, b):
                    if out[r - 1][c] != "\n":
                        out[r - 1][c] = " "
    return "".join("".join(line) for line in out)


def test_patterns_catch_what_they_should():
    hits = ["eos_id=2", "pad_id = 0", "stop_ids=(2,)", "stop_ids=[2, 7]", "eos_token_id: int = 2",
            "if tok == 2 and eos == 2:", "x.pad_id != 0", "0 == self.eos_id",
            "EOS = 2", "PAD_ID = 0", "SEP: int = 3", "self.bos == 1", "stop_id = 5"]
    misses = ["eos_id=tok.eos_id", "pad_id=self.tokenizer.pad_id", "padding = 0",
              "stop_ids=tuple(ids)", "n_pad = 4", "EOS_TOKEN_NAME = tokenizer.eos", "pad_len == 0",
              "num_bytes == 0", "if eos_id == pad_id:", "n_pad == 0", "EOS == tok.eos_id"]
    found = lambda s: any(p.search(s) for p in _PATTERNS.values())  # noqa: E731
    assert [s for s in hits if not found(s)] == []
    assert [s for s in misses if found(s)] == []


def test_no_module_hard_codes_a_special_id():
    root = pathlib.Path(__file__).parent.parent.parent / "vpo"
    hits = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "io" / "tokenizer.py":
            continue
        code = _code_without_comments_and_strings(path.read_text())
        for what, pattern in _PATTERNS.items():
            for m in pattern.finditer(code):
                line = code.count("\n", 0, m.start()) + 1
                hits.append(f"{path.relative_to(root.parent)}:{line}: {what}: "
                            f"{code.splitlines()[line - 1].strip()}")
    assert hits == [], "\n".join(hits)
