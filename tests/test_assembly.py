"""One rule in one place: the sequence-length fit and the pretrained learning rate live in
`vpo.launch.rules`, and changing either there changes what every entry point builds
(`vpo train`, `vpo sft`, `vpo compare`)."""

import os

import pytest

from vpo.cli import main as cli
from vpo.compare import config as compare_config
from vpo.compare import driver as compare
from vpo.config import run as run_config
from vpo.launch import assemble, rules

BPE = os.path.join(os.path.dirname(__file__), "fixtures", "hf", "qwen2_bpe")


class _SeenError(Exception):
    """Raised by a spy to stop a command once it has asked for the value under test."""


def test_the_sequence_length_fit_is_one_rule_every_entry_point_follows(monkeypatch, tmp_path):
    before = assemble.assemble_run("maze", None, ["model=tiny"]).run.model.max_seq_len
    task = compare.make_task(compare_config.make_config("smoke"))
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
    monkeypatch.setitem(run_config.PRETRAINED_LR, "rl", 7e-7)
    monkeypatch.setitem(run_config.PRETRAINED_LR, "sft", 3e-5)
    train = assemble.assemble_run(None, None, ["task=bandit", f"model=hf:{BPE}"]).run
    assert train.train.learning_rate == 7e-7
    arm = compare_config.make_config("smoke", [f"init=hf:{BPE}"])
    assert arm.train.learning_rate == 7e-7  # was the from-scratch 3e-4
    assert compare_config.make_config("smoke", [f"init=hf:{BPE}", "train.learning_rate=1e-3"]
                                      ).train.learning_rate == 1e-3  # a given rate is kept
    assert rules.learning_rate("sft", f"hf:{BPE}", 0) == 3e-5
    assert rules.learning_rate("sft", None, 0) == rules.FROM_SCRATCH_LR["sft"]

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
