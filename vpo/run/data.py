"""grain pipelines of problems: shuffled per epoch, sharded per process, batched, checkpointable.

A batch is `{"problems": {"index", "task"} (B rows), "prompt_BP": int32, "prompt_mask_BP": bool}`
as numpy; B is the per-process batch (global batch / process count), this process's contiguous
slice of the global batch. Prompts are encoded once for the whole problem set (the task's text
through the tokenizer and its chat template), so the pipeline only gathers rows; the prompt mask
is carried (the pad id may be an ordinary token).
The iterator's position is `it.get_state()` / `it.set_state(s)` (a small JSON-able dict).
With `mutation_fraction > 0` a share of the rows carry the problem's search mutation prompt
(`mutation_prompt_arrays`: scored weaker parents, "give m better answers") instead of the plain
prompt, so RL keeps training the policy as the mutation operator that `vpo.search.ingraph` uses; the
reward is the same task reward of the answers for the same problem.
Problems are JSON-able records; `load_jsonl_records` reads them from a file.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import grain
import jax
import numpy as np

from vpo.errors import ConfigError
from vpo.model import sharding as sharding_lib
from vpo.tasks.base import Record, Task
from vpo.tasks.bound import BoundTask


def mutation_prompt_arrays(task: BoundTask, records: list[Record], num_answers: int,
                           num_parents: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One search mutation prompt per problem → (tokens_NP2 int32, mask_NP2 bool).

    The parents are the task's `mutation_demonstrations`: 1..K weaker variants of reference
    answers (near misses, like the members search selects), scored by the task as search scores
    candidates; the prompt is `BoundTask.mutation_prompt`, the one the search builds.
    """
    if not task.has_mutation_demonstrations:
        raise ValueError(f"train.mutation_fraction: task {task.name!r} has no in-graph mutation "
                         "prompts; set train.mutation_fraction=0")
    rng = np.random.default_rng([seed, 7919])
    parents = [task.task.mutation_demonstrations(r, rng, num_parents, num_answers)[0]
               for r in records]
    out = task.mutation_prompt_arrays(records, parents, num_answers, num_parents)
    return out["prompt_BP"], out["prompt_mask_BP"]


class PromptTables(NamedTuple):
    """Every problem's prompts, encoded once: plain (and mutation, or None), same length P."""

    prompts_NP: np.ndarray
    mask_NP: np.ndarray
    mutation_NP: np.ndarray | None
    mutation_mask_NP: np.ndarray | None

    @property
    def prompt_len(self) -> int:
        return self.prompts_NP.shape[1]


def prompt_tables(task: BoundTask, records: list[Record], num_answers: int, *,
                  mutation_fraction: float = 0.0, mutation_parents: int = 2, seed: int = 0
                  ) -> PromptTables:
    """The prompt tables of `problem_dataset` (mutation prompts only when mutation_fraction >
    0); both kinds left-padded to the longer length."""
    if not 0.0 <= mutation_fraction <= 1.0:
        raise ValueError(f"train.mutation_fraction: {mutation_fraction} must be in [0, 1]")
    prompts, pmask = task.prompt_arrays(records, num_answers)
    if mutation_fraction == 0:
        return PromptTables(prompts, pmask, None, None)
    mutation, mmask = mutation_prompt_arrays(task, records, num_answers, mutation_parents, seed)
    P = max(prompts.shape[1], mutation.shape[1])
    pad = task.tokenizer.pad_id
    return PromptTables(*_left_pad(prompts, pmask, P, pad), *_left_pad(mutation, mmask, P, pad))


