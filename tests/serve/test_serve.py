"""`vpo serve`: the OpenAI endpoints on the tiny preset. A request with a seed gets what
`vpo sample` draws with that seed, its log-probs are the trainer's, concurrent requests through
refilled slots get what each gets alone, bad requests get OpenAI error bodies with their status
and the server keeps serving, a full queue answers 503."""

import argparse
import ast
import concurrent.futures
import contextlib
import io
import json

import jax
import numpy as np
import pytest
from flax import nnx
from starlette.testclient import TestClient

from vpo.cli.main import main
from vpo.cli.serve import add_serve_args, build
from vpo.launch.policy_runs import budget_of
from vpo.rl.step import completion_logp
from vpo.rollout import sampler
from vpo.serve.app import make_app
from vpo.serve.engine import QueueFullError, request_keys
from vpo.tasks.prompts import prompt_text

SEED = 7


def _args(*argv):
    p = argparse.ArgumentParser()
    add_serve_args(p)
    return p.parse_args(list(argv))


@pytest.fixture(scope="module")
def served():
    """(client, engine, limits) of `vpo serve --preset tiny --seed 7` with 4 slots: fewer than
    the rows of the tests' requests, so rows wait and take freed slots."""
    engine, limits = build(_args("--preset", "tiny", "--seed", str(SEED), "--slots", "4",
                                 "--max-tokens", "64", "--max-prompt-tokens", "64",
                                 "--chunk", "4", "--queue", "32"))
    engine.start()
    with TestClient(make_app(engine, limits)) as client:
        yield client, engine, limits
    engine.close()


@pytest.fixture(scope="module")
def url(served):
    """The base URL of the served app under uvicorn on a free local port (a real server, as
    `vpo serve` runs it), for the OpenAI client."""
    from vpo.serve.app import serving

    _, engine, limits = served
    with serving(make_app(engine, limits)) as port:
        yield f"http://127.0.0.1:{port}/v1"


def _reference(engine, prompt, seed, n, max_tokens, **sampling):
    """What the sampler `vpo sample` runs draws for one prompt: keys split from the seed."""
    keys = jax.random.split(jax.random.key(seed), n).reshape(1, n)
    ids = np.asarray([prompt], np.int32)
    tok = engine.tokenizer
    graphdef, state = nnx.split(engine.model)
    ro = sampler.generate_jit(graphdef, state, ids,
                              np.ones_like(ids, bool), keys,
                              np.float32(sampling.get("temperature", 1.0)),
                              np.float32(sampling.get("top_p", 1.0)),
                              np.int32(sampling.get("top_k", 0)), max_new_tokens=max_tokens,
                              stop_ids=tok.stop_ids, pad_id=tok.pad_id)
    mask = np.asarray(ro.mask_BGT[0])
    return ([np.asarray(ro.tokens_BGT[0, g])[mask[g]].tolist() for g in range(n)],
            [np.asarray(ro.logp_BGT[0, g])[mask[g]] for g in range(n)])


def test_a_seeded_request_gets_what_vpo_sample_draws(served, capsys):
    client, engine, limits = served
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["sample", "--preset", "tiny", "--prompts", "1", "--samples", "3",
                     "--seed", str(SEED)]) == 0
    printed = [ast.literal_eval(line.split(": ", 1)[1]) for line in out.getvalue().splitlines()
               if line.strip().startswith("sample ")]
    from vpo.launch.rules import load_task

    task = load_task("maze", "tiny")
    record = task.make_problems(SEED, 1)[0]
    budget = budget_of(task, 3, None, None)  # vpo sample's budget for its default m = 3
    assert budget <= limits.max_new_tokens
    r = client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user",
                                       "content": prompt_text(task.task, record, 3)}],
        "n": 3, "seed": SEED, "max_tokens": budget})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["prompt_token_ids"] == task.prompt_ids(record, 3)
    tokens = np.full((3, budget), engine.tokenizer.pad_id, np.int32)
    mask = np.zeros((3, budget), bool)
    for g, choice in enumerate(body["choices"]):
        ids = choice["token_ids"]
        tokens[g, :len(ids)], mask[g, :len(ids)] = ids, True
        assert choice["finish_reason"] in ("stop", "length")
    assert len(printed) == 3
    assert task.completion_texts(tokens, mask) == printed


