"""Word-level task vocabularies: a frozen token list with fixed special ids, and its HF tokenizer.

Every task owns a small vocabulary of whitespace-free word tokens. Ids 0..3 are fixed specials:

    pad = 0   left padding of prompts, filler after the end of a generation
    bos = 1   first token of every prompt
    eos = 2   ends a generation (and so terminates its last answer)
    sep = 3   the delimiter between the m answers of one generation

Text is the tokens joined by single spaces, so `decode(encode(s)) == " ".join(s.split())`, and
`to_tokenizer()` gives the same mapping as a real `tokenizers.Tokenizer` (WordLevel model with a
whitespace-split pre-tokenizer, specials registered as special added tokens) for the host-reward
path and for HF export.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

PAD, BOS, EOS, SEP = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<sep>")
UNKNOWN = "<unk>"  # what `decode(..., strict=False)` writes for an id outside the vocabulary


def answer_count_token(m: int) -> str:
    """The prompt token that requests m answers (`m3` asks for three)."""
    return f"m{m}"


def score_token(tenths: int) -> str:
    """The token of a score quantised to tenths (`q7` is 0.7); used by mutation prompts."""
    return f"q{tenths}"


# Prompt-structure tokens every task vocabulary carries (see `common_tokens`).
EVOLVE, PARENT, SCORE = "evolve", "parent", "score"


def common_tokens(max_answers: int) -> tuple[str, ...]:
    """Tokens shared by all task vocabularies, after the specials.

    `m1..m{max_answers}` (how many answers a prompt requests), `q0..q10` (scores in tenths) and the
    mutation-prompt markers `evolve`, `parent`, `score`.
    """
    if max_answers < 1:
        raise ValueError(f"max_answers must be >= 1; got {max_answers}")
    return (tuple(answer_count_token(m) for m in range(1, max_answers + 1))
            + tuple(score_token(q) for q in range(11)) + (EVOLVE, PARENT, SCORE))


@dataclasses.dataclass(frozen=True)
class Vocab:
    """An immutable word-level vocabulary; `tokens[i]` is the string of id i.

    Build it with `make_vocab(task_tokens)`, which prepends `SPECIAL_TOKENS`. Tokens must be unique,
    non-empty and free of whitespace (text is whitespace-separated).
    """

    tokens: tuple[str, ...]
    _index: dict[str, int] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        tokens = tuple(self.tokens)
        object.__setattr__(self, "tokens", tokens)
        if tokens[:4] != SPECIAL_TOKENS:
            raise ValueError(f"Vocab.tokens must start with {SPECIAL_TOKENS} (pad, bos, eos, sep); "
                             f"got {tokens[:4]}. Build vocabularies with make_vocab(...).")
        index: dict[str, int] = {}
        for i, tok in enumerate(tokens):
            if not isinstance(tok, str) or not tok or any(ch.isspace() for ch in tok):
                raise ValueError(f"Vocab.tokens[{i}] = {tok!r}: tokens must be non-empty strings "
                                 "without whitespace (text is split on whitespace)")
            if tok in index:
                raise ValueError(f"Vocab.tokens: {tok!r} appears twice (ids {index[tok]} and {i}); "
                                 "remove the duplicate")
            index[tok] = i
        object.__setattr__(self, "_index", index)

    @property
    def size(self) -> int:
        """V, the number of token ids."""
        return len(self.tokens)

    pad_id, bos_id, eos_id, sep_id = PAD, BOS, EOS, SEP

    def __contains__(self, token: str) -> bool:
        return token in self._index

    def id(self, token: str) -> int:
        """The id of one token; a ValueError names an unknown token."""
        try:
            return self._index[token]
        except KeyError:
            raise ValueError(
                f"unknown token {token!r}: not in this {self.size}-token vocabulary "
                f"(first tokens: {' '.join(self.tokens[:12])} ...). Use only the task's tokens, "
                "separated by spaces.") from None

    def encode(self, text: str | Sequence[str]) -> list[int]:
        """Token ids of a whitespace-separated string or of a list of token strings."""
        words = text.split() if isinstance(text, str) else list(text)
        return [self.id(w) for w in words]

    def decode(self, ids: Iterable[int], *, strict: bool = True) -> str:
        """Tokens of `ids` joined by single spaces (specials included, as `<sep>` etc.).

        An id outside 0..V-1 raises, or with `strict=False` decodes as `<unk>` (for samples of a
        model whose vocabulary is padded beyond the task's; no answer parser accepts `<unk>`).
        """
        out = []
        for i in ids:
            i = int(i)
            if 0 <= i < self.size:
                out.append(self.tokens[i])
            elif strict:
                raise ValueError(f"token id {i} is out of range for this {self.size}-token "
                                 "vocabulary; was the completion sampled with another vocab? "
                                 "(decode(..., strict=False) maps such ids to <unk>)")
            else:
                out.append(UNKNOWN)
        return " ".join(out)

    def to_tokenizer(self):
        """A `tokenizers.Tokenizer` with exactly these ids (WordLevel + WhitespaceSplit).

        `tok.encode(text, add_special_tokens=False).ids == vocab.encode(text)` and
        `tok.decode(ids, skip_special_tokens=False) == vocab.decode(ids)`. Unknown words raise.
        """
        from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

        tok = Tokenizer(models.WordLevel(vocab=dict(self._index), unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                                for s in SPECIAL_TOKENS])
        return tok


def make_vocab(task_tokens: Iterable[str]) -> Vocab:
    """`Vocab` of `SPECIAL_TOKENS` followed by `task_tokens` (in order)."""
    return Vocab(SPECIAL_TOKENS + tuple(task_tokens))
