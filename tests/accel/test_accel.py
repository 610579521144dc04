"""`vpo.accel` builds vpo's programs for a TPU v5e (one chip and a 4-chip mesh) and an H100 on
this CPU-only host, from abstract inputs (the tiny preset in bfloat16; no weights): the RL step
(full fine-tuning and LoRA) and the sampler compile, and so does an environment run's step (its
episode programs and update, a tiny Qwen2 checkpoint on the calculator); on one device the RL
step holds the log-prob kernel's custom call with `train.logprob_impl=pallas` and none with
`chunked`; the 4-chip mesh has collectives; every compiled program reports positive argument,
output and RL-step temporary bytes. The builds run in .venv-aot's interpreter (libtpu, the
CUDA plugin)."""

import json
import os
import subprocess
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AOT_PYTHON = os.environ.get("VPO_AOT_PYTHON", os.path.join(ROOT, ".venv-aot", "bin", "python"))
INSTALL = ("python3 -m venv .venv-aot && .venv-aot/bin/pip install "
           "\"jax[tpu,cuda12-local]==$(.venv/bin/python -c 'import jax; print(jax.__version__)')\""
           " && .venv-aot/bin/pip install -e .   (as .ci/run does)")
CALL = {"tpu": "tpu_custom_call", "gpu": "__gpu$xla.gpu.triton"}
BF16 = ["model.param_dtype=bfloat16", "model.dtype=bfloat16"]

# ~2 minutes of compiles on 2 cores: with the slow set (CI runs both), so the default run stays
# under 20 minutes; the kernels' own builds (tests/kernels/test_kernels_aot.py) stay in the
# default run
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(AOT_PYTHON),
                                 reason=f"no AOT interpreter at {AOT_PYTHON}; make it with: "
                                        f"{INSTALL}")]

SCRIPT = textwrap.dedent("""
    import json, sys
    from vpo.accel import targets
    targets.set_up_env()
    from vpo.accel import program_report
    from vpo.launch.assemble import assemble_run

    for cell in json.loads(sys.argv[1]):
        a = assemble_run(None, None, cell["overrides"], dataset=cell.get("dataset"))
        for r in program_report.plan(a.run, a.task, cell["target"], cell["programs"]):
            print(json.dumps({"cell": cell["name"], **r.to_json()}), flush=True)
""")

# (name, target, programs, overrides)
LEAN = [
    ("v5e full pallas", "v5e", ["rl_step", "sampler"], ["train.logprob_impl=pallas"]),
    ("v5e full chunked", "v5e", ["rl_step", "sampler"], ["train.logprob_impl=chunked"]),
    ("v5e lora pallas", "v5e", ["rl_step"], ["train.logprob_impl=pallas", "model.lora_rank=4"]),
    ("v5e:2x2 full fsdp", "v5e:2x2", ["rl_step", "sampler"], ["mesh_fsdp=2"]),
    ("v5e:2x2 lora", "v5e:2x2", ["rl_step"], ["model.lora_rank=4"]),
    ("h100 full pallas", "h100", ["rl_step", "sampler"], ["train.logprob_impl=pallas"]),
    ("h100 lora chunked", "h100", ["rl_step", "sampler"], ["model.lora_rank=4"]),
    # refilled slots in the sampler and the packed update (vpo.rollout.slots, vpo.rl.packing)
    ("v5e slots packed", "v5e", ["rl_step", "sampler"],
     ["sampler.num_slots=8", "train.pack_rows=2"]),
    ("h100 slots packed", "h100", ["rl_step", "sampler"],
     ["sampler.num_slots=8", "train.pack_rows=2"]),
]
# A published shape (Qwen2.5-0.5B, scanned layers, LoRA) on one v5e chip and one H100 (whose
# step XLA's Triton GEMM emitter cannot tile: built with vpo's default XLA:GPU flags, which
# turn it off; `targets.set_up_env` sets them).
QWEN = ["model=qwen2.5-0.5b", "model.scan_layers=true", "model.lora_rank=16", "train.batch_size=4"]
# A multi-turn environment run (`vpo plan --env`, `vpo.accel.env_build`): the tiny Qwen2
# checkpoint of tests/fixtures/hf (its chat template) on the shipped calculator environment.
CALCULATOR = {"env": "vpo.env.calculator:make_env"}
TINY_QWEN2 = [f"model=hf:{os.path.join(ROOT, 'tests', 'fixtures', 'hf', 'qwen2_tied')}",
              "train.batch_size=2", "sampler.num_samples=4", "sampler.max_new_tokens=24"]
ENV = [("v5e env calculator", "v5e", ["rl_step", "sampler", "kernels"], TINY_QWEN2),
       ("h100 env calculator", "h100", ["rl_step", "sampler", "kernels"], TINY_QWEN2)]
