"""experiments/device_check.py (the one-call GPU check) in its CPU smoke mode: every part runs at
tiny shapes in a process of its own, with grain made unimportable as on the device, and is
recorded; the JSON and the markdown table are written."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PARTS = ("kernels", "accel", "slots", "packed", "overlap", "graphs", "hf")
HEADER = "| part | what was measured | value | baseline | ratio | seconds | status |"


@pytest.mark.slow
def test_cpu_smoke_records_every_part(tmp_path):
    out = tmp_path / "out"
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                     if "xla_force_host_platform_device_count" not in f)  # one device, as there
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags)
    # the device's 420 s budget is for an accelerator; on a loaded 2-core CPU a part's share of
    # it (34 s for the kernels) can run out, which says nothing about the part: 1200 s here
    proc = subprocess.run([sys.executable, "experiments/device_check.py", "--cpu-smoke",
                           "--budget-s", "1200", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1500)
    report = json.loads((out / "device_check.json").read_text())
    parts = report["parts"]
    assert tuple(parts) == PARTS
    for name, rec in parts.items():
        assert rec["status"] in ("ok", "skipped"), (name, rec.get("reason"),
                                                   rec.get("output_tail"))
        assert rec["status"] == "ok" or rec["reason"], name
    if importlib.util.find_spec("torch") is None:
        assert parts["hf"]["status"] == "skipped" and "torch" in parts["hf"]["reason"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    kernels = parts["kernels"]["data"]
    assert len(kernels["cells"]) == 6 and kernels["interpret"]
    for cell in kernels["cells"]:  # the kernels in interpret mode against their XLA paths
        assert cell["max_abs_diff"] <= 1e-4 * max(1.0, cell["ref_scale"]), cell
    accel = parts["accel"]["data"]
    assert accel["platform"] == "cpu" and accel["sample_tok_s"] > 0
    assert accel["mfu"]["all_tokens_flops"] > accel["mfu"]["completion_flops"] > 0
    assert accel["mfu"]["completion_mfu"] is None  # no peak FLOP/s on CPU
    assert parts["slots"]["data"]["ratio"]["S=2 slots"] > 0
    assert parts["packed"]["data"]["max_grad_diff"] < 1e-4
    assert parts["overlap"]["data"]["speedup"] > 0
    graphs = parts["graphs"]["data"]
    assert "WHILE" in graphs["flags_added"] and graphs["decode_step_s"] > 0
    assert not (out / "kernel_table.json").exists()  # interpret-mode cells refresh nothing

    table = (out / "device_check.md").read_text()
    assert HEADER in table
    for name in PARTS:
        assert f"\n| {name} | " in table, name
    assert [row["part"] for row in report["rows"]].count("accel") >= 8
