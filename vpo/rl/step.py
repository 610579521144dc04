"""In-graph RL trainer: TrainState (born sharded), optax chain, `rl_step`, the host-reward split.

One RL step, as data (docs/architecture.md draws it):

    batch{problems, prompt_BP, prompt_mask_BP}
      ─► generate G samples per prompt            (keys from fold_in(state.rng, state.step))
      ─► jax.vmap(task.reward) over B×G            rewards_BGMR, solution_mask_BGM
      ─► advantages (GRPO family on sum_m w*ᵀr_m, or VPO on the vectors)       adv_BG
      ─► ppo_epochs × num_minibatches updates, lax.scan, each over whole prompt groups
         (a prompt is prefilled once per group; with `train.pack_rows` its completions are
         packed into fewer rows, `vpo.rl.packing`), grad accumulation over micro-batches with
         the objectives' global loss denominator; non-finite loss/grads skip the update
      ─► TrainState' + scalar metrics, among them the first minibatch's log-probs (at the
         sampling parameters) against the sampler's (`vpo.rl.mismatch`)

`rl_step` is one jit with the state donated. Host tasks split it at one boundary:
`sample_step` (jit) → `vpo.rollout.rewards.host_rewards` (numpy) → `update_step` (jit, donated).
The host loop (`vpo.run.loop.train`) and supervised warm start (`vpo.rl.sft`) build on this module.
"""

# size: one job, the RL step: state, optimiser, rollout, update and the host-reward split.

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from vpo.config import (
    ConfigError,
    ModelConfig,
    RunConfig,
    StepConfig,
    TrainConfig,
)
from vpo.eval.metrics import reward_diversity
from vpo.kernels import choice as kernel_choice
from vpo.kernels import hardware
from vpo.kernels import logprob_entropy as logprob_lib
from vpo.model import draw as draw_lib
from vpo.model import lora as lora_lib
from vpo.model import sharding as sharding_lib
from vpo.model.decoder import Decoder
from vpo.rl import groups as groups_lib
from vpo.rl import offpolicy, packing
from vpo.rl import ppo as ppo_lib
from vpo.rollout import rewards as rewards_lib
from vpo.rollout.slots import generate_rollouts
from vpo.tasks.bound import BoundTask, HostTask
from vpo.tree_ops import masked_mean
from vpo.types import Rollout


class TrainState(NamedTuple):
    """Everything a step changes. `rng` is raw key data (uint32[2]); `ref_params` only with KL
    under full fine-tuning.

    LoRA (`model.lora_rank` > 0, `vpo.model.lora`): `params` holds only the adapters (what the
    optimiser sees), `frozen` the base weights (no gradient, no optimiser state); the KL
    reference is that base with the adapters off, so `ref_params` stays None (no second copy).

    `pending` (only with `train.off_policy_steps` = 1): the rollout in flight, sampled by the
    previous step's parameters for the next update (`vpo.rl.overlap`). It is part of the state,
    so a checkpoint holds it and a resumed run trains on exactly the rollout the uninterrupted
    one would.
    """

    step: jax.Array  # int32 scalar: RL (or SFT) steps taken
    params: nnx.State  # what is trained: all nnx.Params, or the LoRA adapters
    opt_state: optax.OptState
    rng: jax.Array
    ref_params: nnx.State | None = None
    frozen: nnx.State | None = None  # LoRA: the base nnx.Params
    pending: dict | None = None  # off_policy_steps = 1: the rollout the next update trains on


# ---------------------------------------------------------------------------------------------
# optimiser and state creation


def make_schedule(cfg: TrainConfig) -> optax.Schedule:
    """Linear warmup to learning_rate, then constant or cosine decay (counted in updates)."""
    total = cfg.steps * cfg.updates_per_step
    if cfg.schedule == "constant":
        after = optax.constant_schedule(cfg.learning_rate)
    else:
        after = optax.cosine_decay_schedule(cfg.learning_rate,
                                            max(total - cfg.warmup_steps, 1), cfg.min_lr_ratio)
    if cfg.warmup_steps == 0:
        return after
    warm = optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps)
    return optax.join_schedules([warm, after], [cfg.warmup_steps])


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """clip_by_global_norm → AdamW with the warmup schedule."""
    return optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay))


