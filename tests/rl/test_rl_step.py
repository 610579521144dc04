"""The RL step (`vpo.rl.step`): learning on the bandit, non-finite guard, host path, mesh,
remat, config errors, state from a model, chunked log-probs, DAPO dynamic sampling and overlong
penalty, Clip-Cov / KL-Cov selection. The loop that drives it is in test_rl_loop.py, SFT in
test_rl_sft.py; both import this file's helpers.

All RL tests share one tiny shape (bandit on a 12-token vocabulary, B=4 prompts, G=8, M=2
answers, T=9, tiny model, 2 minibatches × 2 micro-batches) so the compiles are reused (and hit
the persistent cache).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vpo.config import (
    ConfigError,
    ObjectiveConfig,
    RunConfig,
    SamplerConfig,
    TrainConfig,
    model_preset,
)
from vpo.io.tokenizer import word_tokenizer
from vpo.model import sharding
from vpo.rl import checks as rl_checks
from vpo.rl import step as step_lib
from vpo.rollout import rewards as rewards_lib
from vpo.run import data as data_lib
from vpo.run import loop as loop_lib
from vpo.tasks import answers as answers_lib
from vpo.tasks import make_task
from vpo.tasks.bandit import ARMS
from vpo.tasks.bound import BoundTask, bind
from vpo.tasks.words import task_word_tokenizer

M = 2
BPE_FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf",
                           "qwen2_bpe")


def compact_bandit() -> BoundTask:
    """The bandit bound to a 12-token word vocabulary in which an answer slot is two tokens,
    `<answer k>` and `A </answer k>` (an arm with its close tag), so a random policy fills a slot
    now and then and RL from scratch has a reward to climb. (Through the task's own word-level
    tokenizer, ~130 tokens, a random policy practically never writes a tagged answer.) 12 ids:
    the mesh test shards the vocabulary over tensor=4; no other words (one inside a slot would
    make it a two-word, invalid answer)."""
    task = make_task("bandit", max_answers=4)
    slots = [answers_lib.open_tag(k) for k in (1, 2)]
    slots += [f"{arm} {answers_lib.close_tag(k)}" for k in (1, 2) for arm in ARMS]
    return bind(task, word_tokenizer([], added=slots))


def bound(name: str, **kw) -> BoundTask:
    """A built-in task through its built-in word-level tokenizer (the tiny model's)."""
    task = make_task(name, **kw)
    return bind(task, task_word_tokenizer(task))


@pytest.fixture(scope="module")
def task():
    return compact_bandit()


def prompt_len(task, m=M) -> int:
    return task.prompt_arrays(task.make_problems(0, 64), m)[0].shape[1]


def run_config(task, advantage="grpo", steps=3, **train_kw) -> RunConfig:
    tcfg = dict(batch_size=4, num_answers=M, num_problems=64, learning_rate=3e-3, steps=steps,
                num_minibatches=2, grad_accum=2, checkpoint_every=1000)
    tcfg.update(train_kw)
    T = task.completion_len(M)
    return RunConfig(
        model=model_preset("tiny", vocab_size=task.tokenizer.size,
                           max_seq_len=prompt_len(task) + T),
        sampler=SamplerConfig(max_new_tokens=T, num_samples=8),
        objective=ObjectiveConfig(advantage=advantage), train=TrainConfig(**tcfg))


def one_device():
    return sharding.make_mesh(devices=jax.devices()[:1])


def run_steps(task, run: RunConfig, steps: int, mesh=None, host=False, init=None):
    """(state, list of metrics dicts as numpy) after `steps` RL steps from a fresh state (or
    from the `init` model). host: rewards by `task.host_score` on the text, between two jits."""
    mesh = one_device() if mesh is None else mesh
    tx = step_lib.make_optimizer(run.train)
    if init is None:
        graphdef, state, _ = step_lib.init_state(run.model, tx, mesh, seed=run.train.seed)
    else:
        graphdef, state, _ = step_lib.state_from_model(init, tx, mesh, seed=run.train.seed,
                                                        with_ref=run.objective.kl_coef > 0)
    cfg = step_lib.step_config(run, task)
    if host:
        records = task.make_problems(0, 64)  # the pipeline's problem set (seed 0, 64 problems)
        step = step_lib.make_host_rl_step(graphdef, tx, task, cfg, records)
    else:
        step = step_lib.make_rl_step(graphdef, tx, task, cfg)
    it = data_lib.problem_iterator(task, run.train.batch_size, M, num_problems=64)
    history = []
    for _ in range(steps):
        state, metrics = step(state, loop_lib.shard_batch(next(it), mesh))
        history.append(metrics)
    return state, [jax.tree.map(np.asarray, m) for m in jax.device_get(history)]


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def params_of(state):
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def test_compact_bandit_reads_two_token_slots(task):
    tok = task.tokenizer
    assert tok.size == 12 and tok.stop_ids == (2,) and tok.pad_id == 0
    ids = [tok.token_id("<answer 1>"), tok.token_id("C </answer 1>"),
           tok.token_id("<answer 2>"), tok.token_id("A </answer 2>"), tok.eos_id]
    assert task.completion_len(M) >= len(ids)
    T = task.completion_len(M)
    tokens = np.full((1, T), tok.pad_id, np.int32)
    tokens[0, :len(ids)] = ids
    mask = np.arange(T)[None] < len(ids)
    want_r, want_ok = task.host_score(task.make_problems(0, 1), tokens, mask, M)
    np.testing.assert_allclose(want_r[0], [[0.6, 0.6], [1.0, 0.0]])
    assert want_ok.all()
    problem = jax.tree.map(lambda x: x[0], task.problem_arrays(task.make_problems(0, 1))["task"])
    r, ok = jax.jit(functools.partial(task.reward, num_answers=M))(problem, tokens[0], mask[0])
    np.testing.assert_allclose(r, want_r[0])
    np.testing.assert_array_equal(ok, want_ok[0])


@pytest.mark.parametrize("advantage", ["grpo", "vpo"])
def test_bandit_reward_improves(task, advantage):
    """From a random init few generations hold a well-formed answer (reward ~0.2); both
    objectives learn to fill the answer slots within a few dozen steps."""
    _, history = run_steps(task, run_config(task, advantage, steps=40), 40)
    reward = np.array([h["set_reward"] for h in history])  # the M answers' sum
    assert reward[-10:].mean() > reward[:10].mean() + 0.1, reward
    np.testing.assert_allclose([h["reward"] * M for h in history], reward, rtol=1e-6)
    assert all(np.isfinite(h["loss"]) for h in history)
    assert sum(int(h["skipped_updates"]) for h in history) == 0


def test_logged_reward_is_per_answer_for_every_m(task):
    """`reward` is w*ᵀr per answer slot, the mean over the m answers (0 for an unparsed one),
    so m = 1 and m = 3 runs share a scale; the set's sum is `set_reward` (m > 1 only)."""
    from vpo.types import Rollout

    w = np.asarray(task.eval_weights_R, np.float32)
    R = w.size
    rng = np.random.default_rng(0)
    for m in (1, 3):
        r_BGMR = rng.random((2, 4, m, R)).astype(np.float32)
        mask_BGM = rng.random((2, 4, m)) < 0.7
        T = 5
        rollout = Rollout(**dict.fromkeys(Rollout._fields))._replace(
            entropy_BGT=jnp.ones((2, 4, T)), mask_BGT=jnp.ones((2, 4, T), bool),
            length_BG=jnp.full((2, 4), T), finished_BG=jnp.ones((2, 4), bool))
        out = step_lib.rollout_metrics(task, rollout, jnp.asarray(r_BGMR), jnp.asarray(mask_BGM))
        per_answer = np.where(mask_BGM, r_BGMR @ w, 0.0)
        np.testing.assert_allclose(out["reward"], per_answer.mean(), rtol=1e-5)
        if m == 1:
            assert "set_reward" not in out
        else:
            np.testing.assert_allclose(out["set_reward"], per_answer.sum(-1).mean(), rtol=1e-5)


class NanRewardTask(BoundTask):
    """The bandit with every answer "valid" and a NaN reward (in the graph)."""

    def reward(self, problem, completion_T, mask_T, num_answers):
        r, m = super().reward(problem, completion_T, mask_T, num_answers)
        return r + jnp.nan, jnp.ones_like(m)


def test_nonfinite_reward_skips_update(task):
    bad = NanRewardTask(task.task, task.tokenizer)
    run = run_config(bad, steps=2)
    mesh = one_device()
    tx = step_lib.make_optimizer(run.train)
    _, fresh, _ = step_lib.init_state(run.model, tx, mesh, seed=0)
    state, history = run_steps(bad, run, 2, mesh)
    assert [int(h["skipped_updates"]) for h in history] == [run.train.updates_per_step] * 2
    for a, b in zip(params_of(state), params_of(fresh), strict=True):
        np.testing.assert_array_equal(a, b)
    opt_counts = [np.asarray(x) for x in jax.tree.leaves(state.opt_state) if np.ndim(x) == 0]
    assert all(c == 0 for c in opt_counts)  # optimiser state untouched too
    assert int(state.step) == 2


def test_host_reward_path_matches_in_graph(task):
    """The in-graph byte reader (`task.reward` in the jitted step) and the host scorer
    (`task.host_score` on the decoded text, between two jits) give the same rewards, metrics
    and updates, on rollouts that do hold well-formed answers."""
    run = run_config(task, steps=3)
    s_graph, h_graph = run_steps(task, run, 3)
    s_host, h_host = run_steps(task, run, 3, host=True)
    assert sum(float(h["answers_per_rollout"]) for h in h_graph) > 0  # not all-invalid
    for a, b in zip(h_graph, h_host, strict=True):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for a, b in zip(params_of(s_graph), params_of(s_host), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_mesh_of_8_devices_matches_one(task):
    """data=2 × tensor=4 (params sharded over heads/mlp/vocab) vs one device: the same samples and
    rewards; params agree to 3e-5 (float reduction order differs across the mesh, and Adam's
    m/√v turns tiny gradient differences of near-zero coordinates into ~1e-5 step differences:
    1.9e-5 with the full-logits forward, 1.2e-5 with the vocabulary-tiled one)."""
    run = run_config(task, steps=2)
    mesh8 = sharding.make_mesh(data=2, tensor=4)
    s8, h8 = run_steps(task, run, 2, mesh8)
    s1, h1 = run_steps(task, run, 2)
    assert any(len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated
               for x in jax.tree.leaves(s8.params))
    for a, b in zip(h8, h1, strict=True):
        np.testing.assert_allclose(a["reward"], b["reward"], atol=1e-6)
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-4, atol=1e-5)
    for a, b in zip(params_of(s8), params_of(s1), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=3e-5)


@pytest.mark.slow
def test_scanned_remat_step_matches_unrolled(task):
    """The layer stack as one lax.scan with per-block remat in the update's forward
    (`ModelConfig.scan_layers`, `TrainConfig.remat`) takes the same RL steps as the unrolled,
    stored forward: the same samples and rewards, losses and params equal up to float rounding
    (tolerances of the mesh test: Adam's m/sqrt(v) magnifies rounding of near-zero gradients)."""
    run = run_config(task, steps=2)
    fast = dataclasses.replace(run, model=dataclasses.replace(run.model, scan_layers=True),
                               train=dataclasses.replace(run.train, remat=True))
    s0, h0 = run_steps(task, run, 2)
    s1, h1 = run_steps(task, fast, 2)
    for a, b in zip(h1, h0, strict=True):
        np.testing.assert_allclose(a["reward"], b["reward"], atol=1e-6)
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-4, atol=1e-5)
    for a, b in zip(params_of(s1), params_of(s0), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=3e-5)