def test_reported_logprobs_are_the_trainers(served):
    client, engine, _ = served
    prompt = engine.tokenizer.encode("go up then left")[:6] or [1, 2, 3]
    r = client.post("/v1/completions", json={
        "prompt": prompt, "n": 2, "seed": 3, "max_tokens": 20, "logprobs": 2,
        "temperature": 0.7, "top_k": 8})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    ref_tokens, _ = _reference(engine, prompt, 3, 2, 20, temperature=0.7, top_k=8)
    for g, c in enumerate(choices):
        assert c["token_ids"] == ref_tokens[g]  # the filtered draw of the sampler
        tokens = np.asarray(c["token_ids"], np.int32)[None, None]
        ids = np.asarray([prompt], np.int32)
        logp, _ = completion_logp(engine.model, ids, np.ones_like(ids, bool), tokens)
        np.testing.assert_allclose(c["logprobs"]["token_logprobs"], np.asarray(logp)[0, 0],
                                   atol=2e-5)
        for lp, top in zip(c["logprobs"]["token_logprobs"], c["logprobs"]["top_logprobs"],
                           strict=True):
            best = sorted(top.values(), reverse=True)
            assert len(top) <= 2 and best[0] >= lp - 1e-5  # the most likely token first


def test_concurrent_requests_get_what_each_gets_alone(served):
    """Six requests at once through 4 slots: rows wait, take freed slots between chunks, and
    each gets the tokens and log-probs of the sampler on its prompt alone."""
    client, engine, _ = served
    prompts = [[5 + i, 9, 14 + i, 3] for i in range(6)]

    def ask(i):
        return client.post("/v1/completions", json={
            "prompt": prompts[i], "seed": 100 + i, "max_tokens": 12 + 5 * i,
            "logprobs": 0}).json()

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        bodies = list(pool.map(ask, range(6)))
    for i, body in enumerate(bodies):
        ref_tokens, ref_logp = _reference(engine, prompts[i], 100 + i, 1, 12 + 5 * i)
        c = body["choices"][0]
        assert c["token_ids"] == ref_tokens[0]
        np.testing.assert_allclose(c["logprobs"]["token_logprobs"], ref_logp[0], atol=1e-5)
        assert c["finish_reason"] == ("stop" if len(ref_tokens[0]) < 12 + 5 * i
                                      and ref_tokens[0][-1] in engine.tokenizer.stop_ids
                                      else "length")


def test_stop_strings_cut_the_text_and_the_tokens(served):
    client, engine, _ = served
    ask = dict(prompt=[4, 8, 15, 16], seed=11, max_tokens=24)
    full = client.post("/v1/completions", json=ask).json()["choices"][0]
    words = full["text"].split()
    assert len(words) >= 4
    stop = words[3]
    cut = client.post("/v1/completions", json={**ask, "stop": [stop]}).json()["choices"][0]
    assert cut["finish_reason"] == "stop"
    assert stop not in cut["text"] and full["text"].startswith(cut["text"])
    assert full["token_ids"][:len(cut["token_ids"])] == cut["token_ids"]
    assert stop in engine.tokenizer.decode(cut["token_ids"])