def state_shardings(tx, abstract: TrainState, mesh) -> TrainState:
    """NamedShardings for a TrainState: params by the logical-axis rules; optimiser moments like
    their params; counts, step and rng replicated."""
    rep = sharding_lib.replicated(mesh)
    param_sh = sharding_lib.param_shardings(abstract.params, mesh)
    opt_sh = optax.tree_map_params(tx, lambda _, s: s, abstract.opt_state, param_sh,
                                   transform_non_params=lambda _: rep)
    ref_sh = None if abstract.ref_params is None else param_sh
    frozen_sh = (None if abstract.frozen is None
                 else sharding_lib.param_shardings(abstract.frozen, mesh))
    return TrainState(rep, param_sh, opt_sh, rep, ref_sh, frozen_sh)


def _new_state(params, tx, seed: int, with_ref: bool, frozen=None) -> TrainState:
    """with_ref copies the initial params as the KL reference, under full fine-tuning only
    (under LoRA the reference is the frozen base itself)."""
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=jax.random.key_data(jax.random.key(seed)),
                      ref_params=(jax.tree.map(jnp.copy, params) if with_ref and frozen is None
                                  else None),
                      frozen=frozen)


def init_state(model_cfg: ModelConfig, tx, mesh, *, seed: int = 0, with_ref: bool = False
               ) -> tuple[nnx.GraphDef, TrainState, TrainState]:
    """A fresh policy and optimiser state, born sharded on `mesh` (no weight is materialised
    unsharded). With `model_cfg.lora_rank` > 0 the policy carries adapters and only they are
    trained. The policy targets the mesh's platform (`Decoder.platform`).

    Each weight is drawn by a small program compiled once per (initialiser, shape, dtype,
    sharding) and process (`_weight_program`): a Qwen2.5-0.5B shape compiles 8 of them, where
    one program holding every draw took 44 s to build on an H200 and 10 s to compile on 2 CPU cores.
    The values are those of that one program (same keys, same draws).

    Returns (graphdef, state, shardings of state).
    """
    def draw(init, key, shape, dtype, axes):
        spec = sharding_lib.logical_spec(axes, shape, mesh)
        sharding = jax.sharding.NamedSharding(mesh, spec)
        return _weight_program(init, tuple(shape), jnp.dtype(dtype), sharding)(key)

    with draw_lib.drawing_weights(draw):
        model = Decoder(model_cfg, rngs=nnx.Rngs(seed))
    return state_from_model(model, tx, mesh, seed=seed, with_ref=with_ref, consume=True)


@functools.cache
def _weight_program(init, shape: tuple[int, ...], dtype, sharding):
    """key → init(key, shape, dtype), compiled once per process for its arguments."""
    return jax.jit(lambda key: init(key, shape, dtype), out_shardings=sharding)


def state_from_model(model: Decoder, tx, mesh, *, seed: int = 0, with_ref: bool = False,
                     consume: bool = False) -> tuple[nnx.GraphDef, TrainState, TrainState]:
    """TrainState around existing weights (an SFT result, an HF load), placed on `mesh`. A model
    with adapters (`vpo.model.lora.with_adapters`) trains only them.

    By default the state owns a copy of the weights (steps donate it; `model` stays usable).
    `consume=True` donates the model's arrays to the state instead: no second copy of the
    weights is made or held through the run (SmolLM2-135M: 0.5 GB; an 8B model: 32 GB of
    device memory in f32), and `model` must not be used afterwards (its arrays are deleted).
    The model is set to target the mesh's platform (`Decoder.platform`).
    """
    model.platform = hardware.platform_of(mesh)
    graphdef, params, frozen = lora_lib.split(model)
    new = functools.partial(_new_state, tx=tx, seed=seed, with_ref=with_ref)
    shardings = state_shardings(tx, jax.eval_shape(new, params, frozen=frozen), mesh)
    params = jax.device_put(params, shardings.params, donate=consume)
    frozen = None if frozen is None else jax.device_put(frozen, shardings.frozen, donate=consume)
    make = jax.jit(new, out_shardings=shardings,
                   donate_argnums=(0,) if consume else (),
                   donate_argnames=("frozen",) if consume and frozen is not None else ())
    return graphdef, make(params, frozen=frozen), shardings


def model_of(graphdef: nnx.GraphDef, state: TrainState) -> Decoder:
    """The policy as an NNX module (for sampling, evaluation); under LoRA the adapted model
    (export folds it with `vpo.model.lora.merged`, see `policy_of`)."""
    return lora_lib.merge(graphdef, state.params, state.frozen)