def test_config_errors_name_the_field(task):
    with pytest.raises(ConfigError, match="train.batch_size"):
        TrainConfig(batch_size=6, num_minibatches=4)
    with pytest.raises(ConfigError, match="objective.advantage"):
        ObjectiveConfig(advantage="ppo")
    run, P = run_config(task), prompt_len(task)
    rl_checks.check_run(run, task, P)
    bad = dataclasses.replace(run, sampler=SamplerConfig(max_new_tokens=1))
    with pytest.raises(ConfigError, match="sampler.max_new_tokens"):
        rl_checks.check_run(bad, task, P)
    small = dataclasses.replace(run, model=dataclasses.replace(run.model, vocab_size=8))
    with pytest.raises(ConfigError, match="model.vocab_size: 8 is smaller than the tokenizer's 12"):
        rl_checks.check_run(small, task, P)
    with pytest.raises(ConfigError, match="model.max_seq_len"):
        rl_checks.check_run(run, task, P + 1)
    with pytest.raises(ConfigError, match="train.mutation_fraction"):
        TrainConfig(mutation_fraction=1.5)
    pallas = dataclasses.replace(run, train=dataclasses.replace(run.train, logprob_impl="pallas"))
    with pytest.raises(ConfigError, match="train.logprob_impl: 'pallas' runs on GPU or TPU"):
        rl_checks.check_run(pallas, task, P)
    huge = dataclasses.replace(run, sampler=dataclasses.replace(run.sampler, num_samples=10**8))
    with pytest.raises(ConfigError, match=r"sampler\.num_samples: 100000000 .* need at least"):
        rl_checks.check_run(huge, task, P)


