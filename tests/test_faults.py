"""Nothing lost under faults: one process at a time in a run folder, a signal stops a run with its
last metrics row and its newest checkpoint agreeing, an interrupted policy export is never taken
for finished, damaged files get a named error, and --resume refuses a changed --data file."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from vpo.cli import main as cli
from vpo.config import ConfigError
from vpo.errors import CheckpointError
from vpo.io import checkpoint as ckpt_lib
from vpo.io.tokenizer import load_tokenizer
from vpo.launch import assemble
from vpo.rl import loop, run_folder
from vpo.rl.metrics_log import read_rows

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
BPE = os.path.join(FIXTURES, "hf", "qwen2_bpe")
SMOKE = ["--preset", "smoke", "--compile-cache", ""]
RUN6 = ["train.steps=6", "train.checkpoint_every=4"]
TIMING = ("step_time_s", "tokens_per_s", "sampling_time_s", "update_time_s", "reward_time_s")


KILL_AT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
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
    code = ("import sys, time; from vpo.rl import run_folder; run_folder.lock_run(sys.argv[1]); "
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
    assert time.perf_counter() - t0 < 60
    assert "Traceback" not in p.stderr and f"SIG{sig}: stopping after the step" in p.stderr
    assert steps(out) == [1, 2] and checkpoints(out) == [2]
    if sig == "INT":
        assert cli.main(["train", "--out", out, "--resume"]) == 0
        assert metrics(out) == metrics(finished)


def test_a_second_signal_quits_at_once_without_tracebacks():
    code = ("import os, signal, time\nfrom vpo.rl.stopping import StopSignals\n"
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

    model, tok, info = ckpt_lib.load_model(os.path.join(finished, "policy"))

    def save_then_die(self, folder):  # tokenizer.json written, then the process is gone
        self.backend.save(os.path.join(str(folder), "tokenizer.json"))
        raise KeyboardInterrupt

    monkeypatch.setattr(Tokenizer, "save", save_then_die)
    from flax import nnx

    target = str(tmp_path / "policy")
    with pytest.raises(KeyboardInterrupt):
        ckpt_lib.save_policy(target, model.cfg, nnx.state(model, nnx.Param), {"steps": 6},
                             tokenizer=tok)
    assert not os.path.exists(target) and not run_folder.policy_complete(target)
    monkeypatch.undo()
    ckpt_lib.save_policy(target, model.cfg, nnx.state(model, nnx.Param), {"steps": 6},
                         tokenizer=tok)  # a new export replaces the leftovers
    assert run_folder.policy_complete(target) and not os.path.exists(ckpt_lib.partial_dir(target))


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
    ckpt_lib.load_model(f"hf:{folder}")


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
    assert "no checkpoint restores, all are damaged" in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr) < 5000, p.stderr[:3000]


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


def test_a_full_disk_names_the_folder_and_how_to_continue(monkeypatch, tmp_path, capsys):
    """[Errno 28] without a file name (as orbax raises it) names --out and says --resume."""
    import errno

    from vpo.cli import main as cli
    from vpo.rl import loop

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(loop, "train", full)
    out = str(tmp_path / "run")
    assert cli.main(["train", "--preset", "smoke", "--compile-cache", "", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and out in err and "--resume" in err