def policy_of(graphdef: nnx.GraphDef, state: TrainState) -> Decoder:
    """The trained policy as a plain Decoder (LoRA adapters folded in) for export."""
    return lora_lib.merged(model_of(graphdef, state))


# ---------------------------------------------------------------------------------------------
# the training forward


def unembedding_DV(model: Decoder) -> jax.Array:  # noqa: N802  (shape suffix)
    """The LM head as [D, V] in the compute dtype (the tied embedding transposed, or lm_head)."""
    w = model.embed[...].T if model.lm_head is None else model.lm_head[...]
    return w.astype(model.dtype)


def completion_hidden(model: Decoder, prompt_BP, prompt_mask_BP, tokens_BGT, *,
                      remat: bool = False):
    """Final hidden state that predicts each completion token → hidden_BGTD.

    Position t is predicted from the prompt's last state (t = 0) or from completion token t-1.
    Each prompt is prefilled once and its G completions attend to the shared prefix, exactly as
    the sampler computed them. `remat`: blocks recomputed in the backward pass (`Decoder.prefill`).
    """
    hidden_BPD, prefix = model.prefill(prompt_BP, prompt_mask_BP, remat=remat)
    return _padded_hidden(model, hidden_BPD, prefix, tokens_BGT, remat)


def _padded_hidden(model: Decoder, hidden_BPD, prefix, tokens_BGT, remat: bool):
    """`completion_hidden` after the prefill: every completion over all T positions."""
    B, G, T = tokens_BGT.shape
    first_BG1D = jnp.broadcast_to(hidden_BPD[:, None, -1:], (B, G, 1, hidden_BPD.shape[-1]))
    if T == 1:
        return first_BG1D
    hidden_BGOD, _ = model.extend(tokens_BGT[:, :, :-1], prefix, remat=remat)
    return jnp.concatenate([first_BG1D, hidden_BGOD], axis=2)


def logprob_impl_for(platform: str | None) -> str:
    """`TrainConfig.logprob_impl="auto"` resolved for a program traced for `platform`: "pallas"
    on one GPU / TPU chip where the committed measurements show the kernel's gradient pass
    (the update's use) faster than XLA's (`vpo.kernels.choice`), else "chunked"."""
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.size > 1:
        return "chunked"
    chosen = kernel_choice.default_impl("logprob_entropy", platform, use="backward")
    return "pallas" if chosen == "pallas" else "chunked"


def token_logp_entropy(model: Decoder, hidden_ND, targets_N, *, vocab_block: int = 4096,
                       impl: str = "auto", platform: str | None = None):
    """Log-prob of `targets_N` and entropy under the LM head from final hidden states →
    (logp_N, entropy_N), through the kernel `impl` picks (see `completion_logp`; "auto":
    `logprob_impl_for`)."""
    platform = model.platform if platform is None else platform
    w_DV = unembedding_DV(model)
    block_v = min(vocab_block, w_DV.shape[1])
    if impl == "auto":
        impl = logprob_impl_for(platform)
    if impl == "pallas":
        return logprob_lib.logprob_entropy(hidden_ND, w_DV, targets_N, platform=platform)
    if impl == "reference" or block_v == w_DV.shape[1]:
        return logprob_lib.logprob_entropy_reference(hidden_ND, w_DV, targets_N,
                                                     platform=platform)
    return logprob_lib.logprob_entropy_chunked(hidden_ND, w_DV, targets_N, block_v=block_v,
                                               platform=platform)


