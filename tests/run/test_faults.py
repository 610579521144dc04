"""Nothing lost under faults: one process at a time in a run folder, a signal stops a run with its
last metrics row and its newest checkpoint agreeing, an interrupted policy export is never taken
for finished, damaged files get a named error, and --resume refuses a changed --data file."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from vpo.cli import main as cli
from vpo.config import ConfigError
from vpo.errors import CheckpointError
from vpo.io import checkpoint_errors, policy_folder, run_checkpoint
from vpo.io.tokenizer import load_tokenizer
from vpo.launch import assemble
from vpo.run import loop, run_folder
from vpo.run.metrics_log import read_rows

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures")
BPE = os.path.join(FIXTURES, "hf", "qwen2_bpe")
SMOKE = ["--preset", "smoke", "--compile-cache", ""]
RUN6 = ["train.steps=6", "train.checkpoint_every=4"]
TIMING = ("step_time_s", "tokens_per_s", "sampling_time_s", "update_time_s", "reward_time_s")


KILL_AT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "experiments", "kill_at.py")  # vpo with VPO_KILL_AT's fault injection


def vpo(command: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`vpo COMMAND ARGS` in a fresh process (CPU, the tests' compile cache), with extra
    environment variables."""
    import jax

    cache = ["--compile-cache", jax.config.jax_compilation_cache_dir or ""]
    entry = [KILL_AT] if "VPO_KILL_AT" in env else ["-m", "vpo.cli.main"]
    return subprocess.run([sys.executable, *entry, command, *cache, *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", **env,
                               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"})


def steps(out) -> list[int]:
    return [r["step"] for r in read_rows(os.path.join(out, "metrics.jsonl"))]


def metrics(out) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING}
            for r in read_rows(os.path.join(out, "metrics.jsonl"))]


