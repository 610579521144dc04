"""The `<answer k>` format (vpo.tasks.answers): host parsing of text, the in-graph byte reader on
hand-made byte strings (the two agree rule by rule), and `first_occurrence`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vpo.tasks import answers
from vpo.tasks.base import symbol_words

SYMBOLS = ("U", "D", "L", "R", "dup")  # "dup": a multi-byte symbol; "D" is its prefix
A = 4  # answer_len
M = 3  # num_answers
X = 160  # bytes the graph reads


def _graph_reader():
    sym_VW, sym_len_V = answers.symbol_table(SYMBOLS)

    def read(bytes_X, live_X):
        s, mk, v = answers.read_symbols(bytes_X, live_X, jnp.asarray(sym_VW),
                                        jnp.asarray(sym_len_V), num_answers=M, answer_len=A)
        return s, mk, v, answers.first_occurrence(s, mk, v)

    return jax.jit(jax.vmap(read))


READ = _graph_reader()


def _as_bytes(texts: list[str | bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Hand-made byte strings → (bytes_NX int32, live_NX bool), as `completion_bytes` writes."""
    b = np.zeros((len(texts), X), np.int32)
    live = np.zeros((len(texts), X), bool)
    for i, t in enumerate(texts):
        raw = t.encode() if isinstance(t, str) else t
        assert len(raw) <= X
        b[i, :len(raw)] = np.frombuffer(raw, np.uint8)
        live[i, :len(raw)] = True
    return b, live


def _host(text: str) -> list[list[str] | None]:
    """Host rules (as `base.score_symbol_answers`): slot contents, the symbol check, then later
    duplicates of an earlier valid answer dropped."""
    words = [symbol_words(a, SYMBOLS, A) for a in answers.parse_answers(text, M)]
    seen, out = [], []
    for w in words:  # duplicates of an earlier VALID answer only
        out.append(None if w is None or w in seen else w)
        if w is not None and w not in seen:
            seen.append(w)
    return out


def _graph(texts):
    s, mk, v, first = (np.asarray(x) for x in READ(*_as_bytes(texts)))
    out = []
    for n in range(len(texts)):
        out.append([[SYMBOLS[i] for i in s[n, m][mk[n, m]]] if first[n, m] else None
                    for m in range(M)])
        assert np.all(s[n][~mk[n]] == 0) and not mk[n][~v[n]].any()
    return out


# (text, expected slots after the symbol check and de-duplication)
CASES = [
    ("<answer 1> U R </answer 1>\n<answer 2> D </answer 2>\n<answer 3> dup L </answer 3>",
     [["U", "R"], ["D"], ["dup", "L"]]),
    ("<answer 1>U R</answer 1><answer 2>D</answer 2>", [["U", "R"], ["D"], None]),  # no spaces
    ("Sure! Here: <answer 1> U </answer 1> and then <answer 2> L </answer 2> bye",
     [["U"], ["L"], None]),  # text outside the tags is ignored
    ("<answer 1> U R", [None, None, None]),  # truncated: no close tag
    ("<answer 1> U R </answer", [None, None, None]),  # close tag cut
    ("<answer 1> U </answer 1> <answer 2> D", [["U"], None, None]),
    ("<answer 1> </answer 1> <answer 2></answer 2>", [None, None, None]),  # empty
    ("<answer 1> \t\n </answer 1>", [None, None, None]),  # whitespace only
    ("<answer 2> D </answer 2> <answer 1> U </answer 1>", [["U"], ["D"], None]),  # out of order
    ("<answer 1> U </answer 1> <answer 1> D </answer 1>", [["U"], None, None]),  # first tag wins
    ("</answer 1> <answer 1> U </answer 1>", [["U"], None, None]),  # close before open
    ("<answer 1> U R </answer 1> <answer 2> U  R </answer 2> <answer 3> R U </answer 3>",
     [["U", "R"], None, ["R", "U"]]),  # a duplicate of an earlier answer
    ("<answer 1> X </answer 1> <answer 2> U </answer 2> <answer 3> U </answer 3>",
     [None, ["U"], None]),  # duplicates of a valid answer only
    ("<answer 1> X </answer 1> <answer 2> X </answer 2> <answer 3> U </answer 3>",
     [None, None, ["U"]]),
    ("<answer 1> U < R </answer 1>", [None, None, None]),  # a stray <
    ("<answer 1> U<R </answer 1> <answer 2> R> </answer 2>", [None, None, None]),
    ("<answer 1> U R D L U </answer 1> <answer 2> U R D L </answer 2>",
     [None, ["U", "R", "D", "L"], None]),  # too many words (A = 4)
    ("<answer 1> u r </answer 1> <answer 2> Dup </answer 2> <answer 3> UR </answer 3>",
     [None, None, None]),  # wrong case, glued symbols
    ("<answer 1> U up </answer 1> <answer 2> du </answer 2> <answer 3> dupe </answer 3>",
     [None, None, None]),  # foreign words, prefixes of symbols
    ("<answer 1> U <answer 2> D </answer 2> </answer 1>", [None, ["D"], None]),  # nested
    ("<answer 1> U\tR\nD\r\nL </answer 1>\n<answer 2>\x0bU\x0cD </answer 2>",
     [["U", "R", "D", "L"], ["U", "D"], None]),  # ASCII whitespace of every kind
    ("<answer 1> U\u00a0R </answer 1> <answer 2> Ü </answer 2> <answer 3> R\u3000 </answer 3>",
     [None, None, None]),  # non-ASCII space and letters are word bytes
    ("<answer 10> U </answer 10> <answer 1 > U </answer 1 > <Answer 1> U </Answer 1>",
     [None, None, None]),  # not tags
    ("<answer 3> L </answer 3>", [None, None, ["L"]]),
    ("<answer 1> dup dup dup dup </answer 1> <answer 2> D D </answer 2>",
     [["dup", "dup", "dup", "dup"], ["D", "D"], None]),
    ("<answer 1> U </answer 2> </answer 1>", [None, None, None]),  # a foreign close tag inside
    ("<<answer 1>> U </answer 1>>", [None, None, None]),  # the ">" after the tag is a word
    ("<<answer 1> U </answer 1>>", [["U"], None, None]),
]