@pytest.mark.parametrize("body, status, param", [
    ({"model": "gpt-4", "prompt": "up"}, 404, "model"),
    ({"prompt": "up", "temperature": 5}, 422, "temperature"),
    ({"prompt": "up", "top_p": "high"}, 422, "top_p"),
    ({"prompt": "up", "n": 0}, 422, "n"),
    ({"prompt": "up", "max_tokens": 65}, 400, "max_tokens"),
    ({"prompt": list(range(3, 3 + 65))}, 400, "prompt"),
    ({"prompt": [10 ** 9]}, 422, "prompt"),
    ({"prompt": "up", "stream": "yes"}, 422, "stream"),
    ({"prompt": "up", "foo_bar": 1}, 422, "foo_bar"),
    ({"prompt": "up", "min_p": 0.1}, 422, "min_p"),
    ({"prompt": "up", "response_format": {"type": "json_object"}}, 422, "response_format"),
    ({"prompt": "up", "stream_options": {"include_usage": True}}, 422, "stream_options"),
    ({"prompt": "up", "echo": True, "stream": True}, 422, "echo"),
    ({"prompt": "up", "max_tokens": 0}, 422, "max_tokens"),
    ({"prompt": "up", "logprobs": 6}, 422, "logprobs"),
    ({"prompt": "up", "top_k": 1 << 40}, 422, "top_k"),
    ({"prompt": "up", "seed": -1}, 400, "seed"),
    ({"prompt": "up", "seed": 1 << 63}, 400, "seed"),
    ({"prompt": "up", "temperature": float("nan")}, 400, "temperature"),
    ({"prompt": "up", "top_p": float("inf")}, 400, "top_p"),
    ({"prompt": "up", "logit_bias": {"5": float("-inf")}}, 400, "logit_bias"),
    ({"prompt": "up \ud800"}, 422, "prompt"),
    ({"prompt": "up", "stop": [1]}, 422, "stop"),
    ({"prompt": "up", "seed": "x"}, 422, "seed"),
    ({}, 422, "prompt"),
    ([1, 2], 400, None),
])
def test_bad_requests_get_openai_errors_and_the_server_goes_on(served, body, status, param):
    client, _, _ = served
    r = client.post("/v1/completions", content=json.dumps(body),  # NaN and \ud800 as Python
                    headers={"content-type": "application/json"})  # writes them
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"]
    ok = client.post("/v1/completions", json={"prompt": [4, 5], "max_tokens": 3})
    assert ok.status_code == 200 and len(ok.json()["choices"][0]["token_ids"]) <= 3


def test_chat_errors_models_and_routes(served):
    client, _, limits = served
    assert client.get("/v1/models").json()["data"][0]["id"] == "tiny"
    r = client.post("/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
    r = client.post("/v1/chat/completions", json={"messages": [{"content": "hi"}]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "messages"
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "up " * 80}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert client.get("/v1/nothing").status_code == 404
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": [{"type": "text", "text": "up left"}]}],
        "max_tokens": 4, "logprobs": True, "top_logprobs": 3})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert content and all(len(c["top_logprobs"]) == 3 for c in content)
    r = client.post("/v1/chat/completions", json={  # log-probs without alternatives
        "messages": [{"role": "user", "content": "up left"}], "max_tokens": 4, "logprobs": True})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert content and all(c["top_logprobs"] == [] for c in content), content


def test_an_oversized_body_answers_413_with_or_without_its_length(served, monkeypatch):
    client, _, _ = served
    monkeypatch.setattr("vpo.serve.app.MAX_BODY_BYTES", 1000)
    body = b'{"prompt": "' + b"up " * 400 + b'", "max_tokens": 2}'
    r = client.post("/v1/completions", content=body)  # with Content-Length
    assert r.status_code == 413 and "1000 accepted" in r.json()["error"]["message"], r.text
    r = client.post("/v1/completions", content=iter([body[:600], body[600:]]))  # chunked
    assert r.status_code == 413 and "1000 bytes accepted" in r.json()["error"]["message"], r.text
    ok = client.post("/v1/completions", json={"prompt": [4, 5], "max_tokens": 2})
    assert ok.status_code == 200