def completion_logp(model: Decoder, prompt_BP, prompt_mask_BP, tokens_BGT, *,
                    vocab_block: int = 4096, impl: str = "chunked", remat: bool = False,
                    platform: str | None = None, real_BGT=None, pack_rows: int = 0):
    """Temperature-1 log-prob and entropy of each completion token → (logp_BGT, entropy_BGT).

    Computed from the hidden states in vocabulary tiles of `vocab_block` columns
    (`vpo.kernels.logprob_entropy`: online log-sum-exp), so only [B·G·T, vocab_block] logits
    exist at a time, never [B, G, T, V]. A vocabulary of at most `vocab_block` tokens is one
    tile, computed directly (no scan, no rematerialisation: the same memory, less time).
    `impl="pallas"` runs the Pallas kernel instead of the `lax.scan` path (GPU / TPU, single
    device: XLA cannot partition the kernel over a mesh), with the tiles it derives for the
    platform; `impl="reference"` always materialises all the logits (the definition; a
    baseline for benchmarks). `remat`: the decoder blocks are recomputed in the backward pass
    (`TrainConfig.remat`). `platform`: the target (None: `model.platform`).

    `pack_rows` R > 0 with `real_BGT` (True on real tokens): `packed_completion_logp` when
    every prompt's completions fit R rows, the padded layout otherwise (`lax.cond`: one of the
    two runs), so no token is ever dropped. For a forward pass; a differentiated one puts the
    choice around the gradient instead (`update_from_rollout`): under `jax.grad` a `lax.cond`
    carries both branches' residuals, the padded one's zero-filled.
    """
    B, G, T = tokens_BGT.shape
    kw = dict(vocab_block=vocab_block, impl=impl, remat=remat, platform=platform)
    if pack_rows == 0 or T == 1:
        hidden_BGTD = completion_hidden(model, prompt_BP, prompt_mask_BP, tokens_BGT,
                                        remat=remat)
        logp_N, entropy_N = token_logp_entropy(
            model, hidden_BGTD.reshape(B * G * T, hidden_BGTD.shape[-1]),
            tokens_BGT.reshape(-1), vocab_block=vocab_block, impl=impl, platform=platform)
        return logp_N.reshape(B, G, T), entropy_N.reshape(B, G, T)
    if real_BGT is None:
        raise ValueError("pack_rows > 0 needs real_BGT, the mask of real completion tokens")
    plan = packing.plan_rows(real_BGT)
    return jax.lax.cond(
        plan.fits(pack_rows),
        lambda: packed_completion_logp(model, prompt_BP, prompt_mask_BP, tokens_BGT, plan,
                                       pack_rows, **kw),
        lambda: completion_logp(model, prompt_BP, prompt_mask_BP, tokens_BGT, **kw))


def packed_completion_logp(model: Decoder, prompt_BP, prompt_mask_BP, tokens_BGT,
                           plan: packing.PackPlan, rows: int, *, vocab_block: int = 4096,
                           impl: str = "chunked", remat: bool = False,
                           platform: str | None = None):
    """`completion_logp` with each prompt's completions packed into `rows` rows of T − 1
    slots (`vpo.rl.packing`; `plan.fits(rows)` must hold: segments beyond are left out).

    The first token of every completion is predicted from the prompt's last state, the rest
    from the packed segments (`Decoder.extend(segment_ids_BGO=...)`), all through one kernel
    call over B·(G + rows·(T − 1)) tokens instead of B·G·T. Values equal the padded layout's up
    to each completion's last real token; 0 after it.
    """
    B, G, T = tokens_BGT.shape
    hidden_BPD, prefix = model.prefill(prompt_BP, prompt_mask_BP, remat=remat)
    D = hidden_BPD.shape[-1]
    inputs, targets, segment = packing.pack(tokens_BGT, plan, rows)  # [B, rows, W]
    hidden, _ = model.extend(inputs, prefix, remat=remat, segment_ids_BGO=segment)
    first_ND = jnp.broadcast_to(hidden_BPD[:, None, -1], (B, G, D)).reshape(B * G, D)
    hidden_ND = jnp.concatenate([first_ND, hidden.reshape(-1, D)], axis=0)
    targets_N = jnp.concatenate([tokens_BGT[:, :, 0].reshape(-1), targets.reshape(-1)])
    logp_N, entropy_N = token_logp_entropy(model, hidden_ND, targets_N, vocab_block=vocab_block,
                                           impl=impl, platform=platform)

    def unpacked(x_N):
        return packing.unpack(x_N[B * G:].reshape(targets.shape), x_N[:B * G].reshape(B, G),
                              plan)

    return unpacked(logp_N), unpacked(entropy_N)


# ---------------------------------------------------------------------------------------------
# the update


class StepKeys(NamedTuple):
    """The keys of one step (`step_keys`)."""

    sample: jax.Array  # split into one key per (prompt, sample): `sample_keys_BG`
    advantages: jax.Array  # the estimator's draws (Dirichlet weights)
    epochs: jax.Array  # the PPO epochs: permutations and the loss's draws
    spare: jax.Array  # drawn by no stage


def step_keys(state: TrainState) -> StepKeys:
    """The step's keys: split(fold_in(key(state.rng), state.step), 4), the one split of a
    step's key (the in-graph step, the overlapped step, the environment step)."""
    key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    return StepKeys(*jax.random.split(key, 4))


