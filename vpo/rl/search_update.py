"""The policy-gradient step of the island search that learns (`vpo.search.learn`): one
optimiser update per generation on that generation's children, on-policy (the parameters that
sampled them are the ones updated, so the PPO ratio is 1 and is left out).

A generation's calls form groups: group b is one island of one problem, its G = C / m calls
the island's mutation prompts of that generation (each call one completion holding m answers,
each answer one child). The m answers of a call share one completion's tokens, so a group of
them alone would give every token the same advantage summed to zero; the island's calls are
the completions that compete. Advantages per call, by `LearnConfig.objective`:

    grpo      A_bg = (f_bg - mean_g f_b) / (std_g f_b + eps),  f_bg = sum_j w*ᵀr_bgj over the
              valid answers j of call g (`objectives.grpo_advantages`, GRPO arXiv 2402.03300)
    vpo       A_bg = VPO's z-score of E_w[max_j w·r_bgj], w ~ Dir(alpha), over the call's m
              answers (`objectives.vpo_advantages`, arXiv 2605.22817; needs m >= 2)
    entropic  A_bg = w_bg - 1, w_bg = exp(beta (f_bg - f_max)) / mean_{h != g} exp(beta (f_bh -
              f_max)), beta per group solving KL(q_beta || uniform) = ln 2, q_beta ∝ exp(beta f)
              (`objectives.entropic_advantages`, TTT-Discover arXiv 2601.16175), f = f_bg / m

    loss = -mean_bg(A_bg · sum_t log pi(y_bgt | prompt_bg, y_bg<t))
           + kl_coef · mean_bg(sum_t k3(pi, pi_ref)_bgt)          (only with kl_coef > 0)

The log-probs are recomputed with gradients under the current parameters
(`vpo.rl.step.completion_logp`, the trainer's own pass); `mismatch_max_abs_logp` logs how far
they are from the sampler's. The update: global-norm clipping, Adam's scaling, then
params -= learning_rate · update, the rate a traced value (a new rate never recompiles); a
non-finite loss or gradient skips the update (counted). The search takes the step as a
`Learner` (`make_learner`), as it takes its proposer: `vpo.search` sits beside `vpo.rl`, and
the caller that builds a run joins them.

Shapes: B groups (problems × islands), G calls per group, M answers per call, R reward
components, P prompt tokens, T generated tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from vpo import objectives
from vpo.config import LearnConfig
from vpo.model import lora as lora_lib
from vpo.rl.step import completion_logp
from vpo.rollout.rewards import scalarize
from vpo.tree_ops import all_finite
from vpo.types import SearchCalls


def make_optimizer(learn: LearnConfig) -> optax.GradientTransformation:
    """Global-norm clipping then Adam's moment scaling; the learning rate is applied by
    `learn_update` (a traced value of the state)."""
    return optax.chain(optax.clip_by_global_norm(learn.max_grad_norm), optax.scale_by_adam())


def advantages_BG(learn: LearnConfig, key, gen: SearchCalls, weights_R  # noqa: N802
                  ) -> tuple[jax.Array, dict]:
    """Each call's advantage by `learn.objective` (module docstring) → (adv_BG, scalar
    metrics). `key`: VPO's Dirichlet draws (unused by grpo and entropic)."""
    if learn.objective == "vpo":
        adv_BG, metrics = objectives.vpo_advantages(
            key, gen.rewards_BGMR, gen.valid_BGM, num_weights=learn.num_weights,
            alpha=learn.alpha, eps=learn.eps)
        return adv_BG, {k: v for k, v in metrics.items() if jnp.ndim(v) == 0}
    fitness_BG = scalarize(gen.rewards_BGMR, gen.valid_BGM, weights_R)
    if learn.objective == "entropic":
        return objectives.entropic_advantages(fitness_BG / gen.valid_BGM.shape[-1])
    return objectives.grpo_advantages(fitness_BG, eps=learn.eps)


def logp_fn(graphdef, frozen) -> Callable:
    """`(params, gen) -> (logp_BGT, entropy_BGT)`: the completions' temperature-1 log-probs
    under `params` and the entropy of the temperature-1 next-token distribution at each of
    their positions (one prompt per call: B·G rows of one completion each; the trainer's
    pass, `vpo.rl.step.completion_logp`, which computes both at once)."""

    def logp(params, gen: SearchCalls):
        B, G, P = gen.prompt_BGP.shape
        T = gen.tokens_BGT.shape[-1]
        model = lora_lib.merge(graphdef, params, frozen)
        logp_NGT, entropy_NGT = completion_logp(model, gen.prompt_BGP.reshape(B * G, P),
                                                gen.prompt_mask_BGP.reshape(B * G, P),
                                                gen.tokens_BGT.reshape(B * G, 1, T),
                                                impl="auto")
        return logp_NGT.reshape(B, G, T), entropy_NGT.reshape(B, G, T)

    return logp


