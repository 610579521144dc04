"""Kill soak: stop `vpo train` at many moments, resume each, compare with an uninterrupted run.

    python experiments/kill_soak.py --out runs/kill_soak            # every kill point
    python experiments/kill_soak.py --out runs/kill_soak --fast     # 3 (the test's version)
    python experiments/kill_soak.py --out runs/kill_soak --short    # a few of each kind

A small run (`--preset smoke`, 6 steps, a checkpoint every 2) is stopped at each kill point, then
`vpo train --out DIR --resume` finishes it (a run killed before it wrote its config.json is started
again instead). Kill points are of four kinds: the loop's named points (`VPO_KILL_AT=point:step`,
read by experiments/kill_at.py; `vpo.run.loop.EVENTS`: before a step, after its metrics row, while
an asynchronous checkpoint save is in flight, after a save completed, before the policy export) with
SIGKILL; the same points with SIGINT or SIGTERM (`VPO_KILL_SIGNAL`: the run stops after the step in
flight, its metrics row and checkpoint written); SIGINT / SIGTERM sent from outside once the run has
written a given metrics row (a Ctrl-C at an arbitrary moment); moments inside orbax's save seen from
outside by polling the checkpoint folder (the temporary step folder appears; its `state` item is
being written; the step folder is renamed into place). Two concurrent points start two processes on
one folder (two new runs; two `--resume`): one must refuse at once (the run folder's lock) and the
other finish it.

For each it prints the steps lost (metrics rows written before the kill that had to be computed
again), the rows missing from the finished run's metrics.jsonl (lost for good), whether the
last metrics row and the newest checkpoint agreed when a signal stopped the run, and whether
the final metrics and parameters equal the uninterrupted run's bit for bit.
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
# (point, step, signal): SIGINT / SIGTERM at the loop's hooks, and from outside once row `step`
# is in metrics.jsonl ("row")
SIGNALS = [(p, s, sig) for sig in ("INT", "TERM")
           for p, s in HOOKS + [("row", s) for s in range(1, STEPS)]]
# two processes on one folder at once: two new runs; two resumes of a run stopped at step 2
CONCURRENT = [("concurrent-new", 0), ("concurrent-resume", EVERY)]
FAST = [("logged", 3), ("save", 4), ("orbax-tmp", 2)]
SHORT = [("logged", 3), ("orbax-tmp", 2), ("logged", 3, "INT"), ("save", 4, "INT"),
         ("step", 5, "TERM"), ("row", 2, "INT"), ("row", 3, "TERM"), *CONCURRENT]
ALL = HOOKS + PHASES + SIGNALS + CONCURRENT


KILL_AT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kill_at.py")


def get_config() -> dict:
    return {"steps": STEPS, "checkpoint_every": EVERY, "points": ALL}


def command(out: str, *extra: str) -> list[str]:
    return [sys.executable, KILL_AT, "train", *extra, "--out", out]


def fresh_args() -> list[str]:
    return ["--preset", "smoke", f"train.steps={STEPS}", f"train.checkpoint_every={EVERY}"]


def env(kill_at: str | None = None, sig: str = "KILL") -> dict:
    e = {**os.environ, "JAX_PLATFORMS": "cpu", "VPO_KILL_SIGNAL": sig}
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


STOPPED = (130, 143)  # what `vpo train` exits with once SIGINT / SIGTERM stopped it early


def run_signalled(out: str, point: str, step: int, sig: str) -> float:
    """Start the run, send SIGINT / SIGTERM at the point (a loop hook, or from outside once
    metrics row `step` is written); returns seconds from the signal to the exit."""
    if point != "row":
        t0 = time.perf_counter()
        p = subprocess.run(command(out, *fresh_args()), env=env(f"{point}:{step}", sig),
                           capture_output=True, text=True)
        if p.returncode not in (0, *STOPPED):  # 0: the signal came in the last step
            raise RuntimeError(f"{sig} at {point}:{step}: expected exit status 130 or 143, got "
                               f"{p.returncode}:\n{p.stderr[-2000:]}")
        return time.perf_counter() - t0
    p = subprocess.Popen(command(out, *fresh_args()), env=env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    while p.poll() is None and max((r["step"] for r in rows(out)), default=0) < step:
        time.sleep(0.005)
    t0 = time.perf_counter()
    p.send_signal(getattr(signal, f"SIG{sig}"))
    err = p.communicate(timeout=120)[1]
    if p.returncode not in (0, *STOPPED):
        raise RuntimeError(f"{sig} after row {step}: expected exit status 130 or 143, got "
                           f"{p.returncode}:\n{err[-2000:]}")
    return time.perf_counter() - t0


def agree(out: str) -> bool:
    """Whether the last metrics row is the newest checkpoint's step (none: no rows either)."""
    ckpt = os.path.join(out, "checkpoints")
    steps = [int(n) for n in os.listdir(ckpt) if n.isdigit()] if os.path.isdir(ckpt) else []
    return max((r["step"] for r in rows(out)), default=0) == max(steps, default=0)


