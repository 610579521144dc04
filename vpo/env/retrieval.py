"""A shipped multi-hop retrieval environment over a small local corpus (MuSiQue-like, two hops).

`vpo train --env vpo.env.retrieval:make_env`. The corpus is generated from a seed: people born
in cities, cities in countries, with made-up names (nothing to recall from pretraining). A row
asks in which country a person was born: the answer needs two facts, the person's city and that
city's country. The assistant searches with a line `search: <words>` (the environment answers
with the `top_k` passages sharing the most words with the query, as a tool message) and ends
with `answer: <country>` (or with a message that searches nothing). The reward vector (R = 3):

- correct: the answer names the person's country (exact, case-insensitive);
- bridged: the final message names the bridge entity, the city (the answer shows its hop);
- few_searches: 1 − searches / max_searches: every search costs, and an answer without the
  two searches is a guess.

w* = (0.6, 0.2, 0.2).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

_SEARCH = re.compile(r"^\s*search\s*:\s*(.+?)\s*$", re.I | re.M)
_ANSWER = re.compile(r"^\s*answer\s*:\s*(.+?)\s*$", re.I | re.M)
_SYLLABLES = ("ka", "lo", "mi", "ren", "to", "sa", "vel", "dor", "an", "is", "ur", "bel", "po",
              "zin", "ta", "mor", "el", "quo", "fen", "ga")


def _name(rng: np.random.Generator, parts: int) -> str:
    return "".join(_SYLLABLES[i] for i in rng.integers(len(_SYLLABLES), size=parts)).title()


def make_corpus(seed: int = 0, people: int = 40, cities: int = 12, countries: int = 4
                ) -> tuple[list[str], dict[str, tuple[str, str]]]:
    """(passages, {person: (city, country)}): one passage per fact, names distinct."""
    rng = np.random.default_rng(seed)
    seen: set[str] = set()

    def fresh(parts: int) -> str:
        while True:
            name = _name(rng, parts)
            if name not in seen:
                seen.add(name)
                return name

    country_names = [fresh(2) + "ia" for _ in range(countries)]
    city_country = {fresh(2) + "burg": country_names[i % countries] for i in range(cities)}
    city_names = list(city_country)
    born = {fresh(3): city_names[int(rng.integers(cities))] for _ in range(people)}
    passages = [f"{p} was born in {c}." for p, c in born.items()]
    passages += [f"{c} is a city in {k}." for c, k in city_country.items()]
    order = rng.permutation(len(passages))
    return [passages[i] for i in order], {p: (c, city_country[c]) for p, c in born.items()}


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


class RetrievalEnv:
    """One episode (see the module docstring)."""

    reward_names = ("correct", "bridged", "few_searches")
    weights = (0.6, 0.2, 0.2)

    def __init__(self, corpus_seed: int = 0, top_k: int = 2, max_searches: int = 3):
        self.passages, self.facts = make_corpus(corpus_seed)
        self.top_k, self.max_searches = top_k, max_searches
        self.row: dict[str, Any] = {}
        self.searches = 0

    def problems(self, seed: int, num: int) -> list[dict[str, Any]]:
        """`num` rows: a person of the corpus, drawn by `seed`."""
        rng = np.random.default_rng(seed)
        people = sorted(self.facts)
        return [{"person": people[int(i)]} for i in rng.integers(len(people), size=num)]

    def search(self, query: str) -> list[str]:
        """The `top_k` passages sharing the most words with `query` (ties in corpus order)."""
        q = _words(query)
        scores = [len(q & _words(p)) for p in self.passages]
        order = sorted(range(len(self.passages)), key=lambda i: -scores[i])
        return [self.passages[i] for i in order[:self.top_k] if scores[i] > 0]

    def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
        self.row, self.searches = row, 0
        return [{"role": "user", "content": (
            f"In which country was {row['person']} born? Search the notes with a line "
            "'search: <words>'. End with a line 'answer: <country>'.")}]

    def step(self, messages: list[dict[str, str]]) -> list[dict[str, str]] | None:
        said = messages[-1]["content"]
        if _ANSWER.search(said):
            return None
        query = _SEARCH.search(said)
        if query is None:
            return None
        self.searches += 1
        found = self.search(query.group(1))
        return [{"role": "tool", "content": " ".join(found) if found else "no match"}]

    def score(self, messages: list[dict[str, str]]) -> list[float]:
        said = [m["content"] for m in messages if m["role"] == "assistant"]
        few = 1.0 - min(self.searches, self.max_searches) / self.max_searches
        last = said[-1] if said else ""
        city, country = self.facts[self.row["person"]]
        found = _ANSWER.search(last)
        correct = found is not None and found.group(1).strip(" .").lower() == country.lower()
        return [float(correct), float(city.lower() in last.lower()), few]


def make_env() -> RetrievalEnv:
    """The factory `vpo train --env vpo.env.retrieval:make_env` calls, once per episode."""
    return RetrievalEnv()
