"""vpo.env.from_verifiers: real `verifiers` environments (a ToolEnv with a Python tool, a
MultiTurnEnv subclass) run unchanged through vpo's interface: the rubric's functions as the
reward components and its weights as w*, bad rubrics, rewards and rollouts named, episodes on
the tiny model and `vpo train --env` with GRPO and VPO."""

import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

vf = pytest.importorskip("verifiers", reason="needs verifiers < 0.4: pip install 'verifiers<0.4'")
if not hasattr(vf, "MultiTurnEnv"):
    pytest.skip(f"verifiers {vf.__version__} has no classic API (vf.MultiTurnEnv, verifiers "
                "< 0.4), which the adapter drives", allow_module_level=True)
from datasets import Dataset  # noqa: E402 -- verifiers < 0.4 depends on it

from vpo.env import episode as episode_lib  # noqa: E402
from vpo.env.base import call_env, check_environment, load_env_factory  # noqa: E402
from vpo.env.from_verifiers import from_verifiers  # noqa: E402
from vpo.env.task import make_env_task  # noqa: E402
from vpo.errors import EnvError  # noqa: E402
from vpo.io import hf  # noqa: E402

HERE = pathlib.Path(__file__).parent.parent
FIXTURE = HERE / "fixtures" / "hf" / "qwen2_tied"
GUESS = f"{HERE / 'fixtures' / 'vf_guess_env.py'}:load_environment"


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def correct(completion, answer) -> float:
    said = [m.content or "" for m in completion if m.role == "assistant"]
    return float(bool(said) and answer in said[-1])


async def short(completion, parser) -> float:  # async, and a class object by name
    return 1.0 / len(completion)


def _rows():
    return Dataset.from_list([{"question": "What is 2+3?", "answer": "5"},
                              {"question": "What is 4+4?", "answer": "8"}])


def _tool_env(rubric=None, **kw):
    return vf.ToolEnv(tools=[add], dataset=_rows(), system_prompt="Use the tools.",
                      rubric=rubric or vf.Rubric(funcs=[correct, short], weights=[0.8, 0.2]),
                      **kw)


def _said(text):
    return {"role": "assistant", "content": text}


CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def test_a_tool_env_maps_to_reset_step_score_and_weights():
    """Rows from the env's dataset; the prompt with the tools described; a `<tool_call>` runs
    the Python tool (role "tool"); an answer without a call ends the rollout (ToolEnv's
    no_tools_called); the weighted functions are the components (ToolEnv's weight-0 call
    counters are verifiers metrics, left out)."""
    make = from_verifiers(_tool_env())
    ep = make()
    assert check_environment(ep, "e") == (("correct", "short"), (0.8, 0.2))
    rows = ep.problems(0, 10)
    assert [r["answer"] for r in rows] == ["5", "8"]
    first = ep.reset({**rows[0], "_row": 0})
    assert first[0]["role"] == "system" and first[0]["content"].startswith("Use the tools.")
    assert '"name": "add"' in first[0]["content"] and "<tool_call>" in first[0]["content"]
    assert first[1] == {"role": "user", "content": "What is 2+3?"}
    said = [*first, _said(f"Let me add.\n{CALL}")]
    obs = ep.step(said)
    assert obs == [{"role": "tool", "content": "5"}]
    said += [*obs, _said("It is 5.")]
    assert ep.step(said) is None
    assert ep.score(said) == pytest.approx([1.0, 1 / 3])  # completion: call, result, answer
    state = ep.task.result()
    assert state["completion"][0].tool_calls[0].name == "add"
    assert state["completion"][0].content == "Let me add."
    assert state["stop_condition"] == "no_tools_called"
    ep = make()  # a call that is not JSON: the tool's parse error comes back as its result
    said = [*ep.reset(rows[1]), _said("<tool_call>add 4 4</tool_call>")]
    obs = ep.step(said)
    assert obs[0]["role"] == "tool" and "Expecting value" in obs[0]["content"]
    assert ep.score([*said, *obs, _said("8")]) == pytest.approx([1.0, 1 / 3])
    row = {"question": "What is 1+1?", "answer": "2", "_row": 7}  # a --data row
    assert ep.reset(row)[1:] == [{"role": "user", "content": "What is 1+1?"}]
    assert ep.input["example_id"] == 7 and "_row" not in ep.input
    with pytest.raises(ValueError, match="needs a 'prompt' \\(messages\\) or a 'question'"):
        ep.reset({"text": "What is 1+1?"})