def test_a_full_queue_answers_503():
    """An engine whose thread has not started keeps its rows waiting: past --queue rows a
    request is refused with 503, and the queue's requests stay queued."""
    engine, limits = build(_args("--preset", "tiny", "--slots", "2", "--max-tokens", "8",
                                 "--max-prompt-tokens", "16", "--queue", "4"))
    from vpo.serve.parse import parse_completion

    gen = parse_completion({"prompt": [4, 5], "n": 3}, engine.tokenizer, limits)
    pending = engine.submit(gen)
    with pytest.raises(QueueFullError):
        engine.submit(gen)
    r = TestClient(make_app(engine, limits)).post("/v1/completions",
                                                  json={"prompt": [4, 5], "n": 2})
    assert r.status_code == 503 and "queue is full" in r.json()["error"]["message"]
    assert not pending.done()
    engine.close()
    assert pending.done() and isinstance(pending.exception(), QueueFullError)


def test_request_keys_are_vpo_samples():
    keys = jax.random.split(jax.random.key(SEED), 6)
    np.testing.assert_array_equal(request_keys(SEED, 6), jax.random.key_data(keys))


def test_the_openai_client_recipe_runs_against_a_real_server(served, url, tmp_path, capsys):
    """docs/usage.md's recipe: `vpo serve` listening on a port (uvicorn, as the command runs
    it) and examples/serve/eval_client.py, a plain OpenAI client, scoring its answers; the
    completions are those the endpoint returns for the same seeds."""
    import importlib.util
    import pathlib

    client, engine, limits = served
    path = pathlib.Path(__file__).resolve().parent.parent.parent / "examples/serve/eval_client.py"
    spec = importlib.util.spec_from_file_location("eval_client", path)
    eval_client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eval_client)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in (
        {"prompt": "go up", "solution": "up"}, {"prompt": "go left", "solution": "zebra"})))
    assert eval_client.main(["--data", str(data), "--base-url", url, "--n", "3",
                             "--max-tokens", "8", "--out", str(tmp_path / "out.jsonl")]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["model"] == "tiny" and summary["rows"] == 2 and summary["n"] == 3
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    direct = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "go up"}], "n": 3, "max_tokens": 8,
        "seed": 0, "temperature": 1.0}).json()
    assert out[0]["completions"] == [c["message"]["content"] for c in direct["choices"]]
    assert out[1]["correct"] == [False] * 3  # "zebra" is no word of the maze vocabulary
    c = [sum(r["correct"]) for r in out]
    assert summary["pass@1"] == pytest.approx(sum(k / 3 for k in c) / 2)


def test_a_failed_generation_answers_500_and_the_server_goes_on(served, monkeypatch):
    client, engine, _ = served
    import vpo.serve.engine as engine_lib

    real = engine_lib.live_lib.admit_jit

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine_lib.live_lib, "admit_jit", broken)
    r = client.post("/v1/completions", json={"prompt": [4, 5], "max_tokens": 3})
    assert r.status_code == 500 and "device lost" in r.json()["error"]["message"]
    monkeypatch.setattr(engine_lib.live_lib, "admit_jit", real)
    ok = client.post("/v1/completions", json={"prompt": [4, 5], "max_tokens": 3, "seed": 1})
    assert ok.status_code == 200
    assert ok.json()["choices"][0]["token_ids"] == _reference(engine, [4, 5], 1, 1, 3)[0][0]


def _openai(url):
    import openai

    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)


