"""vpo.env.from_verifiers_v1 and vpo.rl.env_served: a verifiers 0.4 environment
(tests/fixtures/vf1_guess_env.py, a `verifiers.v1` taskset and an in-process chat harness)
runs through vpo's own endpoint: the episodes' tokens are what the server returned, the masks
cover the completions only, the task's rewards are the reward vector, and `vpo train --env`
runs it with GRPO and VPO. Skipped without verifiers >= 0.4 (CI installs it in .venv-vf4)."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

vf = pytest.importorskip("verifiers.v1", reason="needs verifiers 0.4: pip install "
                         "'verifiers==0.4.0' (its own venv: it pins mcp and many others)")
pytest.importorskip("uvicorn", reason="vpo serve's extra: pip install -e '.[serve]'")

from flax import nnx  # noqa: E402

from vpo.env.base import check_environment, load_env_factory  # noqa: E402
from vpo.env.from_verifiers_v1 import (  # noqa: E402
    episode_tokens,
    from_verifiers_v1,
    trace_rewards,
)
from vpo.env.task import make_env_task  # noqa: E402
from vpo.errors import EnvError  # noqa: E402
from vpo.io import hf  # noqa: E402
from vpo.io.tokenizer import left_pad  # noqa: E402
from vpo.rl import env_served  # noqa: E402

HERE = pathlib.Path(__file__).parent.parent
FIXTURE = HERE / "fixtures" / "hf" / "qwen2_tied"
GUESS = f"{HERE / 'fixtures' / 'vf1_guess_env.py'}:load_environment"
SINGLE = f"{HERE / 'fixtures' / 'vf1_guess_env.py'}:load_single"
BRIEF = f"{HERE / 'fixtures' / 'vf1_guess_env.py'}:load_brief"


def test_a_v1_env_maps_to_rows_prompt_and_weighted_rewards():
    """`--env` dispatches a verifiers.v1 Env to the adapter: the taskset's tasks are the rows,
    the prompt is the system prompt then the prompt, the task's @vf.reward methods are the
    components with their weights; its episodes run through the endpoint, not vpo's step."""
    make = load_env_factory(GUESS)
    assert make.through_endpoint
    ep = make()
    assert check_environment(ep, "e") == (("brief", "few_guesses", "found"), (0.1, 0.3, 0.6))
    rows = ep.problems(0, 3)
    assert [r["answer"] for r in rows] == ["1", "2", "3"]
    assert ep.reset(rows[1]) == [{"role": "system", "content": "Answer with one digit."},
                                 {"role": "user", "content": "Guess my number from 1 to 9."}]
    assert ep.task(rows[1]).data.answer == "2"
    with pytest.raises(EnvError, match="endpoint"):
        ep.step([])
    task = make_env_task(GUESS)
    assert task.reward_names == ("brief", "few_guesses", "found")


def test_bad_weights_and_rewards_are_named():
    class Neg(vf.Task):
        @vf.reward(weight=-1.0)
        async def wrong(self, trace) -> float:
            return 0.0

    class Row:
        def __init__(self, **scores):
            self.rewards = {k: vf.Reward(score=v) for k, v in scores.items()}

    from vpo.env.from_verifiers_v1 import reward_spec

    with pytest.raises(EnvError, match="weight -1.0"):
        reward_spec(Neg(vf.TaskData(prompt="x")), "E")
    for scores, words in (({"a": 1.5}, r"in \[0, 1\]"), ({"a": float("nan")}, "finite"),
                          ({"a": 1.0, "b": 0.5}, "besides")):
        with pytest.raises(EnvError, match=words):
            trace_rewards(Row(**scores), ["a"], "E", 3)
    assert trace_rewards(Row(a=0.25), ["a"], "E", 0) == [0.25]
    with pytest.raises(EnvError, match="not a verifiers.v1 Env"):
        from_verifiers_v1(object())