def test_a_multiturn_env_runs_its_own_rollout():
    """setup_state, env_response (user replies) and a @vf.stop condition, as written for
    verifiers; a rollout vpo ends first (turn limit) is ended as overlong and scored."""
    make = load_env_factory(GUESS)  # load_environment returns a vf.Environment: adapted
    ep = make()
    assert (ep.reward_names, ep.weights) == (("found", "few_guesses"), (0.7, 0.3))
    row = ep.problems(0, 9)[5]  # answer 6
    first = ep.reset(row)
    assert [m["role"] for m in first] == ["system", "user"]
    said = [*first, _said("3")]
    assert ep.step(said) == [{"role": "user", "content": "higher"}]
    said += [{"role": "user", "content": "higher"}, _said("I think 6")]
    assert ep.step(said) is None  # the stop condition `guessed`
    assert ep.score(said) == pytest.approx([1.0, 0.75])
    ep = make()  # cut off after one turn: the environment answers it (a guess paid), its
    said = [*ep.reset(row), _said("9")]  # next model request is refused as overlong
    assert ep.score(said) == [0.0, 0.75]
    assert ep.task.result()["stop_condition"] == "prompt_too_long"


@pytest.mark.parametrize("rubric, words", [
    (vf.Rubric(funcs=[correct], weights=[-1.0]), "'correct' has weight -1.0: vpo's w* are "
     "non-negative; reward 1 - correct with weight 1.0"),
    (vf.Rubric(funcs=[lambda completions, answers: [0.0]]), "scores a group of rollouts"),
    (vf.Rubric(funcs=[correct, correct]), "several reward functions are named 'correct'"),
    (vf.Rubric(funcs=[correct], weights=[0.0]), "no reward function of weight > 0"),
])
def test_bad_rubrics_are_named(rubric, words):
    with pytest.raises(EnvError, match=words.replace("*", r"\*").replace(".", r"\.")):
        from_verifiers(_tool_env(rubric))


def test_rubric_groups_are_flattened():
    nested = vf.RubricGroup(rubrics=[vf.Rubric(funcs=[correct], weights=[2.0]), vf.RubricGroup(
        rubrics=[vf.Rubric(funcs=[short], weights=[0.5]), vf.Rubric(funcs=[add], weights=[0])])])
    ep = from_verifiers(_tool_env(nested))()
    assert (ep.reward_names, ep.weights) == (("correct", "short"), (2.0, 0.5))


def test_what_is_not_a_classic_environment_is_named():
    with pytest.raises(EnvError, match="not a classic verifiers environment"):
        from_verifiers(object())
    code = "import sys; sys.modules['verifiers.clients'] = None; import vpo.env.from_verifiers"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "pip install 'verifiers<0.4'" in r.stderr, r.stderr[-1000:]


def _bad(value):
    def bad(completion):
        return value() if callable(value) else value
    return bad


@pytest.mark.parametrize("value, words", [
    (2.0, "'bad' returned 2.0; vpo's components are in [0, 1]: rescale it"),
    (float("nan"), "'bad' returned nan; it must return a finite number"),
    ("yes", "'bad' returned 'yes'"),
    (lambda: 1 / 0, "'bad' raised ZeroDivisionError"),
])
def test_bad_rewards_are_named_with_the_row(value, words):
    env = vf.SingleTurnEnv(dataset=_rows(), rubric=vf.Rubric(funcs=[_bad(value)]))
    ep = from_verifiers(env)()
    said = [*ep.reset(ep.problems(0, 1)[0]), _said("5")]
    assert ep.step(said) is None  # a single turn
    with pytest.raises(EnvError, match=re.escape(f"env.py:make_env: score on dataset row 3 "
                                                 f"raised ValueError: verifiers reward function "
                                                 f"{words}")):
        call_env("env.py:make_env", "score", ep.score, said, row=3)


