"""The multi-answer format: split_answers edge cases, host twin agreement, prompt packing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vpo.tasks import answers, prompting
from vpo.tasks import vocab as vocab_lib

V = vocab_lib.make_vocab(["a", "b", "c"])
A_, B_, C_ = 4, 5, 6
SEP, EOS = vocab_lib.SEP, vocab_lib.EOS
T = 12


def _split(tokens, mask=None, M=3, A=3):
    tokens = np.array(tokens + [0] * (T - len(tokens)), np.int32)
    if mask is None:
        mask = np.arange(T) < T
    return [np.asarray(x) for x in answers.split_answers(
        tokens, np.asarray(mask), num_answers=M, answer_len=A)]


def test_well_formed_generation():
    ans, amask, valid = _split([A_, B_, SEP, C_, SEP, A_, A_, A_, EOS])
    np.testing.assert_array_equal(valid, [True, True, True])
    np.testing.assert_array_equal(ans, [[A_, B_, 0], [C_, 0, 0], [A_, A_, A_]])
    np.testing.assert_array_equal(amask, [[1, 1, 0], [1, 0, 0], [1, 1, 1]])


@pytest.mark.parametrize("tokens, valid", [
    ([A_, EOS], [True, False, False]),  # missing answers
    ([A_, SEP, SEP, B_, EOS], [True, False, True]),  # an empty answer
    ([A_, SEP, B_, SEP, EOS], [True, True, False]),  # empty last answer before eos
    ([A_, A_, A_, A_, SEP, B_, EOS], [False, True, False]),  # longer than answer_len = 3
    ([A_, SEP, B_, EOS, C_, SEP, C_, EOS], [True, True, False]),  # everything after eos ignored
    ([A_, SEP, B_, SEP, C_, SEP, A_, EOS], [True, True, True]),  # a 4th answer is ignored
])
def test_edge_cases(tokens, valid):
    np.testing.assert_array_equal(_split(tokens)[2], valid)


def test_truncated_trailing_answer_is_invalid():
    tokens = [A_, SEP, B_, B_]  # ran out of tokens inside the second answer
    _, amask, valid = _split(tokens, mask=np.arange(T) < len(tokens))
    np.testing.assert_array_equal(valid, [True, False, False])
    assert not amask[1].any()
    # A mask that ends early truncates even if a delimiter follows it.
    _, _, valid = _split([A_, SEP, B_, EOS], mask=np.arange(T) < 3)
    np.testing.assert_array_equal(valid, [True, False, False])


def test_first_occurrence_masks_later_duplicates():
    ans, amask, valid = _split([A_, B_, SEP, A_, SEP, A_, B_, EOS])
    np.testing.assert_array_equal(answers.first_occurrence(ans, amask, valid), [True, True, False])


def test_host_twin_agrees_with_the_in_graph_split():
    rng = np.random.default_rng(0)
    alphabet = np.array([A_, B_, SEP, EOS, SEP])
    tokens_NT = rng.choice(alphabet, size=(300, T)).astype(np.int32)
    lengths_N = rng.integers(0, T + 1, size=300)
    mask_NT = np.arange(T)[None, :] < lengths_N[:, None]

    def split(tokens_T, mask_T):
        ans, amask, valid = answers.split_answers(tokens_T, mask_T, num_answers=3, answer_len=2)
        return ans, amask, answers.first_occurrence(ans, amask, valid)

    ans_NMA, amask_NMA, valid_NM = jax.jit(jax.vmap(split))(tokens_NT, mask_NT)
    for n in range(300):
        text = V.decode(tokens_NT[n, :lengths_N[n]])
        host = answers.split_answer_words(text, num_answers=3, answer_len=2)
        for m in range(3):
            assert (host[m] is not None) == bool(valid_NM[n, m]), (text, m)
            if host[m] is not None:
                assert V.encode(host[m]) == np.asarray(ans_NMA[n, m])[amask_NMA[n, m]].tolist()


def test_pack_left_padded_keeps_order_and_pads_left():
    segments = [prompting.fixed([1, 7]), (jnp.array([8, 9, 10]), jnp.array([True, False, True]))]
    np.testing.assert_array_equal(prompting.pack_left_padded(segments, 7), [0, 0, 0, 1, 7, 8, 10])
    with pytest.raises(ValueError, match="length"):
        prompting.pack_left_padded(segments, 4)


def test_quantize_tenths():
    np.testing.assert_array_equal(prompting.quantize_tenths(jnp.array([0.0, 0.04, 0.66, 1.0, 2.0])),
                                  [0, 0, 7, 10, 10])
