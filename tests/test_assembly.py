"""One rule in one place: the sequence-length fit and the pretrained learning rate live in
`vpo.launch.rules`, and changing either there changes what every entry point builds
(`vpo train`, `vpo sft`, `vpo compare`)."""

import os

import pytest

from vpo.cli import main as cli
from vpo.compare import config as compare_config
from vpo.compare import driver as compare
from vpo.launch import assemble, rules, warm_start

BPE = os.path.join(os.path.dirname(__file__), "fixtures", "hf", "qwen2_bpe")


class _SeenError(Exception):
    """Raised by a spy to stop a command once it has asked for the value under test."""


def test_the_sequence_length_fit_is_one_rule_every_entry_point_follows(monkeypatch, tmp_path):
    before = assemble.assemble_run("maze", None, ["model=tiny"]).run.model.max_seq_len
    task = rules.load_task(compare_config.make_config("smoke").task)
    cfg = compare_config.make_config("smoke")
    compare_before = compare._seq_len(cfg, task, 1)
    monkeypatch.setattr(rules, "SEQ_MARGIN", 5000)
    assert assemble.assemble_run("maze", None, ["model=tiny"]).run.model.max_seq_len > 5000 > before
    assert compare._seq_len(cfg, task, 1) > 5000 > compare_before

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
