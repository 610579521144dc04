"""CLI: typed overrides with clear errors, smoke train + exact resume, sft -> eval artefacts."""

import json
import os
import pathlib

import pytest

from vpo.cli import main as cli
from vpo.config import ConfigError, TrainConfig
from vpo.launch import assemble


def _read(path) -> str:
    return pathlib.Path(path).read_text()

def test_overrides_are_typed_and_fitted_to_the_task():
    plan = assemble.assemble_run("smoke", None, [
        "train.steps=6", "objective.advantage=vpo", "objective.dual_clip=3", "task=maze"])
    run, task = plan.run, plan.task
    assert run.train.steps == 6 and run.objective.advantage == "vpo"
    assert run.objective.dual_clip == 3.0 and run.task == "maze" and task.name.startswith("maze")
    assert run.model.vocab_size >= task.tokenizer.size
    assert run.sampler.max_new_tokens >= task.completion_len(run.train.num_answers)


def test_fitted_fields_keep_what_the_user_gave_or_refuse_it(tmp_path):
    """The vocabulary, sequence length and answer budget are fitted to the task only where the
    user left them out: a given value is kept, and one below what the task needs is an error
    naming the key and the floor, never silently raised."""
    plan = assemble.assemble_run("maze", None, ["model=tiny", "train.num_answers=3"])
    run, task = plan.run, plan.task
    T, V = task.completion_len(3), task.tokenizer.size
    assert run.sampler.max_new_tokens == T and run.model.vocab_size == V
    given = assemble.assemble_run("maze", None, [
        "model=tiny", "train.num_answers=3", f"sampler.max_new_tokens={T + 1}",
        f"model.max_seq_len={run.model.max_seq_len - 1}"]).run
    assert given.sampler.max_new_tokens == T + 1
    assert given.model.max_seq_len == run.model.max_seq_len - 1  # not raised to need + 32
    for key, low, floor in (("sampler.max_new_tokens", T - 4, T),
                            ("model.vocab_size", 64, V)):
        with pytest.raises(ConfigError, match=rf"{key}={low} is below .*\({floor}\)"):
            assemble.assemble_run("maze", None, ["model=tiny", "train.num_answers=3",
                                                    f"{key}={low}"])
    # a --config file's fields count as given too
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "maze", "sampler": {"max_new_tokens": T - 4}}))
    with pytest.raises(ConfigError, match="sampler.max_new_tokens"):
        assemble.assemble_run(None, str(cfg), ["model=tiny", "train.num_answers=3"])


