"""When an RL run stops early: SIGINT / SIGTERM ask the loop to stop after the step in flight
(`StopSignals`; a second one quits at once), the clean stop that follows (`RunInterrupted`,
which `vpo train --resume` continues), and too many consecutive skipped updates (`SkipGuard`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import jax
import numpy as np

from vpo.errors import RewardError
from vpo.tasks.bound import BoundTask


class RunInterrupted(KeyboardInterrupt):
    """The loop stopped on SIGINT / SIGTERM after `step`, its metrics row and checkpoint
    written; `vpo train --resume` continues it."""

    def __init__(self, signum: int, step: int, out_dir: str):
        self.signum, self.step = signum, step
        super().__init__(f"{signal.Signals(signum).name}: stopped after step {step} with its "
                         f"checkpoint saved; continue with vpo train --out {out_dir} --resume")


class StopSignals:
    """While entered (in the main thread of a single-process run), the first SIGINT / SIGTERM
    asks the loop to stop after the step in flight (`signum` is set); a second one quits the
    process at once (exit status 128 + signal), keeping the newest complete checkpoint."""

    def __init__(self):
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread() and jax.process_count() == 1:
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._old.clear()

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is None:
            self.signum = signum
            print(f"\n{name}: stopping after the step in flight and saving its checkpoint "
                  "(send it again to quit at once)", file=sys.stderr, flush=True)
            return
        print(f"\n{name} again: quitting now; --resume continues from the newest complete "
              "checkpoint", file=sys.stderr, flush=True)
        os._exit(128 + signum)


class SkipGuard:
    """Stops a run after `limit` consecutive skipped (non-finite) updates, one step late like
    the metrics (the check reads the previous step's count once the next step is queued).

    A step that skipped all its `per_step` updates adds them to the run of skips; one that
    applied some restarts it at its own skipped count (their order inside a step is not
    reported); `limit` 0 never stops. The error names the reward components that were not
    finite (`reward/<name>` metrics), or says the rewards were finite.
    """

    def __init__(self, limit: int, per_step: int, task: BoundTask):
        self.limit, self.per_step, self.task = limit, per_step, task
        self.run = 0
        self._pending: tuple[int, dict] | None = None

    def check(self, step: int | None = None, metrics: dict | None = None) -> None:
        """Queue `step`'s metrics; count the previously queued step's skips (raise if over)."""
        prev, self._pending = self._pending, (None if metrics is None else (step, metrics))
        if prev is None or self.limit <= 0:
            return
        done, m = prev
        skipped = int(jax.device_get(m["skipped_updates"]))
        self.run = self.run + skipped if skipped >= self.per_step else skipped
        if self.run < self.limit:
            return
        bad = [name for name in self.task.reward_names
               if f"reward/{name}" in m and not np.isfinite(float(jax.device_get(
                   m[f"reward/{name}"])))]
        cause = (f"reward component(s) {', '.join(bad)} of task {self.task.name!r} were not "
                 "finite (NaN or inf)" if bad else "the loss or gradients were not finite "
                 f"(the rewards of task {self.task.name!r} were finite)")
        raise RewardError(f"train.max_skipped_updates: {self.run} consecutive updates were "
                          f"skipped up to step {done} because {cause}; nothing was applied to "
                          "the parameters. Fix the reward (its function or the task's scorer) "
                          "and --resume from the last checkpoint, or raise "
                          "train.max_skipped_updates")
