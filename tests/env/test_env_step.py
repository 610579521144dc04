"""The environment step: VPO's sets of episodes, the shipped calculator environment, and
`vpo train --env` end to end (GRPO and VPO, exact resume, bad settings named)."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from vpo.env import calculator
from vpo.objectives import vpo_advantages
from vpo.rl.env_step import episode_sets

FIXTURE = pathlib.Path(__file__).parent.parent / "fixtures" / "hf" / "qwen2_tied"


def test_episode_sets_give_each_episode_its_sets_value():
    """G = 4 episodes, m = 2: episodes (0, 1) and (2, 3) are sets; VPO's advantage of each
    episode is its set's, and equals VPO over the G/m sets of m answers directly."""
    rng = np.random.default_rng(0)
    r_BGR = rng.uniform(size=(3, 4, 2)).astype(np.float32)
    a_BGR = np.ones_like(r_BGR, bool)
    rewards_BGMR, smask_BGM, applies = episode_sets(r_BGR, a_BGR, 2)
    assert rewards_BGMR.shape == (3, 4, 2, 2) and smask_BGM.all() and applies.all()
    np.testing.assert_array_equal(rewards_BGMR[:, 1], r_BGR[:, 0:2])
    np.testing.assert_array_equal(rewards_BGMR[:, 2], r_BGR[:, 2:4])
    w = jax.random.dirichlet(jax.random.key(1), np.ones(2), (3, 100))
    adv_BG, _ = vpo_advantages(None, rewards_BGMR, smask_BGM, weights_BKR=w)
    sets_BGMR = r_BGR.reshape(3, 2, 2, 2)
    adv_sets, _ = vpo_advantages(None, sets_BGMR, np.ones((3, 2, 2), bool), weights_BKR=w)
    adv_BG = np.asarray(adv_BG)
    np.testing.assert_allclose(adv_BG[:, 0], adv_BG[:, 1])
    np.testing.assert_allclose(adv_BG[:, ::2], np.asarray(adv_sets), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="multiple of 3"):
        episode_sets(r_BGR, a_BGR, 3)


def test_calculator_scores_the_conflict():
    env = calculator.make_env()
    row = {"numbers": [3, 4, 5, 9], "target": 17}
    env.reset(row)
    said = [{"role": "assistant", "content": "calc: 3*4+5"}]
    assert env.step(said) == [{"role": "tool", "content": "= 17"}]
    said += [{"role": "tool", "content": "= 17"},
             {"role": "assistant", "content": "answer: 3*4+5"}]
    assert env.step(said) is None
    assert env.score(said) == pytest.approx([1.0, 1.0, 2 / 3])  # right, but one call paid
    env.reset(row)
    assert env.score([{"role": "assistant", "content": "answer: 17"}]) == [1.0, 0.0, 1.0]
    assert env.score([{"role": "assistant", "content": "answer: 9+9-1"}]) == [1.0, 0.0, 1.0]
    assert calculator.evaluate("__import__('os')") == (None, [])
    rows = env.problems(0, 20)
    assert len(rows) == 20 and all(len(r["numbers"]) == 4 for r in rows)


def _train(out, *extra, env="vpo.env.calculator:make_env"):
    cmd = [sys.executable, "-m", "vpo.cli.main", "train", "--env", env,
           f"model=hf:{FIXTURE}", "train.batch_size=2", "sampler.num_samples=4",
           "sampler.max_new_tokens=24", "train.checkpoint_every=1", "--out", str(out),
           "--compile-cache", jax.config.jax_compilation_cache_dir or "", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""})


def _rows(out):
    return [json.loads(line) for line in (pathlib.Path(out) / "metrics.jsonl").open()]


@pytest.mark.slow
def test_train_on_an_environment_resumes_exactly(tmp_path):
    """GRPO on the calculator: 3 straight steps equal 2 steps then --resume to 3 (the same
    episodes, rewards and loss), the second run with its environments in 2 worker processes
    (`--env-workers 2`, kept on resume); the metrics carry the episodes' turns; VPO runs over
    sets of 2 episodes."""
    straight = _train(tmp_path / "a", "train.steps=3")
    assert straight.returncode == 0, straight.stderr[-2000:]
    part = _train(tmp_path / "b", "train.steps=2", "--env-workers", "2")
    assert part.returncode == 0, part.stderr[-2000:]
    resumed = subprocess.run([sys.executable, "-m", "vpo.cli.main", "train", "--out",
                              str(tmp_path / "b"), "--resume", "train.steps=3"],
                             capture_output=True, text=True, timeout=600,
                             env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""})
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    for key in ("reward", "loss", "env/turns", "reward/hit", "reward/few_calls"):
        assert [r[key] for r in a] == [r[key] for r in b], key
    assert all(r["env/turns"] >= 1 for r in a)
    evaluated = subprocess.run(  # its own environment, from the policy's record
        [sys.executable, "-m", "vpo.cli.main", "eval", "--policy", str(tmp_path / "a" / "policy"),
         "--problems", "2", "--budget", "2", "--out", str(tmp_path / "ev")],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""})
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    table = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert list(table.values())[0]["valid_fraction"] == 1.0
    vpo = _train(tmp_path / "v", "train.steps=1", "objective.advantage=vpo", "--env-set", "2")
    assert vpo.returncode == 0, vpo.stderr[-2000:]
    sample = json.loads((tmp_path / "v" / "samples.jsonl").read_text().splitlines()[0])
    assert sample["messages"][0]["role"] == "user" and "turns" in sample


