"""experiments/decode_anatomy.py and update_anatomy.py on the tiny preset built for an H100 (in
.venv-aot's interpreter, as `vpo plan`): the decode loop with merged products launches fewer
kernels and moves fewer bytes than with the separate ones (no weight concatenation left in the
loop), and the update's walk finds its products, all bf16, their FLOPs near the model count."""

import json
import os
import subprocess

import pytest

from tests.accel.test_accel import AOT_PYTHON, INSTALL, ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(AOT_PYTHON),
                                 reason=f"no AOT interpreter at {AOT_PYTHON}; make it with: "
                                        f"{INSTALL}")]
SHAPE = ["--model", "tiny", "--B", "2", "--G", "2", "--T", "16"]


def _run(script, args, tmp_path, name):
    out = tmp_path / f"{name}.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "experiments")])
    proc = subprocess.run([AOT_PYTHON, os.path.join(ROOT, "experiments", script), *args,
                           "--json", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_decode_loop_merges_products_once(tmp_path):
    merged = _run("decode_anatomy.py", SHAPE, tmp_path, "merged")
    separate = _run("decode_anatomy.py", [*SHAPE, "--separate"], tmp_path, "separate")
    assert merged["merged"] and not separate["merged"]
    assert merged["kernels"] < separate["kernels"], (merged["by_kind"], separate["by_kind"])
    assert merged["bytes"] < separate["bytes"]


def test_update_walk_counts_the_products(tmp_path):
    # vocabulary tiles of 16 (the tiny vocabulary would be one tile: the materialised reference)
    d = _run("update_anatomy.py", [*SHAPE, "--grad-accum", "2", "--set", "train.vocab_block=16"],
             tmp_path, "update")
    assert d["unknown_trip_counts"] == 0 and d["kernels"] > 0 and d["bytes"] > 0
    bf16 = d["gemm_flops_by_dtype"].get("bf16 x bf16", 0.0)
    assert 0.5 * d["model_flops"] < bf16 < 3 * d["model_flops"], (d["gemm_flops_by_dtype"],
                                                                  d["model_flops"])
    assert set(d["bytes_by_part"]) <= {"layers", "attention", "vocabulary tiles"}
    # a bf16 policy's gradient products stay in bf16 (kernels.precision, the log-prob backward)
    assert set(d["gemm_flops_by_dtype"]) == {"bf16 x bf16"}, d["gemm_flops_by_dtype"]