def test_state_from_model_with_kl_reference(task):
    """A TrainState around existing weights; with KL on, the reference stays frozen at them."""
    from flax import nnx

    from vpo.model.decoder import Decoder

    base = run_config(task, steps=2)
    run = dataclasses.replace(base, objective=ObjectiveConfig(kl_coef=0.1))
    model = Decoder(run.model, rngs=nnx.Rngs(7))
    init = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
    state, history = run_steps(task, run, 2, init=model)
    assert all(np.isfinite(h["kl"]) and h["kl"] >= 0 for h in history)
    for a, r in zip(init, jax.tree.leaves(state.ref_params), strict=True):
        np.testing.assert_array_equal(a, np.asarray(r))
    assert max(np.abs(a - b).max() for a, b in zip(init, params_of(state), strict=True)) > 0


@pytest.mark.parametrize("lora_rank", [0, 2])
def test_state_from_model_consumes_the_weights_only_when_asked(lora_rank):
    """consume=True: the state takes the model's own buffers (the model's arrays are deleted,
    the state holds the same values; under LoRA the frozen base too); by default it copies."""
    from flax import nnx

    from vpo.model import lora as lora_lib
    from vpo.model.decoder import Decoder

    cfg = dataclasses.replace(model_preset("tiny", vocab_size=40, max_seq_len=16),
                              lora_rank=lora_rank)
    tx = step_lib.make_optimizer(TrainConfig())
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    for consume in (False, True):
        model = Decoder(cfg, rngs=nnx.Rngs(5))
        leaves = jax.tree.leaves(nnx.state(model, nnx.Param))  # base and adapters
        values = [np.array(x, copy=True) for x in leaves]
        _, state, _ = step_lib.state_from_model(model, tx, mesh, consume=consume)
        assert all(x.is_deleted() == consume for x in leaves)
        merged = nnx.state(lora_lib.merge(*lora_lib.split(model)[:1], state.params,
                                          state.frozen), nnx.Param)
        for want, got in zip(values, jax.tree.leaves(merged), strict=True):
            np.testing.assert_array_equal(want, np.asarray(got))