def test_eval_scores_episodes_as_candidates():
    """`evaluate_policy` on an environment task: every candidate one episode the environment
    scored, best@k / pass@k over them; --answers other than 1 refused by name."""
    from vpo.eval.policies import evaluate_policy
    from vpo.io.policy_folder import load_model
    from vpo.launch.rules import load_task

    spec = f"hf:{FIXTURE}"
    model = load_model(spec)[0]
    task = load_task("env", spec, {"env": "vpo.env.calculator:make_env", "max_turns": 2})
    rows = task.make_problems(0, 2)
    out = evaluate_policy(model, task, rows, num_answers=1, budget=2, ks=[1, 2],
                          key=jax.random.key(0), max_new_tokens=12)
    assert out["valid_fraction"] == 1.0
    assert 0.0 <= out["best@1"] <= out["best@2"] <= 1.0 and 0.0 <= out["pass@2"] <= 1.0
    with pytest.raises(Exception, match="one episode"):
        evaluate_policy(model, task, rows, num_answers=2, budget=2, ks=[1],
                        key=jax.random.key(0), max_new_tokens=12)


@pytest.mark.parametrize("extra, words", [
    (["objective.advantage=vpo"], "--env-set m >= 2"),
    (["--reward", "r.py:f"], "--reward with --env"),
    (["--env-set", "3"], "multiple of 3"),
])
def test_bad_environment_settings_are_named(tmp_path, extra, words):
    r = _train(tmp_path / "x", "train.steps=1", *extra)
    assert r.returncode == 2 and words in r.stderr, r.stderr[-1500:]


def test_an_environment_that_cannot_be_loaded_is_named(tmp_path):
    bad = tmp_path / "env.py"
    bad.write_text("def make_env():\n    return object()\n")
    r = _train(tmp_path / "x", "train.steps=1", env=f"{bad}:make_env")
    assert r.returncode == 2 and "lacks reset, step, score" in r.stderr, r.stderr[-1500:]
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())


def test_retrieval_needs_two_hops_and_scores_the_conflict():
    from vpo.env import retrieval

    env = retrieval.make_env()
    person = env.problems(0, 1)[0]["person"]
    city, country = env.facts[person]
    assert env.reset({"person": person})[0]["content"].startswith("In which country")
    first = env.step([{"role": "assistant", "content": f"search: {person}"}])
    assert f"{person} was born in {city}." in first[0]["content"] and first[0]["role"] == "tool"
    second = env.step([{"role": "assistant", "content": f"search: {city} city"}])
    assert f"{city} is a city in {country}." in second[0]["content"]
    final = [{"role": "assistant", "content": f"{city}, so\nanswer: {country}"}]
    assert env.step(final) is None
    assert env.score(final) == pytest.approx([1.0, 1.0, 1 / 3])
    env.reset({"person": person})  # a guess without searching: cheap, unbridged
    assert env.score([{"role": "assistant", "content": "answer: nowhere"}]) == [0.0, 0.0, 1.0]


def _avals(tree):
    return jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), tree)