def test_a_stream_is_the_non_streamed_answer_in_pieces(served, url):
    """The real `openai` client, stream: true: role delta first, content pieces, each choice's
    finish_reason in its last chunk, a usage chunk with no choices; the text, tokens and
    log-probs are the non-streamed answer's for the same seed."""
    client, _, _ = served
    ask = dict(messages=[{"role": "user", "content": "go up then left"}], n=2, seed=5,
               max_tokens=20, logprobs=True, top_logprobs=2)
    whole = client.post("/v1/chat/completions", json=ask).json()
    chunks = list(_openai(url).chat.completions.create(
        model="tiny", stream=True, stream_options={"include_usage": True}, **ask))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == {
        **whole["usage"], "completion_tokens_details": None, "prompt_tokens_details": None}
    for j, choice in enumerate(whole["choices"]):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == j]
        assert mine[0].delta.role == "assistant"
        assert [m.finish_reason for m in mine[:-1]] == [None] * (len(mine) - 1)
        assert mine[-1].finish_reason == choice["finish_reason"]
        assert "".join(m.delta.content or "" for m in mine) == choice["message"]["content"]
        assert len(mine) > 3  # pieces, not one chunk at the end
        streamed = [t for m in mine if m.logprobs for t in m.logprobs.content]
        assert [t.model_dump() for t in streamed] == choice["logprobs"]["content"]
        assert [i for m in mine for i in m.model_extra.get("token_ids", [])] == choice["token_ids"]


def test_a_recorded_stream_adds_up_to_the_answer(served):
    """What `vpo train --env` records of a streamed answer (a harness that streams): the
    prompt's token ids from the first chunk, each choice's token ids and log-probs, those of the
    non-streamed answer for the same seed; a stream that failed records nothing."""
    from vpo.rl.env_served import streamed_answer

    client, _, _ = served
    ask = dict(messages=[{"role": "user", "content": "go down"}], n=2, seed=9, max_tokens=12,
               logprobs=True)
    whole = client.post("/v1/chat/completions", json=ask).json()
    raw = client.post("/v1/chat/completions", json={**ask, "stream": True}).content
    got = streamed_answer(raw)
    assert got["prompt_token_ids"] == whole["prompt_token_ids"]
    assert [c["token_ids"] for c in got["choices"]] == [c["token_ids"] for c in whole["choices"]]
    assert [c["logprobs"]["content"] for c in got["choices"]] == [
        c["logprobs"]["content"] for c in whole["choices"]]
    assert streamed_answer(b'data: {"error": {"message": "x"}}\n\n') is None


def test_a_streamed_completion_stops_where_the_answer_does(served, url):
    """Text completions streamed through the async client, with a stop string spanning
    tokens: the pieces join to the non-streamed text, none shows the stop string."""
    import asyncio

    import openai

    client, _, _ = served
    ask = dict(prompt=[4, 8, 15, 16], seed=11, max_tokens=24)
    full = client.post("/v1/completions", json=ask).json()["choices"][0]["text"]
    stop = full.split()[3][:3]  # a piece of a word: the text before it is held back
    cut = client.post("/v1/completions", json={**ask, "stop": [stop], "logprobs": 1}).json()
    cut = cut["choices"][0]

    async def stream():
        aclient = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0)
        try:
            return [c async for c in await aclient.completions.create(
                model="tiny", stream=True, stop=[stop], logprobs=1, **ask)]
        finally:
            await aclient.close()

    chunks = asyncio.run(stream())
    pieces = [c.choices[0].text for c in chunks]
    assert "".join(pieces) == cut["text"] and cut["finish_reason"] == "stop"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(stop not in "".join(pieces[:k + 1]) for k in range(len(pieces)))
    assert [lp for c in chunks if c.choices[0].logprobs
            for lp in c.choices[0].logprobs.token_logprobs] == \
        cut["logprobs"]["token_logprobs"]


def test_settled_text_holds_back_what_a_stop_string_could_start():
    from vpo.serve.stream import held_back, settled

    assert held_back("go up and", ["and then"]) == 3
    assert held_back("go up an", ["and then", "n"]) == 2
    assert held_back("go up", ["xyz"]) == 0
    assert settled("go up an", ["and"]) == "go up"
    assert settled("go up \ufffd", []) == "go up"  # an unfinished character, then spaces
    assert settled("", ["a"]) == ""