def test_host_and_graph_read_hand_made_text_alike():
    texts = [t for t, _ in CASES]
    graph = _graph(texts)
    for (text, want), got in zip(CASES, graph, strict=True):
        assert _host(text) == want, text
        assert got == want, text


def test_parse_answers_contents():
    text = "x <answer 2>  D  L\n</answer 2> <answer 1> U </answer 1> <answer 3> </answer 3>"
    assert answers.parse_answers(text, 3) == ["U", "D  L", None]
    assert answers.parse_answers(text, 1) == ["U"]
    assert answers.parse_answers("", 2) == [None, None]
    # the close tag is searched after the open tag: "<answer 1></answer 1>" is empty
    assert answers.parse_answers("<answer 1></answer 1> U </answer 1>", 1) == [None]
    # only the first open tag counts, even when a later one would close
    assert answers.parse_answers("<answer 1> U <answer 1> R </answer 1>", 1) == [
        "U <answer 1> R"]


def test_answer_words_split_like_the_graph():
    assert answers.answer_words("U  R\tD\nL") == ["U", "R", "D", "L"]
    assert answers.answer_words("U<R>>D") == ["U", "<", "R", ">", ">", "D"]
    assert answers.answer_words("( 3 + 4 ) * 5") == ["(", "3", "+", "4", ")", "*", "5"]
    assert answers.answer_words("a\u00a0b") == ["a\u00a0b"]
    assert answers.answer_words(" \n ") == []


def test_format_parse_round_trip_and_tags():
    answers_in = ["U R", "D", "( 1 + 2 ) * 3"]
    text = answers.format_answers(answers_in)
    assert text == ("<answer 1> U R </answer 1>\n<answer 2> D </answer 2>\n"
                    "<answer 3> ( 1 + 2 ) * 3 </answer 3>")
    assert answers.parse_answers(text, 3) == answers_in
    assert answers.parse_answers(text, 4) == [*answers_in, None]
    tags = answers.tag_strings(2)
    assert tags == ("<answer 1>", "</answer 1>", "<answer 2>", "</answer 2>")
    assert len(answers.tag_strings()) == 2 * answers.MAX_TAG


def test_without_duplicates():
    assert answers.without_duplicates(["U R", "U  R", None, "R", "U\nR", "R"]) == [
        "U R", None, None, "R", None, None]


def test_symbol_table():
    table, length = answers.symbol_table(("U", "dup"))
    np.testing.assert_array_equal(table, [[ord("U"), -2, -2], [ord("d"), ord("u"), ord("p")]])
    np.testing.assert_array_equal(length, [1, 3])


def test_answer_spans():
    text = "ab <answer 2> D </answer 2> <answer 1>U</answer 1> <answer 3> L"
    b, live = _as_bytes([text])
    start, end, found = (np.asarray(x) for x in jax.jit(
        lambda b, lv: answers.answer_spans(b, lv, 3))(b[0], live[0]))
    np.testing.assert_array_equal(found, [True, True, False])
    assert text[start[0]:end[0]] == "U" and text[start[1]:end[1]] == " D "
    # bytes that are not live are not read: cutting the text before a close tag hides it
    live2 = live[0] & (np.arange(X) < text.index("</answer 2>") + 5)
    _, _, found2 = answers.answer_spans(jnp.asarray(b[0]), jnp.asarray(live2), 3)
    np.testing.assert_array_equal(found2, [False, False, False])