def checkpoints(out) -> list[int]:
    return sorted(int(n) for n in os.listdir(os.path.join(out, "checkpoints")) if n.isdigit())


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 6-step smoke run (a checkpoint at steps 4 and 6)."""
    out = str(tmp_path_factory.mktemp("runs") / "finished")
    assert cli.main(["train", *SMOKE, *RUN6, "--out", out]) == 0
    return out


# -- 1. one process at a time -------------------------------------------------------------------

def hold_lock(folder: str) -> subprocess.Popen:
    """Another process holding `folder`'s run lock (until killed)."""
    code = ("import sys, time; from vpo.run import run_folder; run_folder.lock_run(sys.argv[1]); "
            "print('locked', flush=True); time.sleep(300)")
    p = subprocess.Popen([sys.executable, "-c", code, folder], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert p.stdout.readline().strip() == "locked"
    return p


def test_a_run_folder_is_held_by_one_process_and_a_killed_holder_lets_go(tmp_path, capsys):
    out = str(tmp_path / "run")
    holder = hold_lock(out)
    try:
        busy = f"another vpo process \\(pid {holder.pid} on "
        for call in (lambda: run_folder.check_new_run(out),
                     lambda: run_folder.check_new_run(out, overwrite=True),
                     lambda: run_folder.clear_run(out), lambda: run_folder.resume_config(out, [])):
            with pytest.raises(run_folder.RunFolderLockedError, match=busy):
                call()
        plan = assemble.assemble_run("smoke", None, ["train.steps=1"])
        with pytest.raises(run_folder.RunFolderLockedError, match=busy):
            loop.train(plan.run, out, task=plan.task, progress=False)
        assert cli.main(["train", *SMOKE, "--out", out]) == 2
        assert f"pid {holder.pid}" in capsys.readouterr().err
        assert os.listdir(out) == [run_folder.LOCK_FILE]  # nothing written, nothing cleared
    finally:
        holder.kill()
        holder.wait()
    run_folder.check_new_run(out)  # the killed holder's lock is free: taken over
    with open(os.path.join(out, run_folder.LOCK_FILE)) as f:
        assert json.load(f)["pid"] == os.getpid()
    run_folder.release_run(out)
    assert os.listdir(out) == []


def test_a_refused_check_leaves_no_trace(finished, tmp_path):
    """A check that refuses lets go of the lock and removes what it made."""
    before = sorted(os.listdir(finished))
    with pytest.raises(ConfigError, match="already holds a run"):
        run_folder.check_new_run(finished)
    assert sorted(os.listdir(finished)) == before
    new = str(tmp_path / "new")
    assert run_folder.lock_run(new) and not run_folder.lock_run(new)  # held: taken once per process
    run_folder.release_locks()
    assert not os.path.exists(new)


@pytest.mark.slow
def test_two_processes_on_one_folder_one_refuses(tmp_path, load_experiment):
    """Two new runs at once, two --resume at once: one refuses naming the other's pid, the
    other finishes the run bit-exactly (experiments/kill_soak.py's concurrent points)."""
    soak = load_experiment("kill_soak")
    results = soak.main(str(tmp_path / "soak"), soak.CONCURRENT, log=lambda *a: None)
    assert [(r["exact"], r["missing"]) for r in results] == [(True, [])] * 2, results


# -- 2. SIGINT / SIGTERM ----------------------------------------------------------------------

@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_a_signal_stops_the_run_with_its_last_row_checkpointed(finished, tmp_path, sig):
    """The signal lands after step 2's row was queued (one step late): the run writes row 2,
    saves step 2 (not a checkpoint step), exits with 128 + the signal's number (130 for SIGINT,
    143 for SIGTERM, as shells report them); --resume finishes it exactly."""
    out = str(tmp_path / "run")
    t0 = time.perf_counter()
    p = vpo("train", "--preset", "smoke", *RUN6, "--out", out, VPO_KILL_AT="logged:2",
            VPO_KILL_SIGNAL=sig)
    assert p.returncode == 128 + getattr(signal, f"SIG{sig}"), p.stderr[-2000:]
    assert time.perf_counter() - t0 < 180  # not stuck after it (62 s on a loaded machine)
    assert "Traceback" not in p.stderr and f"SIG{sig}: stopping after the step" in p.stderr
    assert steps(out) == [1, 2] and checkpoints(out) == [2]
    if sig == "INT":
        assert cli.main(["train", "--out", out, "--resume"]) == 0
        assert metrics(out) == metrics(finished)


def test_a_second_signal_quits_at_once_without_tracebacks():
    code = ("import os, signal, time\nfrom vpo.run.stopping import StopSignals\n"
            "with StopSignals() as stop:\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    assert stop.signum == signal.SIGINT\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    time.sleep(60)\n")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=120)
    assert p.returncode == 130 and time.perf_counter() - t0 < 30
    assert "SIGINT again: quitting now" in p.stderr and "Traceback" not in p.stderr


# -- 3. the policy export -----------------------------------------------------------------------

def test_an_unfinished_policy_export_is_not_taken_for_finished(finished, tmp_path, capsys):
    out = str(tmp_path / "run")
    shutil.copytree(finished, out)
    policy = os.path.join(out, "policy")
    for name in ("tokenizer_config.json", "generation_config.json"):
        os.remove(os.path.join(policy, name))
    assert not run_folder.policy_complete(policy)
    assert cli.main(["train", "--out", out, "--resume"]) == 0
    text = capsys.readouterr()
    assert "restored step 6" in text.out and "already finished" not in text.err
    assert run_folder.policy_complete(policy)
    assert cli.main(["train", "--out", out, "--resume"]) == 2
    assert "already finished all 6 steps" in capsys.readouterr().err