@pytest.mark.parametrize("override, message", [
    ("train.stepz=3", "unknown key 'stepz'"),
    ("train.steps=abc", r"train\.steps: cannot read 'abc' as int"),
    ("objective.advantage=ppo", r"objective\.advantage: must be one of"),
    ("nope.x=1", "unknown key 'nope'"),
    ("train.steps", "expected section.key=value"),
    ("model=gpt-5", "model=gpt-5: not a model; give a preset"),
    ("task=chess", "unknown task"),
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        assemble.assemble_run("smoke", None, [override])


def test_sample_runs_on_its_default_preset(capsys):
    """`vpo sample` with no options: a random tiny policy answers two maze prompts, scored."""
    assert cli.main(["sample", "--prompts", "2", "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert "policy 'tiny'" in out and out.count("sample 1:") == 2 and "tokens/s" in out


def test_cli_reports_config_errors(capsys, tmp_path):
    assert cli.main(["train", "--preset", "smoke", "train.batch_size=0", "--out",
                     str(tmp_path)]) == 2
    assert "train.batch_size" in capsys.readouterr().err


def test_train_smoke_and_resume(tmp_path):
    out = str(tmp_path / "run")
    assert cli.main(["train", "--preset", "smoke", "--out", out]) == 0
    rows = [json.loads(line) for line in _read(os.path.join(out, "metrics.jsonl")).splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(k in rows[0] for k in ("loss", "reward", "entropy"))
    assert os.path.exists(os.path.join(out, "policy", "policy.json"))
    # resume with more steps continues from the last checkpoint (step 3)
    cfg = json.loads(_read(os.path.join(out, "config.json")))
    cfg["train"]["steps"] = 4
    pathlib.Path(out, "config.json").write_text(json.dumps(cfg))
    assert cli.main(["train", "--out", out, "--resume"]) == 0
    rows = [json.loads(line) for line in _read(os.path.join(out, "metrics.jsonl")).splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]


def test_sft_then_eval_writes_report(tmp_path):
    sft = str(tmp_path / "sft")
    assert cli.main(["sft", "--task", "bandit", "--steps", "30", "--batch", "8", "--answers",
                     "2", "--out", sft]) == 0
    ev = str(tmp_path / "eval")
    assert cli.main(["eval", "--policy", sft, "--problems", "4", "--budget", "4", "--out",
                     ev]) == 0
    for name in ("eval.md", "eval.json", "best_at_k.png", "pass_at_k.png"):
        assert os.path.getsize(os.path.join(ev, name)) > 0
    metrics = json.loads(_read(os.path.join(ev, "eval.json")))["sft (m=2)"]
    assert 0.0 <= metrics["best@1"] <= metrics["best@4"] <= 1.0
    assert "# bandit: 4 problems, 4 candidates" in _read(os.path.join(ev, "eval.md"))


def test_sample_reads_a_trained_policy_with_its_own_task_and_m(tmp_path, capsys):
    sft = str(tmp_path / "sft")
    assert cli.main(["sft", "--task", "bandit", "--steps", "2", "--batch", "8", "--answers",
                     "2", "--out", sft]) == 0
    capsys.readouterr()
    assert cli.main(["sample", "--policy", sft, "--prompts", "2", "--samples", "3"]) == 0
    out = capsys.readouterr().out
    assert f"2 prompts x 3 samples x 2 answers, policy {sft}" in out
    assert out.count("its rewards: ") == 6 and "random init" not in out


@pytest.mark.slow  # ~22 s: the slow set (the lean run stays under 15 min)
def test_search_writes_curves(tmp_path):
    sft = str(tmp_path / "sft")
    assert cli.main(["sft", "--task", "program", "--steps", "5", "--batch", "8", "--answers",
                     "2", "--out", sft]) == 0
    out = str(tmp_path / "search")
    assert cli.main(["search", "--policy", sft, "--difficulty", "easy", "--problems", "2",
                     "--islands", "2", "--members", "2", "--children", "2", "--generations", "2",
                     "--out", out]) == 0
    traces = json.loads(_read(os.path.join(out, "search_traces.json")))
    assert set(traces) == {"search", "best_of_n", "revision"}
    budgets = {tuple(t["evaluated"]) for t in traces.values()}
    assert len(budgets) == 1  # the same candidate budget at every point for every method
    assert os.path.getsize(os.path.join(out, "search_solved.png")) > 0


def test_compare_reports_config_errors(capsys, tmp_path):
    assert cli.main(["compare", "--preset", "nope", "--out", str(tmp_path)]) == 2
    assert "--preset: unknown preset 'nope'" in capsys.readouterr().err
    assert cli.main(["compare", "--preset", "smoke", "arms=grpo,ppo", "--out",
                     str(tmp_path)]) == 2
    assert "arms: unknown arm(s) ppo" in capsys.readouterr().err


DATA_REWARDS = '''
import json, os

def text(c):  # a chat row's completion comes as messages, as TRL passes it
    return c if isinstance(c, str) else c[0]["content"]

def correct(prompts, completions, answer, **kw):
    return [1.0 if a in text(c) else 0.0 for c, a in zip(completions, answer)]

def short(prompts, completions, **kw):
    return [max(0.0, 1.0 - len(text(c)) / 40) for c in completions]

def flaky(prompts, completions, **kw):  # fails from its 2nd call on while FAIL exists
    path = os.path.join(os.path.dirname(__file__), "calls")
    n = int(open(path).read()) if os.path.exists(path) else 0
    open(path, "w").write(str(n + 1))
    if n >= 1 and os.path.exists(os.path.join(os.path.dirname(__file__), "FAIL")):
        return [float("nan")] * len(completions)
    return [0.5] * len(completions)
flaky.reward_names = ("flaky",)
'''


@pytest.mark.slow  # ~29 s: the slow set (the lean run stays under 15 min)
def test_train_on_your_data_and_reward_functions(tmp_path, capsys):
    """`vpo train --data FILE --reward MODULE:FUNCTION ...` on a fixture checkpoint: metrics
    named after the functions, samples.jsonl, resume; a reward function that returns NaN at
    step 2 stops the run with its name, row and value, and the step-1 checkpoint resumes once
    the function is fixed."""
    bpe = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf", "qwen2_bpe")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [
        {"prompt": "What is 2 + 3?", "answer": "5"},
        {"prompt": [{"role": "user", "content": "What is 4 + 4?"}], "answer": "8"},
        {"prompt": "Name a colour.", "answer": "red"}]))
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text(DATA_REWARDS)
    (tmp_path / "FAIL").write_text("")
    out = str(tmp_path / "run")
    common = ["--data", str(data), f"model=hf:{bpe}", "train.batch_size=8",
              "sampler.num_samples=2", "sampler.max_new_tokens=12", "train.checkpoint_every=1",
              "train.sample_every=1", "--out", out]
    assert cli.main(["train", "--reward", f"{rewards}:correct", "--reward", f"{rewards}:short",
                     "--reward", f"{rewards}:flaky", "--weights", "2,1,1",
                     "train.steps=3", *common]) == 2
    err = capsys.readouterr().err
    assert "flaky" in err and "value nan for dataset row" in err and "not finite" in err
    rows = [json.loads(line) for line in _read(os.path.join(out, "metrics.jsonl")).splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert {"reward/correct", "reward/short", "reward/flaky"} <= set(rows[0])
    assert rows[0]["reward/flaky"] == pytest.approx(0.5)
    samples = [json.loads(line) for line in _read(os.path.join(out, "samples.jsonl")).splitlines()]
    assert samples and all(len(s["rewards"][0]) == 3 for s in samples)
    assert {s["step"] for s in samples} == {1}
    # the user fixes the function; --resume continues from the step-1 checkpoint
    os.remove(tmp_path / "FAIL")
    assert cli.main(["train", "--out", out, "--resume"]) == 0
    rows = [json.loads(line) for line in _read(os.path.join(out, "metrics.jsonl")).splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["reward/flaky"] == pytest.approx(0.5) for r in rows)
    info = json.loads(_read(os.path.join(out, "policy", "policy.json")))
    assert info["task"] == "dataset" and info["task_kwargs"]["path"] == str(data)


@pytest.mark.parametrize("argv, message", [
    (["--data", "x.jsonl", "--out", "o"], "--data needs at least one --reward"),
    (["--reward", "r.py:f", "--out", "o"], "--reward needs --data FILE"),
    (["--data", "{data}", "--reward", "{rewards}:short", "--out", "o"],
     "--data: your text is read through a pretrained checkpoint's tokenizer"),
    (["--data", "{data}", "--reward", "{rewards}:short", "--weights", "a,b", "--out", "o"],
     "--weights 'a,b': expected comma-separated numbers"),
    (["--data", "{data}", "--reward", "{rewards}:nope", "model=hf:{bpe}", "--out", "o"],
     "has no function 'nope'"),
])
def test_data_flags_report_errors(capsys, tmp_path, argv, message):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    rewards = tmp_path / "r.py"
    rewards.write_text(DATA_REWARDS)
    bpe = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf", "qwen2_bpe")
    argv = [a.format(data=data, rewards=rewards, bpe=bpe) for a in argv]
    assert cli.main(["train", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_pretrained_checkpoint_gets_a_pretrained_learning_rate():
    """model=hf:... without a learning rate: TRL's GRPO default for full fine-tuning, 1e-4 for
    LoRA; a learning rate the user gives is kept, as is a preset model's default."""
    bpe = "hf:" + os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf",
                               "qwen2_bpe")
    lr = lambda *o: assemble.assemble_run(  # noqa: E731
        None, None, ["task=bandit", *o]).run.train.learning_rate
    assert lr(f"model={bpe}") == 1e-6
    assert lr(f"model={bpe}", "model.lora_rank=4") == 1e-4
    assert lr(f"model={bpe}", "train.learning_rate=3e-4") == 3e-4
    assert lr("model=tiny") == TrainConfig().learning_rate


def test_search_on_your_data_writes_the_best_answers(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "What is 2 + 3?", "answer": "5"}\n'
                    '{"prompt": "Name a colour.", "answer": "red"}\n')
    rewards = tmp_path / "r.py"
    rewards.write_text(DATA_REWARDS)
    bpe = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf", "qwen2_bpe")
    out = str(tmp_path / "s")
    assert cli.main(["search", "--policy", f"hf:{bpe}", "--data", str(data), "--reward",
                     f"{rewards}:correct", "--reward", f"{rewards}:short", "--problems", "2",
                     "--islands", "1", "--members", "2", "--children", "2", "--generations",
                     "1", "--max-new-tokens", "6", "--out", out]) == 0
    rows = [json.loads(line) for line in _read(os.path.join(out, "best_answers.jsonl"))
            .splitlines()]
    assert [(r["method"], r["problem"]) for r in rows] == [
        (m, n) for m in ("search", "best_of_n", "revision") for n in (0, 1)]
    for r in rows:
        assert r["prompt"] in ("What is 2 + 3?", "Name a colour.")
        assert set(r["rewards"]) == {"correct", "short"} and isinstance(r["answer"], str)
        assert r["fitness"] == pytest.approx(sum(r["rewards"].values()) / 2, abs=1e-6)


def test_a_setting_given_to_a_command_without_settings_names_its_flag(capsys, tmp_path):
    assert cli.main(["sft", "model=smollm2", "--out", str(tmp_path / "o")]) == 2
    assert "did you mean --model smollm2?" in capsys.readouterr().err


def test_eval_rows_get_distinct_names():
    from vpo.launch.policy_runs import arm_names

    assert arm_names(["runs/c/arms/vpo/seed0/policy", "runs/c/arms/grpo/seed0/policy"]) == [
        "vpo/seed0", "grpo/seed0"]
    assert arm_names(["runs/a", "runs/b/policy", "hf:/ckpt/qwen"]) == ["a", "b", "qwen"]
    assert arm_names(["x", "x"]) == ["x [0]", "x [1]"]
