"""One generation budget for every command (`completion_budget`), `vpo eval`'s --max-new-tokens
and --seed on your data, and progress on stderr from the commands but not from library calls."""

import json
import os
import re

import jax
import pytest

from vpo.cli import main as cli
from vpo.cli.policy import BUDGET_HELP
from vpo.config import ConfigError
from vpo.launch import assemble, rules
from vpo.launch.policy_runs import budget_of
from vpo.launch.rules import completion_budget
from vpo.tasks.dataset import ANSWER_TOKENS

BPE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf", "qwen2_bpe")
REWARDS = "def short(completions, **kw):\n    return [1.0 / (1 + len(c)) for c in completions]\n"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    (d / "rewards.py").write_text(REWARDS)
    (d / "rows.jsonl").write_text("".join(
        json.dumps({"prompt": f"Say the number {i}."}) + "\n" for i in range(12)))
    return ["--data", str(d / "rows.jsonl"), "--reward", f"{d}/rewards.py:short"]


def kwargs_of(data):
    return {"path": data[1], "rewards": [data[3]]}


def data_task(data):
    return rules.load_task("dataset", f"hf:{BPE}", kwargs_of(data))


def test_the_default_budget_is_one_rule(data, tmp_path):
    """Your data: at least ANSWER_TOKENS per answer; a task with fixed answers: its answer
    budget; --max-new-tokens wins; a vpo train run's policy: the run's budget."""
    task = data_task(data)
    T = completion_budget(task, 1)
    assert max(task.completion_len(1), ANSWER_TOKENS) == T
    assert completion_budget(task, 2) == max(task.completion_len(2), 2 * ANSWER_TOKENS)
    assert completion_budget(task, 1, given=9) == 9
    arith = rules.load_task("arithmetic")
    assert completion_budget(arith, 2) == arith.completion_len(2)
    maze = rules.load_task("maze")
    assert completion_budget(maze, 3, given=5) == maze.completion_len(3)  # in-graph: fixed
    run = tmp_path / "run"
    (run / "policy").mkdir(parents=True)
    (run / "policy" / "policy.json").write_text("{}")
    (run / "config.json").write_text(json.dumps({"sampler": {"max_new_tokens": T + 7}}))
    for spec in (str(run), str(run / "policy")):
        assert completion_budget(task, 1, policy=spec) == T + 7
    (run / "policy" / "policy.json").write_text(json.dumps({"max_new_tokens": T + 3}))
    assert completion_budget(task, 1, policy=str(run)) == T + 3
    assert f"{ANSWER_TOKENS} per answer" in BUDGET_HELP
    with pytest.raises(ConfigError, match="--max-new-tokens"):  # in-graph: the reader's budget
        budget_of(maze, 3, None, 5)


def test_train_sample_eval_and_search_use_the_same_default_budget(data, tmp_path, capsys):
    task = data_task(data)
    T = completion_budget(task, 1)
    plan = assemble.assemble_run(None, None, [f"model=hf:{BPE}"], dataset=kwargs_of(data))
    assert plan.run.sampler.max_new_tokens == T
    longest = task.prompt_arrays(task.make_problems(0, 12), 1)[0].shape[1]
    assert plan.run.model.max_seq_len >= longest + T
    kept = assemble.assemble_run(None, None, [f"model=hf:{BPE}", "sampler.max_new_tokens=20"],
                                 dataset=plan.run.task_kwargs)
    assert kept.run.sampler.max_new_tokens == 20

    assert cli.main(["sample", "--policy", f"hf:{BPE}", "--prompts", "1", "--samples", "1",
                     *data]) == 0
    assert f"full budget T={T};" in capsys.readouterr().out

    assert cli.main(["eval", "--policy", f"hf:{BPE}", "--problems", "2", "--budget", "1",
                     "--out", str(tmp_path / "eval"), *data]) == 0
    assert f"up to {T} new tokens" in capsys.readouterr().err

    assert cli.main(["search", "--policy", f"hf:{BPE}", "--problems", "1", "--islands", "1",
                     "--members", "2", "--children", "2", "--generations", "1", "--answers",
                     "1", "--parents", "1", "--out", str(tmp_path / "search"), *data]) == 0
    captured = capsys.readouterr()
    assert f"up to {T} new tokens" in captured.out
    # progress: a bar per method over its generations, on stderr
    for method in ("search", "best_of_n", "revision"):
        assert re.search(rf"{method}: 100%.*2/2", captured.err), captured.err
    assert "loading hf:" in captured.err


def test_eval_honours_max_new_tokens_and_seed_on_your_data(data, tmp_path, capsys,
                                                            monkeypatch):
    import vpo.eval.policies as policies

    seen = []
    real = policies.sample_pool

    def spy(model, task, records, **kw):
        seen.append(([r["_row"] for r in records], kw["max_new_tokens"]))
        return real(model, task, records, **kw)

    monkeypatch.setattr(policies, "sample_pool", spy)
    base = ["eval", "--policy", f"hf:{BPE}", "--problems", "3", "--budget", "1", *data]
    for n, extra in enumerate((["--max-new-tokens", "5"], ["--seed", "1"], ["--seed", "2"])):
        assert cli.main([*base, *extra, "--out", str(tmp_path / f"e{n}")]) == 0
    assert "up to 5 new tokens" in capsys.readouterr().err
    (rows5, t5), (rows1, _), (rows2, _) = seen
    assert t5 == 5
    assert rows1 != rows2 and len(set(rows1)) == len(rows1) == 3
    assert rows1 == sorted(rows1)  # a sample of the rows, in file order


def test_library_calls_print_no_progress(data, capfd):
    from vpo.eval.policies import evaluate_policy
    from vpo.io.hf import from_pretrained
    from vpo.search.ingraph import SearchConfig
    from vpo.search.methods import run_all_methods

    task = data_task(data)
    model = from_pretrained(BPE, max_seq_len=512)
    records = task.make_problems(0, 1)
    evaluate_policy(model, task, records, num_answers=1, budget=1, ks=[1],
                    key=jax.random.key(0), max_new_tokens=4)
    cfg = SearchConfig(islands=1, members=2, parents=1, children=2, generations=1,
                       num_answers=1)
    run_all_methods(jax.random.key(0), model, task, records, cfg, max_new_tokens=4)
    err = capfd.readouterr().err
    assert "it/s" not in err and "gen/s" not in err and "%|" not in err, err
