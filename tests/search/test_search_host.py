"""Search on a host-scored task (a user's dataset and reward functions): the island search,
best-of-N and revision at the same exact candidate budget, mutation prompts written as text
through the checkpoint's chat template, and a policy that always answers the same text."""

import json
import os

import jax
import numpy as np
import pytest

from vpo.io.hf import from_pretrained
from vpo.io.tokenizer import load_tokenizer
from vpo.search import host as host_search
from vpo.search.ingraph import METHODS, SearchConfig, summarize
from vpo.tasks import make_task
from vpo.tasks.bound import bind
from vpo.tasks.prompts import mutation_text

BPE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf", "qwen2_bpe")

REWARDS = '''
def text(c):  # a chat row's completion comes as messages, as TRL passes it
    return c if isinstance(c, str) else c[0]["content"]

def has_digit(prompts, completions, **kw):
    return [float(any(ch.isdigit() for ch in text(c))) for c in completions]

def short(prompts, completions, **kw):
    return [max(0.0, 1.0 - len(text(c)) / 40) for c in completions]
'''


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("hs")
    (d / "rewards.py").write_text(REWARDS)
    rows = [{"prompt": "Name a number."},
            {"prompt": [{"role": "user", "content": "Say something short."}]}]
    (d / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = bind(make_task("dataset", path=str(d / "rows.jsonl"),
                          rewards=[f"{d}/rewards.py:has_digit", f"{d}/rewards.py:short"]),
                load_tokenizer(BPE))
    model = from_pretrained(BPE, max_seq_len=256)
    return task, model


def test_mutation_text_of_chat_messages_appends_to_the_last_user_message(setup):
    task, _ = setup
    rec = task.make_problems(0, 2)[1]
    msgs = mutation_text(task.task, rec, [("hi", [1.0, 0.9])], 1)
    assert isinstance(msgs, list) and msgs[-1]["role"] == "user"
    assert msgs[-1]["content"].startswith("Say something short.\nEarlier answers")
    assert "Answer 1: hi | scores: 1.0 0.9" in msgs[-1]["content"]
    assert msgs[-1]["content"].endswith("Give a better answer. Reply with the answer only.")


@pytest.mark.parametrize("m", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_methods_share_the_exact_budget(setup, m):
    task, model = setup
    cfg = SearchConfig(islands=2, members=2 * m, parents=2, children=2 * m, generations=2,
                       num_answers=m)
    records = task.make_problems(0, 2)
    for method in METHODS:
        trace, _, texts, _ = host_search.run_host_method(jax.random.key(0), method, model, task,
                                                         records, cfg, max_new_tokens=8)
        assert trace.evaluated.shape == (2, cfg.generations + 1)
        assert int(trace.evaluated[0, -1]) == cfg.budget, method
        best = np.asarray(trace.best_fitness)
        np.testing.assert_array_equal(best, np.maximum.accumulate(best, axis=1))  # never drops
        assert len(texts) == len(set(texts))
    s = summarize({"search": trace})["search"]
    assert len(s["solved_count"]) == cfg.generations + 1


def test_the_search_keeps_the_best_candidate_it_scored(setup, monkeypatch):
    """A proposer whose candidates' scores are known: the best-so-far is their maximum."""
    task, model = setup
    cfg = SearchConfig(islands=2, members=2, parents=1, children=2, generations=3,
                       num_answers=1)
    seen = []

    def fake_call(self, records, parents, key):
        B = len(records)
        vals = np.asarray(jax.random.uniform(key, (B,)), np.float32)
        seen.append(vals)
        ids = np.array([self.table.id_of(f"{v:.6f}") for v in vals], np.int32)
        return ids, np.stack([vals, vals], -1), np.ones((B,), bool)

    monkeypatch.setattr(host_search.Proposer, "__call__", fake_call)
    trace, _, _, best = host_search.run_host_method(jax.random.key(3), "search", model, task,
                                                    task.make_problems(0, 1), cfg,
                                                    max_new_tokens=8)
    top = max(v.max() for v in seen)
    np.testing.assert_allclose(trace.best_fitness[0, -1], top, rtol=1e-6)
    # the best answer itself is kept: its text (the proposer wrote the score), rewards, w*ᵀr
    assert best[0]["answer"] == f"{top:.6f}"
    np.testing.assert_allclose(best[0]["rewards"], [top, top], rtol=1e-6)
    np.testing.assert_allclose(best[0]["fitness"], top, rtol=1e-6)


def test_a_prompt_that_cannot_fit_is_a_named_error(setup):
    task, model = setup
    cfg = SearchConfig(islands=1, members=2, parents=1, children=1, generations=1,
                       num_answers=1)
    with pytest.raises(ValueError, match="model.max_seq_len"):
        host_search.run_host_method(jax.random.key(0), "search", model, task,
                                    task.make_problems(0, 1), cfg, max_new_tokens=200)


def test_cli_search_on_your_data(setup, tmp_path, capsys):
    """`vpo search --data --reward` on a checkpoint: the three methods at one budget, a report."""
    from vpo.cli.main import main

    d = tmp_path / "in"
    d.mkdir()
    (d / "rewards.py").write_text(REWARDS)
    rows = [{"prompt": "Name a number."},
            {"prompt": [{"role": "user", "content": "Say something short."}]}]
    (d / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "search"
    rc = main(["search", "--policy", f"hf:{BPE}", "--data", str(d / "rows.jsonl"),
               "--reward", f"{d}/rewards.py:has_digit", "--reward", f"{d}/rewards.py:short",
               "--problems", "2", "--islands", "2", "--members", "2", "--children", "2",
               "--generations", "2", "--answers", "1", "--max-new-tokens", "8",
               "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "scored on the host" in text and "budget 12 candidates" in text
    summary = json.loads((out / "search_traces.json").read_text())
    assert set(summary) == set(METHODS)
    assert all(s["evaluated"][-1] == 12 for s in summary.values())
    assert (out / "search_solved.png").exists()


def test_both_search_apis_share_one_shape():
    """In-graph and host search: key first, a `SearchResult` back, a ConfigError for an
    unknown method."""
    import inspect

    from vpo.errors import ConfigError
    from vpo.search import ingraph

    for fn in (ingraph.run_method, host_search.run_host_method, ingraph.run_search):
        assert list(inspect.signature(fn).parameters)[0] == "key", fn
    for fn, args in ((ingraph.run_method, (None, None, {}, None)),
                     (host_search.run_host_method, (None, None, [], None))):
        with pytest.raises(ConfigError, match="method='nope'"):
            fn(jax.random.key(0), "nope", *args)
