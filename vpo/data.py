"""grain pipelines of problems: shuffled per epoch, sharded per process, batched, checkpointable.

A batch is `{"problems": Problems (B rows), "prompt_BP": int32, "prompt_mask_BP": bool}` as numpy;
B is the per-process batch (global batch / process count), this process's contiguous slice of
the global batch. Prompts are computed once for the whole problem set (the task's jnp
`prompt_tokens`, vmapped), so the pipeline only gathers rows.
The iterator's position is `it.get_state()` / `it.set_state(s)` (a small JSON-able dict).
Host tasks may read their problems from JSONL (`load_jsonl_problems`).
"""

from __future__ import annotations

import json
from typing import Any

import grain
import jax
import numpy as np

from vpo import sharding as sharding_lib
from vpo.tasks import vocab as vocab_lib
from vpo.tasks.base import Problem, Task


def prompt_arrays(task: Task, problems: Problem, num_answers: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(tokens_NP int32, mask_NP bool) of every problem's prompt (left-padded, P = prompt_len)."""
    task.check_num_answers(num_answers)
    fn = jax.jit(jax.vmap(lambda p: task.prompt_tokens(p, num_answers)))
    tokens = np.asarray(fn(jax.tree.map(np.asarray, problems)), np.int32)
    return tokens, tokens != vocab_lib.PAD


def problem_dataset(task: Task, batch_size: int, num_answers: int, *, num_problems: int = 4096,
                    seed: int = 0, problems: Problem | None = None) -> grain.IterDataset:
    """Infinite dataset of batches over `problems` (default `task.make_problems(seed, N)`).

    Problem indices are shuffled by `seed` and reshuffled every epoch, batched into global
    batches of `batch_size`, and each process takes its contiguous slice of every global batch
    (`vpo.sharding.host_local_batch`), so the global batch, and with it every result, does not
    depend on the number of processes.
    """
    n_proc = jax.process_count()
    if batch_size % n_proc:
        raise ValueError(f"train.batch_size: {batch_size} must be divisible by the "
                         f"{n_proc} processes")
    if problems is None:
        problems = task.make_problems(seed, num_problems)
    problems = jax.tree.map(np.asarray, problems)
    n = len(jax.tree.leaves(problems)[0])
    if n == 0:
        raise ValueError("the problem set is empty; give at least one problem")
    prompts, mask = prompt_arrays(task, problems, num_answers)

    rows = sharding_lib.host_local_batch(batch_size)

    def gather(global_idx):
        idx = np.asarray(global_idx)[rows]
        return {"problems": jax.tree.map(lambda x: x[idx], problems), "prompt_BP": prompts[idx],
                "prompt_mask_BP": mask[idx]}

    ds = grain.MapDataset.range(n).shuffle(seed=seed).repeat(None)
    ds = ds.batch(batch_size, drop_remainder=True).map(gather)
    return ds.to_iter_dataset()


def problem_iterator(task: Task, batch_size: int, num_answers: int, **kwargs):
    """`iter(problem_dataset(...))`: a grain DatasetIterator with get_state / set_state."""
    return iter(problem_dataset(task, batch_size, num_answers, **kwargs))


def load_jsonl_problems(path: str, task: Task) -> Problem:
    """Problems from a JSONL file: one object per line with one key per field of the task's
    Problems tuple (e.g. arithmetic: {"numbers": [3, 4, 5], "target": 35}).

    Raises ValueError naming the file, line and field on a malformed row.
    """
    template = task.make_problems(0, 1)
    fields = type(template)._fields
    columns: dict[str, list[Any]] = {f: [] for f in fields}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object with fields {list(fields)}")
            for field in fields:
                ref = np.asarray(getattr(template, field))
                if field not in row:
                    raise ValueError(f"{where}: missing field {field!r} (expected {list(fields)})")
                try:
                    value = np.asarray(row[field], dtype=ref.dtype)
                except (TypeError, ValueError):
                    raise ValueError(f"{where}: field {field!r} = {row[field]!r} is not "
                                     f"convertible to {ref.dtype}") from None
                if value.shape != ref.shape[1:]:
                    raise ValueError(f"{where}: field {field!r} has shape {value.shape}; "
                                     f"expected {ref.shape[1:]}")
                columns[field].append(value)
    if not columns[fields[0]]:
        raise ValueError(f"{path}: no problems (the file is empty)")
    return type(template)(*(np.stack(columns[f]) for f in fields))
