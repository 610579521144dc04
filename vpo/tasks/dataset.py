"""A user's dataset and reward functions as a host-scored task (`vpo train --data --reward`).

    task = make_dataset_task("prompts.jsonl", ["rewards.py:correct", "rewards.py:short"],
                             weights=[0.7, 0.3])

Rows (JSONL, or Parquet through pyarrow) need a `prompt`: text, or a list of chat messages
(`{"role": ..., "content": ...}`) that the checkpoint's chat template renders, ending with a
user message or a tool message (a conversation with tool turns, for the assistant's next turn:
an SFT row per assistant turn warm-starts a tool-using policy). The reward
functions are called as TRL's GRPOTrainer calls them (`vpo.tasks.reward_fns`): by keyword, every
other column by name, and, for a chat prompt, each completion as an assistant message list; an
optional `completion` column (text, or a list of m answer texts) gives SFT demonstrations.

With m = 1 the prompt is sent as written and the whole completion is the answer (as in TRL);
with m > 1 the last user message asks for m answers in `<answer k>` tags and each parsed answer
is one completion for the reward functions. Empty answers and later duplicates of an earlier
answer (same words) are invalid slots: never passed, zero reward, masked.

Reward components are the functions' outputs, in [0, 1]; w* = `weights` normalised to sum 1
(default: equal); solved = w*ᵀr = 1 (full marks on every weighted component), or full marks on
the components named in `solved_by` (`--solved NAMES`: e.g. correctness alone, when a
continuous component such as brevity never reaches 1). A function's None
("does not apply") scores 0 in its component (TRL's nansum); an answer that no function applies
to is unscorable: an invalid slot, like an empty answer.

A held-out split (`vpo compare --data`, `vpo train --eval-fraction`): `split="train"` /
`"eval"` / `"search"` names one part (`split_rows`). The held-out rows are eval_fraction x rows
(rounded half up) drawn by a seeded permutation (`split_seed`), or every row of `eval_path` (a
file of its own, in a seeded order); the training rows are the others, in file order. The last
`search_rows` held-out rows are the search pool, the rest the evaluation rows: no row is in two
parts, and the parts depend on the file, the fraction (or eval file) and the seed only.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from vpo.errors import ConfigError
from vpo.tasks import answers as answers_lib
from vpo.tasks.base import ROW, Record, Task
from vpo.tasks.reward_fns import RewardScorer

ANSWER_HINT = "a complete answer"
LINE = "_line"  # its line in the file (Parquet: row number from 1), for error messages
# The default generation budget per answer of free text (`vpo.launch.rules.completion_budget`):
# what `vpo train`, `sample`, `eval` and `search` generate on your data unless --max-new-tokens /
# sampler.max_new_tokens says otherwise.
ANSWER_TOKENS = 64
MAX_ROW_BYTES = 1 << 20  # a longer line is a mistake (a whole corpus on one line), not a prompt


def short(value: Any, limit: int = 60) -> str:
    """`repr(value)` cut to `limit` characters, for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def read_jsonl(path: str) -> list[tuple[int, Record]]:
    """(line number, JSON object) per non-blank line; a bad line (not UTF-8, not JSON, not an
    object, over `MAX_ROW_BYTES`) is a ConfigError naming the file and line."""
    out: list[tuple[int, Record]] = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if len(raw) > MAX_ROW_BYTES:
                raise ConfigError(f"{path}:{lineno}: the row is {len(raw):,} bytes, over the "
                                  f"{MAX_ROW_BYTES:,}-byte limit of one row; split the file "
                                  "into one JSON object per line")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError(f"{path}:{lineno}: not UTF-8 text (byte "
                                  f"{raw[e.start]:#04x} at column {e.start + 1}); save the file "
                                  "as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{lineno}: not valid JSON ({e.msg}, column "
                                  f"{e.colno})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}:{lineno}: expected a JSON object, got "
                                  f"{type(row).__name__} {short(row)}")
            out.append((lineno, row))
    if not out:
        raise ConfigError(f"{path}: no rows (the file is empty)")
    return out


def read_rows(path: str) -> list[Record]:
    """The rows of a `.jsonl` / `.json` (JSON lines) or `.parquet` file, as dicts."""
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise ConfigError(f"--data: no file {path}")
    if path.lower().endswith((".csv", ".tsv", ".xlsx", ".xls")):
        raise ConfigError(f"--data {path}: reads JSON lines (.jsonl, one object per line) or "
                          "Parquet (.parquet); convert the table, e.g. with pandas: "
                          "pd.read_csv(path).to_json(out, orient='records', lines=True)")
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError(f"--data {path}: reading Parquet needs pyarrow; pip install "
                              "pyarrow (or vpo[data]), or convert the file to JSONL") from None
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # noqa: BLE001  (pyarrow's own error types)
            raise ConfigError(f"--data {path}: not a readable Parquet file "
                              f"({type(e).__name__}: {str(e)[:120]})") from None
        if not rows:
            raise ConfigError(f"{path}: no rows (the table is empty)")
        return [{**row, LINE: i + 1} for i, row in enumerate(rows)]
    return [{**row, LINE: lineno} for lineno, row in read_jsonl(path)]


