"""`vpo train --report-to`: the sink names, a missing wandb package named before a run starts,
and an offline W&B run in <out>/wandb holding the run config, every step's metrics and the
sample tables (read back from its .wandb records file)."""

import glob
import importlib.util
import json
import os
import struct

import pytest

from vpo.cli import main as cli
from vpo.config import ConfigError
from vpo.run import metrics_log

HAS_WANDB = importlib.util.find_spec("wandb") is not None
needs_wandb = pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed "
                                 "(pip install 'vpo[wandb]' or the test extra)")


def test_report_to_names():
    assert metrics_log.parse_report_to(None) == ("tensorboard",)
    assert metrics_log.parse_report_to("none") == ()
    assert metrics_log.parse_report_to(" Tensorboard ,none") == ("tensorboard",)
    with pytest.raises(ConfigError, match="unknown 'mlflow'"):
        metrics_log.parse_report_to("tensorboard,mlflow")


def test_missing_wandb_is_named_before_the_run(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    out = tmp_path / "run"
    assert cli.main(["train", "--preset", "smoke", "--report-to", "wandb", "--out",
                     str(out)]) == 2
    assert "pip install 'vpo[wandb]'" in capsys.readouterr().err
    assert not out.exists()  # refused before the run folder was touched


def _records(path):
    """The protobuf records of a .wandb file (a LevelDB-style log: 7-byte header, 32 KiB
    blocks of chunks, each with crc32c, length, type FULL 1 / FIRST 2 / MIDDLE 3 / LAST 4)."""
    from wandb.proto import wandb_internal_pb2 as pb

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header: padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if n == 0 and kind == 0:
            pos += block - pos % block
            continue
        buf += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            yield record


@needs_wandb
def test_offline_wandb_run_logs_config_metrics_and_samples(tmp_path, monkeypatch):
    for k, v in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
                 "WANDB_CONFIG_DIR": str(tmp_path / "cfg"), "WANDB_CACHE_DIR": str(tmp_path / "c"),
                 "WANDB_DATA_DIR": str(tmp_path / "d")}.items():
        monkeypatch.setenv(k, v)
    bpe = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf", "qwen2_bpe")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)})
                            + "\n" for i in range(4)))
    rewards = tmp_path / "length_reward.py"
    rewards.write_text("def short(completions, **kw):\n"
                       "    return [1.0 / (1 + len(c)) for c in completions]\n")
    out = str(tmp_path / "run")
    assert cli.main(["train", "--data", str(data), "--reward", f"{rewards}:short",
                     f"model=hf:{bpe}", "train.batch_size=8", "sampler.num_samples=2",
                     "sampler.max_new_tokens=10", "train.steps=3", "train.sample_every=2",
                     "--report-to", "wandb,tensorboard", "--out", out]) == 0
    assert os.path.isdir(os.path.join(out, "tb"))
    [path] = glob.glob(os.path.join(out, "wandb", "offline-run-*", "run-*.wandb"))
    history, config = {}, {}
    for r in _records(path):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in r.history.item}
            history.setdefault(items["_step"], {}).update(items)
        elif kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in r.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in r.config.update})
    assert config["train"]["steps"] == 3 and config["task"] == "dataset"
    rows = metrics_log.read_rows(os.path.join(out, "metrics.jsonl"))
    assert sorted(history) == [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        logged = history[row["step"]]
        assert logged["loss"] == pytest.approx(row["loss"])
        assert logged["reward/short"] == pytest.approx(row["reward/short"])
    assert history[2]["samples/_type"] == "table-file"  # the sample log's rows at step 2