def problem_dataset(task: BoundTask, batch_size: int, num_answers: int, *,
                    num_problems: int = 4096, seed: int = 0, records: list[Record] | None = None,
                    mutation_fraction: float = 0.0, mutation_parents: int = 2,
                    tables: PromptTables | None = None) -> grain.IterDataset:
    """Infinite dataset of batches over `records` (default `task.make_problems(seed, N)`).

    Problem indices are shuffled by `seed` and reshuffled every epoch, batched into global
    batches of `batch_size`, and each process takes its contiguous slice of every global batch
    (`vpo.model.sharding.host_local_batch`), so the global batch, and with it every result, does not
    depend on the number of processes. With `mutation_fraction > 0` each row of global batch i
    carries its problem's mutation prompt with probability `mutation_fraction` (coins drawn from
    (seed, i), so a resumed iterator repeats them) and every prompt is left-padded to
    the longer of the two lengths.
    The batch's "problems" are `task.problem_arrays` rows ("index" into `records`, and the
    in-graph task arrays). `tables`: `prompt_tables(...)` of the same arguments, if already
    computed.
    """
    n_proc = jax.process_count()
    if batch_size % n_proc:
        raise ValueError(f"train.batch_size: {batch_size} must be divisible by the "
                         f"{n_proc} processes")
    if records is None:
        records = task.make_problems(seed, num_problems)
    n = len(records)
    if n == 0:
        raise ValueError("the problem set is empty; give at least one problem")
    notice = few_rows_notice(n, batch_size)
    if notice:
        print(notice, file=sys.stderr, flush=True)
    problems = task.problem_arrays(records)
    if tables is None:
        tables = prompt_tables(task, records, num_answers, mutation_fraction=mutation_fraction,
                               mutation_parents=mutation_parents, seed=seed)
    prompts, pmask, mutation, mmask = tables

    rows = sharding_lib.host_local_batch(batch_size)

    def gather(i, global_idx):
        idx = np.asarray(global_idx)[rows]
        tokens, mask = prompts[idx], pmask[idx]
        if mutation is not None:
            coin = np.random.default_rng([seed, i]).random(batch_size)[rows]
            use = (coin < mutation_fraction)[:, None]
            tokens = np.where(use, mutation[idx], tokens)
            mask = np.where(use, mmask[idx], mask)
        return {"problems": jax.tree.map(lambda x: x[idx], problems), "prompt_BP": tokens,
                "prompt_mask_BP": mask}

    ds = grain.MapDataset.range(n).shuffle(seed=seed).repeat(None)
    ds = ds.batch(batch_size, drop_remainder=True).map_with_index(gather)
    return ds.to_iter_dataset()


def few_rows_notice(num_rows: int, batch_size: int) -> str | None:
    """The one-line notice of a problem set smaller than a batch (each batch then holds every
    row about batch_size / num_rows times), or None."""
    if num_rows >= batch_size:
        return None
    return (f"notice: {num_rows} problem row(s) for a batch of {batch_size} prompts: every batch "
            f"draws each row about {batch_size / num_rows:.3g} times; give more rows, or set "
            f"train.batch_size to {num_rows} or fewer to draw each once per batch")


def _left_pad(tokens_NP, mask_NP, length: int, pad_id: int):
    extra = length - tokens_NP.shape[1]
    return (np.pad(tokens_NP, ((0, 0), (extra, 0)), constant_values=pad_id),
            np.pad(mask_NP, ((0, 0), (extra, 0))))


def problem_iterator(task: BoundTask, batch_size: int, num_answers: int, **kwargs):
    """`iter(problem_dataset(...))`: a grain DatasetIterator with get_state / set_state."""
    return iter(problem_dataset(task, batch_size, num_answers, **kwargs))


def load_jsonl_records(path: str, task: BoundTask | Task | None = None) -> list[Record]:
    """Problem records from a JSONL file (one JSON object per line, blank lines skipped); a
    malformed line raises a ValueError naming the file and line. With `task`, every record is
    also read as the task reads it (its statement, and its arrays for in-graph tasks), so a
    record with a missing or ill-typed field fails here, at its line, not mid-run: each field
    must have the type of the task's own generated problems (an int is not a float or a
    bool), ints must fit int32 and stay >= 0 where the task's own are; an in-graph task's arrays
    must have the shapes its own problems give (a maze grid of the task's size), and with a
    `BoundTask` every word of the statement must be one its tokenizer can write (the word-level
    tokenizer of a model preset knows the task's own words only: no silent `<unk>`)."""
    from vpo.tasks.dataset import read_jsonl

    try:
        lines = read_jsonl(path)
    except ConfigError as e:
        raise ConfigError(str(e).replace("no rows", "no problems")) from None
    if task is not None:
        base = task.task if isinstance(task, BoundTask) else task
        templates = base.make_problems(0, 16)
        shapes = _array_shapes(base, templates[:1])
        for lineno, row in lines:
            for key, value in row.items():
                like = [t[key] for t in templates if key in t]
                if like:
                    _check_like(value, like, f"{path}:{lineno}: {key}")
            _check_record(task, row, f"{path}:{lineno}", shapes)
    return [row for _, row in lines]


def _kind(value) -> str:
    return {bool: "bool", int: "int", float: "float", str: "text", list: "list",
            dict: "object", type(None): "null"}.get(type(value), type(value).__name__)


