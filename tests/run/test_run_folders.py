"""Run folders are never lost: a new run refuses a used --out, --resume needs a run and extends
it exactly (train.steps=N), damaged metrics / checkpoints are dropped or named."""

import json
import os
import shutil

import numpy as np
import pytest

from vpo.cli import main as cli
from vpo.errors import CheckpointError, RewardError
from vpo.io.run_checkpoint import CheckpointManager
from vpo.run.metrics_log import read_rows
from vpo.run.stopping import SkipGuard

TIMING = ("step_time_s", "tokens_per_s", "sampling_time_s", "update_time_s", "reward_time_s")
SMOKE = ["--preset", "smoke", "--compile-cache", ""]


def metrics(out):
    return [{k: v for k, v in r.items() if k not in TIMING}
            for r in read_rows(os.path.join(out, "metrics.jsonl"))]


def policy_params(out):
    from flax import nnx

    from vpo.io.policy_folder import load_policy

    model, _ = load_policy(os.path.join(out, "policy"))
    return [np.asarray(x) for x in __import__("jax").tree.leaves(nnx.state(model, nnx.Param))]


def snapshot(folder):
    """{relative path: bytes} of every file under `folder`."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = f.read()
    return out


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted 5-step smoke run."""
    out = str(tmp_path_factory.mktemp("runs") / "straight5")
    assert cli.main(["train", *SMOKE, "train.steps=5", "--out", out]) == 0
    return out


def test_resume_extends_exactly_and_guards_the_folder(straight, tmp_path, capsys):
    out = str(tmp_path / "run")
    assert cli.main(["train", *SMOKE, "--out", out]) == 0  # 3 steps
    before = snapshot(out)
    # a new run into it, a finished run resumed, an unsafe override: refused, nothing touched
    assert cli.main(["train", *SMOKE, "--out", out]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert cli.main(["train", "--out", out, "--resume"]) == 2
    assert "already finished all 3 steps" in capsys.readouterr().err
    assert cli.main(["train", "--out", out, "--resume", "train.learning_rate=0.5"]) == 2
    assert "train.learning_rate: cannot change on --resume" in capsys.readouterr().err
    assert cli.main(["train", "--out", out, "--resume", "train.steps=2"]) == 2
    assert "train.steps: 2 is below step 3" in capsys.readouterr().err
    assert snapshot(out) == before
    # torn final metrics line (a kill mid-write) is dropped; the run extends to 5 steps
    with open(os.path.join(out, "metrics.jsonl"), "a") as f:
        f.write('{"step": 4, "loss": 0.1')
    # the command that started it, with --resume: its overrides must build the recorded run
    assert cli.main(["train", *SMOKE, "sampler.temperature=0.5", "--out", out, "--resume",
                     "train.steps=5"]) == 2
    assert "sampler.temperature differ" in capsys.readouterr().err
    assert cli.main(["train", *SMOKE, "sampler.temperature=1.0", "--out", out, "--resume",
                     "train.steps=5"]) == 0
    assert metrics(out) == metrics(straight)
    for a, b in zip(policy_params(out), policy_params(straight), strict=True):
        np.testing.assert_array_equal(a, b)
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["train"]["steps"] == 5
    # --overwrite replaces it
    assert cli.main(["train", *SMOKE, "train.steps=1", "--out", out, "--overwrite"]) == 0
    assert [r["step"] for r in metrics(out)] == [1]


def test_damaged_newest_checkpoint_falls_back(straight, tmp_path):
    out = str(tmp_path / "run")
    shutil.copytree(straight, out)
    shutil.rmtree(os.path.join(out, "policy"))
    ckpt = os.path.join(out, "checkpoints")
    assert sorted(os.listdir(ckpt)) == ["2", "4", "5"]
    for root, _, files in os.walk(os.path.join(ckpt, "5", "state")):
        for name in files:
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"\0garbage")
    assert cli.main(["train", "--out", out, "--resume"]) == 0
    assert sorted(os.listdir(ckpt)) == ["2", "4", "5", "damaged-5"]  # 5 re-run from 4
    assert metrics(out) == metrics(straight)
    for a, b in zip(policy_params(out), policy_params(straight), strict=True):
        np.testing.assert_array_equal(a, b)


def test_checkpoint_errors_are_named(tmp_path):
    path = tmp_path / "checkpoints"
    path.write_text("not a folder")
    with pytest.raises(CheckpointError, match="is a file, not a checkpoint folder"):
        CheckpointManager(str(path))
    with pytest.raises(CheckpointError, match="no checkpoint to restore"):
        CheckpointManager(str(tmp_path / "empty")).restore({})


def test_metrics_rows_name_a_damaged_middle_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2\n{"step": 3}\n')
    with pytest.raises(CheckpointError, match=r"metrics.jsonl:2: not a metrics row"):
        read_rows(str(path))
    path.write_text('{"step": 1}\n{"step": 2}\n{"st')
    assert [r["step"] for r in read_rows(str(path))] == [1, 2]


class _Task:
    name, reward_names = "toy", ("correct", "short")


def test_skip_guard_stops_after_consecutive_skips_naming_the_component():
    nan = float("nan")
    guard = SkipGuard(3, 2, _Task())  # 2 updates per step: stop on the 2nd all-skipped step
    guard.check(1, {"skipped_updates": 2, "reward/correct": nan, "reward/short": 0.5})
    guard.check(2, {"skipped_updates": 0, "reward/correct": 0.1, "reward/short": 0.5})
    guard.check(3, {"skipped_updates": 2, "reward/correct": nan, "reward/short": 0.5})
    guard.check(4, {"skipped_updates": 2, "reward/correct": nan, "reward/short": 0.5})
    with pytest.raises(RewardError, match=r"train.max_skipped_updates: 4 consecutive updates "
                                          r"were skipped up to step 4 because reward "
                                          r"component\(s\) correct of task 'toy'"):
        guard.check()  # step 4's count is read once the next step is queued (or at the end)
    never = SkipGuard(0, 1, _Task())
    for step in range(1, 10):
        never.check(step, {"skipped_updates": 1})
    never.check()


@pytest.mark.slow
@pytest.mark.heavy  # ~8 min on 2 loaded cores
def test_kill_soak_fast(tmp_path, load_experiment):
    """experiments/kill_soak.py's 3 kill points (a metrics row written, an async checkpoint
    save in flight, orbax's temporary step folder): each resumes bit-exactly."""
    soak = load_experiment("kill_soak")
    results = soak.main(str(tmp_path / "soak"), soak.FAST, log=lambda *a: None)
    assert [r["exact"] for r in results] == [True] * 3, results


def test_checkpoints_under_a_relative_out_path_restore(tmp_path, monkeypatch):
    """`--out runs/x` (relative, as in the quickstart) saves and restores: orbax needs absolute
    paths, so the manager makes them absolute."""
    import jax.numpy as jnp

    from vpo.io.run_checkpoint import CheckpointManager

    monkeypatch.chdir(tmp_path)
    state = {"w": jnp.arange(4.0)}
    mngr = CheckpointManager("runs/rel/checkpoints", async_save=False)
    mngr.save(1, state)
    mngr.wait()
    restored, _ = mngr.restore(state, step=1)
    assert (restored["w"] == state["w"]).all()
