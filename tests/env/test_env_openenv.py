"""vpo.env.from_openenv: an OpenEnv Environment (tests/fixtures/oe_word_env.py) run in-process
through vpo's interface: reset / step / score from its observations and rewards, the --env
hook, bad returns named, and `vpo train --env` on the tiny model."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

pytest.importorskip("openenv.core.env_server.interfaces",
                    reason="needs OpenEnv: pip install openenv-core")
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from vpo.env.base import call_env, check_environment, load_env_factory  # noqa: E402
from vpo.env.from_openenv import from_openenv, render_observation  # noqa: E402
from vpo.errors import EnvError  # noqa: E402

HERE = pathlib.Path(__file__).parent.parent
FIXTURE = HERE / "fixtures" / "hf" / "qwen2_tied"
WORDS = HERE / "fixtures" / "oe_word_env.py"
sys.path.insert(0, str(HERE / "fixtures"))
from oe_word_env import make_env  # noqa: E402


def _said(text):
    return {"role": "assistant", "content": text}


def test_an_episode_maps_reset_step_score():
    """The row's `word` column goes to reset (a named parameter; `_row` and others do not);
    the one-string-field observation is the text and the action; a miss is observed, a hit
    ends the episode; components: the summed reward, then the metadata reward."""
    ep = make_env()
    assert check_environment(ep, "e") == (("reward", "short"), (0.8, 0.2))
    first = ep.reset({"word": "dog", "other": 1, "_row": 0})
    assert first == [{"role": "system", "content": "Answer with one word."},
                     {"role": "user", "content": "Say the word dog."}]
    msgs = [*first, _said("a cat")]
    assert ep.step(msgs) == [{"role": "user", "content": "no, again"}]
    msgs += [{"role": "user", "content": "no, again"}, _said("dog " * 10)]
    assert ep.step(msgs) is None
    assert ep.score(msgs) == [1.0, 0.0]
    ep = make_env()  # three misses end it with reward 0
    ep.reset({"word": "dog"})
    assert [ep.step([_said("no")]) for _ in range(3)][-1] is None
    assert ep.score([]) == [0.0, 1.0]


def test_the_env_hook_wraps_an_openenv_factory():
    """`--env module.py:WordEnv` (the class is the factory): one environment per episode,
    the defaults (components ("reward",), the role user)."""
    factory = load_env_factory(f"{WORDS}:WordEnv")
    a, b = factory(), factory()
    assert a.env is not b.env and a.reward_names == ("reward",) and a.weights == (1.0,)
    assert a.reset({"word": "x"})[0]["content"] == "Say the word x."


class Move(Action):
    dx: int
    dy: int


class Pos(Observation):
    x: int
    y: int


class Walk(Environment):
    def reset(self, seed=None, episode_id=None, **kw):
        self.p = Pos(x=0, y=0)
        return self.p

    def step(self, action: Move, timeout_s=None, **kw):
        self.p = Pos(x=self.p.x + action.dx, y=self.p.y + action.dy, reward=-1.0,
                     done=action.dx == 0 and action.dy == 0)
        return self.p

    @property
    def state(self):
        return State()


def test_structured_actions_are_json_and_bad_ones_are_told():
    """An action of several fields is read as JSON (the class from step's annotation); the
    observation of several fields is rendered as JSON; an unparsable action is answered, not
    stepped; a negative reward range rescales."""
    ep = from_openenv(Walk, reward_range=(-3, 0), role="tool")()
    assert json.loads(ep.reset({})[0]["content"]) == {"x": 0, "y": 0}
    assert ep.step([_said('{"dx": 1, "dy": 2}')]) == [{"role": "tool",
                                                        "content": '{"x": 1, "y": 2}'}]
    bad = ep.step([_said("go left")])
    assert bad[0]["role"] == "user" and bad[0]["content"].startswith("Invalid action:")
    assert ep.step([_said('{"dx": 0, "dy": 0}')]) is None
    assert ep.score([]) == [pytest.approx(1 / 3)]
    assert render_observation(Pos(x=1, y=1, reward=3.0)) == '{"x": 1, "y": 1}'


class Untyped(Walk):
    def step(self, action, timeout_s=None, **kw):
        return "moved"


@pytest.mark.parametrize("make, call, row, words", [
    (lambda: from_openenv(Untyped), "make_env", None, "parse_action"),
    (lambda: from_openenv(lambda: object()), "make_env", None, "not an OpenEnv Environment"),
    (lambda: from_openenv(Untyped, parse_action=lambda t: Move(dx=1, dy=0)), "step", 3,
     "returned str, not an OpenEnv Observation"),
    (lambda: from_openenv(Walk, reward_range=(0, 1)), "score", 2, "outside reward_range"),
])
def test_bad_environments_are_named(make, call, row, words):
    with pytest.raises(EnvError, match=words) as e:
        ep = call_env("env.py:make_env", "make_env", make())
        ep.reset({})
        call_env("env.py:make_env", "step", ep.step, [_said('{"dx": 1, "dy": 0}')], row=row)
        call_env("env.py:make_env", "score", ep.score, [], row=row)
    assert call in str(e.value) and (row is None or f"row {row}" in str(e.value))
    with pytest.raises(EnvError, match="one weight per component"):
        from_openenv(Walk, weights=(1, 2))


def _train(out, data, *extra):
    cmd = [sys.executable, "-m", "vpo.cli.main", "train", "--env", f"{WORDS}:make_env",
           "--data", str(data), f"model=hf:{FIXTURE}", "train.batch_size=2",
           "sampler.num_samples=4", "sampler.max_new_tokens=24", "--env-turns", "3", "--out",
           str(out), "--compile-cache", jax.config.jax_compilation_cache_dir or "", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""})


@pytest.mark.slow
def test_vpo_train_runs_an_openenv_environment(tmp_path):
    """`vpo train --env oe_word_env.py:make_env --data words.jsonl`: GRPO for 2 steps, the
    components logged and the episodes multi-turn."""
    data = tmp_path / "words.jsonl"
    data.write_text("".join(json.dumps({"word": w}) + "\n" for w in ("cat", "dog", "sun")))
    r = _train(tmp_path / "run", data, "train.steps=2")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert len(rows) == 2 and all("reward/reward" in m and "reward/short" in m
                                  and m["env/turns"] >= 1 for m in rows), rows[-1]