def _check_prompt(prompt: Any, where: str) -> None:
    if isinstance(prompt, str):
        if prompt.strip():
            return
        raise ConfigError(f"{where}: prompt: is empty; give the prompt text")
    if isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in prompt):
        if prompt[-1]["role"] in ("user", "tool"):
            return
        raise ConfigError(f"{where}: prompt: the last chat message has role "
                          f"{short(prompt[-1]['role'])}; end the prompt with a user message "
                          "(or a tool message: the assistant's turn after a tool call)")
    raise ConfigError(f"{where}: prompt: must be text or a non-empty list of "
                      "{'role': ..., 'content': ...} messages; got "
                      f"{type(prompt).__name__} {short(prompt)}")


def _check_completion(completion: Any, where: str) -> None:
    if completion is None or isinstance(completion, str) or (
            isinstance(completion, list) and completion
            and all(isinstance(t, str) for t in completion)):
        return
    raise ConfigError(f"{where}: completion: must be text or a non-empty list of answer texts; "
                      f"got {type(completion).__name__} {short(completion)}")


def check_rows(rows: Sequence[Record], where: str) -> list[Record]:
    """Each row has a usable `prompt` (and `completion`, when given) and the first row's columns
    (a reward function gets every column for every row: a missing one is not passed as None);
    returns copies carrying their index (`_row`). Errors name `where:line` (the file's line
    when the row has `_line`)."""
    out = []
    first: set[str] = set()
    for i, row in enumerate(rows):
        at = f"{where}:{row[LINE]}" if LINE in row else f"{where}: row {i}"
        if "prompt" not in row:
            columns = ", ".join(k for k in row if k != LINE)
            raise ConfigError(f"{at}: prompt: missing (columns: {columns[:120]}); name "
                              "the prompt column `prompt`")
        _check_prompt(row["prompt"], at)
        _check_completion(row.get("completion"), at)
        columns = set(row) - {LINE}
        if i == 0:
            first = columns
        elif columns != first:
            lacks, extra = sorted(first - columns), sorted(columns - first)
            what = (f"no {', '.join(lacks)} column" if lacks else
                    f"a column the first row lacks: {', '.join(extra)}")
            raise ConfigError(f"{at}: {what[:160]}; give every row the same columns as the "
                              "first (null where a row has no value)")
        out.append({**{k: v for k, v in row.items() if k != LINE}, ROW: i})
    return out


def _weights(weights: Sequence[float] | None, names: Sequence[str]) -> np.ndarray:
    R = len(names)
    if weights is None:
        return np.full((R,), 1.0 / R, np.float32)
    w = np.asarray([float(x) for x in weights], np.float64)
    if w.shape != (R,):
        raise ConfigError(f"--weights: {len(w)} weights for {R} reward components "
                          f"({', '.join(names)}); give one weight per component")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ConfigError(f"--weights: {w.tolist()} must be finite, non-negative and not all "
                          "zero")
    return (w / w.sum()).astype(np.float32)


SPLITS = ("train", "eval", "search")
EVAL_FRACTION = 0.2  # the share of rows `vpo compare --data` holds out unless told otherwise


def split_rows(rows: Sequence[Record], split: str, *, where: str,
               eval_fraction: float = EVAL_FRACTION, split_seed: int = 0,
               eval_rows: Sequence[Record] | None = None, search_rows: int = 0) -> list[Record]:
    """The rows of one part of a dataset (see the module docstring): "train", "eval" (the
    held-out rows that are not the search pool) or "search" (the last `search_rows` held-out
    rows). `eval_rows`: the rows of a held-out file of their own (then every row of `rows`
    trains). A part that would be empty is a ConfigError saying how many rows there are and
    which setting to change; `where` names the file in it."""
    if split not in SPLITS:
        raise ConfigError(f"split: {split!r} is not one of {', '.join(SPLITS)}")
    if eval_rows is None:
        N = len(rows)
        if not 0.0 < eval_fraction < 1.0:
            raise ConfigError(f"--eval-fraction {eval_fraction}: the share of the rows held out "
                              "must be between 0 and 1, e.g. 0.2")
        k = int(eval_fraction * N + 0.5)  # rounded half up
        if k < 1:
            raise ConfigError(f"--data {where}: --eval-fraction {eval_fraction:g} of its {N} "
                              f"rows holds out none; raise it to at least {1 / N:.2g}, or "
                              "pass --eval-data FILE (held-out rows of their own)")
        if k >= N:
            raise ConfigError(f"--data {where}: --eval-fraction {eval_fraction:g} of its {N} "
                              "rows leaves none to train on; lower --eval-fraction")
        order = np.random.default_rng(split_seed).permutation(N)
        held_out = set(order[:k].tolist())
        train = [r for i, r in enumerate(rows) if i not in held_out]
        held = [rows[i] for i in order[:k]]
        source = f"{k} of the {N} rows of {where} (--eval-fraction {eval_fraction:g})"
    else:
        train = list(rows)
        held = [eval_rows[i] for i in np.random.default_rng(split_seed).permutation(
            len(eval_rows))]
        source = f"the {len(held)} rows of --eval-data"
    if split == "train":
        return train
    if not 0 <= search_rows < len(held):
        raise ConfigError(f"{source} are held out: a search pool of {search_rows} of them "
                          "leaves none to evaluate on; lower search_pool or hold out more rows "
                          "(raise --eval-fraction, or pass --eval-data FILE)")
    cut = len(held) - search_rows
    if split == "search" and not search_rows:
        raise ConfigError("split=search: search_rows is 0, so no held-out row is a search row")
    return held[:cut] if split == "eval" else held[cut:]