def test_completion_bytes_concatenates_leading_masked_tokens():
    pieces = [b"", b" U", b"<answer 1>", b"\n", b"\xc3\xa9", b" </answer 1>", b"abcdef"]
    L = max(len(p) for p in pieces)
    bytes_VW = np.zeros((len(pieces), L), np.uint8)
    length_V = np.array([len(p) for p in pieces], np.int32)
    for i, p in enumerate(pieces):
        bytes_VW[i, :len(p)] = np.frombuffer(p, np.uint8)
    fn = jax.jit(answers.completion_bytes, static_argnums=4)

    def run(tokens, mask, num_bytes):
        b, live = fn(jnp.asarray(tokens, jnp.int32), jnp.asarray(mask), jnp.asarray(bytes_VW),
                     jnp.asarray(length_V), num_bytes)
        b, live = np.asarray(b), np.asarray(live)
        assert np.all(b[~live] == 0) and np.all(live == (np.arange(num_bytes) < live.sum()))
        return bytes(b[live].astype(np.uint8))

    tokens = [2, 0, 1, 3, 4, 5, 1]
    assert run(tokens, [True] * 7, 64) == b"<answer 1> U\n\xc3\xa9 </answer 1> U"
    # only the leading run of True counts; the special token 0 adds no bytes
    assert run(tokens, [True, True, True, False, True, True, True], 64) == b"<answer 1> U"
    assert run(tokens, [False] * 7, 64) == b""
    # bytes past X are cut, even inside a token
    assert run(tokens, [True] * 7, 12) == b"<answer 1> U"
    assert run([6, 6, 6], [True] * 3, 8) == b"abcdefab"
    assert run([99], [True], 8) == b""  # ids past the byte table add nothing


def test_first_occurrence():
    s = jnp.array([[0, 3, 0], [0, 3, 0], [0, 3, 1], [0, 0, 0], [0, 3, 0]], jnp.int32)
    mk = jnp.array([[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], bool)
    v = jnp.array([True, True, True, True, True])
    np.testing.assert_array_equal(answers.first_occurrence(s, mk, v),
                                  [True, False, True, True, False])
    # masked positions do not count: [0, 3] with a stale 1 behind the mask equals [0, 3]
    s2 = s.at[1, 2].set(1)
    np.testing.assert_array_equal(answers.first_occurrence(s2, mk, v),
                                  [True, False, True, True, False])
    # an invalid earlier slot does not hide a later equal one
    v2 = jnp.array([False, True, True, True, True])
    np.testing.assert_array_equal(answers.first_occurrence(s, mk, v2),
                                  [False, True, True, True, False])
    # a prefix is not a duplicate; invalid slots stay invalid
    v3 = jnp.array([True, False, True, True, False])
    np.testing.assert_array_equal(answers.first_occurrence(s, mk, v3),
                                  [True, False, True, True, False])


@pytest.mark.parametrize("seed", [0, 1])
def test_host_and_graph_agree_on_random_text(seed):
    """Random strings over tag pieces, symbols, junk and whitespace: both readers agree."""
    rng = np.random.default_rng(seed)
    pieces = ["<answer 1>", "</answer 1>", "<answer 2>", "</answer 2>", "<answer 3>",
              "</answer 3>", "<answer ", "</answer", "1", "2", ">", "<", " ", " ", " ", "\n",
              "\t", "U", "D", "L", "R", "dup", "du", "x", "é"]
    texts = []
    for _ in range(200):
        text = "".join(rng.choice(pieces, size=int(rng.integers(0, 40))))
        texts.append(text.encode()[:X].decode("utf-8", errors="ignore"))
    for text, got in zip(texts, _graph(texts), strict=True):
        assert got == _host(text), text


def test_ids_past_the_tokenizer_add_no_bytes():
    """A model vocabulary padded beyond the tokenizer's (HF checkpoints): such ids read as
    nothing, on the host and in the graph alike."""
    import jax.numpy as jnp

    from vpo.io.tokenizer import word_tokenizer
    from vpo.tasks import answers as answers_lib

    tok = word_tokenizer(["A", "B"], added=answers_lib.tag_strings(2))
    table, length = tok.token_bytes()
    ids = [tok.token_id("<answer 1>"), tok.size + 3, tok.token_id("A"),
           tok.token_id("</answer 1>")]
    text = tok.completion_text(ids)
    assert text == " <answer 1> A </answer 1>"
    b_X, live_X = answers_lib.completion_bytes(jnp.asarray(ids), jnp.ones((4,), bool),
                                               jnp.asarray(table.astype("int32")),
                                               jnp.asarray(length), 64)
    got = bytes(int(x) for x, v in zip(b_X, live_X, strict=True) if v).decode()
    assert got == text
