"""The scripts in examples/objective/ run as a user runs them (own process, own 2-device mesh)."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (ROOT / "examples" / "objective").glob("*.py"))


def test_the_examples_are_all_here():
    assert EXAMPLES == ["linen_trl_layout.py", "nnx_train_step.py", "vpo_vector_rewards.py"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the script sets its own
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "objective" / name)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    if name != "vpo_vector_rewards.py":
        assert "devices 2" in out.stdout, out.stdout  # the 2-device mesh