def make_dataset_task(path: str, rewards: Sequence[str], weights: Sequence[float] | None = None,
                      *, max_answers: int = 8, answer_hint: str = ANSWER_HINT,
                      reward_workers: int = 0, reward_timeout: float | None = None,
                      reward_ranges: dict[str, Sequence[float]] | None = None,
                      name: str | None = None, split: str | None = None,
                      eval_fraction: float | None = None, split_seed: int | None = None,
                      eval_path: str | None = None, search_rows: int = 0,
                      solved_by: Sequence[str] | None = None) -> Task:
    """The task of a dataset file and reward functions (see the module docstring).

    `rewards`: `MODULE:FUNCTION` specs. `reward_workers` > 0 runs the functions in a process
    pool with `reward_timeout` seconds per call. `reward_ranges`: {component: (lo, hi)}, the
    declared scale of components not in [0, 1] (`vpo.tasks.reward_fns`). `split` (with
    `eval_fraction` or `eval_path`, `split_seed`, `search_rows`): one part of the rows
    (`split_rows`); None: every row. `solved_by`: the components that define solved (each at
    full marks); None: every weighted component (w*ᵀr = 1).
    """
    return dataset_tasks(
        path, rewards, weights, splits=(split,), max_answers=max_answers,
        answer_hint=answer_hint, reward_workers=reward_workers, reward_timeout=reward_timeout,
        reward_ranges=reward_ranges, name=name, eval_fraction=eval_fraction,
        split_seed=split_seed, eval_path=eval_path, search_rows=search_rows,
        solved_by=solved_by)[split]


def dataset_tasks(path: str, rewards: Sequence[str], weights: Sequence[float] | None = None,
                  *, splits: Sequence[str | None], max_answers: int = 8,
                  answer_hint: str = ANSWER_HINT, reward_workers: int = 0,
                  reward_timeout: float | None = None,
                  reward_ranges: dict[str, Sequence[float]] | None = None,
                  name: str | None = None, eval_fraction: float | None = None,
                  split_seed: int | None = None, eval_path: str | None = None,
                  search_rows: int = 0, solved_by: Sequence[str] | None = None
                  ) -> dict[str | None, Task]:
    """{split: the task of that part of the rows} (`make_dataset_task`'s arguments), sharing one
    read of the file and one set of loaded reward functions (one worker pool)."""
    rows = check_rows(read_rows(path), path)
    if any(s is not None for s in splits):
        if eval_path is not None and eval_fraction is not None:
            raise ConfigError("--eval-data and --eval-fraction: choose one (the held-out rows "
                              "come from their own file, or are a share of --data's)")
        eval_rows = None
        if eval_path is not None:
            eval_rows = check_rows(read_rows(eval_path), eval_path)
            lacks = sorted(set(rows[0]) ^ set(eval_rows[0]))
            if lacks:
                raise ConfigError(f"--eval-data {eval_path}: its columns differ from --data "
                                  f"{path}'s ({', '.join(lacks)[:120]}); the reward functions "
                                  "get every column, so give both files the same columns")
        parts = {s: split_rows(rows, s, where=path, split_seed=split_seed or 0,
                               eval_fraction=EVAL_FRACTION if eval_fraction is None
                               else eval_fraction, eval_rows=eval_rows,
                               search_rows=search_rows)
                 for s in splits if s is not None}
    elif eval_path is not None or eval_fraction is not None or split_seed is not None \
            or search_rows:
        raise ConfigError("eval_fraction / eval_path / split_seed / search_rows choose a "
                          "held-out split: give split='train', 'eval' or 'search' with them")
    else:
        parts = {}
    base = _dataset_task(path, rows, rewards, weights, max_answers=max_answers,
                         answer_hint=answer_hint, reward_workers=reward_workers,
                         reward_timeout=reward_timeout, reward_ranges=reward_ranges, name=name,
                         solved_by=solved_by)
    return {s: base if s is None else dataclasses.replace(base, make_problems=_first(parts[s]))
            for s in splits}


