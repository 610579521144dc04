"""The built-in word-level tokenizer of a task (what the tiny policies read): its words, answer
tags and the fixed sentences of its prompt templates, each one token."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from vpo.io.tokenizer import Tokenizer, word_tokenizer
from vpo.tasks import answers as answers_lib
from vpo.tasks.base import Task
from vpo.tasks.prompts import answer_instruction, mutation_text, prompt_text


def common_phrases(texts: Sequence[str], *, min_words: int = 3) -> list[str]:
    """The longest runs of ≥ `min_words` space-separated words, within one line, that occur in
    every one of `texts` (the fixed sentences of a prompt template: legend, goal, instruction),
    left to right through the first text's lines."""
    out: list[str] = []
    for line in texts[0].split("\n"):
        words, i = line.split(" "), 0
        while i < len(words):
            for j in range(len(words), i + min_words - 1, -1):
                phrase = " ".join(words[i:j])
                if phrase.strip() == phrase and all(phrase in t for t in texts):
                    out.append(phrase)
                    i = j
                    break
            else:
                i += 1
    return out


def task_word_tokenizer(task: Task, *, num_problems: int = 64) -> Tokenizer:
    """The built-in word-level tokenizer of a task: every word its prompts, mutation prompts,
    demonstrations and `task.words` can contain, the answer tags as single tokens, and each
    fixed sentence of its prompt templates (`common_phrases`) as one token, so the tiny policy
    reads a prompt as its variable part plus a few template tokens."""
    records = task.make_problems(0, num_problems)
    rng = np.random.default_rng(0)
    tags = answers_lib.tag_strings(task.max_answers)
    tag_re = re.compile("|".join(re.escape(t) for t in tags))

    def split(text: str) -> set[str]:  # as the tokenizer splits: tags first, then whitespace
        return {w for piece in tag_re.split(text) for w in piece.split()}

    words: set[str] = set(task.words) | set(task.symbols or ())
    phrases: dict[str, None] = {}
    for m in range(1, task.max_answers + 1):
        prompts = [prompt_text(task, r, m) for r in records]
        phrases.update(dict.fromkeys(common_phrases(prompts)))
        words |= split(answer_instruction(task, m))
        words |= split(answer_instruction(task, m, better=True))
    mutations = []
    for r in records:
        demos = task.demonstrations(r, rng, 2)
        mutations.append(mutation_text(task, r, [(d, [0.0] * task.num_rewards) for d in demos],
                                       1))
        words |= split(mutations[-1])
        words |= {w for d in demos for w in d.split()}
    for m in range(1, task.max_answers + 1):  # the search mutation prompts' fixed sentences
        texts = [mutation_text(task, r, [], m) for r in records]
        phrases.update(dict.fromkeys(common_phrases(texts)))
    words |= {f"{q / 10:.1f}" for q in range(11)} | {f"{k}:" for k in range(1, 65)}
    words |= {"Answer", "|", "scores:"}
    return word_tokenizer(sorted(words), added=(*tags, *phrases))
