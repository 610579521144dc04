"""One rule in one place: the sequence-length fit and the pretrained learning rate live in
`vpo.launch.rules`, and changing either there changes what every entry point builds
(`vpo train`, `vpo sft`, `vpo compare`)."""

import os

import pytest

from vpo.cli import main as cli
from vpo.compare import config as compare_config
from vpo.compare import driver
from vpo.launch import assemble, rules, warm_start

BPE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf", "qwen2_bpe")


class _SeenError(Exception):
    """Raised by a spy to stop a command once it has asked for the value under test."""


def test_the_sequence_length_fit_is_one_rule_every_entry_point_follows(monkeypatch, tmp_path):
    before = assemble.assemble_run("maze", None, ["model=tiny"]).run.model.max_seq_len
    task = rules.load_task(compare_config.make_config("smoke").task)
    cfg = compare_config.make_config("smoke")
    compare_before = driver._seq_len(cfg, task, 1)
    monkeypatch.setattr(rules, "SEQ_MARGIN", 5000)
    assert assemble.assemble_run("maze", None, ["model=tiny"]).run.model.max_seq_len > 5000 > before
    assert driver._seq_len(cfg, task, 1) > 5000 > compare_before

    def spy(*args, **kwargs):
        raise _SeenError(kwargs)

    monkeypatch.setattr(rules, "fit_seq_len", spy)
    with pytest.raises(_SeenError):  # vpo sft asks the same function for its length
        cli.main(["sft", "--task", "bandit", "--steps", "1", "--out", str(tmp_path / "s")])


def test_the_pretrained_learning_rate_is_one_rule_every_entry_point_follows(monkeypatch,
                                                                             tmp_path):
    monkeypatch.setitem(rules.PRETRAINED_LR, "rl", 7e-7)
    monkeypatch.setitem(rules.PRETRAINED_LR, "sft", 3e-5)
    train = assemble.assemble_run(None, None, ["task=bandit", f"model=hf:{BPE}"]).run
    assert train.train.learning_rate == 7e-7
    assert rules.learning_rate("sft", f"hf:{BPE}", 0) == 3e-5
    assert rules.learning_rate("sft", None, 0) == rules.FROM_SCRATCH_LR["sft"]
    # vpo compare's warm start asks the same rule when its preset leaves sft_lr out
    cfg = compare_config.make_config("smoke", [f"init=hf:{BPE}"])
    assert cfg.sft_lr is None
    task = rules.load_task(cfg.task, cfg.init)
    plan = warm_start.assemble_sft(task, cfg.init, num_answers=[1, 2], seed=0,
                                   learning_rate=cfg.sft_lr)
    assert plan.learning_rate == 3e-5

    seen = {}

    def spy(kind, spec, lora_rank, given=None):
        seen.update(kind=kind, spec=spec, given=given)
        raise _SeenError

    monkeypatch.setattr(rules, "learning_rate", spy)
    with pytest.raises(_SeenError):  # vpo sft asks the same rule
        cli.main(["sft", "--task", "bandit", "--steps", "1", "--out", str(tmp_path / "s")])
    assert seen == {"kind": "sft", "spec": "tiny", "given": None}


def test_a_policy_folder_of_pretrained_weights_counts_as_pretrained(tmp_path):
    """`source_of`: an SFT of a checkpoint records its source, so RL from it gets the
    pretrained rate too (it got the from-scratch 1e-3)."""
    folder = tmp_path / "policy"
    folder.mkdir()
    (folder / "policy.json").write_text(f'{{"model": {{}}, "source": "hf:{BPE}"}}')
    assert rules.source_of(str(folder)) == f"hf:{BPE}"
    assert rules.source_of("tiny") is None and rules.source_of(None) is None


