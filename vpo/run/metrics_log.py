"""Scalar metrics to JSONL (one object per step), TensorBoard and W&B, fetched one step late.

`log(step, metrics)` keeps this step's metrics (device arrays, still being computed) and writes
the previous step's, whose values are ready by the time the next step has been dispatched: the
host never waits on the device just to log. `close()` writes the last one.

Every row gets `step_time_s`: wall time between the moments two logged steps' metrics became
ready, per step (the device runs steps back to back, so in steady state this is the step's
time; the first row after start-up includes compilation), and `tokens_per_s` =
`generated_tokens` / `step_time_s` when the step reports `generated_tokens`.

`report_to` (TRL's `report_to`: "tensorboard", "wandb", "all", "none" or a comma list) picks the
sinks beside the JSONL file, which is always written. W&B (`pip install 'vpo[wandb]'`) gets the
same rows, the run config at init and the sample log's rows as tables; its run folder is
`<out>/wandb` (`WANDB_MODE=offline` writes it without network; `wandb sync` uploads it later).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

JSONL = "metrics.jsonl"
REPORT_TO = ("tensorboard", "wandb")


def parse_report_to(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """The sinks `value` names ("tensorboard", "wandb", "all", "none", or a comma list or
    sequence of them; None: tensorboard); anything else is a `ConfigError`. A missing wandb
    package is one too, naming its install command: checked here, before a run allocates."""
    import importlib.util

    from vpo.config import ConfigError

    if value is None:
        return ("tensorboard",)
    parts = value.split(",") if isinstance(value, str) else list(value)
    names = [p.strip().lower() for p in parts if p.strip()]
    bad = [n for n in names if n not in (*REPORT_TO, "all", "none")]
    if bad:
        raise ConfigError(f"--report-to: unknown {', '.join(map(repr, bad))}; give "
                          "tensorboard, wandb, all or none (or a comma list)")
    out = tuple(n for n in REPORT_TO if n in names or "all" in names)
    if "wandb" in out and importlib.util.find_spec("wandb") is None:
        raise ConfigError("--report-to wandb: the wandb package is not installed; "
                          "pip install 'vpo[wandb]' (or drop wandb from --report-to)")
    return out


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


class TensorBoardEvents:
    """A TensorBoard event file under `logdir`, written in the caller's thread: `add_scalar`,
    `add_text`, `flush`, `close`. (tensorboardX's `SummaryWriter` writes from a thread of its
    own through a queue of 10 events: when that thread dies on a full disk, the next writes
    wait forever. Here a failed write raises where it happens.)"""

    def __init__(self, logdir: str, filename_suffix: str = ""):
        from tensorboardX.event_file_writer import EventsWriter

        os.makedirs(logdir, exist_ok=True)
        self._writer = EventsWriter(os.path.join(logdir, "events"), filename_suffix)
        self._closed = False

    def _add(self, summary, step: int) -> None:
        from tensorboardX.proto import event_pb2

        self._writer.write_event(event_pb2.Event(summary=summary, step=int(step),
                                                 wall_time=time.time()))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboardX.summary import scalar

        self._add(scalar(tag, float(value)), step)

    def add_text(self, tag: str, text: str, step: int) -> None:
        from tensorboardX.summary import text as text_summary

        self._add(text_summary(tag, text), step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the file (once; a second call does nothing). A flush that fails (a
        full disk) still closes it, then raises."""
        if self._closed:
            return
        self._closed = True
        try:
            self._writer.close()
        except OSError:
            record = getattr(self._writer, "_py_recordio_writer", None)
            file = getattr(record, "_writer", None)
            if file is not None:
                with contextlib.suppress(OSError):
                    file.close()  # its buffer is lost with the disk; the file is closed
            raise


class _Wandb:
    """A W&B run in `out_dir/wandb`: scalar rows and sample tables at their steps."""

    def __init__(self, out_dir: str, config: dict[str, Any] | None):
        import wandb

        name = None if os.environ.get("WANDB_NAME") else os.path.basename(out_dir)
        try:
            self.run = wandb.init(dir=out_dir, config=config, name=name,
                                  project=os.environ.get("WANDB_PROJECT", "vpo"))
        except Exception as e:  # noqa: BLE001 -- not logged in, no network, a bad setting
            from vpo.config import ConfigError

            raise ConfigError(f"--report-to wandb: wandb.init failed ({e}); run `wandb login`, "
                              "or set WANDB_MODE=offline and `wandb sync` the run later") from e
        self.step = 0  # the last step logged: W&B drops a step below it

    def log(self, step: int, data: dict[str, Any]) -> None:
        self.step = max(step, self.step)
        self.run.log(data, step=self.step)

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        import wandb

        cols = ["step", "prompt", "completion", "score", "rewards"]
        table = wandb.Table(columns=cols, data=[
            [step, r.get("prompt", ""), r.get("completion", ""), r.get("score"),
             json.dumps(r.get("rewards"))] for r in rows])
        self.log(step, {"samples": table})

    def close(self) -> None:
        self.run.finish()


class MetricsLogger:
    """Writes `out_dir/metrics.jsonl`, and TensorBoard events under `out_dir/tb` and a W&B run
    under `out_dir/wandb` as `report_to` says (`parse_report_to`; process 0 only).

    `resume_from=k` drops JSONL lines of steps > k left by an interrupted run, so a resumed run's
    file reads as one uninterrupted run. `config`: the run config W&B records. `watch` (e.g.
    `vpo.run.watch.RunWatch.check`) reads each row and returns warnings, printed to stderr and
    kept in `warnings`.
    """

    def __init__(self, out_dir: str, *, resume_from: int | None = None, tensorboard: bool = True,
                 every: int = 1, report_to: str | Sequence[str] | None = None,
                 config: dict[str, Any] | None = None,
                 watch: Callable[[dict[str, Any]], list[str]] | None = None):
        self.active = jax.process_index() == 0
        self.every = every
        self.path = os.path.join(out_dir, JSONL)
        self._pending: tuple[int, Any, dict[str, float]] | None = None
        self._ready = (resume_from or 0, time.perf_counter())  # (step, time) last seen ready
        self.history: list[dict[str, Any]] = []
        self.warnings: list[str] = []
        self.watch = watch
        sinks = parse_report_to(report_to) if report_to is not None else (
            ("tensorboard",) if tensorboard else ())
        self.tensorboard = "tensorboard" in sinks
        self._tb = self._wandb = None
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
        if self.tensorboard:
            self._tb = TensorBoardEvents(os.path.join(out_dir, "tb"))
        if "wandb" in sinks:
            self._wandb = _Wandb(out_dir, config)

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
            if self._wandb is not None:
                self._wandb.log(step, {k: v for k, v in row.items() if k != "step"})
        for msg in self.watch(row) if self.watch is not None else ():
            self.warnings.append(msg)
            if self.active:
                import tqdm  # beside a progress bar on stderr

                tqdm.tqdm.write(f"warning: {msg}", file=sys.stderr)
        return row

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """The sample log's rows of `step` (`vpo.run.samples_log.sample_rows`) to W&B as a table."""
        if self.active and self._wandb is not None and rows:
            self._wandb.samples(step, rows)

    def close(self) -> None:
        self.flush()
        if self.active:
            self._file.close()
            if self._tb is not None:
                self._tb.close()
            if self._wandb is not None:
                self._wandb.close()
                self._wandb = None
