"""`vpo serve`: the OpenAI endpoints on the tiny preset. A request with a seed gets what
`vpo sample` draws with that seed, its log-probs are the trainer's, concurrent requests through
refilled slots get what each gets alone, bad requests get OpenAI error bodies with their status
and the server keeps serving, a full queue answers 503."""

import argparse
import ast
import concurrent.futures
import contextlib
import io

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
    ({"prompt": "up", "stream": True}, 422, "stream"),
    ({"prompt": "up", "stop": [1]}, 422, "stop"),
    ({"prompt": "up", "seed": "x"}, 422, "seed"),
    ({}, 422, "prompt"),
    ([1, 2], 400, None),
])
def test_bad_requests_get_openai_errors_and_the_server_goes_on(served, body, status, param):
    client, _, _ = served
    r = client.post("/v1/completions", json=body)
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
    from vpo.serve.protocol import parse_completion

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


def test_the_openai_client_recipe_runs_against_a_real_server(served, tmp_path, capsys):
    """docs/usage.md's recipe: `vpo serve` listening on a port (uvicorn, as the command runs
    it) and examples/serve/eval_client.py, a plain OpenAI client, scoring its answers; the
    completions are those the endpoint returns for the same seeds."""
    import importlib.util
    import json
    import pathlib
    import socket
    import threading

    import uvicorn

    client, engine, limits = served
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(make_app(engine, limits), host="127.0.0.1",
                                           port=port, log_config=None, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    path = pathlib.Path(__file__).resolve().parent.parent.parent / "examples/serve/eval_client.py"
    spec = importlib.util.spec_from_file_location("eval_client", path)
    eval_client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eval_client)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in (
        {"prompt": "go up", "solution": "up"}, {"prompt": "go left", "solution": "zebra"})))
    try:
        import time

        for _ in range(100):
            if server.started:
                break
            time.sleep(0.05)
        assert eval_client.main(["--data", str(data), "--base-url", f"http://127.0.0.1:{port}/v1",
                                 "--n", "3", "--max-tokens", "8", "--out",
                                 str(tmp_path / "out.jsonl")]) == 0
    finally:
        server.should_exit = True
        thread.join()
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