def run_concurrent(out: str, point: str, step: int) -> float:
    """Two processes on `out` at once (two new runs, or two resumes of a run stopped after
    `step`); one must refuse (naming the other's pid, or that it has not written it yet), one
    finish. Returns the refusal's seconds."""
    args = fresh_args()
    if point == "concurrent-resume":
        run_signalled(out, "logged", step, "INT")
        args = ["--resume"]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(command(out, *args), env=env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    done = [(p.communicate(timeout=300), p.returncode, time.perf_counter() - t0) for p in procs]
    codes = sorted(rc for _, rc, _ in done)
    refused = [(err, secs) for (_, err), rc, secs in done if rc == 2]
    if codes != [0, 2] or "another vpo process (" not in refused[0][0]:
        raise RuntimeError(f"{point}: expected one run to finish and one to refuse, got exit "
                           f"statuses {codes}:\n" + "\n".join(e[-1500:] for (_, e), _, _ in done))
    return refused[0][1]


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
    if p.returncode == 2 and "already finished all" in p.stderr:
        return STEPS  # the signal came in the last step: the run finished as asked
    if p.returncode != 0:
        raise RuntimeError(f"resume of {out} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    for line in p.stdout.splitlines():
        if line.startswith("resuming: restored step "):
            return int(line.split()[3])
    return 0


def rows(out: str) -> list[dict]:
    from vpo.run.metrics_log import read_rows

    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_rows(path)]


def params(out: str) -> list[np.ndarray]:
    import jax
    from flax import nnx

    from vpo.io.policy_folder import load_policy

    model, _ = load_policy(os.path.join(out, "policy"))
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def soak_one(out: str, spec: tuple, ref_rows: list[dict], ref_params) -> dict:
    """Stop one run at kill point `spec` ((point, step) or (point, step, signal)), finish it and
    compare it with the uninterrupted run."""
    point, step, sig = (*spec, "KILL")[:3]
    name = f"{point}:{step}" + ("" if sig == "KILL" else f":{sig}")
    run = os.path.join(out, name.replace(":", "-"))
    agreed = None
    if point.startswith("concurrent"):  # the process that was not refused finished the run
        secs = run_concurrent(run, point, step)
        at_kill = restored = step
    else:
        if sig == "KILL":
            secs = run_killed(run, point, step)
        else:
            secs = run_signalled(run, point, step, sig)
            agreed = agree(run)
        at_kill = max((r["step"] for r in rows(run)), default=0)
        restored = resume(run)
    final = rows(run)
    missing = sorted({r["step"] for r in ref_rows} - {r["step"] for r in final})
    exact = final == ref_rows and all(
        np.array_equal(a, b) for a, b in zip(params(run), ref_params, strict=True))
    return {"point": name, "seconds": secs, "rows_at_kill": at_kill, "restored": restored,
            "lost": max(at_kill - restored, 0), "missing": missing, "agree": agreed,
            "exact": exact}


def main(out: str = "runs/kill_soak", points=None, log=print) -> list[dict]:
    """Run the soak over `points` (default: all); returns one dict per kill point."""
    points = points or ALL
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    ref = os.path.join(out, "uninterrupted")
    p = subprocess.run(command(ref, *fresh_args()), env=env(), capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"the uninterrupted run failed:\n{p.stderr[-3000:]}")
    ref_rows, ref_params = rows(ref), params(ref)
    results = []
    log(f"{'kill point':<24} {'seconds':>8} {'rows at kill':>12} {'restored':>9} "
        f"{'lost steps':>10} {'missing rows':>12} {'agree':>6}  bit-exact")
    for spec in points:
        r = soak_one(out, spec, ref_rows, ref_params)
        results.append(r)
        log(f"{r['point']:<24} {r['seconds']:>7.1f}s {r['rows_at_kill']:>12} "
            f"{r['restored']:>9} {r['lost']:>10} {len(r['missing']):>12} "
            f"{'-' if r['agree'] is None else 'yes' if r['agree'] else 'NO':>6}  "
            f"{'yes' if r['exact'] else 'NO'}")
    n = sum(r["exact"] for r in results)
    log(f"\n{n}/{len(results)} kill points bit-exact; steps lost per kill: "
        f"max {max(r['lost'] for r in results)}, total {sum(r['lost'] for r in results)}; "
        f"rows missing for good: {sum(len(r['missing']) for r in results)}; signalled runs "
        f"whose last row and checkpoint disagreed: {sum(r['agree'] is False for r in results)}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/kill_soak")
    parser.add_argument("--fast", action="store_true", help="3 kill points (the test's)")
    parser.add_argument("--short", action="store_true", help="a few kill points of each kind")
    a = parser.parse_args()
    res = main(a.out, FAST if a.fast else SHORT if a.short else None)
    sys.exit(0 if all(r["exact"] and not r["missing"] and r["agree"] is not False
                      for r in res) else 1)
