"""Kernel call sites take their platform from the devices a program is built for: the tiny
decoder's decode step and the RL log-prob forward, compiled ahead of time for a TPU v5e chip
from this CPU host (by .venv-aot's interpreter, which has libtpu) with the kernels chosen, hold
the Pallas kernels' `tpu_custom_call` (by default a TPU takes XLA: no TPU measurement in
`vpo.kernels.choice`'s table); built for this host's CPU they hold no custom call."""

import json
import os
import subprocess
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AOT_PYTHON = os.environ.get("VPO_AOT_PYTHON", os.path.join(ROOT, ".venv-aot", "bin", "python"))

BUILD = textwrap.dedent("""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec as P

    from vpo.config import model_preset
    from vpo.kernels.hardware import platform_of
    from vpo.model.decoder import Decoder, decode_attention_impl
    from vpo.rl.step import completion_logp

    B, G, PL, T = 2, 2, 8, 4


    def compiled_texts(devices, choice="auto"):
        \"\"\"{name: compiled HLO text} of the decode step and the log-prob forward for a mesh
        of the first device of `devices`, the decode attention by `choice`.\"\"\"
        mesh = jax.sharding.Mesh(np.array(devices[:1]), ("x",))
        cfg = model_preset("tiny")
        graphdef, state = nnx.split(nnx.eval_shape(
            lambda: Decoder(cfg, rngs=nnx.Rngs(0), platform=platform_of(mesh))))
        attention = decode_attention_impl(mesh, choice=choice)

        def decode(state, prompt_BP, tok_BG1):
            model = nnx.merge(graphdef, state)
            _, prefix = model.prefill(prompt_BP)
            cache = model.init_cache(B, G, T, attention)
            h, _ = model.extend(tok_BG1, prefix, cache, start=0, attention=attention)
            return model.logits(h)

        def logp(state, prompt_BP, tokens_BGT):
            model = nnx.merge(graphdef, state)
            return completion_logp(model, prompt_BP, jnp.ones_like(prompt_BP, bool),
                                   tokens_BGT, impl="pallas" if attention == "pallas"
                                   else "chunked")

        rep = NamedSharding(mesh, P())
        aval = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep)
        state = jax.tree.map(aval, state)
        prompt = aval(jax.ShapeDtypeStruct((B, PL), jnp.int32))
        texts = {"attention": attention}
        with jax.set_mesh(mesh):
            for name, fn, tokens in (("decode", decode, (B, G, 1)), ("logp", logp, (B, G, T))):
                tok = aval(jax.ShapeDtypeStruct(tokens, jnp.int32))
                texts[name] = jax.jit(fn).trace(state, prompt, tok).lower().compile().as_text()
        return texts
""")

TPU_MAIN = textwrap.dedent("""
    import json
    from vpo.kernels.aot_check import set_up_env, target_devices
    set_up_env()
    exec(BUILD)
    devices = target_devices("v5e")
    texts = compiled_texts(devices, choice="pallas")
    counts = {k: v if k == "attention" else v.count("tpu_custom_call") for k, v in texts.items()}
    counts["auto"] = decode_attention_impl(devices[:1], keys=16)
    print(json.dumps(counts))
""")


def test_cpu_build_takes_no_kernel():
    import jax

    namespace = {}
    exec(BUILD, namespace)
    texts = namespace["compiled_texts"](jax.devices("cpu"))
    assert texts["attention"] == "xla"
    for name in ("decode", "logp"):
        assert "custom_call" not in texts[name], name


@pytest.mark.skipif(not os.path.exists(AOT_PYTHON),
                    reason=f"no AOT interpreter (libtpu) at {AOT_PYTHON}; see "
                           "tests/kernels/test_kernels_aot.py for how to make it")
def test_tpu_build_from_cpu_host_takes_the_kernels():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([AOT_PYTHON, "-c", f"BUILD = {BUILD!r}\n{TPU_MAIN}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    rows = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    assert rows, f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    counts = json.loads(rows[-1])
    assert counts["auto"] == "xla"  # no TPU measurement in the committed table: XLA by default
    assert counts["attention"] == "pallas"
    assert counts["decode"] >= 1 and counts["logp"] >= 1, counts


def test_gpu_xla_flags_are_added_unless_the_user_sets_them(monkeypatch):
    """vpo's commands turn XLA:GPU's Triton GEMM emitter off (it cannot tile the RL step's
    small dots on H100), keeping every flag the user gave and their own choice of it."""
    from vpo.accel.targets import default_xla_flags

    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    assert default_xla_flags() == ("--xla_force_host_platform_device_count=8 "
                                   "--xla_gpu_enable_triton_gemm=false")
    assert default_xla_flags() == os.environ["XLA_FLAGS"]  # once
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=true")
    assert default_xla_flags() == "--xla_gpu_enable_triton_gemm=true"
    monkeypatch.delenv("XLA_FLAGS")
    assert default_xla_flags() == "--xla_gpu_enable_triton_gemm=false"