def _solved_rule(names: Sequence[str], w_R, solved_by: Sequence[str] | None):
    """solved(rewards_R) -> bool: full marks (>= 1 - 1e-6) on each component of `solved_by`, or
    w*ᵀr = 1 (every weighted component at full marks) when it is None; an unknown name is a
    ConfigError listing the components."""
    if solved_by is None:
        return lambda r: jnp.dot(jnp.asarray(r, jnp.float32), jnp.asarray(w_R)) >= 1.0 - 1e-6
    unknown = [s for s in solved_by if s not in names]
    if unknown or not solved_by:
        raise ConfigError(f"--solved {','.join(solved_by)}: "
                          + (f"no component named {', '.join(unknown)}" if unknown else "empty")
                          + f"; the components are {', '.join(names)}")
    idx = np.array([list(names).index(s) for s in solved_by])
    return lambda r: jnp.all(jnp.asarray(r, jnp.float32)[idx] >= 1.0 - 1e-6)


def _first(rows: list[Record]):
    def make_problems(seed: int, num: int) -> list[Record]:
        del seed  # a dataset is a fixed list: the first `num` rows (all, when fewer)
        return rows[:num]

    return make_problems


def _dataset_task(path: str, rows: list[Record], rewards: Sequence[str],
                  weights: Sequence[float] | None, *, max_answers: int, answer_hint: str,
                  reward_workers: int, reward_timeout: float | None,
                  reward_ranges: dict[str, Sequence[float]] | None, name: str | None,
                  solved_by: Sequence[str] | None = None) -> Task:
    """The task of every row of `path` (already read and checked)."""
    scorer = RewardScorer.load(list(rewards), rows[0], workers=reward_workers,
                               timeout=reward_timeout, ranges=reward_ranges)
    names = scorer.names
    w_R = _weights(weights, names)
    solved = _solved_rule(names, w_R, solved_by)
    make_problems = _first(rows)  # in file order

    def score_applies(records, answers, answer_ids=None):
        """(rewards_NMR, valid_NM, applies_NMR: False where a function returned None for a
        valid answer); `answer_ids[n][m]`: slot m's token ids, when the caller has them
        (passed to the functions as `completion_ids`)."""
        N = len(records)
        M = max((len(a) for a in answers), default=0)
        rewards_NMR = np.zeros((N, M, len(names)), np.float32)
        valid_NM = np.zeros((N, M), bool)
        applies_NMR = np.ones((N, M, len(names)), bool)
        flat: list[tuple[int, int]] = []
        for n, slots in enumerate(answers):
            for m, a in enumerate(answers_lib.without_duplicates(
                    [a if a and a.strip() else None for a in slots])):
                if a is not None:
                    flat.append((n, m))
        if flat:
            got, applies = scorer.score(
                [records[n] for n, _ in flat], [answers[n][m].strip() for n, m in flat],
                [records[n][ROW] for n, _ in flat],
                None if answer_ids is None else [answer_ids[n][m] for n, m in flat])
            for (n, m), r, a in zip(flat, got, applies, strict=True):
                rewards_NMR[n, m] = r
                valid_NM[n, m] = a.any()  # no function applies: unscorable
                applies_NMR[n, m] = a | ~a.any()
        return rewards_NMR, valid_NM, applies_NMR

    def score(records, answers, answer_ids=None):
        """(rewards_NMR, valid_NM) of `score_applies`."""
        return score_applies(records, answers, answer_ids)[:2]

    def demonstrations(record: Record, rng, num_answers: int) -> list[str]:
        del rng
        given = record.get("completion")
        if given is None:
            raise ValueError(f"{path}: row {record[ROW]} has no `completion` column; SFT on a "
                             "dataset needs one (text, or a list of m answer texts)")
        texts = [given] if isinstance(given, str) else [str(t) for t in given]
        if len(texts) < num_answers:
            raise ValueError(f"{path}: row {record[ROW]} gives {len(texts)} completion(s) for "
                             f"m = {num_answers} answers; give a list of {num_answers}")
        return texts[:num_answers]

    return Task(
        name=name or os.path.splitext(os.path.basename(path))[0],
        reward_names=names,
        eval_weights_R=w_R,
        make_problems=make_problems,
        statement=lambda record: record["prompt"],
        answer_hint=answer_hint,
        score=score,
        solved=solved,
        demonstrations=demonstrations,
        max_answers=max_answers,
        tagless_single=True,
        score_applies=score_applies,
    )