def test_the_training_sequence_is_the_last_request_and_masks_what_it_holds_as_sampled():
    """The last request's prompt then completion; an earlier completion is masked only where
    the last prompt holds it, after the same prompt, as sampled (else it is context)."""
    prompt = [1, 2]
    calls = [{"prompt_token_ids": [1, 2], "token_ids": [5, 6], "logprobs": [-0.5, -0.6]},
             {"prompt_token_ids": [1, 2, 5, 6, 9], "token_ids": [7], "logprobs": [-0.7]},
             {"prompt_token_ids": [1, 2, 5, 6, 9, 8, 9], "token_ids": [3, 4],
              "logprobs": [-0.3, -0.4]}]  # the second completion re-rendered as 8: context
    ep = episode_tokens(calls, prompt, 8, "E", 0)
    assert ep["tokens"][:ep["length"]].tolist() == [5, 6, 9, 8, 9, 3, 4]
    assert ep["mask"].tolist() == [True, True, False, False, False, True, True, False]
    np.testing.assert_allclose(ep["logp"][ep["mask"]], [-0.5, -0.6, -0.3, -0.4])
    assert ep["trained"] == 2 and ep["finished"]
    cut = episode_tokens(calls, prompt, 6, "E", 0)
    assert cut["mask"].tolist() == [True, True, False, False, False, True] and not cut[
        "finished"]
    with pytest.raises(EnvError, match="row's prompt"):
        episode_tokens(calls, [1, 3], 8, "E", 0)


@pytest.fixture(scope="module")
def policy():
    return hf.from_pretrained(FIXTURE, dtype="float32"), hf.load_tokenizer(FIXTURE)


def _run(policy, monkeypatch, spec, T, G=2, rows=2, context=0, engines=None):
    model, tok = policy
    make = load_env_factory(spec)
    recs = make().problems(0, rows)
    ids = [tok.prompt_ids(make().reset(r)) for r in recs]
    prompt_BP, mask_BP = left_pad(ids, None, tok.pad_id)
    seen = []

    class Keep(env_served.Recorder):  # kept to compare with what the server answered
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self)

    monkeypatch.setattr(env_served, "Recorder", Keep)
    if engines is not None:
        from vpo.serve import engine as engine_lib

        class Seen(engine_lib.Engine):  # the served engine, to read its capacity
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                engines.append(self)

        monkeypatch.setattr(engine_lib, "Engine", Seen)
    ep, trained = env_served.run_served_episodes(
        model, tok, make, recs, G, prompts=(prompt_BP, mask_BP), max_tokens=T, seed=3,
        where=spec, context=context)
    return ep, trained, seen[0].calls, ids


def _same_as_the_trainer(policy, ep):
    """The policy's forward pass over the rollout gives the server's log-probs on the trained
    tokens (the layout is right), and the rollout's entropies are that pass's (not 0)."""
    graphdef, state = nnx.split(policy[0])
    r = ep.rollout
    logp, entropy = env_served.token_logp_entropy_jit(graphdef, state, jnp.asarray(ep.prompt_BP),
                                                      jnp.asarray(ep.prompt_mask_BP),
                                                      r.tokens_BGT)
    mask = np.asarray(r.mask_BGT)
    np.testing.assert_allclose(np.asarray(logp)[mask], np.asarray(r.logp_BGT)[mask], atol=2e-4)
    got = np.asarray(r.entropy_BGT)
    np.testing.assert_allclose(got[mask], np.asarray(entropy)[mask], rtol=1e-5, atol=1e-6)
    assert (got[mask] > 0).all() and (got[~mask] == 0).all()


@pytest.mark.slow
def test_single_turn_episodes_hold_the_tokens_the_server_sampled(policy, monkeypatch):
    engines = []
    ep, trained, calls, ids = _run(policy, monkeypatch, SINGLE, T=16, engines=engines)
    B, G, T = ep.rollout.tokens_BGT.shape
    assert (B, G, T) == (2, 2, 16) and (ep.turns_BG == 1).all() and (trained == 1).all()
    P = ep.prompt_BP.shape[1]  # the rows' prompt length: the slots hold P + 2 T positions,
    assert engines[0].prompt_len == P + 16 < policy[0].cfg.max_seq_len - 16  # not 128 - T
    assert engines[0].max_new_tokens == 16
    answers = {tuple(body["choices"][0]["token_ids"]) for bodies in calls.values()
               for body in bodies}
    mask = np.asarray(ep.rollout.mask_BGT)
    tokens = np.asarray(ep.rollout.tokens_BGT)
    for b, g in np.ndindex(B, G):
        said = tuple(tokens[b, g][mask[b, g]].tolist())
        assert said in answers and mask[b, g, :len(said)].all()  # the completion, from 0
    bodies = [body for bodies in calls.values() for body in bodies]
    assert all(body["prompt_token_ids"] == ids[0] for body in bodies)  # every row: one prompt
    logp = np.asarray(ep.rollout.logp_BGT)[mask]
    assert np.isfinite(logp).all() and (logp <= 0).all() and (logp < 0).any()
    _same_as_the_trainer(policy, ep)
    assert ep.applies_BGR.all() and ((ep.rewards_BGR >= 0) & (ep.rewards_BGR <= 1)).all()
    np.testing.assert_allclose(ep.rewards_BGR[..., 1], 1.0)  # few_guesses: one guess
    assert ep.messages[0][0][-1]["role"] == "assistant"


