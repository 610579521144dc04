"""The Pallas kernels compile for a TPU v5e (one chip and a 4-chip mesh) and an H100 at real
shapes, on this CPU-only machine: `python -m vpo.kernels.aot_check` run by the interpreter of
.venv-aot (libtpu and the CUDA plugin, kept out of the test venv: installed there they make
every plain `import jax` without JAX_PLATFORMS=cpu print plugin errors). Each cell must hold
the kernel's custom call (`tpu_custom_call`; Triton's `__gpu$xla.gpu.triton`), and its
compiled program must need no more than its inputs and a little scratch."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AOT_PYTHON = os.environ.get("VPO_AOT_PYTHON", os.path.join(ROOT, ".venv-aot", "bin", "python"))
INSTALL = ("python3 -m venv .venv-aot && .venv-aot/bin/pip install "
           "\"jax[tpu,cuda12-local]==$(.venv/bin/python -c 'import jax; print(jax.__version__)')\""
           " && .venv-aot/bin/pip install -e .   (as .ci/run does)")
CALL = {"tpu": "tpu_custom_call", "gpu": "__gpu$xla.gpu.triton"}

pytestmark = pytest.mark.skipif(not os.path.exists(AOT_PYTHON),
                                reason=f"no AOT interpreter at {AOT_PYTHON}; make it with: "
                                       f"{INSTALL}")


def _build(target: str, cells: str = "lean", devices: int = 1) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [AOT_PYTHON, "-m", "vpo.kernels.aot_check", "--target", target, "--cells", cells,
         "--devices", str(devices)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    if not rows:
        pytest.fail(f"aot_check --target {target} printed no cell (exit {proc.returncode}):\n"
                    f"{proc.stderr[-3000:]}", pytrace=False)
    return rows


def _check(rows: list[dict]):
    failed = [f"{r['kernel']} {r['pass']} {r['shape']} {r['dtype']}: {r['error']}"
              for r in rows if not r["ok"]]
    assert not failed, "\n".join(failed)
    for r in rows:
        name = f"{r['target']} {r['kernel']} {r['pass']} {r['shape']}"
        assert r["custom_calls"].get(CALL[r["platform"]], 0) >= 1, (name, r["custom_calls"])
        mem = r["memory"]
        # the kernels stream: scratch stays far below the inputs (grad: the chunked backward's
        # [V, D] tiles and weight gradient, about two weight tables)
        assert mem["argument"] > 0 and mem["temp"] <= 2.2 * mem["argument"], (name, mem)
        if r["pass"] == "fwd":
            assert mem["temp"] <= 0.1 * mem["argument"] + 2**26, (name, mem)


@pytest.mark.parametrize("target", ["v5e", "h100"])
def test_kernels_compile_for_one_chip(target):
    rows = _build(target)
    assert {(r["kernel"], r["pass"]) for r in rows} == {
        ("logprob_entropy", "fwd"), ("logprob_entropy", "grad"), ("decode_attention", "fwd")}
    _check(rows)


def test_kernels_compile_per_shard_on_a_v5e_mesh():
    """Rows / samples sharded over 4 chips, one kernel per chip (shard_map)."""
    rows = _build("v5e", devices=4)
    assert rows and all(r["devices"] == 4 for r in rows)
    _check(rows)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["v5e", "v5p", "v6e", "h100"])
def test_kernels_compile_at_all_shapes(target):
    """Also Qwen3-0.6B's 2048 rows, D=4096 in float32, and Qwen2.5-0.5B's decode shape."""
    _check(_build(target, cells="full"))


def test_aot_python_matches_the_test_jax():
    import jax

    out = subprocess.run([AOT_PYTHON, "-c", "import jax; print(jax.__version__)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == jax.__version__, f".venv-aot has jax {out}, tests run {jax.__version__}"
    assert sys.version_info[:2] == tuple(int(x) for x in subprocess.run(
        [AOT_PYTHON, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
        capture_output=True, text=True, check=True).stdout.split())
