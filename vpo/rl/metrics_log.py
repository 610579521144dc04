"""Scalar metrics to JSONL (one object per step) and TensorBoard, fetched one step late.

`log(step, metrics)` keeps this step's metrics (device arrays, still being computed) and writes
the previous step's, whose values are ready by the time the next step has been dispatched: the
host never waits on the device just to log. `close()` writes the last one.

Every row gets `step_time_s`: wall time between the moments two logged steps' metrics became
ready, per step (the device runs steps back to back, so in steady state this is the step's
time; the first row after start-up includes compilation), and `tokens_per_s` =
`generated_tokens` / `step_time_s` when the step reports `generated_tokens`.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import jax
import numpy as np

JSONL = "metrics.jsonl"


def _scalar(x) -> float | int:
    a = np.asarray(x)
    v = a.item() if a.size == 1 else float(a.mean())
    return v if isinstance(v, int) or math.isfinite(v) else float(v)


def read_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl. A torn final line (what a kill mid-write leaves) is dropped;
    any other unreadable line is a `CheckpointError` naming file:line."""
    from vpo.errors import CheckpointError

    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    last = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
    rows = []
    for i, raw in enumerate(lines[:last + 1]):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError("not an object with an integer `step`")
        except ValueError as e:
            if i == last:
                break  # torn by a kill: the step is logged again when it is re-run
            raise CheckpointError(f"{path}:{i + 1}: not a metrics row ({e}; starts "
                                  f"{raw[:60]!r}); delete or fix the line, then resume") from None
        rows.append(row)
    return rows


class MetricsLogger:
    """Writes `out_dir/metrics.jsonl` and TensorBoard events under `out_dir/tb` (process 0 only).

    `resume_from=k` drops JSONL lines of steps > k left by an interrupted run, so a resumed run's
    file reads as one uninterrupted run.
    """

    def __init__(self, out_dir: str, *, resume_from: int | None = None, tensorboard: bool = True,
                 every: int = 1):
        self.active = jax.process_index() == 0
        self.every = every
        self.path = os.path.join(out_dir, JSONL)
        self._pending: tuple[int, Any, dict[str, float]] | None = None
        self._ready = (resume_from or 0, time.perf_counter())  # (step, time) last seen ready
        self.history: list[dict[str, Any]] = []
        self._tb = None
        if not self.active:
            return
        os.makedirs(out_dir, exist_ok=True)
        if resume_from is not None and os.path.exists(self.path):
            keep = [json.dumps(row) + "\n" for row in read_rows(self.path)
                    if row["step"] <= resume_from]
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                f.writelines(keep)
            os.replace(tmp, self.path)
        elif resume_from is None and os.path.exists(self.path):
            os.remove(self.path)
        self._file = open(self.path, "a")  # noqa: SIM115  (open for the run; close() closes)
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(out_dir, "tb"))

    def log(self, step: int, metrics: dict[str, Any], host: dict[str, float] | None = None
            ) -> dict[str, Any] | None:
        """Queue `metrics` of `step` (and host-measured scalars `host`, which override the
        derived ones); write and return the previously queued step's row (or None)."""
        done = self.flush()
        if step % self.every == 0:
            self._pending = (step, metrics, host or {})
        return done

    def flush(self) -> dict[str, Any] | None:
        """Write the queued step's row now (waits for its values); None if nothing is queued."""
        if self._pending is None:
            return None
        step, metrics, host = self._pending
        self._pending = None
        row = {"step": int(step)}
        row.update({k: _scalar(v) for k, v in jax.device_get(metrics).items()})
        now = time.perf_counter()
        last_step, last_time = self._ready
        self._ready = (step, now)
        row["step_time_s"] = (now - last_time) / max(step - last_step, 1)
        row.update(host)
        if "generated_tokens" in row:
            row["tokens_per_s"] = row["generated_tokens"] / max(row["step_time_s"], 1e-9)
        self.history.append(row)
        if self.active:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
            if self._tb is not None:
                for k, v in row.items():
                    if k != "step":
                        self._tb.add_scalar(k, v, step)
        return row

    def close(self) -> None:
        self.flush()
        if self.active:
            self._file.close()
            if self._tb is not None:
                self._tb.close()
