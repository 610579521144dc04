"""What `vpo compare --resume` reuses from an earlier, interrupted run of the same comparison,
and how it is checked: the folder (`check_out_dir`: the same settings, else a refusal naming
those that differ; `--overwrite` removes exactly `OUTPUTS`), each finished stage
(`Stages`: out_dir/stages/<stage>.json, its result and seconds, read back instead of run again)
and each finished (arm, seed) run (`ARM_DONE`, written last in its folder; `read_arm_run`;
`clear_arm` for one that did not finish)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time

from vpo.compare.config import CompareConfig
from vpo.config import ConfigError, from_dict
from vpo.io.policy_folder import load_model
from vpo.run.metrics_log import JSONL
from vpo.run.run_folder import policy_complete, write_json_atomic

# What `vpo.compare.driver.run_compare` writes in its folder, so --overwrite removes exactly that.
OUTPUTS = ("config.json", "sft", "arms", "stages", "report.md", "summary.json")
ARM_DONE = "compare_run.json"  # written last in an (arm, seed) folder: the run is complete


def check_out_dir(cfg: CompareConfig, out_dir: str, *, resume: bool, overwrite: bool) -> None:
    """A comparison folder is never silently replaced: an existing one needs `resume` (same
    config, finished stages and runs are read back) or `overwrite` (its outputs removed)."""
    path = os.path.join(out_dir, "config.json")
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite: choose one")
    if resume:
        if not os.path.exists(path):
            raise ConfigError(f"--resume: {out_dir} holds no comparison (no config.json); run "
                              "without --resume to start one there")
        # Settings added to vpo after the comparison started hold their defaults there.
        recorded = read_json(path)
        with contextlib.suppress(ConfigError, TypeError):  # a removed setting: named below
            recorded = dataclasses.asdict(from_dict(CompareConfig, recorded))
        old, new = (json.loads(json.dumps(c)) for c in (recorded, dataclasses.asdict(cfg)))
        diff = sorted(k for k in {*old, *new} if old.get(k) != new.get(k))
        if diff:
            raise ConfigError(f"--resume: the comparison in {out_dir} was started with other "
                              f"settings ({', '.join(diff)} differ); resume it with the same "
                              "--preset and overrides, or start a new one in another --out")
    elif os.path.exists(path):
        if not overwrite:
            raise ConfigError(f"--out: {out_dir} already holds a comparison; continue it with "
                              "--resume, pick a new folder, or pass --overwrite to replace it")
        for name in OUTPUTS:
            target = os.path.join(out_dir, name)
            if os.path.isdir(target):
                shutil.rmtree(target)
            elif os.path.exists(target):
                os.remove(target)


class Stages:
    """The stages of one attempt at a comparison: `stages(name, fn)` runs a stage, or reads it
    back from out_dir/stages when resuming; `wall` holds each stage's seconds (a resumed stage:
    those it took earlier)."""

    def __init__(self, out_dir: str, *, resume: bool, log=print):
        self.out_dir, self.resume, self.log = out_dir, resume, log
        self.wall: dict[str, float] = {}

    def path(self, name: str) -> str:
        return os.path.join(self.out_dir, "stages", name.replace(" ", "_") + ".json")

    def __call__(self, name: str, fn, cached: bool = True):
        """Run a stage, or read it back when resuming; `cached=False`: the stage keeps its own
        progress (warm start, RL) and reports its time through `fn`'s return."""
        path = self.path(name)
        if self.resume and cached and os.path.exists(path):
            record = read_json(path)
            self.wall[name] = record["seconds"]
            self.log(f"[{name}] resumed ({self.wall[name]:.1f} s earlier)")
            return record["result"]
        self.log(f"[{name}]")
        t0 = time.perf_counter()
        result = fn()
        self.wall[name] = time.perf_counter() - t0
        if cached:  # read back as a resumed run would, so both give the same report
            result = json.loads(json.dumps(result, default=_plain))
            write_json_atomic(path, {"result": result, "seconds": self.wall[name]})
        self.log(f"[{name}] {self.wall[name]:.1f} s")
        return result

    def kept(self, name: str, fn):
        """A stage whose result is kept where it belongs and read back by `fn` itself (the warm
        start's policy folder): the first attempt's seconds are recorded in its stage file and
        added to this attempt's."""
        path = self.path(name)
        before = read_json(path)["seconds"] if self.resume and os.path.exists(path) else 0.0

        def timed():
            t0 = time.perf_counter()
            result = fn()
            if not before:
                write_json_atomic(path, {"seconds": time.perf_counter() - t0})
            return result

        result = self(name, timed, cached=False)
        self.wall[name] += before
        return result


def metrics_rows(path: str) -> list[dict]:
    """The per-step metrics a run wrote in its folder (metrics.jsonl)."""
    with open(os.path.join(path, JSONL)) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_arm_run(path: str, max_len: int):
    """A finished (arm, seed) of an earlier, interrupted `vpo compare` → (its exported policy,
    metrics, `ARM_DONE` record: entropy-law trajectory, seconds); None if it did not finish."""
    done = os.path.join(path, ARM_DONE)
    if not os.path.exists(done):
        return None
    record = read_json(done)
    model = load_model(os.path.join(path, "policy"), max_seq_len=max_len)[0]
    return model, metrics_rows(path), record


def clear_arm(path: str, *, resume: bool) -> None:
    """An (arm, seed) folder that did not finish, made ready to train: a run that trained but
    was killed before its entropy-law scores is redone (a resumed run continues from its last
    checkpoint otherwise); without `resume` an earlier folder is removed."""
    if resume and policy_complete(os.path.join(path, "policy")):
        shutil.rmtree(path)  # trained, but killed before its law scores: redo it
    elif not resume and os.path.exists(path):
        shutil.rmtree(path)


def _plain(x):
    """numpy scalars and arrays as JSON values."""
    return x.tolist() if hasattr(x, "tolist") else str(x)


def read_json(path: str):
    with open(path) as f:
        return json.load(f)
