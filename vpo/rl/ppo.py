"""The update's PPO epochs over one step's groups: `train.ppo_epochs` × `train.num_minibatches`
optimiser updates under `lax.scan`, each minibatch whole prompt groups of a fresh permutation
per epoch, its gradient summed over `train.grad_accum` micro-batches that share the minibatch's
loss denominator (`objectives.loss_denominator`), so the micro-batch losses sum to the
minibatch loss; a non-finite loss or gradient skips its update (counted).

The policy's log-prob pass is an argument, `logp_fn(params, mb, plan) -> (logp_BGT,
entropy_BGT)` (`vpo.rl.step.policy_logp_fn`): padded with `plan=None`, packed into
`train.pack_rows` rows per prompt with a `vpo.rl.packing` plan.

Shapes: B groups, G samples, T tokens; E epochs, K minibatches per epoch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from vpo import objectives
from vpo.config import ObjectiveConfig, TrainConfig
from vpo.rl import packing
from vpo.rl.mismatch import MISMATCH_SUMS, combine_mismatch, mismatch_metrics, mismatch_sums
from vpo.tree_ops import all_finite, update_if


def split_rows(tree, n: int):
    """Leading axis B → [n, B/n, ...]."""
    return jax.tree.map(lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), tree)


def micro_loss(params, mb, den, key, plan=None, *, logp_fn: Callable, cfg: ObjectiveConfig,
               horizon: int):
    """One micro-batch's `objectives.policy_loss` (the settings `objectives.loss_options`
    reads from the objective) and the mismatch sums of its log-probs against the sampler's."""
    logp, ent = logp_fn(params, mb, plan)
    loss, metrics = objectives.policy_loss(
        logp, mb["old_logp_BGT"], mb["adv_BG"], mb["mask_BGT"],
        ref_logp_BGT=mb.get("ref_logp_BGT"), entropy_BGT=ent, key=key,
        loss_denominator=den, horizon=horizon, is_weight_BGT=mb.get("is_weight_BGT"),
        **objectives.loss_options(cfg))
    metrics.update(mismatch_sums(jax.lax.stop_gradient(logp), mb["old_logp_BGT"],
                                 mb["real_BGT"]))
    return loss, metrics


def micro_grads(params, mb, den, key, *, loss_grad_fn: Callable, pack_rows: int, horizon: int):
    """The micro-batch's (loss, metrics) and gradient, packed when its completions fit
    `pack_rows` rows per prompt, else padded (the choice around the whole gradient: see
    `vpo.rl.step.completion_logp`)."""
    if not pack_rows or horizon == 1:
        return loss_grad_fn(params, mb, den, key)
    plan = packing.plan_rows(mb["real_BGT"])
    fits = plan.fits(pack_rows)
    (loss, metrics), grads = jax.lax.cond(
        fits, lambda: loss_grad_fn(params, mb, den, key, plan),
        lambda: loss_grad_fn(params, mb, den, key))
    metrics["pack/packed"] = fits.astype(jnp.float32)
    metrics["pack/rows_needed"] = jnp.max(plan.rows_needed_B).astype(jnp.float32)
    return (loss, metrics), grads


def minibatch_update(carry, xs, *, grad_fn: Callable, tx, agg: str, horizon: int,
                     grad_accum: int):
    """One optimiser update on a minibatch: gradients summed over `grad_accum` micro-batches
    (Σ micro losses = the minibatch loss), applied only when loss and gradients are finite.
    carry: (params, opt_state, skipped updates); xs: (minibatch, key)."""
    params, opt_state, skipped = carry
    mb, key = xs
    den = objectives.loss_denominator(mb["mask_BGT"], agg, horizon=horizon)
    micros = split_rows(mb, grad_accum)

    def micro(acc, ys):
        m, k = ys
        (loss, metrics), grads = grad_fn(params, m, den, k)
        return jax.tree.map(jnp.add, acc, grads), (loss, metrics)

    keys = jax.random.split(key, grad_accum)
    if grad_accum == 1:  # no accumulator: a zero-filled copy of the params saved
        (loss, metrics), grads = grad_fn(params, jax.tree.map(lambda x: x[0], micros), den,
                                         keys[0])
        losses, metrics = loss[None], jax.tree.map(lambda x: x[None], metrics)
    else:
        zeros = jax.tree.map(jnp.zeros_like, params)
        grads, (losses, metrics) = jax.lax.scan(micro, zeros, (micros, keys))
    loss = jnp.sum(losses)  # micro-batch losses sum to the minibatch loss
    sums = {k: metrics.pop(k) for k in MISMATCH_SUMS}
    metrics = jax.tree.map(jnp.mean, metrics)
    metrics.update(combine_mismatch(sums))
    metrics["loss"] = loss
    finite = jnp.isfinite(loss) & all_finite(grads)
    params, opt_state = update_if(finite, tx, grads, opt_state, params)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return (params, opt_state, skipped + (~finite).astype(jnp.int32)), metrics


def epoch(carry, key, *, data, minibatch: Callable, num_minibatches: int):
    """One pass over the groups in a random order: `num_minibatches` minibatch updates."""
    k_perm, k_mb = jax.random.split(key)
    perm = jax.random.permutation(k_perm, data["adv_BG"].shape[0])
    mbs = split_rows(jax.tree.map(lambda x: x[perm], data), num_minibatches)
    return jax.lax.scan(minibatch, carry, (mbs, jax.random.split(k_mb, num_minibatches)))


def ppo_epochs(params, opt_state, data, key, *, logp_fn: Callable, tx, cfg: ObjectiveConfig,
               tcfg: TrainConfig):
    """`tcfg.ppo_epochs` epochs over `data` (`vpo.rl.groups.update_batch`, optionally with
    ref_logp_BGT and is_weight_BGT) → (params, opt_state, skipped updates, metrics).

    metrics: each update's means, averaged; the mismatch (`mismatch_metrics`) of the first
    minibatch of the first epoch, the only forward at the sampling parameters."""
    horizon = data["tokens_BGT"].shape[2]
    loss_fn = functools.partial(micro_loss, logp_fn=logp_fn, cfg=cfg, horizon=horizon)
    grad_fn = functools.partial(micro_grads, loss_grad_fn=jax.value_and_grad(
        loss_fn, has_aux=True), pack_rows=tcfg.pack_rows, horizon=horizon)
    minibatch = functools.partial(minibatch_update, grad_fn=grad_fn, tx=tx, agg=cfg.agg,
                                  horizon=horizon, grad_accum=tcfg.grad_accum)
    run_epoch = functools.partial(epoch, data=data, minibatch=minibatch,
                                  num_minibatches=tcfg.num_minibatches)
    (params, opt_state, skipped), upd_metrics = jax.lax.scan(
        run_epoch, (params, opt_state, jnp.int32(0)), jax.random.split(key, tcfg.ppo_epochs))
    on_policy = {k: upd_metrics.pop(k)[0, 0] for k in MISMATCH_SUMS}
    metrics = jax.tree.map(jnp.mean, upd_metrics)
    metrics.update(mismatch_metrics(on_policy))
    return params, opt_state, skipped, metrics