SLOW = [
    ("v5e qwen2.5-0.5b lora", "v5e", ["rl_step"], QWEN),
    ("h100 qwen2.5-0.5b lora", "h100", ["rl_step"], QWEN),
]


def _plan(cells, timeout=900, dataset=None) -> dict[str, list[dict]]:
    spec = [{"name": n, "target": t, "programs": p, "overrides": [*BF16, *o], "dataset": dataset}
            for n, t, p, o in cells]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([AOT_PYTHON, "-c", SCRIPT, json.dumps(spec)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode or not rows:
        pytest.fail(f"vpo.accel build failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}",
                    pytrace=False)
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["cell"], []).append(r)
    return out


@pytest.fixture(scope="module")
def lean():
    return _plan(LEAN)


def _check_built(rows):
    for r in rows:
        name = f"{r['cell']}: {r['program']}"
        assert r["ok"], (name, r["error_name"], r["error"])
        assert r["fits"], (name, r["bytes_per_device"])
        assert r["argument_bytes"] > 0 and r["output_bytes"] > 0, (name, r)
        # temporaries as the compiler reports them (XLA:TPU reports none for the tiny RL step
        # once the sampler's decode attention is a Mosaic kernel)
        assert r["temp_bytes"] >= 0 and r["bytes_per_device"] > 0, (name, r)


@pytest.mark.parametrize("cell", [c[0] for c in LEAN])
def test_programs_compile_with_memory(lean, cell):
    rows = lean[cell]
    assert {r["program"] for r in rows} == set(next(c[2] for c in LEAN if c[0] == cell))
    _check_built(rows)


@pytest.mark.parametrize("cell,platform", [("v5e full pallas", "tpu"), ("v5e lora pallas", "tpu"),
                                           ("h100 full pallas", "gpu")])
def test_rl_step_holds_the_kernel_with_pallas(lean, cell, platform):
    step = next(r for r in lean[cell] if r["program"] == "rl_step")
    assert step["custom_calls"].get(CALL[platform], 0) >= 1, step["custom_calls"]


@pytest.mark.parametrize("cell", ["v5e full chunked", "h100 lora chunked"])
def test_rl_step_has_no_logprob_kernel_when_chunked(lean, cell):
    """logprob_impl=chunked: the log-prob kernel is absent; the decode-attention kernel of the
    sampler (one chip) stays, so the step holds exactly the sampler's kernel calls."""
    step = next(r for r in lean[cell] if r["program"] == "rl_step")
    sampler = next(r for r in lean[cell] if r["program"] == "sampler")
    assert step["custom_calls"] == sampler["custom_calls"], (step["custom_calls"],
                                                              sampler["custom_calls"])


def test_a_mesh_build_has_collectives_and_one_chip_none(lean):
    for cell in ("v5e:2x2 full fsdp", "v5e:2x2 lora"):
        for r in lean[cell]:
            assert sum(r["collectives"].values()) > 0, (cell, r["program"])
            assert r["target"] == "v5e-4"
    assert not any(r["collectives"] for r in lean["v5e full chunked"])


@pytest.fixture(scope="module")
def env_plans():
    return _plan(ENV, dataset=CALCULATOR)


@pytest.mark.parametrize("cell", [c[0] for c in ENV])
def test_environment_step_compiles_with_memory(env_plans, cell):
    """The episode prefill, the advance at the first and the widest observation queue (8 and
    32 tokens under a budget of 24) and the update compile and fit; the single-turn sampler
    and the decode kernel, which episodes do not run, are rows that say so."""
    rows = {r["program"]: r for r in env_plans[cell]}
    _check_built([rows[p] for p in ("env_prefill", "env_advance (queue 8)",
                                    "env_advance (queue 32)", "env_update")])
    for name in ("sampler", "kernel decode_attention"):
        r = rows[name]
        assert not r["applicable"] and r["error_name"] == "NotApplicable", r
        assert "--env vpo.env.calculator:make_env" in r["error"], r["error"]


def test_plan_refuses_a_batch_the_mesh_cannot_split_and_names_the_setting():
    rows = _plan([("odd batch", "v5e:2x2", ["rl_step"], ["train.batch_size=2"])])["odd batch"]
    (r,) = rows
    assert not r["ok"] and r["error_name"] == "SettingRefused", r
    assert "train.batch_size" in r["error"]


@pytest.mark.slow
def test_a_published_shape_compiles_and_fits():
    """Qwen2.5-0.5B's RL step, LoRA on one v5e chip: compiles and fits."""
    for rows in _plan(SLOW, timeout=3000).values():
        _check_built(rows)
