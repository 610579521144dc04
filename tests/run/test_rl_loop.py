"""The RL loop (`vpo.run.loop.train`): a smoke run's metrics, samples, checkpoints and policy
folder; the sequence sized for mutation prompts before any compile; SFT then RL through a
byte-level BPE checkpoint. Shares the RL step tests' tiny shape and helpers (test_rl_step.py), so
the compiles are reused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy as np
import pytest

from tests.rl.test_rl_step import (
    BPE_FIXTURE,
    M,
    bound,
    compact_bandit,
    one_device,
    params_of,
    prompt_len,
    read_jsonl,
    run_config,
)
from vpo.config import (
    ConfigError,
    ObjectiveConfig,
    RunConfig,
    SamplerConfig,
    TrainConfig,
    model_preset,
)
from vpo.io.tokenizer import load_tokenizer
from vpo.rl import checks as rl_checks
from vpo.rl import sft as sft_lib
from vpo.rl import step as step_lib
from vpo.run import data as data_lib
from vpo.run import loop as loop_lib
from vpo.tasks import make_task
from vpo.tasks.bound import bind


@pytest.fixture(scope="module")
def task():
    return compact_bandit()


def test_smoke_train_writes_metrics(task, tmp_path):
    # an entropy bonus gives every step a gradient, whatever the rewards
    run = dataclasses.replace(run_config(task, steps=3, profile_every=2),
                              objective=ObjectiveConfig(entropy_coef=0.01))
    graphdef, state = loop_lib.train(run, str(tmp_path), task=task, mesh=one_device(),
                                      progress=False)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        for key in ("loss", "reward", "entropy", "skipped_updates", "adv_std", "diversity",
                    "truncation_rate", "answers_per_rollout", "reward/first", "clip_frac_high",
                    "high_entropy_frac", "kl_cov_frac", "zero_variance_frac", "step_time_s",
                    "solved_rate", "cov_logp_adv"):
            assert np.isfinite(r[key]), key
        assert r["generated_tokens"] == round(r["response_length"] * 4 * 8)  # B·G rollouts
        np.testing.assert_allclose(r["tokens_per_s"], r["generated_tokens"] / r["step_time_s"])
    # step 2 (profile_every=2) is timed in parts: sampling alone, then the step; so is the last
    # step, which logs a sample (sample_every=10 > 3 steps: a short run still shows one)
    for split in (rows[1], rows[2]):
        assert split["sampling_time_s"] > 0 and split["update_time_s"] >= 0
    assert "sampling_time_s" not in rows[0]
    assert {r["step"] for r in read_jsonl(tmp_path / "samples.jsonl")} == {3}
    assert int(state.step) == 3
    _, fresh, _ = step_lib.init_state(run.model, step_lib.make_optimizer(run.train),
                                       one_device(), seed=run.train.seed)
    moved = [np.abs(a - b).max() for a, b in zip(params_of(state), params_of(fresh), strict=True)]
    assert max(moved) > 0
    assert os.listdir(tmp_path / "tb")
    assert json.loads((tmp_path / "config.json").read_text())["objective"]["advantage"] == "grpo"
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3"]
    # the tokenizer the run read its task through, beside the run and beside the policy
    for folder in (tmp_path, tmp_path / "policy"):
        tok = load_tokenizer(folder)
        assert tok.backend.get_vocab() == task.tokenizer.backend.get_vocab()
        assert (tok.stop_ids, tok.pad_id) == (task.tokenizer.stop_ids, task.tokenizer.pad_id)
    assert json.loads((tmp_path / "policy" / "policy.json").read_text())["steps"] == 3


def test_runs_differing_only_in_seed_share_one_compiled_step(task, tmp_path, monkeypatch):
    """`programs`: the second seed reuses the first's compiled step (no second compile) and
    trains exactly as it does alone; another learning rate is another program."""
    from vpo.rl import host_memory

    compiles = []
    real = host_memory.compile_now
    monkeypatch.setattr(host_memory, "compile_now",
                        lambda *a: compiles.append(1) or real(*a))
    base = run_config(task, steps=2)
    seeded = lambda seed, **kw: dataclasses.replace(  # noqa: E731
        base, train=dataclasses.replace(base.train, seed=seed, **kw))
    programs: dict = {}
    mesh = one_device()
    loop_lib.train(seeded(0), str(tmp_path / "s0"), task=task, mesh=mesh, progress=False,
                   programs=programs)
    first = len(compiles)
    _, shared = loop_lib.train(seeded(1), str(tmp_path / "s1"), task=task, mesh=mesh,
                               progress=False, programs=programs)
    assert len(programs) == 1 and len(compiles) == first  # nothing compiled again
    _, alone = loop_lib.train(seeded(1), str(tmp_path / "alone"), task=task, mesh=mesh,
                              progress=False)
    for a, b in zip(params_of(shared), params_of(alone), strict=True):
        np.testing.assert_array_equal(a, b)
    loop_lib.train(seeded(1, learning_rate=1e-3), str(tmp_path / "lr"), task=task, mesh=mesh,
                   progress=False, programs=programs)
    assert len(programs) == 2


def test_mutation_prompts_need_room_and_an_in_graph_task(tmp_path):
    maze = bound("maze")
    records = maze.make_problems(0, 64)
    T = maze.completion_len(M)
    P = data_lib.prompt_tables(maze, records, M).prompt_len
    P2 = data_lib.prompt_tables(maze, records, M, mutation_fraction=0.25).prompt_len
    run = RunConfig(model=model_preset("tiny", vocab_size=maze.tokenizer.size,
                                       max_seq_len=P + T),
                    sampler=SamplerConfig(max_new_tokens=T),
                    train=TrainConfig(num_answers=M, num_problems=64, mutation_fraction=0.25))
    assert P2 > P
    with pytest.raises(ConfigError, match=fr"longest prompt \({P2} tokens\)"):
        rl_checks.check_run(run, maze, P2)
    rl_checks.check_run(dataclasses.replace(run, train=TrainConfig(num_answers=M)), maze, P)
    # the loop sizes the sequence for the mutation prompts it mixes in (before any compile)
    with pytest.raises(ConfigError, match=fr"longest prompt \({P2} tokens\)"):
        loop_lib.train(run, str(tmp_path / "run"), task=maze, mesh=one_device(), progress=False)
    assert not os.path.exists(tmp_path / "run")
    arith = bound("arithmetic")
    host = dataclasses.replace(run, model=model_preset("tiny", vocab_size=arith.tokenizer.size,
                                                       max_seq_len=4096),
                               sampler=SamplerConfig(max_new_tokens=arith.completion_len(M)))
    with pytest.raises(ConfigError, match="no in-graph mutation prompts"):
        rl_checks.check_run(host, arith, prompt_len(arith))


@pytest.mark.slow  # ~21 s: the slow set (the lean run stays under 15 min)
@pytest.mark.skipif(not os.path.isdir(BPE_FIXTURE),
                    reason="no tests/fixtures/hf/qwen2_bpe/; write it with "
                           ".venv/bin/python tests/fixtures/make_bpe_fixture.py")
def test_sft_then_rl_through_a_bpe_checkpoint_solves_mazes(tmp_path):
    """A random tiny Qwen2 with a real byte-level BPE tokenizer (tags and moves split over several
    tokens, a chat template, pad = `<|endoftext|>` at the END of the vocabulary, two stop ids):
    SFT on maze demonstrations, then RL steps through `vpo.run.loop.train` from the SFT policy; the
    RL rollouts solve mazes, and the policy folder carries the checkpoint's tokenizer."""
    from vpo.io import policy_folder

    model, tok, _ = policy_folder.load_model("hf:" + BPE_FIXTURE)
    assert len(tok.stop_ids) == 2 and tok.pad_id == tok.size - 3
    maze = bind(make_task("maze"), tok)
    t0 = time.perf_counter()
    graphdef, state, losses = sft_lib.run_sft(maze, model.cfg, 100, batch_size=16,
                                                learning_rate=3e-3, num_demos=256,
                                                mutation_fraction=0.0, init=model)
    t_sft = time.perf_counter() - t0
    assert np.mean(losses[-10:]) < 0.25 * np.mean(losses[:5]), losses
    run = RunConfig(model=model.cfg,
                    sampler=SamplerConfig(max_new_tokens=maze.completion_len(1), num_samples=8),
                    objective=ObjectiveConfig(advantage="vpo"),
                    train=TrainConfig(batch_size=4, num_answers=1, num_problems=64, steps=3,
                                      learning_rate=1e-4, profile_every=0,
                                      checkpoint_every=1000),
                    task="maze")
    t0 = time.perf_counter()
    loop_lib.train(run, str(tmp_path), task=maze, mesh=one_device(), progress=False,
                   init=step_lib.model_of(graphdef, state))
    t_rl = time.perf_counter() - t0
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert max(r["solved_rate"] for r in rows) > 0, rows
    assert all(r["answers_per_rollout"] > 0 and r["skipped_updates"] == 0 for r in rows)
    saved = load_tokenizer(tmp_path / "policy")
    assert (saved.stop_ids, saved.pad_id) == (tok.stop_ids, tok.pad_id)
    assert saved.chat_template == tok.chat_template
    print(f"bpe maze: sft {t_sft:.1f}s, rl {t_rl:.1f}s")