def sample_keys_BG(state: TrainState, B: int, G: int) -> jax.Array:  # noqa: N802
    """One sampling key per (prompt, sample): split(step_keys(state).sample, B·G)."""
    return jax.random.split(step_keys(state).sample, B * G).reshape(B, G)


def policy_logp_fn(graphdef, frozen, tcfg: TrainConfig) -> Callable:
    """The update's log-prob pass on trained parameters, `(params, mb, plan=None) ->
    (logp_BGT, entropy_BGT)`: `completion_logp`, or `packed_completion_logp` with a plan."""

    def logp(params, mb, plan=None):
        model = lora_lib.merge(graphdef, params, frozen)
        args = (model, mb["prompt_BP"], mb["prompt_mask_BP"], mb["tokens_BGT"])
        kw = dict(vocab_block=tcfg.vocab_block, impl=tcfg.logprob_impl, remat=tcfg.remat)
        if plan is None:
            return completion_logp(*args, **kw)
        return packed_completion_logp(*args, plan, tcfg.pack_rows, **kw)

    return logp


def reference_logp_BGT(state: TrainState, graphdef, groups: groups_lib.Groups,  # noqa: N802
                       cfg: StepConfig):
    """The KL reference's log-probs of the groups' completions (stop-gradient), or None
    without a reference: the reference copy (`state.ref_params`), or under LoRA with
    `objective.kl_coef` > 0 the base with the adapters off, on the policy's platform."""
    tcfg = cfg.train
    if state.ref_params is not None:
        ref = nnx.merge(graphdef, state.ref_params)
    elif state.frozen is not None and cfg.objective.kl_coef > 0:  # LoRA: the base
        ref = lora_lib.base_model(model_of(graphdef, state))
    else:
        return None
    r = groups.rollout
    return jax.lax.stop_gradient(completion_logp(
        ref, groups.prompt_BP, groups.prompt_mask_BP, r.tokens_BGT,
        vocab_block=tcfg.vocab_block, impl=tcfg.logprob_impl,
        platform=model_of(graphdef, state).platform, real_BGT=r.mask_BGT,
        pack_rows=tcfg.pack_rows)[0])


def update_from_rollout(state: TrainState, batch, rollout: Rollout, rewards_BGMR,
                        solution_mask_BGM, *, graphdef, tx, task: BoundTask, cfg: StepConfig,
                        behaviour_logp_BGT=None):
    """The update from one rollout of oversample × batch_size groups, in stages → (state,
    metrics): the rollout's metrics; group selection (overlong penalty, dynamic sampling:
    `vpo.rl.groups.select_groups`); advantages (the configured estimator, `objective.advantage`
    read once: `vpo.rollout.rewards.estimator_of`); importance weights; reference log-probs
    (`reference_logp_BGT`); the PPO epochs (`vpo.rl.ppo.ppo_epochs`).

    `rollout.logp_BGT` is the PPO ratio's old_logp. `behaviour_logp_BGT`: the sampler's
    log-probs when they differ from it (a stale rollout whose old_logp was recomputed at the
    current parameters, `vpo.rl.overlap`); None: the rollout's own. With
    `objective.rollout_is` (`vpo.rl.offpolicy.rollout_is_mode`) other than "none", the
    importance weights of old_logp over the behaviour log-probs weigh the policy-gradient
    term (`policy_loss(is_weight_BGT=)`) and offpolicy/* metrics are logged.
    """
    ocfg, tcfg = cfg.objective, cfg.train
    keys, est, weights_R = step_keys(state), rewards_lib.estimator_of(ocfg), task.eval_weights_R
    rewards_NGMR = jnp.asarray(rewards_BGMR, jnp.float32)
    smask_NGM = jnp.asarray(solution_mask_BGM, bool)
    solved_NG = rewards_lib.solved(task, rewards_NGMR, smask_NGM)
    sampled_metrics = rollout_metrics(task, rollout, rewards_NGMR, smask_NGM, solved_NG)
    behaviour_NGT = rollout.logp_BGT if behaviour_logp_BGT is None else behaviour_logp_BGT
    groups, selection = groups_lib.select_groups(
        ocfg, est, weights_R, batch, rollout, rewards_NGMR, smask_NGM, solved_NG, behaviour_NGT,
        max_new_tokens=cfg.sampler.max_new_tokens)
    adv_BG, adv_metrics = est.fn(ocfg, groups.x, groups.solution_mask_BGM, weights_R,
                                 keys.advantages)
    mask_BGT = groups_lib.loss_mask_BGT(ocfg, groups)
    data, is_metrics = groups_lib.update_batch(groups, adv_BG, mask_BGT), {}
    is_mode = offpolicy.rollout_is_mode(ocfg, tcfg)
    if is_mode != "none":
        data["is_weight_BGT"], is_metrics = offpolicy.rollout_is_weights_BGT(
            is_mode, groups.rollout.logp_BGT, groups.behaviour_BGT, mask_BGT,
            ocfg.rollout_is_cap)
    ref_logp_BGT = reference_logp_BGT(state, graphdef, groups, cfg)
    if ref_logp_BGT is not None:
        data["ref_logp_BGT"] = ref_logp_BGT
    params, opt_state, skipped, metrics = ppo_lib.ppo_epochs(
        state.params, state.opt_state, data, keys.epochs,
        logp_fn=policy_logp_fn(graphdef, state.frozen, tcfg), tx=tx, cfg=ocfg, tcfg=tcfg)
    metrics.update(adv_metrics)
    metrics.update(sampled_metrics)
    metrics.update(is_metrics)
    metrics.update(groups_lib.group_metrics(groups, adv_BG, mask_BGT, selection))
    metrics["skipped_updates"] = skipped
    metrics["lr"] = make_schedule(tcfg)(state.step * tcfg.updates_per_step)
    new_state = state._replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics


