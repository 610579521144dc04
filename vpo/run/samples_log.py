"""What the model writes: a few prompts, completions and their reward vectors every n steps, to
`samples.jsonl` (one object per completion) and TensorBoard text (tab "samples").

    {"step": 10, "prompt": "...", "completion": "...", "answers": ["U R", null],
     "rewards": [[1.0, 0.5, ...], [0, 0, ...]], "valid": [true, false], "score": 0.81}

`score` is the best valid answer's w*ᵀr (0 without one), the number GRPO trains on.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from vpo.tasks.bound import BoundTask

JSONL = "samples.jsonl"


def _first_row(x) -> np.ndarray:
    """Row 0 of this process's part of a batch-sharded array, on the host. Multi-process, the
    global array is not addressable here: the process logs the first prompt it holds."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        shard = min(x.addressable_shards, key=lambda s: s.index[0].start or 0)
        return np.asarray(shard.data)[0]
    return np.asarray(x[0])


def sample_rows(task: BoundTask, records, batch, rollout, num_answers: int, *,
                rewards=None, max_rows: int = 4) -> list[dict[str, Any]]:
    """The first prompt of `batch` (of this process's part of it) and up to `max_rows` of its G
    completions with their rewards, as JSON-able rows. `rewards`: the step's (rewards_BGMR,
    solution_mask_BGM) when the loop has them (host rewards: the user's functions are not called
    twice); else scored here by `task.host_score`, which equals the in-graph reward."""
    tokens_GT = _first_row(rollout.tokens_BGT)[:max_rows]
    mask_GT = _first_row(rollout.mask_BGT)[:max_rows]
    prompt = _first_row(batch["prompt_BP"])[_first_row(batch["prompt_mask_BP"])]
    record = records[int(_first_row(batch["problems"]["index"]))]
    G = tokens_GT.shape[0]
    if rewards is None:
        rewards_GMR, valid_GM = task.host_score([record] * G, tokens_GT, mask_GT, num_answers)
    else:
        rewards_GMR = _first_row(rewards[0])[:max_rows]
        valid_GM = _first_row(rewards[1])[:max_rows]
    texts = task.completion_texts(tokens_GT, mask_GT)
    prompt_text = task.tokenizer.decode(prompt.tolist(), skip_special_tokens=False)
    rows = []
    for g in range(G):
        parsed = task.parse_text(texts[g], num_answers)
        scores_M = rewards_GMR[g] @ task.eval_weights_R
        rows.append({
            "prompt": prompt_text, "completion": texts[g],
            "answers": [a if v else None for a, v in zip(parsed, valid_GM[g], strict=True)],
            "rewards": np.round(rewards_GMR[g], 4).tolist(), "valid": valid_GM[g].tolist(),
            "score": float(np.max(np.where(valid_GM[g], scores_M, 0.0)))})
    return rows


def one_line(row: dict[str, Any], width: int = 160) -> str:
    """A row as one line for the terminal (under the progress bar)."""
    text = " ".join(row["completion"].split())
    if len(text) > width:
        text = text[:width - 3] + "..."
    return f"score {row['score']:.2f} | {text}"


class SampleLog:
    """Appends rows to `out_dir/samples.jsonl` and TensorBoard text (process 0 only);
    `resume_from=k` drops rows of steps > k left by an interrupted run."""

    def __init__(self, out_dir: str, *, resume_from: int | None = None,
                 tensorboard: bool = True):
        self.active = jax.process_index() == 0
        self._tb = None
        if not self.active:
            return
        path = os.path.join(out_dir, JSONL)
        if resume_from is not None and os.path.exists(path):
            with open(path) as f:
                keep = [ln for ln in f if ln.strip() and ln.endswith("\n")
                        and json.loads(ln)["step"] <= resume_from]
            with open(path, "w") as f:
                f.writelines(keep)
        elif resume_from is None and os.path.exists(path):
            os.remove(path)
        self._file = open(path, "a")  # noqa: SIM115  (open for the run; close() closes)
        if tensorboard:
            from vpo.run.metrics_log import TensorBoardEvents

            self._tb = TensorBoardEvents(os.path.join(out_dir, "tb"), filename_suffix=".samples")

    def write(self, step: int, rows: list[dict[str, Any]]) -> None:
        if not self.active:
            return
        for row in rows:
            self._file.write(json.dumps({"step": int(step), **row}) + "\n")
        self._file.flush()
        if self._tb is not None and rows:
            md = [f"**prompt**\n\n```\n{rows[0]['prompt']}\n```"]
            md += [f"**completion {i}** (score {r['score']:.3f}, rewards {r['rewards']})\n\n"
                   f"```\n{r['completion']}\n```" for i, r in enumerate(rows)]
            self._tb.add_text("samples", "\n\n".join(md), step)
            self._tb.flush()

    def close(self) -> None:
        if self.active:
            self._file.close()
            if self._tb is not None:
                self._tb.close()


def write_samples(step: int, rows, samples: SampleLog, logger, bar) -> None:
    """Sample rows to samples.jsonl and the metrics logger (`MetricsLogger.log_samples`); the
    first on the progress bar (`bar`, None: not shown) of process 0."""
    samples.write(step, rows)
    logger.log_samples(step, rows)
    if rows and bar is not None and jax.process_index() == 0:
        bar.write(f"step {step}: {one_line(rows[0])}")
