"""Kill soak: SIGKILL `vpo train` at many moments, resume each, compare with an uninterrupted run.

    python experiments/kill_soak.py --out runs/kill_soak            # 24 kill points
    python experiments/kill_soak.py --out runs/kill_soak --fast     # 3 (the test's version)

A small run (`--preset smoke`, 6 steps, a checkpoint every 2) is killed with SIGKILL at each
kill point, then `vpo train --out DIR --resume` finishes it (a run killed before it wrote its
config.json is started again instead). Kill points are of two kinds: the loop's named points
(`VPO_KILL_AT=point:step`, `vpo.rl.loop.KILL_POINTS`: before a step, after its metrics row, while
an asynchronous checkpoint save is in flight, after a save completed, before the policy export)
and moments inside orbax's save seen from outside by polling the checkpoint folder (the
temporary step folder appears; its `state` item is being written; the step folder is renamed
into place). For each it prints the steps lost (metrics rows written before the kill that had
to be computed again) and whether the final metrics and parameters equal the uninterrupted
run's bit for bit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

STEPS, EVERY = 6, 2
TIMING = ("step_time_s", "tokens_per_s", "sampling_time_s", "update_time_s", "reward_time_s")
# loop hooks (point, step) and orbax save phases seen by polling (phase, step)
HOOKS = ([("step", s) for s in range(1, STEPS + 1)]
         + [("logged", s) for s in range(1, STEPS + 1)]
         + [("save", s) for s in range(EVERY, STEPS + 1, EVERY)]
         + [("saved", s) for s in range(EVERY, STEPS, EVERY)] + [("policy", STEPS)])
PHASES = [(p, s) for s in (EVERY, 2 * EVERY) for p in ("orbax-tmp", "orbax-state", "orbax-final")]
FAST = [("logged", 3), ("save", 4), ("orbax-tmp", 2)]


def get_config() -> dict:
    return {"steps": STEPS, "checkpoint_every": EVERY, "points": HOOKS + PHASES}


def command(out: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "vpo.cli.main", "train", *extra, "--out", out]


def fresh_args() -> list[str]:
    return ["--preset", "smoke", f"train.steps={STEPS}", f"train.checkpoint_every={EVERY}"]


def env(kill_at: str | None = None) -> dict:
    e = {**os.environ, "JAX_PLATFORMS": "cpu"}
    e.pop("VPO_KILL_AT", None)
    if kill_at:
        e["VPO_KILL_AT"] = kill_at
    return e


def _phase_seen(ckpt: str, phase: str, step: int) -> bool:
    """Whether orbax's save of `step` is in `phase`, from the checkpoint folder's entries."""
    try:
        names = os.listdir(ckpt)
    except FileNotFoundError:
        return False
    tmp = [n for n in names if n.startswith(f"{step}.orbax-checkpoint-tmp")]
    if phase == "orbax-tmp":
        return bool(tmp)
    if phase == "orbax-state":
        return any(os.path.isdir(os.path.join(ckpt, t, "state")) for t in tmp)
    return str(step) in names  # orbax-final: renamed into place (commit may still be running)


def run_killed(out: str, point: str, step: int) -> float:
    """Start the run, SIGKILL it at the point; returns seconds until the kill."""
    t0 = time.perf_counter()
    if not point.startswith("orbax"):
        p = subprocess.run(command(out, *fresh_args()), env=env(f"{point}:{step}"),
                           capture_output=True, text=True)
        if p.returncode != -signal.SIGKILL:
            raise RuntimeError(f"{point}:{step}: expected a SIGKILL, got rc {p.returncode}:\n"
                               f"{p.stderr[-2000:]}")
        return time.perf_counter() - t0
    p = subprocess.Popen(command(out, *fresh_args()), env=env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    ckpt = os.path.join(out, "checkpoints")
    while p.poll() is None:
        if _phase_seen(ckpt, point, step):
            p.send_signal(signal.SIGKILL)
            p.wait()
            return time.perf_counter() - t0
        time.sleep(0.0005)
    raise RuntimeError(f"{point}:{step}: the run ended (rc {p.returncode}) before the phase "
                       "was seen")


def resume(out: str) -> int:
    """Finish the run; returns the step it restored from (0: started again)."""
    p = subprocess.run(command(out, "--resume"), env=env(), capture_output=True, text=True)
    if p.returncode == 2 and "holds no run to resume" in p.stderr:
        shutil.rmtree(out)  # killed before its config.json: nothing was kept, start again
        p = subprocess.run(command(out, *fresh_args()), env=env(), capture_output=True,
                           text=True)
    if p.returncode != 0:
        raise RuntimeError(f"resume of {out} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    for line in p.stdout.splitlines():
        if line.startswith("resuming: restored step "):
            return int(line.split()[3])
    return 0


def rows(out: str) -> list[dict]:
    from vpo.rl.metrics_log import read_rows

    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_rows(path)]


def params(out: str) -> list[np.ndarray]:
    import jax
    from flax import nnx

    from vpo.io.checkpoint import load_policy

    model, _ = load_policy(os.path.join(out, "policy"))
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def main(out: str = "runs/kill_soak", points=None, log=print) -> list[dict]:
    """Run the soak over `points` (default: all); returns one dict per kill point."""
    points = points or HOOKS + PHASES
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    ref = os.path.join(out, "uninterrupted")
    p = subprocess.run(command(ref, *fresh_args()), env=env(), capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"the uninterrupted run failed:\n{p.stderr[-3000:]}")
    ref_rows, ref_params = rows(ref), params(ref)
    results = []
    log(f"{'kill point':<16} {'killed after':>12} {'rows at kill':>12} {'restored':>9} "
        f"{'lost steps':>10}  bit-exact")
    for point, step in points:
        run = os.path.join(out, f"{point}-{step}")
        secs = run_killed(run, point, step)
        at_kill = max((r["step"] for r in rows(run)), default=0)
        restored = resume(run)
        exact = rows(run) == ref_rows and all(
            np.array_equal(a, b) for a, b in zip(params(run), ref_params, strict=True))
        r = {"point": f"{point}:{step}", "seconds": secs, "rows_at_kill": at_kill,
             "restored": restored, "lost": max(at_kill - restored, 0), "exact": exact}
        results.append(r)
        log(f"{r['point']:<16} {secs:>11.1f}s {at_kill:>12} {restored:>9} {r['lost']:>10}  "
            f"{'yes' if exact else 'NO'}")
    n = sum(r["exact"] for r in results)
    log(f"\n{n}/{len(results)} kill points bit-exact; steps lost per kill: "
        f"max {max(r['lost'] for r in results)}, total {sum(r['lost'] for r in results)}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/kill_soak")
    parser.add_argument("--fast", action="store_true", help="3 kill points (the test's)")
    a = parser.parse_args()
    res = main(a.out, FAST if a.fast else None)
    sys.exit(0 if all(r["exact"] for r in res) else 1)
