"""LoRA (vpo.model.lora): only the adapters train, the KL reference is the frozen base, the merged
export equals the adapted model, resume is exact, bad settings name their field.

RL runs share one tiny shape (bandit on a 12-token vocabulary, B=4 prompts, G=8, M=2, tiny
model with rank-4 adapters on all seven projections, one minibatch) so compiles are reused.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vpo.config import (
    LORA_TARGETS,
    ConfigError,
    ModelConfig,
    ObjectiveConfig,
    RunConfig,
    SamplerConfig,
    TrainConfig,
    apply_overrides,
    from_dict,
    model_preset,
)
from vpo.io import hf, policy_folder
from vpo.io.tokenizer import word_tokenizer
from vpo.model import lora, sharding
from vpo.model.decoder import Decoder
from vpo.rl import step as step_lib
from vpo.run import data as data_lib
from vpo.run import loop as loop_lib
from vpo.tasks import answers as answers_lib
from vpo.tasks import make_task
from vpo.tasks.bandit import ARMS
from vpo.tasks.bound import bind

M, RANK, STEPS = 2, 4, 2


def compact_bandit():
    """The bandit on a 12-token vocabulary (as in test_rl_step: a random policy fills slots)."""
    task = make_task("bandit", max_answers=4)
    slots = [answers_lib.open_tag(k) for k in (1, 2)]
    slots += [f"{arm} {answers_lib.close_tag(k)}" for k in (1, 2) for arm in ARMS]
    return bind(task, word_tokenizer([], added=slots))


@pytest.fixture(scope="module")
def task():
    return compact_bandit()


def run_config(task, **train_kw) -> RunConfig:
    T = task.completion_len(M)
    P = task.prompt_arrays(task.make_problems(0, 64), M)[0].shape[1]
    tcfg = dict(batch_size=4, num_answers=M, num_problems=64, learning_rate=1e-2, steps=STEPS,
                checkpoint_every=1000, profile_every=0)
    tcfg.update(train_kw)
    return RunConfig(
        model=model_preset("tiny", vocab_size=task.tokenizer.size, max_seq_len=P + T,
                           lora_rank=RANK),
        sampler=SamplerConfig(max_new_tokens=T, num_samples=8),
        objective=ObjectiveConfig(kl_coef=0.1), train=TrainConfig(**tcfg))


def mesh1():
    return sharding.make_mesh(devices=jax.devices()[:1])


def arrays(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def logits(model, tokens_BS):
    return np.asarray(model(tokens_BS))


TOKENS = jnp.array([[3, 5, 7, 9, 11, 4], [0, 0, 6, 8, 10, 2]], jnp.int32)


@pytest.fixture(scope="module")
def rl(task):
    """STEPS RL steps with KL from a plain policy that `as_configured` gives rank-4 adapters."""
    run = run_config(task)
    plain = Decoder(lora.base_config(run.model), rngs=nnx.Rngs(7))
    adapted = lora.as_configured(plain, run.model, seed=0)
    mesh = mesh1()
    tx = step_lib.make_optimizer(run.train)
    graphdef, state, _ = step_lib.state_from_model(adapted, tx, mesh, seed=0, with_ref=True)
    init_adapters = arrays(state.params)
    step = step_lib.make_rl_step(graphdef, tx, task, step_lib.step_config(run, task))
    it = data_lib.problem_iterator(task, 4, M, num_problems=64)
    history = []
    for _ in range(STEPS):
        state, metrics = step(state, loop_lib.shard_batch(next(it), mesh))
        history.append(jax.tree.map(np.asarray, jax.device_get(metrics)))
    return dict(run=run, plain=plain, graphdef=graphdef, state=state, history=history,
                init_adapters=init_adapters)


def test_config_validation_and_parsing():
    cfg = model_preset("tiny", lora_rank=8, lora_targets="q, v")
    assert cfg.lora_targets == ("q", "v") and cfg.lora_alpha == 16.0
    assert from_dict(ModelConfig, dataclasses.asdict(cfg)) == cfg  # JSON list → tuple
    run = apply_overrides(RunConfig(), ["model.lora_rank=2", "model.lora_targets=o,down",
                                        "model.lora_alpha=4"])
    assert (run.model.lora_rank, run.model.lora_targets, run.model.lora_alpha) == (
        2, ("o", "down"), 4.0)
    for kw, field in [(dict(lora_rank=-1), "model.lora_rank"),
                      (dict(lora_rank=33), "model.lora_rank"),  # > dim 32
                      (dict(lora_rank=4, lora_alpha=0.0), "model.lora_alpha"),
                      (dict(lora_rank=4, lora_targets=("q", "x")), "model.lora_targets"),
                      (dict(lora_rank=4, lora_targets=("q", "q")), "model.lora_targets"),
                      (dict(lora_rank=4, lora_targets=""), "model.lora_targets")]:
        with pytest.raises(ConfigError, match=field):
            model_preset("tiny", **kw)
    with pytest.raises(ConfigError, match="gate"):  # the error lists the valid names
        model_preset("tiny", lora_targets=("mlp",))


def test_adapters_start_at_base_and_merge_exactly():
    cfg = model_preset("tiny", lora_rank=RANK, lora_targets=tuple(LORA_TARGETS))
    plain = Decoder(lora.base_config(cfg), rngs=nnx.Rngs(3))
    built = Decoder(cfg, rngs=nnx.Rngs(3))  # a LoRA Decoder has the plain one's base weights
    for a, b in zip(arrays(nnx.state(plain, nnx.Param)), arrays(lora.split(built)[2]),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    adapted = lora.with_adapters(plain, RANK, seed=1)
    assert adapted.cfg == cfg and plain.cfg.lora_rank == 0  # the input keeps no adapters
    np.testing.assert_array_equal(logits(adapted, TOKENS), logits(plain, TOKENS))  # B = 0
    graphdef, ab, base = lora.split(adapted)
    assert sum(x.size for x in jax.tree.leaves(ab)) == cfg.num_lora_params
    assert sum(x.size for x in jax.tree.leaves(base)) == cfg.num_params
    # non-zero B everywhere: the adapted model differs from its base; the merge folds it in
    keys = iter(jax.random.split(jax.random.key(2), len(jax.tree.leaves(ab))))
    ab = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), ab)
    adapted = lora.merge(graphdef, ab, base)
    before = arrays(nnx.state(adapted))
    want = logits(adapted, TOKENS)
    assert np.abs(want - logits(plain, TOKENS)).max() > 1e-2
    folded = lora.merged(adapted)
    assert folded.cfg == lora.base_config(cfg) and lora.split(folded)[2] is None
    np.testing.assert_allclose(logits(folded, TOKENS), want, atol=1e-5, rtol=1e-5)
    for a, b in zip(before, arrays(nnx.state(adapted)), strict=True):  # merged copies
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(logits(lora.base_model(adapted), TOKENS),
                                  logits(plain, TOKENS))
    with pytest.raises(ValueError, match="already has"):
        lora.with_adapters(adapted, RANK)


def test_scanned_adapters_match_unrolled():
    """Adapters inside the scanned layer stack (`scan_layers=True`): the same logits and adapter
    gradients as the unrolled stack, and the merged export folds the same weights."""
    cfg = model_preset("tiny", num_layers=3, lora_rank=RANK, scan_layers=False)
    unrolled = Decoder(cfg, rngs=nnx.Rngs(3))
    graphdef, ab, base = lora.split(unrolled)
    keys = iter(jax.random.split(jax.random.key(2), len(jax.tree.leaves(ab))))
    ab = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), ab)
    scanned_def = lora.split(Decoder(dataclasses.replace(cfg, scan_layers=True),
                                     rngs=nnx.Rngs(3)))[0]

    def loss(ab, graphdef):
        return jnp.sum(jax.nn.log_softmax(lora.merge(graphdef, ab, base)(TOKENS))[..., 5])

    grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    (want, g_want), (got, g_got) = grad(ab, graphdef), grad(ab, scanned_def)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for x, y in zip(arrays(g_got), arrays(g_want), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5 * np.abs(y).max())
    scanned = lora.merge(scanned_def, ab, base)
    assert scanned.scanned
    np.testing.assert_allclose(logits(lora.merged(scanned), TOKENS),
                               logits(lora.merged(lora.merge(graphdef, ab, base)), TOKENS),
                               atol=1e-5, rtol=0)


def test_rl_trains_only_adapters(rl):
    state, plain = rl["state"], rl["plain"]
    assert state.ref_params is None  # no second copy of the base for the KL reference
    for a, b in zip(arrays(nnx.state(plain, nnx.Param)), arrays(state.frozen), strict=True):
        np.testing.assert_array_equal(a, b)  # the base is bit-identical after training
    moved = [np.abs(a - b).max() for a, b in zip(rl["init_adapters"], arrays(state.params),
                                                  strict=True)]
    assert min(moved) > 0  # every A and B moved
    assert all(h["skipped_updates"] == 0 and np.isfinite(h["loss"]) for h in rl["history"])


def test_optimizer_state_covers_adapters_only(rl):
    state, cfg = rl["state"], rl["run"].model
    n_adapters = sum(x.size for x in jax.tree.leaves(state.params))
    assert n_adapters == cfg.num_lora_params
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
    assert sum(x.size for x in moments) == 2 * n_adapters  # Adam mu and nu, nothing else
    assert sum(x.nbytes for x in moments) == 2 * 4 * cfg.num_lora_params
    adapter_shapes = sorted(x.shape for x in jax.tree.leaves(state.params))
    assert sorted(x.shape for x in moments) == sorted(adapter_shapes * 2)


def test_kl_reference_is_the_base(rl):
    """Step 1 samples and updates from the base (B = 0): KL(π‖ref) is exactly 0; after one
    update the adapters move and KL > 0. The reference forward is the base's forward."""
    h = rl["history"]
    assert h[0]["kl"] == 0.0 and h[1]["kl"] > 0
    model = step_lib.model_of(rl["graphdef"], rl["state"])
    np.testing.assert_array_equal(logits(lora.base_model(model), TOKENS),
                                  logits(rl["plain"], TOKENS))
    assert np.abs(logits(model, TOKENS) - logits(rl["plain"], TOKENS)).max() > 0


