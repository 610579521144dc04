"""LoRA checkpoints hold the adapters and optimiser state only (the base by reference and
checksum), resume from them is bit-exact, a changed base is refused; `vpo export` writes a PEFT
adapter folder (checked field by field against PEFT's format, its merge equal to vpo's merged
export) and a transformers folder in the asked dtype.

One LoRA run (bandit, rank-2 adapters on all seven projections of a D=256 model started from a
Hugging Face folder) is trained 2 steps straight and 1 + 1 resumed.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from vpo.cli.main import main
from vpo.config import (
    LORA_TARGETS,
    ObjectiveConfig,
    RunConfig,
    SamplerConfig,
    TrainConfig,
    model_preset,
)
from vpo.errors import CheckpointError
from vpo.io import hf, peft, run_checkpoint
from vpo.io.tokenizer import word_tokenizer
from vpo.model import lora, sharding
from vpo.model.decoder import Decoder
from vpo.run import loop as loop_lib
from vpo.run import run_folder
from vpo.tasks import answers as answers_lib
from vpo.tasks import make_task
from vpo.tasks.bandit import ARMS
from vpo.tasks.bound import bind

RANK, M = 2, 2


def compact_bandit():
    """The bandit on a 12-token vocabulary (as in test_lora)."""
    slots = [answers_lib.open_tag(k) for k in (1, 2)]
    slots += [f"{arm} {answers_lib.close_tag(k)}" for k in (1, 2) for arm in ARMS]
    return bind(make_task("bandit", max_answers=4), word_tokenizer([], added=slots))


def run_config(task) -> RunConfig:
    T = task.completion_len(M)
    P = task.prompt_arrays(task.make_problems(0, 64), M)[0].shape[1]
    model = model_preset("tiny", vocab_size=task.tokenizer.size, max_seq_len=P + T, dim=256,
                         mlp_dim=512, head_dim=64, lora_rank=RANK, lora_alpha=8.0)
    return RunConfig(model=model, sampler=SamplerConfig(max_new_tokens=T, num_samples=8),
                     objective=ObjectiveConfig(kl_coef=0.1),
                     train=TrainConfig(batch_size=4, num_answers=M, num_problems=64,
                                       learning_rate=1e-2, steps=2, checkpoint_every=1,
                                       profile_every=0))


def mesh1():
    return sharding.make_mesh(devices=jax.devices()[:1])


def arrays(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    task = compact_bandit()
    run = run_config(task)
    base_dir = str(tmp / "base")
    hf.save_pretrained(Decoder(lora.base_config(run.model), rngs=nnx.Rngs(7)), base_dir)
    out = {}
    for name in ("a", "b"):
        out[name] = str(tmp / name)
        os.makedirs(out[name])
        with open(os.path.join(out[name], run_folder.INIT_FILE), "w") as f:
            json.dump({"init": f"hf:{base_dir}"}, f)
    load = lambda: hf.from_pretrained(base_dir)  # noqa: E731
    graphdef, s_straight = loop_lib.train(run, out["a"], task=task, mesh=mesh1(),
                                          progress=False, init=load())
    loop_lib.train(run, out["b"], task=task, mesh=mesh1(), progress=False, init=load(),
                   stop_at=1)
    _, s_resumed = loop_lib.train(run, out["b"], resume=True, task=task, mesh=mesh1(),
                                  progress=False, init=load())
    return dict(tmp=tmp, task=task, run=run, base=base_dir, load=load, graphdef=graphdef,
                straight=s_straight, resumed=s_resumed, **out)


def test_checkpoint_holds_adapters_only(runs):
    step_dir = os.path.join(runs["a"], "checkpoints", "2")
    assert os.path.isdir(os.path.join(step_dir, "base"))
    state = runs["straight"]  # the final state, step 2
    full = str(runs["tmp"] / "full")
    mngr = run_checkpoint.CheckpointManager(full, async_save=False)
    mngr.save(2, state._asdict())  # the same state with its base, as before
    mngr.close()
    small, big = dir_bytes(step_dir), dir_bytes(os.path.join(full, "2"))
    assert small * 10 <= big, (small, big)


def test_resume_from_adapters_only_is_bit_exact(runs):
    a, b = runs["straight"], runs["resumed"]
    assert a.frozen is not None
    for x, y in zip(arrays(a), arrays(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_changed_base_is_refused(runs):
    run, out = runs["run"], runs["a"]
    changed = runs["load"]()
    changed.layers[0].attn.wq[...] = changed.layers[0].attn.wq[...] * 1.0001
    with pytest.raises(CheckpointError, match=f"base model.*hf:{runs['base']}"):
        loop_lib.train(dataclasses.replace(run, train=dataclasses.replace(run.train, steps=3)),
                       out, resume=True, task=runs["task"], mesh=mesh1(), progress=False,
                       init=changed)


def test_adapter_export_is_peft_format(runs):
    adapter, merged = str(runs["tmp"] / "adapter"), str(runs["tmp"] / "merged")
    assert main(["export", "--policy", runs["a"], "--out", adapter, "--adapter"]) == 0
    assert main(["export", "--policy", runs["a"], "--out", merged, "--merged"]) == 0
    assert sorted(os.listdir(adapter)) == ["adapter_config.json", "adapter_model.safetensors"]
    config, tensors = peft.load_adapter(adapter)
    cfg = runs["run"].model
    assert {k: config[k] for k in ("peft_type", "task_type", "r", "lora_alpha", "bias",
                                   "base_model_name_or_path", "fan_in_fan_out")} == {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": 8,
        "bias": "none", "base_model_name_or_path": runs["base"], "fan_in_fan_out": False}
    assert config["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                        "up_proj", "down_proj"]
    from safetensors.numpy import load_file

    base = load_file(os.path.join(runs["base"], "model.safetensors"))
    out = load_file(os.path.join(merged, "model.safetensors"))
    assert len(tensors) == 2 * cfg.num_layers * len(LORA_TARGETS)
    for i in range(cfg.num_layers):
        for module in config["target_modules"]:
            part = "self_attn" if module[0] in "qkvo" else "mlp"
            name = f"model.layers.{i}.{part}.{module}"
            la = tensors[f"base_model.model.{name}.lora_A.weight"]
            lb = tensors[f"base_model.model.{name}.lora_B.weight"]
            w = base[name + ".weight"]
            assert la.shape == (RANK, w.shape[1]) and lb.shape == (w.shape[0], RANK)
            assert np.abs(lb).max() > 0  # trained
            np.testing.assert_allclose(peft.merged_weight(w, la, lb, config),
                                       out[name + ".weight"], rtol=1e-5, atol=1e-6)
    for name in base:  # everything else is the base, bit for bit
        if not any(f".{m}." in name for m in config["target_modules"]):
            np.testing.assert_array_equal(base[name], out[name])
    with open(os.path.join(merged, "config.json")) as f:
        assert json.load(f)["model_type"] == "llama"
    assert os.path.exists(os.path.join(merged, "tokenizer.json"))


def test_merged_export_in_bfloat16(runs):
    out = str(runs["tmp"] / "bf16")
    assert main(["export", "--policy", runs["a"], "--out", out, "--merged",
                 "--dtype", "bfloat16"]) == 0
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["torch_dtype"] == "bfloat16"
    model = hf.from_pretrained(out)
    assert jax.tree.leaves(nnx.state(model, nnx.Param))[0].dtype == "bfloat16"
    assert main(["export", "--policy", runs["a"], "--out", out, "--merged"]) == 2


HF_PYTHON = os.environ.get("VPO_HF_PYTHON", "")
PEFT_SCRIPT = """
import json, sys
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

