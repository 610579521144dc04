"""Checkpoints: resume is exact, and an interrupted save leaves the previous one restorable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from vpo.config import ObjectiveConfig, RunConfig, SamplerConfig, TrainConfig, model_preset
from vpo.io import policy_folder, run_checkpoint
from vpo.launch import assemble, rules
from vpo.model import sharding
from vpo.rl import step as step_lib
from vpo.run import data as data_lib
from vpo.run import loop as loop_lib
from vpo.tasks import make_task
from vpo.tasks.bound import bind, seq_len_for
from vpo.tasks.words import task_word_tokenizer

M = 2


def setup():
    raw = make_task("bandit", max_answers=4)
    task = bind(raw, task_word_tokenizer(raw))
    seq_len = seq_len_for(task, task.make_problems(0, 64), M)
    run = RunConfig(
        model=model_preset("tiny", vocab_size=task.tokenizer.size, max_seq_len=seq_len),
        sampler=SamplerConfig(max_new_tokens=task.completion_len(M), num_samples=8),
        objective=ObjectiveConfig(advantage="grpo"),
        train=TrainConfig(batch_size=4, num_answers=M, num_problems=64, learning_rate=3e-3,
                          steps=6, num_minibatches=2, grad_accum=2, checkpoint_every=2,
                          keep_checkpoints=2, schedule="cosine", warmup_steps=2))
    return task, run, sharding.make_mesh(devices=jax.devices()[:1])


def leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(state)]


TIMING = ("step_time_s", "tokens_per_s", "sampling_time_s", "update_time_s")


def rows(path):
    """metrics.jsonl rows without the wall-clock timings (those differ between any two runs)."""
    with open(os.path.join(path, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in lines]


def test_resume_is_exact(tmp_path):
    """6 steps straight == 4 steps (interrupted after the step-4 checkpoint, with step 5 logged
    but never saved) + resume for the remaining 2: same metrics, params, optimiser and rng."""
    task, run, mesh = setup()
    a, b = str(tmp_path / "straight"), str(tmp_path / "resumed")
    _, s_straight = loop_lib.train(run, a, task=task, mesh=mesh, progress=False)
    loop_lib.train(run, b, task=task, mesh=mesh, progress=False, stop_at=5)
    # simulate a crash after step 5: drop its exit checkpoint so step 4 is the latest
    mngr = run_checkpoint.CheckpointManager(os.path.join(b, "checkpoints"))
    assert mngr.all_steps()[-2:] == [4, 5]
    mngr._mngr.delete(5)
    mngr.close()
    _, s_resumed = loop_lib.train(run, b, resume=True, task=task, mesh=mesh, progress=False)
    ra, rb = rows(a), rows(b)
    assert [r["step"] for r in rb] == [1, 2, 3, 4, 5, 6]
    assert ra == rb
    for x, y in zip(leaves(s_straight), leaves(s_resumed), strict=True):
        np.testing.assert_array_equal(x, y)


def test_interrupted_save_keeps_previous_checkpoint(tmp_path):
    task, run, mesh = setup()
    tx = step_lib.make_optimizer(run.train)
    _, state, _ = step_lib.init_state(run.model, tx, mesh)
    it = data_lib.problem_iterator(task, 4, M, num_problems=64)
    directory = str(tmp_path / "ckpt")
    mngr = run_checkpoint.CheckpointManager(directory, keep=3)
    next(it)
    mngr.save(2, state, it, {"a": 1})
    expected_data = it.get_state()
    next(it)
    mngr.save(4, state._replace(step=state.step + 4), it, {"a": 2})
    mngr.wait()
    # an interrupted save: orbax's temporary directory, never renamed or committed
    os.makedirs(os.path.join(directory, "6.orbax-checkpoint-tmp-1234", "state"))
    # a damaged step directory that looks final but holds nothing restorable
    os.makedirs(os.path.join(directory, "8", "state"))
    mngr.close()

    mngr = run_checkpoint.CheckpointManager(directory, keep=3)
    it2 = data_lib.problem_iterator(task, 4, M, num_problems=64)
    restored, step = mngr.restore(state, data_iterator=it2)
    assert step == 4
    assert int(restored.step) == int(state.step) + 4
    for x, y in zip(leaves(state.params), leaves(restored.params), strict=True):
        np.testing.assert_array_equal(x, y)
    assert it2.get_state() == {**expected_data, "next_index": expected_data["next_index"] + 1}
    assert mngr.config(4) == {"a": 2}


def test_policy_folder_carries_its_tokenizer(tmp_path):
    """save_policy(tokenizer=...) writes the tokenizer beside the params; load_model gives back
    (model, tokenizer, info), and tokenizer_for reads a task through it; a folder without one, or
    an hf: checkpoint, load as documented."""
    from flax import nnx

    from vpo.model.decoder import Decoder

    task, run, _ = setup()
    tok = task.tokenizer
    model = Decoder(run.model, rngs=nnx.Rngs(0))
    folder = str(tmp_path / "policy")
    policy_folder.save_policy(folder, run.model, nnx.state(model, nnx.Param), {"steps": 7},
                              tokenizer=tok)
    loaded, got, info = policy_folder.load_model(folder)
    assert info["steps"] == 7 and loaded.cfg == run.model
    for x, y in zip(leaves(nnx.state(model, nnx.Param)), leaves(nnx.state(loaded, nnx.Param)),
                    strict=True):
        np.testing.assert_array_equal(x, y)
    assert (got.stop_ids, got.pad_id, got.bos_id, got.add_bos, got.size) == (
        tok.stop_ids, tok.pad_id, tok.bos_id, tok.add_bos, tok.size)
    records = task.make_problems(3, 4)
    for a, b in zip(task.prompt_arrays(records, M), bind(task.task, got).prompt_arrays(records, M),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(tok.token_bytes(), got.token_bytes(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert rules.tokenizer_for(task.task, folder).encode("A B C") == tok.encode("A B C")
    assert rules.tokenizer_for(task.task, None).size == tok.size  # a preset: the word one
    assert rules.tokenizer_for(task.task, "tiny").size == tok.size

    bare = str(tmp_path / "bare")
    policy_folder.save_policy(bare, run.model, nnx.state(model, nnx.Param))
    with pytest.raises(FileNotFoundError, match="no tokenizer.json beside the policy"):
        policy_folder.load_model(bare)
    (tmp_path / "nothing").mkdir()
    with pytest.raises(FileNotFoundError, match="not a policy folder"):
        policy_folder.load_model(str(tmp_path / "nothing"))

    src = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf", "qwen2_tied")
    hf_model, hf_tok, hf_info = policy_folder.load_model("hf:" + src)
    assert hf_info == {"source": "hf:" + src} and hf_model.cfg.param_dtype == "float32"
    assert hf_tok.stop_ids == (72, 70) and hf_tok.pad_id == 70
    assert rules.tokenizer_for(task.task, "hf:" + src).stop_ids == (72, 70)


KILL_RUN = ["--preset", "smoke", "train.steps=4", "train.checkpoint_every=2"]


def _cli(args):
    return [sys.executable, "-c", "import sys; from vpo.cli.main import main; sys.exit(main())",
            "train", *args]


@pytest.mark.slow
def test_kill_during_save_then_resume(tmp_path):
    """A real `vpo train` process is SIGKILLed while its step-4 (last) checkpoint is being
    written (orbax's temporary directory exists, not yet committed). A new `vpo train --resume`
    restores step 2, the latest complete checkpoint, and finishes the run; its metrics and final
    state equal those of an uninterrupted run."""
    out = tmp_path / "run"
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir or "",
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               XLA_FLAGS="--xla_force_host_platform_device_count=1")  # one device: fast steps
    proc = subprocess.Popen(_cli([*KILL_RUN, "--out", str(out)]), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ckpt_dir = out / "checkpoints"
    deadline = time.monotonic() + 300
    in_flight = None
    while proc.poll() is None and time.monotonic() < deadline:
        names = os.listdir(ckpt_dir) if ckpt_dir.exists() else []
        in_flight = next((n for n in names if n.startswith("4.orbax-checkpoint-tmp")), None)
        if in_flight:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.001)  # the save of even this small state is in flight for a few ms+
    log = proc.communicate(timeout=60)[0]
    assert in_flight, f"never saw the step-4 save in flight (rc {proc.returncode}):\n{log[-3000:]}"
    assert proc.returncode == -signal.SIGKILL
    left = sorted(os.listdir(ckpt_dir))
    assert "4" not in left and "2" in left, left  # killed before the step-4 commit
    assert in_flight in left  # the interrupted save's debris stays behind

    resumed = subprocess.run(_cli(["--out", str(out), "--resume"]), env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    mngr = run_checkpoint.CheckpointManager(str(ckpt_dir))
    assert mngr.latest_step() == 4
    assert "restored step 2" in resumed.stdout, resumed.stdout[-2000:]
    got = rows(out)
    assert [r["step"] for r in got] == [1, 2, 3, 4]

    # the same run uninterrupted, in this process
    plan = assemble.assemble_run("smoke", None, KILL_RUN[2:])
    run, task = plan.run, plan.task
    _, straight = loop_lib.train(run, str(tmp_path / "straight"), task=task, progress=False,
                                 mesh=sharding.make_mesh(devices=jax.devices()[:1]))
    restored, _ = mngr.restore(straight)
    mngr.close()
    assert got == rows(tmp_path / "straight")
    for x, y in zip(leaves(straight), leaves(restored), strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_run_folder_names_its_policy(tmp_path):
    """`resolve_model_spec`: a `vpo train --out` folder (no policy.json, policy/ has one) means
    its policy/; a policy folder, an unfinished run and hf: specs stay as given."""
    from vpo.io.policy_folder import resolve_model_spec

    run = tmp_path / "run"
    (run / "policy").mkdir(parents=True)
    assert resolve_model_spec(str(run)) == str(run)  # unfinished: no policy yet
    (run / "policy" / "policy.json").write_text("{}")
    assert resolve_model_spec(str(run)) == os.path.join(str(run), "policy")
    assert resolve_model_spec(str(run / "policy")) == str(run / "policy")
    assert resolve_model_spec("hf:/x/y") == "hf:/x/y"


def test_a_failed_writes_leftover_noise_is_dropped_and_other_errors_are_kept():
    """After a checkpoint write fails on a full disk (a named `CheckpointWriteError`), orbax's
    per-array write futures are collected at exit: asyncio logs "Future exception was never
    retrieved" with tensorstore's text (no orbax frame on it), and Python warns that their
    coroutines were never awaited. Both are dropped; an unrelated asyncio error still shows."""
    import gc
    import logging
    import warnings

    from vpo.io.checkpoint_errors import quiet_failed_reads

    quiet_failed_reads()
    logger = logging.getLogger("asyncio")
    disk = ValueError('RESOURCE_EXHAUSTED: Error writing "params.w/0.0.0" in OCDBT database at '
                      'local file "/x/run/checkpoints/4.orbax-checkpoint-tmp/state": No space')
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger.addHandler(handler)
    try:
        logger.error("Future exception was never retrieved\nfuture: <Future finished "
                     f"exception={disk!r}>", exc_info=(ValueError, disk, None))
        assert seen == []
        logger.error("Future exception was never retrieved", exc_info=(
            KeyError, KeyError("mine"), None))
        assert len(seen) == 1
    finally:
        logger.removeHandler(handler)

    async def async_serialize_from_host():
        return None

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_failed_reads()
        never = async_serialize_from_host()
        never.__qualname__ = "async_serialize_from_host.<locals>.write_fragment"
        del never
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