def pg_loss(params, gen: SearchCalls, adv_BG, ref_logp_BGT, *, logp: Callable,
            kl_coef: float) -> tuple[jax.Array, dict]:
    """-mean(A · sum_t log pi) (+ kl_coef · mean of the completions' summed k3 KL to the
    reference when `ref_logp_BGT` is given) → (loss, metrics). `logp`: `logp_fn`'s shape,
    `(params, gen) -> (logp_BGT, entropy_BGT)`; `entropy` logs the mean token entropy over the
    completions' real tokens (of the parameters that sampled them; not in the loss)."""
    logp_BGT, entropy_BGT = logp(params, gen)
    mask_BGT = gen.mask_BGT
    seq_BG = jnp.sum(jnp.where(mask_BGT, logp_BGT, 0.0), axis=-1)
    loss = -jnp.mean(jax.lax.stop_gradient(adv_BG) * seq_BG)
    gap_BGT = jnp.where(mask_BGT, jnp.abs(jax.lax.stop_gradient(logp_BGT) - gen.logp_BGT), 0.0)
    real = jnp.maximum(jnp.sum(mask_BGT), 1)
    metrics = {"mismatch_max_abs_logp": jnp.max(gap_BGT),
               "entropy": jnp.sum(jnp.where(mask_BGT, jax.lax.stop_gradient(entropy_BGT), 0.0))
               / real}
    if ref_logp_BGT is not None:
        kl_BGT = objectives.kl_estimate(logp_BGT, ref_logp_BGT, "k3")
        kl = jnp.mean(jnp.sum(jnp.where(mask_BGT, kl_BGT, 0.0), axis=-1))
        loss = loss + kl_coef * kl
        metrics["kl"] = kl
    return loss, metrics


def learn_update(params, opt_state, learning_rate, gen: SearchCalls, key, *, logp: Callable,
                 ref_logp: Callable | None, tx, learn: LearnConfig, weights_R):
    """One update on a generation → (params, opt_state, metrics): advantages, the loss's
    gradient, clipped and Adam-scaled, params -= learning_rate · update when the loss and
    gradient are finite (else unchanged; `skipped` = 1)."""
    adv_BG, metrics = advantages_BG(learn, key, gen, weights_R)
    ref_BGT = None if ref_logp is None else jax.lax.stop_gradient(ref_logp(gen))
    (loss, loss_metrics), grads = jax.value_and_grad(pg_loss, has_aux=True)(
        params, gen, adv_BG, ref_BGT, logp=logp, kl_coef=learn.kl_coef)
    finite = jnp.isfinite(loss) & all_finite(grads)

    def apply(p, o):
        updates, o = tx.update(grads, o, p)
        return jax.tree.map(lambda x, u: (x - learning_rate * u).astype(x.dtype), p, updates), o

    params, opt_state = jax.lax.cond(finite, apply, lambda p, o: (p, o), params, opt_state)
    fitness_BG = scalarize(gen.rewards_BGMR, gen.valid_BGM, weights_R)
    metrics.update(loss_metrics, loss=loss, grad_norm=optax.tree.norm(grads),
                   skipped=(~finite).astype(jnp.int32), adv_abs_mean=jnp.mean(jnp.abs(adv_BG)),
                   fitness=jnp.mean(fitness_BG) / gen.valid_BGM.shape[-1])
    return params, opt_state, metrics


class Learner(NamedTuple):
    """The step as the search calls it (`make_learner`): `init(params) -> opt_state`;
    `update(params, frozen, ref, opt_state, learning_rate, gen, key) -> (params, opt_state,
    metrics)`, `frozen` the LoRA base (None under full weights), `ref` the starting weights
    (full weights with KL only)."""

    init: Callable
    update: Callable


def reference_logp(graphdef, params, frozen, ref, kl_coef: float) -> Callable | None:
    """The KL reference's log-prob pass `gen -> logp_BGT` (None without KL): under LoRA the
    base with the adapters off (`vpo.model.lora.base_model`: no copy), else `ref`."""
    if not kl_coef:
        return None
    if frozen is None:
        ref_pass = functools.partial(logp_fn(graphdef, None), ref)
    else:
        base = lora_lib.base_model(lora_lib.merge(graphdef, params, frozen))
        base_def, base_params = nnx.split(base, nnx.Param)
        ref_pass = functools.partial(logp_fn(base_def, None), base_params)
    return lambda gen: ref_pass(gen)[0]


def make_learner(graphdef, learn: LearnConfig, weights_R) -> Learner:
    """The search's policy-gradient step for the model `graphdef` (`vpo.model.lora.split`'s),
    with w* = `weights_R` (the task's) scalarising the fitness."""
    tx = make_optimizer(learn)

    def update(params, frozen, ref, opt_state, learning_rate, gen: SearchCalls, key):
        return learn_update(params, opt_state, learning_rate, gen, key,
                            logp=logp_fn(graphdef, frozen),
                            ref_logp=reference_logp(graphdef, params, frozen, ref,
                                                    learn.kl_coef),
                            tx=tx, learn=learn, weights_R=weights_R)

    return Learner(tx.init, update)