def test_a_value_the_preset_or_the_user_sets_is_never_replaced_by_a_rule():
    """'Not given' is None or an absent key, never a value equal to a default: the smollm
    preset's rates (3e-4 RL, 5e-4 SFT, from a pretrained checkpoint) are the ones it runs at,
    and so is a user's rate equal to the from-scratch default."""
    smollm = compare_config.PRESETS["smollm"]
    cfg = compare_config.make_config("smollm")
    assert cfg.train.learning_rate == smollm.train.learning_rate == 3e-4
    assert cfg.sft_lr == smollm.sft_lr == 5e-4
    cfg = compare_config.make_config("smoke", [f"init=hf:{BPE}"])
    assert cfg.train.learning_rate == compare_config.PRESETS["smoke"].train.learning_rate
    default_rate = rules.FROM_SCRATCH_LR["rl"]
    given = assemble.assemble_run(None, None, ["task=bandit", f"model=hf:{BPE}",
                                               f"train.learning_rate={default_rate}"]).run
    assert given.train.learning_rate == default_rate  # not the pretrained 1e-6


def test_fitted_fields_keep_a_given_value_and_fill_an_absent_one():
    """vocab_size, max_seq_len and max_new_tokens: a given value at or above the task's need is
    kept as given (even when it equals the default); an absent one is fitted to the need."""
    from vpo.config import RunConfig

    default = RunConfig()
    fitted = assemble.assemble_run("maze", None, ["model=tiny"]).run
    assert fitted.model.max_seq_len >= default.model.max_seq_len
    for key, value in (("model.max_seq_len", fitted.model.max_seq_len + 7),
                       ("model.vocab_size", fitted.model.vocab_size + 3),
                       ("sampler.max_new_tokens", fitted.sampler.max_new_tokens + 2)):
        run = assemble.assemble_run("maze", None, ["model=tiny", f"{key}={value}"]).run
        section, field = key.split(".")
        assert getattr(getattr(run, section), field) == value, key


# -- the budget against a checkpoint's context: one rule (`rules.fit_budget`) -----------------

@pytest.fixture(scope="module")
def short_context(tmp_path_factory):
    """The BPE fixture with a 64- and a 128-position context, a two-row data file and its
    reward module."""
    import json
    import shutil

    tmp = tmp_path_factory.mktemp("context")
    out = {}
    for n in (64, 128):
        folder = tmp / f"bpe{n}"
        shutil.copytree(BPE, folder)
        cfg = json.loads((folder / "config.json").read_text())
        cfg["max_position_embeddings"] = n
        (folder / "config.json").write_text(json.dumps(cfg))
        out[n] = f"hf:{folder}"
    (tmp / "data.jsonl").write_text('{"prompt": "What is 2 + 3?"}\n{"prompt": "Name a colour."}\n')
    (tmp / "long.jsonl").write_text('{"prompt": "' + "word " * 80 + '"}\n')
    (tmp / "rewards.py").write_text("def ok(prompts, completions, **kw):\n"
                                    "    return [0.5] * len(completions)\n")
    out["data"] = {"path": str(tmp / "data.jsonl"), "rewards": [f"{tmp}/rewards.py:ok"]}
    out["long"] = {**out["data"], "path": str(tmp / "long.jsonl")}
    return out


def test_a_budget_left_out_is_fitted_within_a_short_context(short_context):
    """--data on a 64-position checkpoint without sampler.max_new_tokens: the budget is fitted
    to what the longest prompt leaves (it was fitted to 64 tokens, then refused), at least the
    task's answer budget; the sequence length stays within the context."""
    plan = assemble.assemble_run(None, None, [f"model={short_context[64]}"],
                                 dataset=short_context["data"])
    run, task = plan.run, plan.task
    records = task.make_problems(run.train.seed, 64)
    prompt_len = task.prompt_arrays(records, run.train.num_answers)[0].shape[1]
    budget = run.sampler.max_new_tokens
    assert task.completion_len(run.train.num_answers) <= budget == 64 - prompt_len
    assert run.model.max_seq_len == 64
    # the same data on the full context keeps its default budget
    wide = assemble.assemble_run(None, None, [f"model=hf:{BPE}"], dataset=short_context["data"])
    assert wide.run.sampler.max_new_tokens > budget