def test_chunked_completion_logp_matches_full_logits():
    """The vocabulary-tiled training forward (5 ragged tiles of 64 over V = 300) gives the
    log-probs, entropies and parameter gradients of the full causal forward's logits."""
    from flax import nnx

    from vpo.model.decoder import Decoder

    cfg = model_preset("tiny", vocab_size=300, max_seq_len=16)
    model = Decoder(cfg, rngs=nnx.Rngs(3))
    graphdef, params = nnx.split(model, nnx.Param)
    B, G, P, T = 2, 3, 5, 4
    k1, k2 = jax.random.split(jax.random.key(1))
    prompt_BP = jax.random.randint(k1, (B, P), 3, 300)
    mask_BP = jnp.arange(P)[None, :] >= jnp.array([[0], [2]])  # second prompt left-padded
    tokens_BGT = jax.random.randint(k2, (B, G, T), 3, 300)
    c_BGT = jnp.linspace(0.5, 1.5, B * G * T).reshape(B, G, T)

    def full(params):
        m = nnx.merge(graphdef, params)
        seq = jnp.concatenate([jnp.repeat(prompt_BP[:, None], G, 1), tokens_BGT[..., :-1]], -1)
        smask = jnp.concatenate([jnp.repeat(mask_BP[:, None], G, 1),
                                 jnp.ones((B, G, T - 1), bool)], -1)
        logits = m(seq.reshape(B * G, -1), smask.reshape(B * G, -1))[:, P - 1:]
        logp_V = jax.nn.log_softmax(logits.reshape(B, G, T, -1), -1)
        logp = jnp.take_along_axis(logp_V, tokens_BGT[..., None], -1)[..., 0]
        return logp, -jnp.sum(jnp.exp(logp_V) * logp_V, -1)

    def chunked(params):
        return step_lib.completion_logp(nnx.merge(graphdef, params), prompt_BP, mask_BP,
                                         tokens_BGT, vocab_block=64)

    def loss(fn, params):
        logp, ent = fn(params)
        return jnp.sum(c_BGT * logp) + 0.3 * jnp.sum(ent), (logp, ent)

    (_, out_chunk), g_chunk = jax.jit(jax.value_and_grad(functools.partial(loss, chunked),
                                                         has_aux=True))(params)
    (_, out_full), g_full = jax.jit(jax.value_and_grad(functools.partial(loss, full),
                                                       has_aux=True))(params)
    for a, b in zip(out_chunk, out_full, strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_chunk), jax.tree.leaves(g_full), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


