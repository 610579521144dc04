"""RL / SFT trainer: smoke run, learning on the bandit, non-finite guard, host path, mesh, SFT.

All RL tests share one tiny shape (bandit, B=4 prompts, G=8, M=2 answers, T=4, tiny model,
2 minibatches × 2 micro-batches) so the compiles are reused (and hit the persistent cache).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vpo import data as data_lib
from vpo import loop as loop_lib
from vpo import sft as sft_lib
from vpo import sharding
from vpo import train as train_lib
from vpo.config import SamplerConfig, model_preset
from vpo.tasks import answers as answers_lib
from vpo.tasks.bandit import ARM_REWARDS_3R, ARMS, make_bandit_task
from vpo.train_config import ObjectiveConfig, RunConfig, TrainConfig

M = 2


@pytest.fixture(scope="module")
def task():
    return make_bandit_task(max_answers=4)


def run_config(task, advantage="grpo", steps=3, **train_kw) -> RunConfig:
    tcfg = dict(batch_size=4, num_answers=M, num_problems=64, learning_rate=3e-3, steps=steps,
                num_minibatches=2, grad_accum=2, checkpoint_every=1000)
    tcfg.update(train_kw)
    return RunConfig(
        model=model_preset("tiny", vocab_size=task.vocab.size, max_seq_len=16),
        sampler=SamplerConfig(max_new_tokens=task.completion_len(M), num_samples=8),
        objective=ObjectiveConfig(advantage=advantage), train=TrainConfig(**tcfg))


def one_device():
    return sharding.make_mesh(devices=jax.devices()[:1])


def run_steps(task, run: RunConfig, steps: int, mesh=None, host=False):
    """(state, list of metrics dicts as numpy) after `steps` RL steps from a fresh state."""
    mesh = one_device() if mesh is None else mesh
    tx = train_lib.make_optimizer(run.train)
    graphdef, state, _ = train_lib.init_state(run.model, tx, mesh, seed=run.train.seed)
    make = train_lib.make_host_rl_step if host else train_lib.make_rl_step
    step = make(graphdef, tx, task, train_lib.step_config(run, task))
    it = data_lib.problem_iterator(task, run.train.batch_size, M, num_problems=64)
    history = []
    for _ in range(steps):
        state, metrics = step(state, loop_lib.shard_batch(next(it), mesh))
        history.append(metrics)
    return state, [jax.tree.map(np.asarray, m) for m in jax.device_get(history)]


def params_of(state):
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def test_smoke_train_writes_metrics(task, tmp_path):
    run = run_config(task, steps=3)
    graphdef, state = loop_lib.train(run, str(tmp_path), task=task, mesh=one_device(),
                                      progress=False)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        for key in ("loss", "reward", "entropy", "skipped_updates", "adv_std", "diversity",
                    "truncation_rate", "answers_per_rollout", "reward/first", "clip_frac_high"):
            assert np.isfinite(r[key]), key
    assert int(state.step) == 3
    _, fresh, _ = train_lib.init_state(run.model, train_lib.make_optimizer(run.train),
                                       one_device(), seed=run.train.seed)
    moved = [np.abs(a - b).max() for a, b in zip(params_of(state), params_of(fresh))]
    assert max(moved) > 0
    assert os.listdir(tmp_path / "tb")
    assert json.load(open(tmp_path / "config.json"))["objective"]["advantage"] == "grpo"
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3"]


@pytest.mark.parametrize("advantage", ["grpo", "vpo"])
def test_bandit_reward_improves(task, advantage):
    """From a random init most answers are invalid tokens (reward 0); both objectives learn to
    emit valid arms within a few dozen steps."""
    _, history = run_steps(task, run_config(task, advantage, steps=40), 40)
    reward = np.array([h["reward"] for h in history])
    assert reward[-10:].mean() > reward[:10].mean() + 0.1, reward
    assert all(np.isfinite(h["loss"]) for h in history)
    assert sum(int(h["skipped_updates"]) for h in history) == 0


def test_nonfinite_reward_skips_update(task):
    def nan_reward(problem, completion_T, mask_T, num_answers):
        r, m = task.reward(problem, completion_T, mask_T, num_answers)
        return r + jnp.nan, jnp.ones_like(m)  # every answer "valid" with a NaN reward

    bad = dataclasses.replace(task, reward=nan_reward)
    run = run_config(bad, steps=2)
    mesh = one_device()
    tx = train_lib.make_optimizer(run.train)
    _, fresh, _ = train_lib.init_state(run.model, tx, mesh, seed=0)
    state, history = run_steps(bad, run, 2, mesh)
    assert [int(h["skipped_updates"]) for h in history] == [run.train.updates_per_step] * 2
    for a, b in zip(params_of(state), params_of(fresh)):
        np.testing.assert_array_equal(a, b)
    opt_counts = [np.asarray(x) for x in jax.tree.leaves(state.opt_state) if np.ndim(x) == 0]
    assert all(c == 0 for c in opt_counts)  # optimiser state untouched too
    assert int(state.step) == 2


def host_bandit(task):
    """The bandit with its reward moved to the host (on decoded text)."""
    rewards = {arm: ARM_REWARDS_3R[i] for i, arm in enumerate(ARMS)}

    def host_reward(problem, text, num_answers):
        slots = answers_lib.split_answer_words(text, num_answers=num_answers, answer_len=1)
        r = np.zeros((num_answers, 2), np.float32)
        ok = np.zeros((num_answers,), np.bool_)
        for m, words in enumerate(slots):
            if words is not None and words[0] in rewards:
                r[m], ok[m] = rewards[words[0]], True
        return r, ok

    return dataclasses.replace(task, reward=None, host_reward=host_reward)


def test_host_reward_path_matches_in_graph(task):
    run = run_config(task, steps=3)
    s_graph, h_graph = run_steps(task, run, 3)
    s_host, h_host = run_steps(host_bandit(task), run, 3, host=True)
    for a, b in zip(h_graph, h_host):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for a, b in zip(params_of(s_graph), params_of(s_host)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_mesh_of_8_devices_matches_one(task):
    """data=2 × tensor=4 (params sharded over heads/mlp/vocab) vs one device: the same samples and
    rewards; params agree to 1e-5 (float reduction order differs across the mesh)."""
    run = run_config(task, steps=2)
    mesh8 = sharding.make_mesh(data=2, tensor=4)
    s8, h8 = run_steps(task, run, 2, mesh8)
    s1, h1 = run_steps(task, run, 2)
    assert any(len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated
               for x in jax.tree.leaves(s8.params))
    for a, b in zip(h8, h1):
        np.testing.assert_allclose(a["reward"], b["reward"], atol=1e-6)
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-4, atol=1e-5)
    for a, b in zip(params_of(s8), params_of(s1)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_config_errors_name_the_field(task):
    from vpo.config import ConfigError

    with pytest.raises(ConfigError, match="train.batch_size"):
        TrainConfig(batch_size=6, num_minibatches=4)
    with pytest.raises(ConfigError, match="objective.advantage"):
        ObjectiveConfig(advantage="ppo")
    bad = dataclasses.replace(run_config(task), sampler=SamplerConfig(max_new_tokens=1))
    with pytest.raises(ConfigError, match="sampler.max_new_tokens"):
        train_lib.check_run(bad, task)


def test_sft_learns_maze_demonstrations():
    from vpo import sampler
    from vpo.tasks.maze import make_maze_task

    maze = make_maze_task()
    cfg = model_preset("tiny", vocab_size=maze.vocab.size, max_seq_len=64)
    graphdef, state, losses = sft_lib.run_sft(maze, cfg, 150, batch_size=32,
                                                learning_rate=3e-3, num_demos=512)
    assert np.mean(losses[-20:]) < 0.5 * np.mean(losses[:5])
    problems = maze.make_problems(123, 64)
    prompts, mask = data_lib.prompt_arrays(maze, problems, 1)
    rollout = sampler.sample(train_lib.model_of(graphdef, state), prompts, mask,
                             jax.random.key(0), SamplerConfig(maze.completion_len(1), 4),
                             eos_id=2, pad_id=0)
    r, ok = train_lib.in_graph_rewards(maze, problems, rollout.tokens_BGT, rollout.mask_BGT, 1)
    solved = jax.vmap(jax.vmap(jax.vmap(maze.solved)))(r) & ok
    assert float(jnp.mean(solved)) > 0.05


def test_state_from_model_with_kl_reference(task):
    """A TrainState around existing weights; with KL on, the reference stays frozen at them."""
    from flax import nnx

    from vpo.model import Decoder

    base = run_config(task, steps=2)
    run = dataclasses.replace(base, objective=ObjectiveConfig(kl_coef=0.1))
    model = Decoder(run.model, rngs=nnx.Rngs(7))
    init = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
    mesh = one_device()
    tx = train_lib.make_optimizer(run.train)
    graphdef, state, _ = train_lib.state_from_model(model, tx, mesh, with_ref=True)
    step = train_lib.make_rl_step(graphdef, tx, task, train_lib.step_config(run, task))
    it = data_lib.problem_iterator(task, 4, M, num_problems=64)
    for _ in range(2):
        state, metrics = step(state, loop_lib.shard_batch(next(it), mesh))
    assert np.isfinite(float(metrics["kl"])) and float(metrics["kl"]) >= 0
    for a, r in zip(init, jax.tree.leaves(state.ref_params)):
        np.testing.assert_array_equal(a, np.asarray(r))
    assert max(np.abs(a - b).max() for a, b in zip(init, params_of(state))) > 0
