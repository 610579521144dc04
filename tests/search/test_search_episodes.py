"""Search on an environment (`vpo.search.episodes`, `vpo search --env`): each candidate is one
multi-turn episode the environment scored; a mutation is an episode whose first message shows
the parents (their assistant messages and rewards); the three methods spend the same budget."""

import json
import pathlib

import jax
import numpy as np
import pytest

from vpo.env import episode as episode_lib
from vpo.errors import ConfigError
from vpo.search import episodes as episodes_lib
from vpo.search.episodes import mutation_messages
from vpo.search.ingraph import SearchConfig
from vpo.search.methods import run_all_methods

FIXTURE = pathlib.Path(__file__).parent.parent / "fixtures" / "hf" / "qwen2_tied"
ENV = "vpo.env.calculator:make_env"


def test_a_mutations_first_message_shows_the_parents():
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "Reach 7"}]
    assert mutation_messages(first, [], ("hit", "few")) == first
    out = mutation_messages(first, [("calc: 3+4\nanswer: 3+4", [1.0, 0.64])], ("hit", "few"))
    assert out[0] == first[0] and first[1]["content"] == "Reach 7"  # nothing changed in place
    assert out[1]["content"] == (
        "Reach 7\nEarlier attempts and their scores (hit, few):\nAnswer 1: calc: 3+4\n"
        "answer: 3+4 | scores: 1.0 0.6" + episodes_lib.ASK)


@pytest.fixture(scope="module")
def policy_and_task():
    from vpo.io.policy_folder import load_model
    from vpo.launch.rules import load_task

    spec = f"hf:{FIXTURE}"
    return load_model(spec)[0], load_task("env", spec, {"env": ENV, "max_turns": 2})


def test_every_method_scores_episodes_at_the_same_budget(policy_and_task, monkeypatch):
    model, task = policy_and_task
    assert task.name == "calculator"  # named by the module, as reports and tables show it
    shown, fed = [], []
    write, run = episodes_lib.mutation_messages, episode_lib.run_episodes

    def spy_write(first, parents, names):
        shown.append(len(parents))
        return write(first, parents, names)

    def spy_run(model, tok, envs, rows, keys, **kw):
        fed.append(kw["prompts"][0].shape[0])  # one prompt per episode
        return run(model, tok, envs, rows, keys, **kw)

    monkeypatch.setattr(episodes_lib, "mutation_messages", spy_write)
    monkeypatch.setattr(episode_lib, "run_episodes", spy_run)  # under task_episodes
    cfg = SearchConfig(islands=2, members=2, children=2, generations=2, parents=1,
                       num_answers=1, fresh_rate=0.0)
    rows = task.make_problems(0, 2)
    out = run_all_methods(jax.random.key(0), model, task, rows, cfg, max_new_tokens=16)
    assert set(out) == {"search", "best_of_n", "revision"}
    for method, result in out.items():
        evaluated = np.asarray(result.trace.evaluated)
        assert (evaluated[:, -1] == cfg.budget).all(), (method, evaluated)
        best = np.asarray(result.trace.best_fitness)
        assert (np.diff(best, axis=1) >= 0).all()  # best-so-far never falls
        for b in result.best:  # the assistant side of the best episode, and its rewards
            assert b is not None and len(b["rewards"]) == 3 and b["answer"] in result.texts
    assert 1 in shown and 0 in shown  # mutation episodes showed a parent, fresh ones none
    assert sum(fed) == 3 * len(rows) * cfg.budget  # every candidate one episode
    with pytest.raises(ConfigError, match="one episode"):
        run_all_methods(jax.random.key(0), model, task, rows,
                        SearchConfig(islands=2, members=2, children=2, generations=1,
                                     num_answers=2), max_new_tokens=16)


def test_vpo_search_takes_an_environment(tmp_path, capsys):
    from vpo.cli.main import main

    rc = main(["search", "--policy", f"hf:{FIXTURE}", "--env", ENV, "--env-turns", "2",
               "--answers", "1", "--problems", "1", "--islands", "2", "--members", "2",
               "--children", "2", "--generations", "1", "--max-new-tokens", "16",
               "--out", str(tmp_path / "s")])
    assert rc == 0, capsys.readouterr().err[-2000:]
    lines = [json.loads(x) for x in (tmp_path / "s" / "best_answers.jsonl").read_text().split(
        "\n") if x]
    assert {x["method"] for x in lines} == {"search", "best_of_n", "revision"}
    assert all(set(x["rewards"]) == {"hit", "given_only", "few_calls"} for x in lines)
    assert "Reach" in lines[0]["prompt"][-1]["content"]  # the environment's first message
