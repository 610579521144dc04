"""The overlapped RL step (`train.off_policy_steps` = 1): sampling one step ahead of the update.

    prime_overlap:       rollout 0 = sample(θ_0, batch 0)                  → state.pending
    overlapped_rl_step:  rollout t+1 = sample(θ_t, batch t+1)               ─┐ one program,
                         θ_{t+1} = update(θ_t, rollout t; old_logp = log π_θ_t, ─┘ no data between
                                          IS weights over the sampler's)

As peers' one-step-off modes do (TRL's AsyncGRPOTrainer `max_staleness`, verl's one-step-off
and fully-async trainers, Tunix's `off_policy_steps`, prime-rl's `max_async_level`), here in one
jitted program per step. The rollout in flight lives in `TrainState.pending` (prompts, rollout,
in-graph rewards, the step whose parameters sampled it), so checkpoints hold it and a resumed
run continues exactly. In-graph rewards only (`vpo.rl.checks.check_run` refuses host-scored
tasks and environments).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from vpo.config import StepConfig
from vpo.model import sharding as sharding_lib
from vpo.rl import offpolicy
from vpo.rl.mismatch import mismatch_metrics, mismatch_sums
from vpo.rl.step import (
    TrainState,
    completion_logp,
    make_rl_step,
    model_of,
    sample_rollout,
    update_from_rollout,
)
from vpo.rollout import rewards as rewards_lib
from vpo.tasks.bound import BoundTask
from vpo.types import Rollout


def _sample_pending(state: TrainState, batch, index, *, graphdef, task: BoundTask,
                    cfg: StepConfig) -> dict:
    """Rollout number `index` (its keys those of step `index`: `sample_rollout`) of `batch`
    by `state.params`, with its in-graph rewards → `TrainState.pending`."""
    rollout = sample_rollout(state._replace(step=index), batch, graphdef=graphdef, cfg=cfg)
    rewards_BGMR, smask_BGM = rewards_lib.in_graph_rewards(
        task, batch["problems"], rollout.tokens_BGT, rollout.mask_BGT, cfg.train.num_answers)
    return dict(prompt_BP=batch["prompt_BP"], prompt_mask_BP=batch["prompt_mask_BP"],
                rollout=rollout._asdict(), rewards_BGMR=rewards_BGMR, solution_mask_BGM=smask_BGM,
                policy_step=state.step)


def prime_overlap(state: TrainState, batch, *, graphdef, task: BoundTask,
                  cfg: StepConfig) -> TrainState:
    """The overlapped run's first rollout, before its first step: `batch` sampled by the
    initial parameters with step `state.step`'s keys → the state with it `pending`. The first
    step then trains on it at staleness 0 and samples again (two samplings, one update)."""
    return state._replace(pending=_sample_pending(state, batch, state.step, graphdef=graphdef,
                                                  task=task, cfg=cfg))


def overlapped_rl_step(state: TrainState, batch, *, graphdef, tx, task: BoundTask,
                       cfg: StepConfig):
    """One step of `train.off_policy_steps` = 1 → (state, metrics): in one program, sample the
    NEXT rollout (`batch`, keys of step t + 1) with the current parameters θ_t, and update θ_t
    on the pending rollout, sampled one step earlier by θ_{t−1} (`prime_overlap` at t = 0:
    by θ_0 itself).

    The two halves share no data but θ_t, so XLA may schedule them concurrently; on one
    device they share its cores, and the synchronous `rl_step` is one program too (no dispatch
    is saved): the gain is at most work run on units the other half leaves idle, against one
    more log-prob pass (docs/performance.md measures it). The update recomputes log π_{θ_t}
    on the stale rollout (the proximal policy: the PPO ratio's old_logp) and corrects the gap
    to the sampler's log-probs with `objective.rollout_is` (`vpo.rl.offpolicy`). Reward and
    rollout metrics describe the rollout trained on; offpolicy/staleness is t minus the step
    whose parameters sampled it (1, and 0 at the first step); offpolicy/behaviour_kl and
    offpolicy/behaviour_max_abs_logp compare π_{θ_t} with the sampler on it
    (`mismatch_metrics`' k3 over all its real tokens). Jit it with `make_in_graph_step`.
    """
    tcfg, pending = cfg.train, state.pending
    if pending is None:
        raise ValueError("overlapped_rl_step needs state.pending: start with prime_overlap")
    following = _sample_pending(state, batch, state.step + 1, graphdef=graphdef, task=task,
                                cfg=cfg)
    rollout = Rollout(**pending["rollout"])
    proximal_BGT = jax.lax.stop_gradient(completion_logp(
        model_of(graphdef, state), pending["prompt_BP"], pending["prompt_mask_BP"],
        rollout.tokens_BGT, vocab_block=tcfg.vocab_block, impl=tcfg.logprob_impl,
        real_BGT=rollout.mask_BGT, pack_rows=tcfg.pack_rows)[0])
    staleness = (state.step - pending["policy_step"]).astype(jnp.float32)
    gap = mismatch_metrics(mismatch_sums(proximal_BGT, rollout.logp_BGT, rollout.mask_BGT))
    new_state, metrics = update_from_rollout(
        state._replace(pending=None), pending, rollout._replace(logp_BGT=proximal_BGT),
        pending["rewards_BGMR"], pending["solution_mask_BGM"], graphdef=graphdef, tx=tx,
        task=task, cfg=cfg, behaviour_logp_BGT=rollout.logp_BGT)
    metrics[offpolicy.STALENESS] = staleness
    metrics["offpolicy/behaviour_kl"] = gap["rollout/mismatch_kl"]
    metrics["offpolicy/behaviour_max_abs_logp"] = gap["rollout/mismatch_max_abs_logp"]
    return new_state._replace(pending=following), metrics


def make_in_graph_step(graphdef, tx, task: BoundTask, cfg: StepConfig) -> Callable:
    """The fused step of an in-graph task, jitted with the state donated: (state, batch) ->
    (state, metrics): `overlapped_rl_step` with `train.off_policy_steps` = 1, else
    `vpo.rl.step.make_rl_step`'s `rl_step`."""
    if not cfg.train.off_policy_steps:
        return make_rl_step(graphdef, tx, task, cfg)
    return jax.jit(functools.partial(overlapped_rl_step, graphdef=graphdef, tx=tx, task=task,
                                     cfg=cfg), donate_argnums=0)


def make_prime_step(graphdef, task: BoundTask, cfg: StepConfig) -> Callable:
    """`prime_overlap` jitted with the state donated: (state, batch) -> state."""
    return jax.jit(functools.partial(prime_overlap, graphdef=graphdef, task=task, cfg=cfg),
                   donate_argnums=0)


def pending_like(state: TrainState, batch, mesh, *, graphdef, task: BoundTask,
                 cfg: StepConfig):
    """Shapes and shardings of `TrainState.pending` for `batch`'s shapes (`prime_overlap`
    under `jax.eval_shape`: nothing runs), laid out as batches are: what a checkpoint's rollout
    in flight is restored onto."""
    shapes = jax.eval_shape(lambda s, b: prime_overlap(s, b, graphdef=graphdef, task=task,
                                                       cfg=cfg).pending, state, batch)
    rep = sharding_lib.replicated(mesh)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=sharding_lib.batch_sharding(mesh, x.ndim) if x.ndim
        else rep), shapes)