def _model_logp(engine, context, continuation):
    ids = np.asarray([context], np.int32)
    logp, _ = completion_logp(engine.model, ids, np.ones_like(ids, bool),
                              np.asarray(continuation, np.int32)[None, None])
    return np.asarray(logp)[0, 0]


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_scores_a_prompt_as_lm_evals_local_completions_asks(served, max_tokens):
    """lm-eval's log-likelihood request: token-id prompts (context + continuation), echo,
    logprobs 1, temperature 0; the prompt's log-probs (the first None) are the model's,
    the top alternative is the argmax (lm-eval's is_greedy)."""
    client, engine, _ = served
    context, continuation = [5, 9, 14, 3, 22], [40, 41, 7]
    prompts = [context + continuation, [6, 2, 11, 9]]
    r = client.post("/v1/completions", json={
        "prompt": prompts, "echo": True, "max_tokens": max_tokens, "logprobs": 1,
        "temperature": 0, "seed": 1234})
    assert r.status_code == 200, r.text
    for prompt, choice in zip(prompts, r.json()["choices"], strict=True):
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(prompt) + max_tokens == len(lp["token_logprobs"])
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        np.testing.assert_allclose(lp["token_logprobs"][1:len(prompt)],
                                   _model_logp(engine, prompt[:1], prompt[1:]), atol=2e-5)
        assert choice["text"].startswith(engine.tokenizer.decode(prompt,
                                                                 skip_special_tokens=False))
        for t, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:], strict=True):
            assert len(top) == 1 and max(top.values()) >= t - 1e-6
        assert lp["text_offset"] == sorted(lp["text_offset"])
    choice = r.json()["choices"][0]
    ctx = len(context)
    ll = sum(choice["logprobs"]["token_logprobs"][ctx:len(prompts[0])])
    assert ll == pytest.approx(float(_model_logp(engine, context, continuation).sum()),
                               abs=1e-4)
    greedy = np.argmax(_greedy_logits(engine, prompts[0]), -1)[ctx - 1:-1].tolist() \
        == continuation
    tops = choice["logprobs"]["top_logprobs"][ctx:len(prompts[0])]
    toks = choice["logprobs"]["token_logprobs"][ctx:len(prompts[0])]
    assert greedy == all(t == max(top.values()) for t, top in zip(toks, tops, strict=True))


def _greedy_logits(engine, prompt):
    ids = np.asarray([prompt], np.int32)
    hidden, _ = engine.model.prefill(ids, np.ones_like(ids, bool))
    return np.asarray(engine.model.logits(hidden))[0]


def test_echo_of_a_text_prompt_without_logprobs(served):
    client, _, _ = served
    r = client.post("/v1/completions", json={"prompt": "go up", "echo": True,
                                             "max_tokens": 3, "seed": 2})
    assert r.status_code == 200, r.text
    plain = client.post("/v1/completions", json={"prompt": "go up", "max_tokens": 3,
                                                 "seed": 2}).json()["choices"][0]
    assert r.json()["choices"][0]["text"] == "go up" + plain["text"]
    assert r.json()["choices"][0]["logprobs"] is None
    r = client.post("/v1/completions", json={"prompt": "go up", "max_tokens": 2,
                                             "seed": (1 << 63) - 1})  # the largest seed
    assert r.status_code == 200, r.text