base_dir, adapter, merged = sys.argv[1:4]
ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7]])
with torch.no_grad():
    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32), adapter)
    ours = AutoModelForCausalLM.from_pretrained(merged, torch_dtype=torch.float32)
    a, b = peft_model(ids).logits, ours(ids).logits
    folded = peft_model.merge_and_unload().state_dict()
    weights = max(float((folded[k] - v).abs().max()) for k, v in ours.state_dict().items())
print(json.dumps({"logits": float((a - b).abs().max()), "scale": float(b.abs().max()),
                  "weights": weights}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(HF_PYTHON or "/nonexistent"),
                    reason="VPO_HF_PYTHON: a Python with torch, transformers and peft")
def test_peft_loads_the_adapter_onto_its_base(runs):
    """PEFT itself (PeftModel.from_pretrained on the transformers base) reads `vpo export
    --adapter`: its logits equal those of vpo's merged export, and its merge_and_unload equals
    the merged weights."""
    import subprocess

    adapter, merged = str(runs["tmp"] / "peft_adapter"), str(runs["tmp"] / "peft_merged")
    assert main(["export", "--policy", runs["a"], "--out", adapter, "--adapter"]) == 0
    assert main(["export", "--policy", runs["a"], "--out", merged, "--merged"]) == 0
    proc = subprocess.run([HF_PYTHON, "-c", PEFT_SCRIPT, runs["base"], adapter, merged],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["scale"] > 0 and got["logits"] <= 1e-4 * max(1.0, got["scale"]), got
    assert got["weights"] <= 1e-5, got