def rollout_metrics(task: BoundTask, rollout: Rollout, rewards_BGMR, solution_mask_BGM,
                    solved_BG=None):
    """Scalar metrics of one batch of rollouts (rewards, entropy, lengths, diversity, solved);
    `solved_BG` (`vpo.rollout.rewards.solved`) is computed when not given.

    `reward` is on one scale for every objective: w*ᵀr per answer slot (0 for an answer that
    does not parse), the mean over the m answers of a generation, so GRPO (m = 1) and VPO or
    Multi-RLVR (m > 1) curves compare; with m > 1 the set's sum Σ_j w*ᵀr_j (what Multi-RLVR
    trains on) is logged as `set_reward`."""
    B, G, M, R = rewards_BGMR.shape
    set_BG = rewards_lib.scalarize(rewards_BGMR, solution_mask_BGM, task.eval_weights_R)
    if solved_BG is None:
        solved_BG = rewards_lib.solved(task, rewards_BGMR, solution_mask_BGM)
    out = {
        "reward": jnp.mean(set_BG) / M,
        "entropy": masked_mean(rollout.entropy_BGT, rollout.mask_BGT),
        "response_length": jnp.mean(rollout.length_BG.astype(jnp.float32)),
        "generated_tokens": jnp.sum(rollout.mask_BGT.astype(jnp.int32)),
        "truncation_rate": jnp.mean((~rollout.finished_BG).astype(jnp.float32)),
        "answers_per_rollout": jnp.mean(jnp.sum(solution_mask_BGM, -1).astype(jnp.float32)),
        "solved_rate": jnp.mean(solved_BG.astype(jnp.float32)),
        "diversity": jnp.mean(reward_diversity(
            rewards_BGMR.reshape(B, G * M, R), solution_mask_BGM.reshape(B, G * M))),
    }
    if M > 1:
        out["set_reward"] = jnp.mean(set_BG)
    for r, name in enumerate(task.reward_names):
        out[f"reward/{name}"] = jnp.mean(rewards_BGMR[..., r])
    return out


def sample_rollout(state: TrainState, batch, *, graphdef, cfg: StepConfig) -> Rollout:
    """The step's rollout of `batch`: G samples per prompt with the keys `sample_keys_BG`."""
    keys_BG = sample_keys_BG(state, batch["prompt_BP"].shape[0], cfg.sampler.num_samples)
    s = cfg.sampler
    return generate_rollouts(model_of(graphdef, state), batch["prompt_BP"],
                             batch["prompt_mask_BP"], keys_BG, jnp.float32(s.temperature),
                             jnp.float32(s.top_p), jnp.int32(s.top_k),
                             max_new_tokens=s.max_new_tokens, stop_ids=cfg.stop_ids,
                             pad_id=cfg.pad_id, num_slots=s.num_slots)