def test_a_budget_that_cannot_fit_says_what_helps(short_context):
    given = f"sampler.max_new_tokens={40}"
    with pytest.raises(assemble.ConfigError) as e:
        assemble.assemble_run(None, None, [f"model={short_context[64]}", given],
                              dataset=short_context["data"])
    text = str(e.value)
    assert "trained on 64" in text and "lower sampler.max_new_tokens to at most " in text
    assert "model.max_seq_len" not in text  # cannot help a pretrained checkpoint
    with pytest.raises(assemble.ConfigError, match="no budget fits") as e:
        assemble.assemble_run(None, None, [f"model={short_context[64]}"],
                              dataset=short_context["long"])
    assert "shorten the longest prompts" in str(e.value)


def test_sample_eval_and_search_fit_their_budget_by_the_same_rule(short_context, capsys):
    """`vpo sample/eval/search` (`launch.policy_runs.budget_of`) on a 64-position checkpoint: a
    budget left out is fitted to what the longest prompt leaves and said so; one given that does
    not fit is refused naming the command's flag; no checkpoint context (a preset): unchanged."""
    from vpo.launch.policy_runs import budget_of

    task = assemble.assemble_run(None, None, [f"model={short_context[64]}"],
                                 dataset=short_context["data"]).task
    records = task.make_problems(0, 2)
    prompt_len = task.prompt_arrays(records, 1)[0].shape[1]
    unfitted = budget_of(task, 1, short_context[64], None)
    assert unfitted > 64 - prompt_len  # the default alone would run past the context
    assert budget_of(task, 1, short_context[64], None, records=records) == 64 - prompt_len
    assert "budget fitted from" in capsys.readouterr().err
    room = 64 - prompt_len
    assert budget_of(task, 1, short_context[64], room, records=records) == room
    with pytest.raises(assemble.ConfigError, match=f"lower --max-new-tokens to at most {room}"):
        budget_of(task, 1, short_context[64], room + 5, records=records)
    assert budget_of(task, 1, "tiny", 60, records=records) == 60


def test_the_packed_update_is_on_by_default_where_it_pays(short_context):
    """`rules.pack_rows`: free-text data with a budget of at least PACK_MIN_BUDGET tokens packs
    into G/2 rows; an in-graph task, a short budget, or a value the user set stays as is."""
    data = short_context["data"]
    run = assemble.assemble_run(None, None, [f"model=hf:{BPE}", "sampler.num_samples=8",
                                             "sampler.max_new_tokens=128"], dataset=data).run
    assert run.train.pack_rows == 4
    for overrides in (["sampler.max_new_tokens=64"], ["train.pack_rows=0"],
                      ["train.pack_rows=0", "sampler.max_new_tokens=256"]):
        run = assemble.assemble_run(None, None, [f"model=hf:{BPE}", "sampler.num_samples=8",
                                                 *overrides], dataset=data).run
        assert run.train.pack_rows == 0, overrides
    run = assemble.assemble_run(None, None, [f"model=hf:{BPE}", "train.pack_rows=3",
                                             "sampler.max_new_tokens=256"], dataset=data).run
    assert run.train.pack_rows == 3
    assert assemble.assemble_run("maze", None, ["model=tiny"]).run.train.pack_rows == 0


def test_an_in_graph_task_on_a_short_checkpoint_gets_advice_that_works(short_context):
    """maze on a 128-position checkpoint: one message, which names neither
    sampler.max_new_tokens (an in-graph task's budget is its answer budget) nor model.max_seq_len
    (a pretrained checkpoint's context is fixed)."""
    with pytest.raises(assemble.ConfigError) as e:
        assemble.assemble_run(None, None, [f"model={short_context[128]}", "task=maze"])
    text = str(e.value)
    assert "trained on 128" in text and "longer context" in text and "task_kwargs" in text
    assert "sampler.max_new_tokens" not in text and "model.max_seq_len" not in text
    # the same rule's message where no checkpoint bounds the length (vpo.rl.checks.check_run)
    task = rules.load_task("maze")
    scratch = rules.too_long(task, 1, 300, task.completion_len(1), max_seq_len=200)
    assert "raise model.max_seq_len to at least 300" in scratch
    assert "sampler.max_new_tokens" not in scratch