@pytest.mark.slow
def test_multi_turn_episodes_train_on_their_last_request(policy, monkeypatch):
    """Up to three turns of 6 tokens (the harness's max_tokens) with its hints between them:
    the rollout is the last request's prompt and completion after the row's prompt; the last
    completion is masked in as the server sampled it, and the hints are context."""
    ep, trained, calls, _ = _run(policy, monkeypatch, BRIEF, T=54)
    B, G, _ = ep.rollout.tokens_BGT.shape
    assert ep.turns_BG.max() >= 2 and (trained >= 1).all()
    hints = {m["content"] for b in range(B) for g in range(G) for m in ep.messages[b][g][2:]
             if m["role"] == "user"}
    assert hints and hints <= {"higher", "lower", "Say a number from 1 to 9."}
    assert ep.observation_tokens_BG.max() > 0
    mask = np.asarray(ep.rollout.mask_BGT)
    tokens = np.asarray(ep.rollout.tokens_BGT)
    _same_as_the_trainer(policy, ep)
    lasts = {tuple(bodies[-1]["choices"][0]["token_ids"]) for bodies in calls.values()}
    for b, g in np.ndindex(B, G):
        n = int(np.nonzero(mask[b, g])[0].max()) + 1
        run = [i for i in range(n) if mask[b, g, i]]
        tail = []
        for i in reversed(run):  # the last masked span: the last completion (cut at T)
            if tail and i != tail[-1] - 1:
                break
            tail.append(i)
        said = tuple(tokens[b, g][sorted(tail)].tolist())
        assert any(last[:len(said)] == said for last in lasts)


@pytest.mark.slow
def test_an_episode_that_outgrows_the_served_context_is_named(policy, monkeypatch):
    """sampler.served_context one position over the rows' prompt and T: the second turn's
    prompt (the first answer and a hint added) is over what the server holds, and the run ends
    with the setting named, not an OOM or a bare 400."""
    from vpo.config import ConfigError

    model, tok = policy
    make = load_env_factory(BRIEF)
    P = max(len(tok.prompt_ids(make().reset(r))) for r in make().problems(0, 2))
    with pytest.raises(ConfigError, match=rf"over the {P + 1} the served policy holds "
                       r"\(sampler.served_context"):
        _run(policy, monkeypatch, BRIEF, T=54, context=P + 54 + 1)


def _train(out, spec, *extra):
    cmd = [sys.executable, "-m", "vpo.cli.main", "train", "--env", spec,
           f"model=hf:{FIXTURE}", "train.batch_size=2", "sampler.num_samples=4",
           "sampler.max_new_tokens=24", "--out", str(out),
           "--compile-cache", jax.config.jax_compilation_cache_dir or "", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""})


@pytest.mark.slow
def test_vpo_train_runs_a_verifiers_v1_environment(tmp_path):
    """`vpo train --env MODULE:load_single`: GRPO for 2 steps and VPO over sets of 2
    episodes, the task's rewards logged, every completion trained on, a finite loss, and the
    server's log-probs the trainer's (PPO ratio 1 on the first epoch)."""
    for name, extra in (("grpo", ["train.steps=2"]),
                        ("vpo", ["train.steps=1", "objective.advantage=vpo", "--env-set", "2"])):
        r = _train(tmp_path / name, SINGLE, *extra)
        assert r.returncode == 0, r.stderr[-2000:]
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").open()]
        for m in rows:
            assert all(f"reward/{k}" in m for k in ("brief", "few_guesses", "found")), m
            assert m["env/turns_trained"] == 1.0 and np.isfinite(m["loss"])
            assert m["response_length"] > 0 and abs(m["ratio_mean"] - 1.0) < 1e-4