def rl_step(state: TrainState, batch, *, graphdef, tx, task: BoundTask, cfg: StepConfig):
    """One in-graph RL step: sample → task.reward → advantages → updates. Returns (state, metrics).

    batch: {"problems": B problems, "prompt_BP": int32, "prompt_mask_BP": bool}.
    Jit it with `make_rl_step` (state donated).
    """
    rollout = sample_rollout(state, batch, graphdef=graphdef, cfg=cfg)
    rewards_BGMR, smask_BGM = rewards_lib.in_graph_rewards(
        task, batch["problems"], rollout.tokens_BGT, rollout.mask_BGT, cfg.train.num_answers)
    return update_from_rollout(state, batch, rollout, rewards_BGMR, smask_BGM, graphdef=graphdef,
                               tx=tx, task=task, cfg=cfg)


def make_rl_step(graphdef, tx, task: BoundTask, cfg: StepConfig) -> Callable:
    """`rl_step` jitted with the state donated: (state, batch) -> (state, metrics). The step of
    `train.off_policy_steps` = 1 builds on this module: `vpo.rl.overlap.make_in_graph_step`
    gives either."""
    if isinstance(task, HostTask):
        raise ConfigError(f"task {task.name!r} has a host reward; use make_host_rl_step")
    if cfg.train.off_policy_steps:
        raise ConfigError("train.off_policy_steps: 1 is the overlapped step; build it with "
                          "vpo.rl.overlap.make_in_graph_step")
    return jax.jit(functools.partial(rl_step, graphdef=graphdef, tx=tx, task=task, cfg=cfg),
                   donate_argnums=0)


def make_sample_step(graphdef, cfg: StepConfig) -> Callable:
    """The sampling part of a step, jitted: (state, batch) -> Rollout (the state is not donated;
    it draws the same samples as the step itself: with `train.off_policy_steps` = 1, the next
    rollout, with the keys of step + 1)."""
    offset = cfg.train.off_policy_steps

    def sample(state, batch):
        return sample_rollout(state._replace(step=state.step + offset) if offset else state,
                              batch, graphdef=graphdef, cfg=cfg)

    return jax.jit(sample)


@dataclasses.dataclass(frozen=True)
class HostRLStep:
    """The host-reward step in its three parts; calling it chains them: (state, batch) ->
    (state, metrics). The loop may run the parts itself (to time them, or to log the samples
    with the rewards the step used, without scoring twice)."""

    sample: Callable  # jit: (state, batch) -> Rollout
    score: Callable  # host: (batch, rollout) -> (rewards_BGMR, solution_mask_BGM, applies_BGMR)
    update: Callable  # jit, state donated: (state, batch, rollout, rewards, smask) -> (state, m)
    reward_names: tuple[str, ...] = ()

    def __call__(self, state, batch):
        rollout = self.sample(state, batch)
        return self.apply(state, batch, rollout, self.score(batch, rollout))

    def apply(self, state, batch, rollout, scored):
        """The update on `score`'s output → (state, metrics); `reward/<name>` left out where
        the component's function returned None (`rewards_lib.component_means`)."""
        rewards_BGMR, smask_BGM, applies_BGMR = scored
        state, metrics = self.update(state, batch, rollout, rewards_BGMR, smask_BGM)
        return state, {**metrics, **rewards_lib.component_means(
            self.reward_names, rewards_BGMR, applies_BGMR)}


def make_host_rl_step(graphdef, tx, task: BoundTask, cfg: StepConfig, records) -> HostRLStep:
    """The host-reward step: jitted sample → `task.host_score` on the text (numpy) → jitted,
    donated update. `records`: the problems that batch["problems"]["index"] points into."""

    def update(state, batch, rollout, rewards, smask):
        return update_from_rollout(state, batch, rollout, rewards, smask, graphdef=graphdef,
                                   tx=tx, task=task, cfg=cfg)

    def score(batch, rollout):
        return rewards_lib.host_rewards(task, records, batch["problems"], rollout,
                                        cfg.train.num_answers)

    return HostRLStep(make_sample_step(graphdef, cfg), score,
                      jax.jit(update, donate_argnums=0), tuple(task.reward_names))


def step_config(run: RunConfig, task: BoundTask) -> StepConfig:
    """The static step settings of a run (stop and pad ids from the task's tokenizer)."""
    tok = task.tokenizer
    return StepConfig(run.sampler, run.objective, run.train, stop_ids=tok.stop_ids,
                      pad_id=tok.pad_id)


