"""A format warm start without demonstrations: the model's own single answers, joined into the
m-answer format.

A pretrained chat model answers a single-answer prompt in its own words, but rarely writes the
`<answer 1> ... </answer 1>` tags of an m-answer set (VPO's and Multi-RLVR's format), so on data
without a `completion` column such an arm would train without a reward. `self_demonstrations`
samples single answers to the training prompts from the model itself, keeps the complete ones
(ended with a stop token) that parse and that a reward function applies to, drops repeats, and
gives each row its first m distinct valid answers; `with_demonstrations` makes the training
task demonstrate those (m = 1: the first answer alone), so the SFT teaches the format and
nothing the model did not already say. Rows without m distinct valid answers are left out of
the warm start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from vpo.config import SamplerConfig
from vpo.rollout.slots import sample
from vpo.tasks import answers as answers_lib
from vpo.tasks.base import ROW  # the record's index in the file
from vpo.tasks.bound import BoundTask


def self_demonstrations(model, task: BoundTask, records: Sequence[Mapping[str, Any]], *,
                        num_answers: int, samples: int, key, temperature: float = 1.0,
                        chunk: int = 16) -> dict[int, list[str]]:
    """{row id: the first `num_answers` distinct valid single answers of `model`} for each
    record with that many among `samples` single-answer generations at `temperature`.

    Valid: the generation ended with a stop token within the task's budget (a cut-off answer
    is not a complete one), the slot parses (m = 1: the whole stripped text) and some reward
    function applies (`Task.score`'s valid); distinct: `answers.without_duplicates` (same
    words = repeat)."""
    tok = task.tokenizer
    T = task.completion_len(1)
    cfg = SamplerConfig(max_new_tokens=T, num_samples=samples, temperature=temperature)
    out: dict[int, list[str]] = {}
    for i, start in enumerate(range(0, len(records), chunk)):
        rows = list(records[start:start + chunk])
        prompts, pmask = task.prompt_arrays(rows, 1)
        r = sample(model, prompts, pmask, jax.random.fold_in(key, i), cfg,
                   stop_ids=tok.stop_ids, pad_id=tok.pad_id)
        tokens_BGT, mask_BGT = np.asarray(r.tokens_BGT), np.asarray(r.mask_BGT)
        B, G, L = tokens_BGT.shape
        texts = task.completion_texts(tokens_BGT.reshape(B * G, L), mask_BGT.reshape(B * G, L))
        slots = [task.parse_text(t, 1)[0] for t in texts]
        _, valid = task.task.score([rows[n // G] for n in range(B * G)], [[a] for a in slots])
        # an answer the token budget cut off is no demonstration of a complete answer
        valid = np.asarray(valid, bool).reshape(B, G) & np.asarray(r.finished_BG, bool)
        for b, row in enumerate(rows):
            kept = [slots[b * G + g] for g in range(G) if valid[b, g]]
            distinct = [a.strip() for a in answers_lib.without_duplicates(kept) if a]
            if len(distinct) >= num_answers:
                out[int(row[ROW])] = distinct[:num_answers]
    return out


def with_demonstrations(task: BoundTask, demos: Mapping[int, list[str]]) -> BoundTask:
    """`task` restricted to the rows of `demos` (in its own order), demonstrating them: m
    answers → the row's first m texts."""
    keep = [r for r in task.make_problems(0, 1 << 62) if int(r[ROW]) in demos]

    def make_problems(seed: int, num: int):
        del seed  # a fixed list, as the dataset's own
        return keep[:num]

    def demonstrations(record, rng, num_answers: int) -> list[str]:
        del rng
        texts = demos[int(record[ROW])]
        if len(texts) < num_answers:
            raise ValueError(f"row {record[ROW]}: {len(texts)} self-demonstrations for "
                             f"m = {num_answers}")
        return texts[:num_answers]

    inner = dataclasses.replace(task.task, make_problems=make_problems,
                                demonstrations=demonstrations)
    return dataclasses.replace(task, task=inner)