def test_deep_huge_and_odd_bodies_are_refused_fast(served):
    """100k nested arrays: 400 before parsing (no RecursionError, no 500); a 5 MB prompt:
    400 before tokenising; a message's tool call: 422 by name."""
    import time

    client, _, _ = served
    for body in (b"[" * 100_000 + b"]" * 100_000,
                 b'{"prompt": ' + b"[" * 70 + b"1" + b"]" * 70 + b"}"):
        r = client.post("/v1/completions", content=body)
        assert r.status_code == 400 and "nested" in r.json()["error"]["message"], r.text
    r = client.post("/v1/completions", content=b'{"prompt": "[[[[", "max_tokens": 2}')
    assert r.status_code == 200, r.text  # brackets inside a string are text
    t0 = time.perf_counter()
    r = client.post("/v1/completions", json={"prompt": "up " * ((5 << 20) // 3)})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert time.perf_counter() - t0 < 5
    r = client.post("/v1/chat/completions", json={"messages": [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "x"}]}]})
    assert r.status_code == 422 and "tool_calls" in r.json()["error"]["message"], r.text
    r = client.post("/v1/chat/completions", json={  # an answer's message echoed back as is
        "messages": [{"role": "user", "content": "up"},
                     {"role": "assistant", "content": "L", "tool_calls": None,
                      "refusal": None}], "max_tokens": 2, "user": "someone",
        "response_format": {"type": "text"}})
    assert r.status_code == 200, r.text


def test_a_seed_keeps_all_its_bits():
    """Seeds of 2**32 and more are not wrapped: their keys are those jax makes of them with
    64-bit integers on (checked here in a process with JAX_ENABLE_X64)."""
    import os
    import subprocess
    import sys

    big = (1 << 63) - 1 - SEED
    assert not np.array_equal(request_keys((1 << 32) + SEED, 3), request_keys(SEED, 3))
    code = (f"import jax, numpy; k = jax.random.split(jax.random.key({big}), 3); "
            "print(numpy.asarray(jax.random.key_data(k)).tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu"})
    assert json.loads(out.stdout.strip().splitlines()[-1]) == request_keys(big, 3).tolist()
    keys = jax.random.split(jax.random.key(SEED), 3)  # under 2**32: jax's own keys
    np.testing.assert_array_equal(request_keys(SEED, 3), jax.random.key_data(keys))


def _wait_idle(engine, timeout=60.0):
    import time

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        load = engine.load()
        if load["decoding"] == 0 and load["waiting"] == 0:
            return load
        time.sleep(0.02)
    raise AssertionError(f"the engine is still busy: {engine.load()}")