def test_a_policy_export_killed_midway_leaves_no_policy(finished, tmp_path, monkeypatch):
    from vpo.io.tokenizer import Tokenizer

    model, tok, info = policy_folder.load_model(os.path.join(finished, "policy"))

    def save_then_die(self, folder):  # tokenizer.json written, then the process is gone
        self.backend.save(os.path.join(str(folder), "tokenizer.json"))
        raise KeyboardInterrupt

    monkeypatch.setattr(Tokenizer, "save", save_then_die)
    from flax import nnx

    target = str(tmp_path / "policy")
    with pytest.raises(KeyboardInterrupt):
        policy_folder.save_policy(target, model.cfg, nnx.state(model, nnx.Param), {"steps": 6},
                                  tokenizer=tok)
    assert not os.path.exists(target) and not run_folder.policy_complete(target)
    monkeypatch.undo()
    policy_folder.save_policy(target, model.cfg, nnx.state(model, nnx.Param), {"steps": 6},
                              tokenizer=tok)  # a new export replaces the leftovers
    assert run_folder.policy_complete(target)
    assert not os.path.exists(policy_folder.partial_dir(target))


# -- 4. damaged files -------------------------------------------------------------------------

def _truncate(name):
    def damage(folder):
        path = os.path.join(folder, name)
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[:len(data) // 2])
    return damage


def _write(name, text):
    def damage(folder):
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return damage


def _header_length(folder):
    path = os.path.join(folder, "model.safetensors")
    with open(path, "r+b") as f:
        f.write((10 ** 15).to_bytes(8, "little"))


def _model(folder):
    policy_folder.load_model(f"hf:{folder}")


def _tokenizer(folder):
    load_tokenizer(folder)


DAMAGED = {
    "weights truncated": (_truncate("model.safetensors"), _model, "model.safetensors"),
    "weights header length": (_header_length, _model, "model.safetensors"),
    "config.json malformed": (_write("config.json", '{"model_type": "qwen2",'), _model,
                              "config.json: not valid JSON"),
    "config.json a list": (_write("config.json", "[1, 2]"), _model,
                           "config.json: expected a JSON object, got a list"),
    "tokenizer.json truncated": (_truncate("tokenizer.json"), _tokenizer, "tokenizer.json"),
    "tokenizer.json empty object": (_write("tokenizer.json", "{}"), _tokenizer,
                                    "tokenizer.json"),
    "chat template syntax": (_write("chat_template.jinja", "{% for m in messages %}{{ m }"),
                             _tokenizer, "chat_template.jinja: the chat template does not "
                             "compile"),
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_checkpoint_file_is_named(tmp_path, case):
    damage, load, named = DAMAGED[case]
    folder = str(tmp_path / "ckpt")
    shutil.copytree(BPE, folder)
    damage(folder)
    with pytest.raises(CheckpointError, match=named.replace(".", r"\.")) as e:
        load(folder)
    assert folder in str(e.value)


def test_every_checkpoint_damaged_is_one_named_error(finished, tmp_path):
    out = str(tmp_path / "run")
    shutil.copytree(finished, out, ignore=shutil.ignore_patterns("policy"))
    for root, _, files in os.walk(os.path.join(out, "checkpoints")):
        if os.path.basename(root) == "d" and f"{os.sep}state{os.sep}" in root + os.sep:
            for name in files:
                _truncate(name)(root)
    p = vpo("train", "--out", out, "--resume")
    assert p.returncode == 2
    assert "no checkpoint restores, all are damaged (steps 6, 4: " in p.stderr or (
        "step 6: " in p.stderr and "; step 4: " in p.stderr), p.stderr[:3000]
    assert "file truncated" in p.stderr and "restore a copy of the folder" in p.stderr
    # one short line (it was 1,561 characters of tensorstore's driver errors)
    assert "Traceback" not in p.stderr and len(p.stderr) < 500, p.stderr[:3000]


def test_a_checkpoint_of_another_shape_is_one_line(finished, tmp_path):
    """config.json edited (model.dim 32 -> 64) before --resume: one line naming the array, the
    shape saved and the shape the config makes, the model field that differs, and the fix (it
    was 5.9k characters of orbax / tensorstore spec)."""
    out = str(tmp_path / "run")
    shutil.copytree(finished, out, ignore=shutil.ignore_patterns("policy"))
    path = os.path.join(out, "config.json")
    with open(path) as f:
        config = json.load(f)
    assert config["model"]["dim"] == 32
    config["model"]["dim"] = 64
    with open(path, "w") as f:
        json.dump(config, f)
    p = vpo("train", "--out", out, "--resume")
    assert p.returncode == 2
    err = p.stderr
    assert "Traceback" not in err and len(err) < 500, err[:3000]
    assert re.search(r"checkpoints: the checkpoints hold another model than the run's \(steps "
                     r"6, 4: params\.embed\.value \(\d+, 32\) saved, \(\d+, 64\) now, \+\d+ "
                     r"arrays; model\.dim 32 saved, 64 now\); resume with the config they were "
                     r"saved with", err), err
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["4", "6"]  # nothing moved


# -- 5. the --data file -------------------------------------------------------------------------

def test_resume_refuses_a_changed_data_file(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "a"}\n')
    plan = assemble.assemble_run("smoke", None, ["train.steps=2"])
    run = dataclasses.replace(plan.run, task_kwargs={"path": str(data)})
    out = str(tmp_path / "run")
    loop.train(run, out, task=plan.task, progress=False, stop_at=1)
    assert run_folder.resume_config(out, []).task_kwargs == {"path": str(data)}
    data.write_text('{"prompt": "b"}\n')
    with pytest.raises(ConfigError, match=f"data file {data} changed since the run started"):
        run_folder.resume_config(out, [])
    run_folder.resume_config(out, [], data_changed_ok=True)  # on purpose: the new file is recorded
    run_folder.resume_config(out, [])
    data.unlink()
    with pytest.raises(ConfigError, match=f"data file {data} is gone"):
        run_folder.resume_config(out, [])


# A run whose disk fills, on a tmpfs of its own: a user and mount namespace (no root needed) in
# which the command runs, then --resume after the space is freed; the run's metrics are copied
# out before the namespace (and its disk) goes. argv: DISK KEEP FAIL_JSON RESUME_JSON.
ON_A_SMALL_DISK = r"""
import fcntl, json, os, shutil, subprocess, sys, time
disk, keep = sys.argv[1], sys.argv[2]
fail, resume = json.loads(sys.argv[3]), json.loads(sys.argv[4])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", disk], check=True)
run = os.path.join(disk, "run")
t0 = time.monotonic()
try:
    p = subprocess.run(fail, capture_output=True, text=True, timeout=300)
    rc, err = p.returncode, p.stderr
except subprocess.TimeoutExpired as e:
    rc, err = "hung", (e.stderr or b"").decode(errors="replace")
took = time.monotonic() - t0
lock = os.path.join(run, ".vpo.lock")
free = True
if os.path.exists(lock):
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        free = False
    os.close(fd)
ckpt = os.path.join(run, "checkpoints")
steps = sorted(int(n) for n in os.listdir(ckpt) if n.isdigit()) if os.path.isdir(ckpt) else []
os.remove(os.path.join(disk, "ballast"))  # the space freed
p = subprocess.run(resume, capture_output=True, text=True, timeout=300)
shutil.copy(os.path.join(run, "metrics.jsonl"), keep)
print(json.dumps({"rc": rc, "stderr": err, "seconds": took, "lock_free": free,
                  "checkpoints": steps, "resume_rc": p.returncode, "resume_err": p.stderr[-3000:]}))
"""


def on_a_small_disk(folder: str, keep: str, fail: list[str], resume: list[str]) -> dict:
    """Run command `fail` then `resume` with `folder` a 16 MB tmpfs of their own (what
    ON_A_SMALL_DISK reports); skipped where this system has no user namespaces."""
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no user namespaces here (unshare -rm): no tmpfs of the test's own")
    os.makedirs(folder, exist_ok=True)
    p = subprocess.run(["unshare", "-rm", sys.executable, "-c", ON_A_SMALL_DISK, folder, keep,
                        json.dumps(fail), json.dumps(resume)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_full_disk_ends_the_run_named_and_resume_finishes_it(finished, tmp_path):
    """The disk fills as step 4's checkpoint is written (all but 64 KiB taken at the loop's
    point after step 3's row: the rows fit, the checkpoint does not). The run ends (it used to
    hang on TensorBoard's writer thread, caught as "hung" by the 300 s subprocess timeout of
    ON_A_SMALL_DISK, or end in orbax tracebacks) with one named
    error: the folder, the step, the free space, --resume; its lock let go, no checkpoint left
    half-written as complete. After the space is freed, --resume finishes it as the straight
    run did."""
    import jax

    disk, keep = str(tmp_path / "disk"), str(tmp_path / "metrics.jsonl")
    out = os.path.join(disk, "run")
    cache = ["--compile-cache", jax.config.jax_compilation_cache_dir or ""]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "VPO_FILL_AT": "logged:3",
           "VPO_FILL_FILE": os.path.join(disk, "ballast"), "VPO_FILL_LEAVE": str(64 << 10),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    fail = ["env", *(f"{k}={v}" for k, v in env.items() if k.startswith(("VPO_", "JAX_"))),
            sys.executable, KILL_AT, "train", *cache, *SMOKE[:2], *RUN6, "--out", out]
    resume = [sys.executable, "-m", "vpo.cli.main", "train", *cache, "--out", out, "--resume"]
    r = on_a_small_disk(disk, keep, fail, resume)
    err = r["stderr"]
    assert r["rc"] == 2, (r["rc"], r["seconds"], err[-3000:])
    assert "Traceback" not in err and len(err.split("vpo train: error:")[-1]) < 600, err[-3000:]
    assert (f"{out}/checkpoints: the checkpoint of step 4 was not written (no space left on "
            "the disk; ") in err and " free); no checkpoint is complete yet" in err, err[-3000:]
    assert "then run the same command with --resume" in err
    assert r["lock_free"] and r["checkpoints"] == []
    assert r["resume_rc"] == 0, r["resume_err"]
    got = [{k: v for k, v in row.items() if k not in TIMING} for row in read_rows(keep)]
    assert got == metrics(finished)


def test_a_checkpoint_write_that_fails_is_named(tmp_path):
    """A save that fails in orbax's background thread (here: tensorstore's RESOURCE_EXHAUSTED
    as orbax raises it) is seen by `check` once the save is over, named: the folder, the step,
    the free space, the newest complete checkpoint, --resume; a permission error says so."""
    import jax.numpy as jnp

    from vpo.errors import CheckpointWriteError

    folder = str(tmp_path / "checkpoints")
    mngr = run_checkpoint.CheckpointManager(folder)
    mngr.save(2, {"x": jnp.zeros(3)})
    mngr.wait()
    mngr.save(4, {"x": jnp.ones(3)})
    real_wait = mngr._mngr.wait_until_finished
    real_wait()  # over (and, as far as orbax's thread knew, failed):

    def failed():
        raise ValueError('RESOURCE_EXHAUSTED: Error writing local file "/x/4.orbax-checkpoint'
                         '-tmp/state": No space left on device [os_error_code=\'28\']')

    mngr._mngr.wait_until_finished = failed
    mngr._mngr.all_steps = lambda: [2]  # the failed step is not complete
    with pytest.raises(CheckpointWriteError) as e:
        mngr.check()
    text = str(e.value)
    assert text.startswith(f"{os.path.abspath(folder)}: the checkpoint of step 4 was not "
                           "written (no space left on the disk; ")
    assert "the newest complete checkpoint is step 2" in text and "--resume" in text
    assert len(text) < 400
    mngr._mngr.wait_until_finished = real_wait
    mngr.check()  # reported once
    assert checkpoint_errors.write_failure(PermissionError(13, "Permission denied"))[0] == (
        "permission denied")
    assert checkpoint_errors.write_failure(ValueError("a bad tree")) is None


def test_a_full_disk_names_the_folder_and_how_to_continue(monkeypatch, tmp_path, capsys):
    """[Errno 28] without a file name (as orbax raises it) names --out and says --resume."""
    import errno

    from vpo.cli import main as cli
    from vpo.run import loop

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(loop, "train", full)
    out = str(tmp_path / "run")
    assert cli.main(["train", "--preset", "smoke", "--compile-cache", "", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and out in err and "--resume" in err
