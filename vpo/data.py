"""grain pipelines of problems: shuffled per epoch, sharded per process, batched, checkpointable.

A batch is `{"problems": Problems (B rows), "prompt_BP": int32, "prompt_mask_BP": bool}` as numpy;
B is the per-process batch (global batch / process count), this process's contiguous slice of
the global batch. Prompts are computed once for the whole problem set (the task's jnp
`prompt_tokens`, vmapped), so the pipeline only gathers rows.
The iterator's position is `it.get_state()` / `it.set_state(s)` (a small JSON-able dict).
With `mutation_fraction > 0` a share of the rows carry the problem's search mutation prompt
(`mutation_prompt_arrays`: scored weaker parents, "give m better answers") instead of the plain
prompt, so RL keeps training the policy as the mutation operator that `vpo.search` uses; the
reward is the same task reward of the answers for the same problem.
Host tasks may read their problems from JSONL (`load_jsonl_problems`).
"""

from __future__ import annotations

import json
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np

from vpo import _search_ops as search_ops
from vpo import sharding as sharding_lib
from vpo.tasks import vocab as vocab_lib
from vpo.tasks.base import Problem, Task, index_problem


def prompt_arrays(task: Task, problems: Problem, num_answers: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(tokens_NP int32, mask_NP bool) of every problem's prompt (left-padded, P = prompt_len)."""
    task.check_num_answers(num_answers)
    fn = jax.jit(jax.vmap(lambda p: task.prompt_tokens(p, num_answers)))
    tokens = np.asarray(fn(jax.tree.map(np.asarray, problems)), np.int32)
    return tokens, tokens != vocab_lib.PAD


def mutation_prompt_arrays(task: Task, problems: Problem, num_answers: int, num_parents: int,
                           seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One search mutation prompt per problem → (tokens_NP2 int32, mask_NP2 bool), P2 =
    `task.mutation_prompt_len(num_parents)`.

    The parents are `task.mutation_demonstrations`' 1..K weaker variants of reference answers
    (near misses, like the members search selects), scored with the task's in-graph reward as
    search scores candidates (`ans <eos>`); absent slots are dropped from the prompt. Raises if
    the task has no in-graph mutation prompts.
    """
    if task.mutation_demonstrations is None or task.is_host:
        raise ValueError(f"train.mutation_fraction: task {task.name!r} has no in-graph mutation "
                         "prompts; set train.mutation_fraction=0")
    K, A = num_parents, task.answer_len
    rng = np.random.default_rng([seed, 7919])
    n = len(jax.tree.leaves(problems)[0])
    par = np.zeros((n, K, A), np.int32)
    for i in range(n):
        parents, _ = task.mutation_demonstrations(index_problem(problems, i), rng, K,
                                                  num_answers)
        for k, a in enumerate(parents[:K]):
            par[i, k, :len(a)] = a
    pmask = par != vocab_lib.PAD

    @jax.jit
    def build(problems, par, pmask):
        rew_NKR, _ = jax.vmap(lambda p, a, m: search_ops.score_answers(task, p, a, m))(
            problems, par, pmask)
        rew_NKR = jnp.where(pmask.any(-1)[..., None], rew_NKR, 0.0)
        return jax.vmap(lambda p, a, m, r: task.mutation_prompt(p, a, m, r, num_answers))(
            problems, par, pmask, rew_NKR)

    tokens = np.asarray(build(problems, par, pmask), np.int32)
    return tokens, tokens != vocab_lib.PAD


def _left_pad(tokens_NP: np.ndarray, length: int) -> np.ndarray:
    pad = np.full((tokens_NP.shape[0], length - tokens_NP.shape[1]), vocab_lib.PAD, np.int32)
    return np.concatenate([pad, tokens_NP], axis=1)


def problem_dataset(task: Task, batch_size: int, num_answers: int, *, num_problems: int = 4096,
                    seed: int = 0, problems: Problem | None = None,
                    mutation_fraction: float = 0.0, mutation_parents: int = 2
                    ) -> grain.IterDataset:
    """Infinite dataset of batches over `problems` (default `task.make_problems(seed, N)`).

    Problem indices are shuffled by `seed` and reshuffled every epoch, batched into global
    batches of `batch_size`, and each process takes its contiguous slice of every global batch
    (`vpo.sharding.host_local_batch`), so the global batch, and with it every result, does not
    depend on the number of processes. With `mutation_fraction > 0` each row of global batch i
    carries its problem's mutation prompt with probability `mutation_fraction` (coins drawn from
    (seed, i), so a resumed iterator repeats them) and every prompt is left-padded to
    `task.mutation_prompt_len(mutation_parents)`.
    """
    if not 0.0 <= mutation_fraction <= 1.0:
        raise ValueError(f"train.mutation_fraction: {mutation_fraction} must be in [0, 1]")
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
    prompts, _ = prompt_arrays(task, problems, num_answers)
    mutation = None
    if mutation_fraction > 0:
        mutation, _ = mutation_prompt_arrays(task, problems, num_answers, mutation_parents, seed)
        prompts = _left_pad(prompts, mutation.shape[1])

    rows = sharding_lib.host_local_batch(batch_size)

    def gather(i, global_idx):
        idx = np.asarray(global_idx)[rows]
        tokens = prompts[idx]
        if mutation is not None:
            coin = np.random.default_rng([seed, i]).random(batch_size)[rows]
            tokens = np.where((coin < mutation_fraction)[:, None], mutation[idx], tokens)
        return {"problems": jax.tree.map(lambda x: x[idx], problems), "prompt_BP": tokens,
                "prompt_mask_BP": tokens != vocab_lib.PAD}

    ds = grain.MapDataset.range(n).shuffle(seed=seed).repeat(None)
    ds = ds.batch(batch_size, drop_remainder=True).map_with_index(gather)
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