def test_plan_builds_the_programs_the_step_runs(monkeypatch):
    """`vpo plan`'s environment programs (`vpo.accel.env_build`, from abstract inputs) take
    the shapes, dtypes and static settings one environment step calls its jits with: the
    episode prefill, every advance (at a queue width the plan lists) and the update."""
    import jax.numpy as jnp

    from vpo.accel import build, env_build
    from vpo.env import episode
    from vpo.launch.assemble import assemble_run
    from vpo.model import sharding
    from vpo.rl import step as step_lib
    from vpo.rl.env_step import make_env_rl_step

    B, G, T = 2, 4, 24
    a = assemble_run(None, None, [f"model=hf:{FIXTURE}", f"train.batch_size={B}",
                                  f"sampler.num_samples={G}", f"sampler.max_new_tokens={T}"],
                     dataset={"env": "vpo.env.calculator:make_env"})
    run, task = a.run, a.task
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    ctx, update = env_build.env_build(run, task, mesh)
    calls: dict[str, list] = {"prefill_episodes": [], "advance_episodes": []}
    for name, fn in ((n, getattr(episode, n)) for n in calls):
        monkeypatch.setattr(episode, name, lambda *a, _n=name, _f=fn, **k: calls[_n].append(
            (a, k)) or _f(*a, **k))
    tx = step_lib.make_optimizer(run.train)
    graphdef, state, _ = step_lib.init_state(run.model, tx, mesh, seed=run.train.seed)
    batch = jax.tree.map(jnp.asarray, build.rl_batch(run, task, B))
    step = make_env_rl_step(graphdef, tx, task, step_lib.step_config(run, task),
                            task.make_problems(run.train.seed, 64))
    rollout = step.sample(state, batch)
    rewards, smask, _ = step.score(batch, rollout)

    prefill = env_build.prefill_program(ctx)
    ((args, kw),) = calls["prefill_episodes"]
    assert args[0] == prefill.args[0] and kw == prefill.kwargs
    assert _avals(args[1:]) == _avals(prefill.args[1:])
    carry = env_build.carry_of(ctx, build.Built("env_prefill"), mesh)
    assert calls["advance_episodes"]
    for args, kw in calls["advance_episodes"]:
        width = args[3].shape[-1]
        assert width in episode.queue_widths(T), width
        advance = env_build.advance_program(ctx, carry, width, mesh)
        assert args[0] == advance.args[0] and kw == advance.kwargs
        assert _avals(args[1:]) == _avals(advance.args[1:])
    assert ctx.shapes.widths == (8, 32) and episode.queue_widths(T) == (8, 16, 32)
    assert _avals((state, batch, rollout, jnp.asarray(rewards), jnp.asarray(smask))) == (
        _avals(update.args))


@pytest.mark.slow
def test_the_environment_step_builds_ahead_of_time():
    """`vpo plan`'s environment step (`vpo.accel.program_report.built_programs`, rl_step of an
    --env run) compiled
    ahead of time for this host's 8 CPU devices (a data mesh; the advance takes the prefill's
    compiled layout); the TPU / H100 builds are tests/accel/test_accel.py's."""
    from vpo.accel.program_report import built_programs
    from vpo.launch.assemble import assemble_run
    from vpo.model import sharding

    a = assemble_run(None, None, [f"model=hf:{FIXTURE}", "train.batch_size=8",
                                  "sampler.num_samples=2", "sampler.max_new_tokens=16"],
                     dataset={"env": "vpo.env.calculator:make_env"})
    mesh = sharding.make_mesh(devices=jax.devices()[:8])
    built = built_programs("rl_step", a.run, a.task, mesh)
    assert [b.name for b in built] == ["env_prefill", "env_advance (queue 8)",
                                       "env_advance (queue 16)", "env_update"]
    assert all(b.error is None for b in built), [b.error for b in built]


def test_sample_prints_episodes_turn_by_turn(capsys):
    from vpo.cli.main import main

    rc = main(["sample", "--policy", f"hf:{FIXTURE}", "--env", "vpo.env.calculator:make_env",
               "--env-turns", "2", "--prompts", "1", "--samples", "2", "--max-new-tokens", "16"])
    out = capsys.readouterr()
    assert rc == 0, out.err[-2000:]
    assert out.out.count('[user] "Reach') == 2 and "[assistant]" in out.out
    assert out.out.count("w*·r") == 2 and "given_only" in out.out
    assert main(["sample", "--env", "vpo.env.calculator:make_env"]) != 0
    assert "pass --policy" in capsys.readouterr().err


LONG_REPLY_ENV = '''
class LongReply:
    reward_names, weights = ("said",), (1.0,)

    def problems(self, seed, n):
        return [{"i": i} for i in range(n)]

    def reset(self, row):
        return [{"role": "user", "content": "Say something."}]

    def step(self, messages):
        return [{"role": "user", "content": "REPLY " * 300}]

    def score(self, messages, truncated=False):
        return [0.0 if truncated else 1.0]

def make_env():
    return LongReply()
'''


def test_sample_prints_no_observation_the_model_never_saw(capsys, tmp_path):
    """An observation too long to answer after (the budget is 24 tokens) cuts the episode off:
    `vpo sample` prints the conversation the model saw, ending with its message, and the
    environment's score was told (truncated=True scores 0)."""
    from vpo.cli.main import main

    (tmp_path / "long_env.py").write_text(LONG_REPLY_ENV)
    rc = main(["sample", "--policy", f"hf:{FIXTURE}", "--env",
               f"{tmp_path / 'long_env.py'}:make_env", "--env-turns", "3", "--prompts", "1",
               "--samples", "4", "--max-new-tokens", "24"])
    out = capsys.readouterr()
    assert rc == 0, out.err[-2000:]
    assert "REPLY" not in out.out
    cut = [line for line in out.out.splitlines() if "(cut off" in line]
    assert cut and all("w*·r 0.00" in line for line in cut)