def test_a_client_that_goes_away_frees_its_rows(served, url):
    """32 rows x 64 tokens abandoned, streamed (after its first chunk) and not (the socket
    closed once the request is sent): the waiting rows leave the queue, the decoding ones
    their slots, and a short request is answered."""
    import socket
    import time
    import urllib.parse

    client, engine, _ = served
    long = {"prompt": [4, 5, 6], "n": 32, "max_tokens": 64, "seed": 3}
    before = _wait_idle(engine)["cancelled_rows"]
    with _openai(url).completions.create(model="tiny", stream=True, **long) as chunks:
        next(iter(chunks))
    after_stream = _wait_idle(engine)["cancelled_rows"]
    assert after_stream - before >= 16  # over half the rows never ran
    host = urllib.parse.urlparse(url)
    body = json.dumps(long).encode()
    with socket.create_connection((host.hostname, host.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                     b"application/json\r\ncontent-length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        for _ in range(1000):  # hang up once the engine holds the request
            if engine.load()["waiting"]:
                break
            time.sleep(0.01)
        assert engine.load()["waiting"]
    assert _wait_idle(engine)["cancelled_rows"] - after_stream >= 16
    r = client.post("/v1/completions", json={"prompt": [4, 5], "max_tokens": 3, "seed": 1})
    assert r.status_code == 200
    assert r.json()["choices"][0]["token_ids"] == _reference(engine, [4, 5], 1, 1, 3)[0][0]


def test_models_created_and_the_access_log(served):
    import time

    _, engine, limits = served
    log = io.StringIO()
    t0 = int(time.time())
    with TestClient(make_app(engine, limits, access_log=log)) as client:
        created = client.get("/v1/models").json()["data"][0]["created"]
        r = client.post("/v1/completions", json={"prompt": [4, 5], "max_tokens": 3})
        bad = client.post("/v1/completions", json={"prompt": [4, 5], "foo_bar": 1})
    assert t0 - 1 <= created <= time.time()
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("GET /v1/models 200 tokens=- ")
    total = r.json()["usage"]["total_tokens"]
    assert lines[1].startswith(f"POST /v1/completions 200 tokens={total} ")
    assert lines[1].endswith("ms") and bad.status_code == 422
    assert lines[2].startswith("POST /v1/completions 422 tokens=- ")
    assert _args("--quiet").quiet and not _args().quiet


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_no_bad_body_gets_a_500(served, path):
    client, _, _ = served
    bodies = [None, 1e999, "x", [], {"prompt": None}, {"prompt": [[1, "a"]]},
              {"prompt": [-1]}, {"prompt": "up", "n": 1.5}, {"prompt": "up", "max_tokens": True},
              {"prompt": "up", "logprobs": True}, {"prompt": "up", "stop": ""},
              {"prompt": "up", "stream": True, "stream_options": []},
              {"messages": "hi"}, {"messages": [{"role": "user", "content": 5}]},
              {"messages": [{"role": "user", "content": "\ud800"}]},
              {"messages": [{"role": "user", "content": "up"}], "top_logprobs": 3},
              {"messages": [{"role": "user", "content": "up"}], "echo": True},
              {"messages": [{"role": "user", "content": "up"}], "tools": [{"type": "function"}]},
              {"messages": [{"role": "user", "content": "up"}], "max_tokens": 0},
              {"messages": [{"role": "user", "content": "up"}], "temperature": -float("inf")}]
    for body in bodies:
        r = client.post(path, content=json.dumps(body),
                        headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500, (body, r.text)
        assert r.json()["error"]["message"]


_COMPILES: list[str] = []  # jax's trace and compile events while a test listens
_LISTENING = [False]


def _listen(event, duration, **_):
    if _LISTENING[0] and event in ("/jax/core/compile/jaxpr_trace_duration",
                                   "/jax/core/compile/backend_compile_duration"):
        _COMPILES.append(event)


def test_after_warmup_no_request_compiles():
    """`vpo serve --warmup`: every prefill bucket (rows admitted x prompt length), decode
    chunk, slot release, key split and prompt scoring is compiled before serving, so requests
    of every shape the server takes (1 to 16 rows, prompts of 3 to 64 tokens, echo with
    log-probs, stop strings, streaming, concurrent) trace and compile nothing."""
    import time

    engine, limits = build(_args("--preset", "tiny", "--seed", "3", "--slots", "4",
                                 "--max-tokens", "8", "--max-prompt-tokens", "64", "--chunk",
                                 "4", "--queue", "64"))
    t0 = time.perf_counter()
    engine.warmup()
    warm = time.perf_counter() - t0
    jax.monitoring.register_event_duration_secs_listener(_listen)
    _COMPILES.clear()
    _LISTENING[0] = True
    engine.start()
    try:
        with TestClient(make_app(engine, limits)) as client:
            bodies = [{"prompt": [4] * 3, "max_tokens": 8, "n": 1},
                      {"prompt": [5] * 64, "max_tokens": 8, "n": 3, "seed": 1},
                      {"prompt": [[6] * 20, [7] * 40], "max_tokens": 5, "n": 4},
                      {"prompt": [8] * 17, "max_tokens": 0, "echo": True, "logprobs": 2},
                      {"prompt": [9] * 33, "max_tokens": 2, "echo": True, "logprobs": 1},
                      {"prompt": "up", "max_tokens": 8, "stop": ["e"], "stream": True}]
            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                answers = list(pool.map(lambda b: client.post("/v1/completions", json=b),
                                        bodies + bodies[::-1]))
            assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
            assert client.post("/v1/completions", json={"prompt": [4] * 3, "n": 16,
                                                        "max_tokens": 3}).status_code == 200
    finally:
        _LISTENING[0] = False
        engine.close()
    assert _COMPILES == [], f"{len(_COMPILES)} compiles after warmup ({warm:.1f}s)"