def test_loop_resume_and_merged_export(task, tmp_path):
    """Through vpo.run.loop.train: 2 steps straight == 1 step, then resumed from the checkpoint
    (adapters, optimiser state and base bit-exact); `policy/` holds the merged plain model,
    whose logits equal the adapted policy's, as does its HF safetensors export."""
    run = run_config(task, steps=2, checkpoint_every=1)
    a, b = str(tmp_path / "straight"), str(tmp_path / "resumed")
    graphdef, s_straight = loop_lib.train(run, a, task=task, mesh=mesh1(), progress=False)
    loop_lib.train(run, b, task=task, mesh=mesh1(), progress=False, stop_at=1)
    _, s_resumed = loop_lib.train(run, b, resume=True, task=task, mesh=mesh1(), progress=False)
    assert s_straight.frozen is not None and s_straight.ref_params is None
    for x, y in zip(arrays(s_straight), arrays(s_resumed), strict=True):
        np.testing.assert_array_equal(x, y)
    policy, info = policy_folder.load_policy(os.path.join(a, "policy"))
    assert policy.cfg == lora.base_config(run.model) and info["lora"]["lora_rank"] == RANK
    adapted = step_lib.model_of(graphdef, s_straight)
    np.testing.assert_allclose(logits(policy, TOKENS), logits(adapted, TOKENS), atol=1e-5,
                               rtol=1e-5)
    assert np.abs(logits(policy, TOKENS)
                  - logits(lora.base_model(adapted), TOKENS)).max() > 1e-4
    hf.save_pretrained(policy, str(tmp_path / "hf"))  # the merged weights as safetensors
    np.testing.assert_allclose(logits(hf.from_pretrained(str(tmp_path / "hf")), TOKENS),
                               logits(adapted, TOKENS), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="do not match"):  # adapters alone are no policy
        policy_folder.save_policy(str(tmp_path / "bad"), run.model, s_straight.params)