class Raises(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        raise KeyError("tool")


class Sandbox(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        raise vf.SandboxError("the sandbox is gone")


class Forgets(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        return [vf.UserMessage(content="again")]

    async def get_prompt_messages(self, state):
        messages = await super().get_prompt_messages(state)
        return [messages[0], messages[-1]] if state["trajectory"] else messages  # no history


class Rewrites(Forgets):
    async def setup_state(self, state):
        state["prompt"] = [vf.UserMessage(content="another question")]
        return state

    get_prompt_messages = vf.MultiTurnEnv.get_prompt_messages


@pytest.mark.parametrize("cls, words", [
    (Raises, "step on dataset row 0 raised KeyError: 'tool'"),
    (Sandbox, "ended with verifiers' SandboxError: the sandbox is gone"),
    (Forgets, "does not extend the conversation"),
    (Rewrites, "first request differs from the row's prompt"),
])
def test_bad_rollouts_are_named(cls, words):
    env = cls(dataset=_rows(), rubric=vf.Rubric(funcs=[correct]), max_turns=4)
    ep = from_verifiers(env)()
    said = [*ep.reset(ep.problems(0, 1)[0]), _said("5")]
    with pytest.raises(EnvError, match=words):
        call_env("env.py:make_env", "step", ep.step, said, row=0)


@pytest.fixture(scope="module")
def policy():
    return hf.from_pretrained(FIXTURE, dtype="float32"), hf.load_tokenizer(FIXTURE)


def test_episodes_on_the_tiny_model(policy):
    """The environment task (rows from the env's dataset, no --data) and B × G episodes of
    the guessing game on the tiny model: its user replies fed between turns, each episode
    scored by the rubric; with --env-timeout the rollouts' loop runs on vpo's worker thread."""
    task = make_env_task(GUESS, max_turns=3)
    assert task.reward_names == ("found", "few_guesses")
    np.testing.assert_allclose(task.eval_weights_R, [0.7, 0.3])
    rows = task.make_problems(0, 2)
    assert len(rows) == 2 and task.statement(rows[0])[1]["content"].startswith("Guess")
    make = load_env_factory(GUESS)
    model, tok = policy
    B, G = 2, 2
    ep = episode_lib.run_episodes(
        model, tok, [[make() for _ in range(G)] for _ in range(B)], rows,
        jax.random.split(jax.random.key(0), B * G).reshape(B, G), max_tokens=48, max_turns=3,
        reward_names=task.reward_names, row_ids=[r["_row"] for r in rows], timeout=60)
    assert ep.turns_BG.max() >= 2 and ep.observation_tokens_BG.sum() > 0
    replies = {m["content"] for b in range(B) for g in range(G) for m in ep.messages[b][g][2:]
               if m["role"] == "user"}
    assert replies and replies <= {"higher", "lower", "Say a number from 1 to 9."}
    assert ep.applies_BGR.all() and ((ep.rewards_BGR >= 0) & (ep.rewards_BGR <= 1)).all()


def _train(out, *extra):
    cmd = [sys.executable, "-m", "vpo.cli.main", "train", "--env", GUESS,
           f"model=hf:{FIXTURE}", "train.batch_size=2", "sampler.num_samples=4",
           "sampler.max_new_tokens=24", "--env-turns", "3", "--out", str(out),
           "--compile-cache", jax.config.jax_compilation_cache_dir or "", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""})


@pytest.mark.slow
def test_vpo_train_runs_a_verifiers_environment(tmp_path):
    """`vpo train --env MODULE:load_environment`, the module written for verifiers alone:
    GRPO for 2 steps and VPO over sets of 2 episodes, the rubric's functions logged."""
    for name, extra in (("grpo", ["train.steps=2"]),
                        ("vpo", ["train.steps=1", "objective.advantage=vpo", "--env-set", "2"])):
        r = _train(tmp_path / name, *extra)
        assert r.returncode == 0, r.stderr[-2000:]
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").open()]
        assert all("reward/found" in m and "reward/few_guesses" in m and m["env/turns"] >= 1
                   for m in rows), rows[-1]