def _check_like(value, like: list, where: str) -> None:
    """`value` has the JSON type of the task's own values `like` (recursively through lists and
    objects), ints in int32 and non-negative where all of `like` are; else a ConfigError
    naming `where` (file:line: field) with the value cut short."""
    from vpo.tasks.dataset import short

    kinds = {_kind(v) for v in like}
    kind = _kind(value)
    if kind not in kinds and not (kind == "int" and "float" in kinds):
        raise ConfigError(f"{where}: expected {' or '.join(sorted(kinds))} (as the task's own "
                          f"problems have), got {kind} {short(value)}")
    if kind == "int":
        lo = 0 if all(v >= 0 for v in like if _kind(v) == "int") else -2**31
        if not lo <= value < 2**31:
            raise ConfigError(f"{where}: {short(value)} is out of range; expected an integer in "
                              f"[{lo}, 2**31)")
    elif kind == "list":
        items = [x for v in like if isinstance(v, list) for x in v]
        if items:
            for i, x in enumerate(value):
                _check_like(x, items, f"{where}[{i}]")
    elif kind == "object":
        for k, x in value.items():
            sub = [v[k] for v in like if isinstance(v, dict) and k in v]
            if sub:
                _check_like(x, sub, f"{where}.{k}")


def _check_record(task: BoundTask | Task, record: Record, where: str,
                  shapes: list[tuple[str, tuple]] | None = None) -> None:
    """Read `record` as `task` does (statement; arrays of in-graph tasks, of the `shapes` its
    own problems have); with a `BoundTask`, its statement's words must be ones the tokenizer
    writes. Any failure is a ConfigError naming `where` and the task."""
    base = task.task if isinstance(task, BoundTask) else task
    try:
        statement = base.statement(record)
        got = _array_shapes(base, [record])
    except KeyError as e:
        raise ConfigError(f"{where}: {base.name} cannot read this problem: missing field "
                         f"{e.args[0]!r}") from None
    except Exception as e:  # noqa: BLE001  (the task's own error, reported at the line)
        raise ConfigError(f"{where}: {base.name} cannot read this problem: "
                         f"{type(e).__name__}: {e}") from None
    for (name, shape), (_, want) in zip(got or (), shapes or (), strict=False):
        if shape != want:
            raise ConfigError(f"{where}: {base.name} reads this problem's {name.lstrip('.')} "
                              f"with shape {shape}, its own problems' with {want}; a run stacks "
                              "every problem into one array: give problems of the task's size, "
                              "or build the task for this one (task_kwargs, e.g. size)")
    if isinstance(task, BoundTask):
        unknown = unwritable_words(task.tokenizer, _text_of(statement))
        if unknown:
            raise ConfigError(f"{where}: {base.name}: {', '.join(map(repr, unknown[:5]))} "
                              f"{'is' if len(unknown) == 1 else 'are'} not in the tokenizer's "
                              f"vocabulary ({_vocabulary_hint(base)}) and would reach the model as "
                              "<unk>; keep the problem within the task's range, or read it with "
                              "a pretrained checkpoint's tokenizer (model=smollm2, model=hf:PATH)")


def _array_shapes(base: Task, records: list[Record]) -> list[tuple[str, tuple]] | None:
    """(leaf path, per-problem shape) of the task's arrays of `records`; None for a host task."""
    if base.arrays is None:
        return None
    leaves = jax.tree_util.tree_leaves_with_path(base.arrays(records))
    return [(jax.tree_util.keystr(path), tuple(np.shape(x))[1:]) for path, x in leaves]


def _text_of(statement) -> str:
    """A statement's text: the string, or its messages' contents one per line."""
    if isinstance(statement, str):
        return statement
    return "\n".join(str(m.get("content", "")) for m in statement)


def unwritable_words(tokenizer, text: str) -> list[str]:
    """The distinct pieces of `text` the tokenizer encodes as its unknown token (a word-level
    vocabulary; a byte-level BPE writes any text, so none)."""
    unk = tokenizer.special_tokens.get("unk_token")
    unk_id = tokenizer.backend.token_to_id(unk) if unk else None
    if unk_id is None:
        return []
    enc = tokenizer.backend.encode(text, add_special_tokens=False)
    return list(dict.fromkeys(text[a:b] for i, (a, b) in zip(enc.ids, enc.offsets, strict=True)
                              if i == unk_id and text[a:b] != unk))


def _vocabulary_hint(base: Task) -> str:
    """What the task's word-level vocabulary holds, e.g. "its numbers are 0..99"."""
    numbers = sorted(int(w) for w in base.words if w.isdigit())
    if numbers:
        return f"the task's own words; its numbers are {numbers[0]}..{numbers[-1]}"
    return "the task's own words"
