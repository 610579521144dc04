"""Vocab: fixed specials, encode/decode, clear errors, and the HF tokenizer round trip."""

import numpy as np
import pytest

from vpo.tasks import arithmetic, maze, program, vocab


def test_specials_have_fixed_ids_and_round_trip():
    v = vocab.make_vocab(["a", "b", "+"])
    assert (v.pad_id, v.bos_id, v.eos_id, v.sep_id) == (0, 1, 2, 3)
    assert v.tokens[:4] == ("<pad>", "<bos>", "<eos>", "<sep>") and v.size == 7
    ids = v.encode("a + b <sep> b <eos>")
    assert ids == [4, 6, 5, 3, 5, 2] and v.encode(["a", "+"]) == [4, 6]
    assert v.decode(ids) == "a + b <sep> b <eos>"
    assert v.decode(v.encode("  a   b\n")) == "a b"


def test_errors_name_the_problem():
    v = vocab.make_vocab(["a"])
    with pytest.raises(ValueError, match="unknown token 'zz'"):
        v.encode("a zz")
    with pytest.raises(ValueError, match="out of range"):
        v.decode([5])
    assert v.decode([4, 5], strict=False) == "a <unk>"
    with pytest.raises(ValueError, match="twice"):
        vocab.make_vocab(["a", "a"])
    with pytest.raises(ValueError, match="whitespace"):
        vocab.make_vocab(["a b"])
    with pytest.raises(ValueError, match="must start with"):
        vocab.Vocab(("a", "b", "c", "d"))


@pytest.mark.parametrize("make", [arithmetic.make_arithmetic_task, maze.make_maze_task,
                                  program.make_program_task])
def test_hf_tokenizer_round_trips_every_task_vocab(make):
    v = make().vocab
    tok = v.to_tokenizer()
    assert tok.get_vocab_size() == v.size
    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.integers(0, v.size, size=200)]
    text = v.decode(ids)
    assert tok.encode(text, add_special_tokens=False).ids == ids == v.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_tokenizer_encodes_answer_text():
    v = arithmetic.make_arithmetic_task().vocab
    text = "( 3 + 4 ) * 5 <sep> 35 <eos>"
    assert v.to_tokenizer().encode(text, add_special_tokens=False).ids == v.encode(text)
    with pytest.raises(Exception, match="UNK|unk"):
        v.to_tokenizer().encode("3 / 4")