def test_overlong_penalty_formula():
    """DAPO soft punishment with L_max = 10, L_cache = 4: free up to 6 tokens, then -1/4 per
    token, -1 beyond L_max."""
    got = rewards_lib.overlong_penalty(jnp.array([[5, 6, 7, 8, 10, 11]]), 10, 4)
    np.testing.assert_allclose(got, [[0.0, 0.0, -0.25, -0.5, -1.0, -1.0]])


def test_dynamic_selection_keeps_varying_groups_first():
    """4 groups of G = 2 with one answer and R = 2: groups 1 and 3 vary; B = 3 takes them and
    fills with group 0, which is masked out (valid False)."""
    r_NG = jnp.array([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    rewards_NGMR = jnp.stack([r_NG, r_NG], -1)[:, :, None, :]
    smask = jnp.ones((4, 2, 1), bool)
    w = jnp.array([0.5, 0.5])
    zero = jnp.zeros((4, 2))
    keep = rewards_lib.group_varies(ObjectiveConfig(), rewards_NGMR, smask, w, zero)
    np.testing.assert_array_equal(keep, [False, True, False, True])
    idx, valid = rewards_lib.dynamic_selection(keep, 3)
    np.testing.assert_array_equal(idx, [1, 3, 0])
    np.testing.assert_array_equal(valid, [True, True, False])
    # a length penalty that differs inside group 0 makes it vary for the scalar estimators
    pen = zero.at[0, 1].set(-0.5)
    keep = rewards_lib.group_varies(ObjectiveConfig(), rewards_NGMR, smask, w, pen)
    np.testing.assert_array_equal(keep, [True, True, False, True])
    # vpo: equal vectors but a different valid-answer pattern varies; equal everything does not
    vpo = ObjectiveConfig(advantage="vpo")
    smask2 = smask.at[2, 0, 0].set(False)
    keep = rewards_lib.group_varies(vpo, rewards_NGMR, smask2, w, zero)
    np.testing.assert_array_equal(keep, [False, True, True, True])


def test_dynamic_sampling_and_overlong_mask_in_update(task):
    """8 sampled groups (oversample 2 × B 4) with hand-set rewards (groups 1, 3, 6 vary) plus
    the soft penalty of the sampled lengths: the kept and zero-variance fractions, and the loss
    denominator, which counts exactly the finished responses' tokens of the first 4 varying
    groups, match a numpy recomputation."""
    base = run_config(task, steps=1)
    obj = ObjectiveConfig(dynamic_sampling=True, oversample=2, overlong_mask=True,
                          overlong_cache_len=2)
    run = dataclasses.replace(base, objective=obj)
    mesh = one_device()
    tx = step_lib.make_optimizer(run.train)
    graphdef, state, _ = step_lib.init_state(run.model, tx, mesh, seed=0)
    cfg = step_lib.step_config(run, task)
    batch = loop_lib.shard_batch(next(data_lib.problem_iterator(task, 8, M, num_problems=64)),
                                 mesh)
    rollout = jax.jit(functools.partial(step_lib.sample_rollout, graphdef=graphdef, cfg=cfg))(
        state, batch)
    r_NG = np.zeros((8, 8), np.float32)
    for n in (1, 3, 6):
        r_NG[n, n % 8] = 1.0
    rewards = np.broadcast_to(r_NG[:, :, None, None], (8, 8, M, 2)).copy()
    smask = np.ones((8, 8, M), bool)
    update = jax.jit(functools.partial(step_lib.update_from_rollout, graphdef=graphdef, tx=tx,
                                       task=task, cfg=cfg))
    _, metrics = update(state, batch, rollout, rewards, smask)
    L = np.asarray(rollout.length_BG)
    T = run.sampler.max_new_tokens
    pen_NG = np.where(L <= T - 2, 0.0, (T - 2 - L) / 2)  # L never exceeds T = L_max
    np.testing.assert_allclose(float(metrics["overlong_penalty"]), pen_NG.mean(), rtol=1e-6)
    shaped = M * r_NG + pen_NG  # grpo sees w*ᵀr summed over the M valid answers, + penalty
    varies = shaped.max(1) > shaped.min(1)
    kept = [n for n in range(8) if varies[n]][:4]
    assert float(metrics["zero_variance_frac"]) == 1 - varies.mean()
    assert float(metrics["kept_frac"]) == len(kept) / 4
    mask = np.asarray(rollout.mask_BGT) & np.asarray(rollout.finished_BG)[:, :, None]
    want_den = mask[kept].sum() / run.train.num_minibatches  # mean over minibatches
    np.testing.assert_allclose(float(metrics["loss_denominator"]), want_den, rtol=1e-6)
    assert np.isfinite(float(metrics["loss"]))


def test_default_cov_controls_select_at_least_10_tokens_per_update():
    """At the default batch (RunConfig(): B/(minibatches·accum) prompts × G × T tokens per loss
    call) the default Clip-Cov / KL-Cov settings act on >= 10 tokens (the 7B recipe's 2e-3 alone
    would pick floor(2e-3 · 1024) = 2)."""
    from vpo import objectives

    run, ocfg = RunConfig(), ObjectiveConfig()
    b = run.train.batch_size // (run.train.num_minibatches * run.train.grad_accum)
    shape = (b, run.sampler.num_samples, run.sampler.max_new_tokens)
    n_tokens = int(np.prod(shape))
    assert int(ocfg.kl_cov_ratio * n_tokens) < 10 <= ocfg.cov_min_tokens
    rng = np.random.default_rng(0)
    logp = jnp.asarray(rng.normal(-1.0, 1.0, shape), jnp.float32)
    adv = jnp.asarray(rng.choice([-3.0, 3.0], shape[:2]), jnp.float32)  # many 1 < cov < 5
    mask = jnp.ones(shape, bool)
    kw = dict(clip_cov_ratio=ocfg.clip_cov_ratio, clip_cov_lb=ocfg.clip_cov_lb,
              clip_cov_ub=ocfg.clip_cov_ub, kl_cov_ratio=ocfg.kl_cov_ratio,
              kl_cov_coef=ocfg.kl_cov_coef, cov_min_tokens=ocfg.cov_min_tokens)

    @jax.jit
    def selected(logp, adv, mask, key):
        return {c: objectives.policy_loss(logp, logp, adv, mask, cov_control=c, key=key,
                                          **kw)[1][f"{c}_frac"] * n_tokens
                for c in ("kl_cov", "clip_cov")}

    for control, n in selected(logp, adv, mask, jax.random.key(0)).items():
        assert round(float(n)) >= 10, control


@pytest.mark.slow
def test_passk_with_dynamic_sampling_and_kl_cov_in_update(task):
    """pass@k training sees `task.solved` through dynamic selection: of 8 sampled groups
    (oversample 2 × B 4) the ones whose solved pattern varies are kept; KL-Cov acts and the
    covariance metric is logged. Slow: one compile of the update (~20-50 s on 2 cores)."""
    obj = ObjectiveConfig(advantage="passk", dynamic_sampling=True, oversample=2,
                          cov_control="kl_cov")
    run = dataclasses.replace(run_config(task, steps=1), objective=obj)
    mesh = one_device()
    tx = step_lib.make_optimizer(run.train)
    graphdef, state, _ = step_lib.init_state(run.model, tx, mesh, seed=0)
    cfg = step_lib.step_config(run, task)
    batch = loop_lib.shard_batch(next(data_lib.problem_iterator(task, 8, M, num_problems=64)),
                                 mesh)
    rollout = jax.jit(functools.partial(step_lib.sample_rollout, graphdef=graphdef, cfg=cfg))(
        state, batch)
    solved_NG = np.zeros((8, 8), bool)
    solved_NG[[0, 2, 5], 3] = True  # groups 0, 2, 5 vary
    solved_NG[7] = True  # all solved: no variation
    rewards = np.broadcast_to(solved_NG[:, :, None, None], (8, 8, M, 2)).astype(np.float32)
    smask = np.ones((8, 8, M), bool)
    update = jax.jit(functools.partial(step_lib.update_from_rollout, graphdef=graphdef, tx=tx,
                                       task=task, cfg=cfg))
    _, metrics = update(state, batch, rollout, rewards, smask)
    assert float(metrics["zero_variance_frac"]) == 5 / 8
    assert float(metrics["kept_frac"]) == 3 / 4
    assert float(metrics["solved_rate"]) == solved_NG.mean()
    assert float(metrics["kl_cov_frac"]) > 0
    assert np.isfinite(float(metrics["cov_logp_adv"])) and np.isfinite(float(metrics["loss"]))


def test_dapo_config_errors():
    from vpo.config import ConfigError

    with pytest.raises(ConfigError, match="objective.oversample"):
        ObjectiveConfig(oversample=2)
    with pytest.raises(ConfigError, match="objective.overlong_cache_len"):
        ObjectiveConfig(overlong_cache_len=5, overlong_max_len=4)

