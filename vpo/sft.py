"""Supervised warm start: cross-entropy on a task's demonstrations, prompt tokens masked.

RL needs a base policy that already produces well-formed answers; `run_sft` trains one from the
task's `demonstrations` (diverse valid answers, e.g. maze routes via gold, via diamond, direct).
Evolutionary search (`vpo.search`) also uses the policy as its mutation operator, so by default
a fraction of every batch are mutation-prompt demonstrations (`mutation_demonstration_set`):
K weaker parents with their real rewards in `task.mutation_prompt` → m children that each score
strictly higher than every parent under the task's reward.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from vpo import _search_ops as search_ops
from vpo import data as data_lib
from vpo import sharding as sharding_lib
from vpo.config import ModelConfig
from vpo.tasks import vocab as vocab_lib
from vpo.tasks.base import Task, encode_completion, index_problem, join_answers
from vpo.train import (
    TrainState,
    _masked_mean,
    _select,
    _tree_finite,
    completion_logp,
    init_state,
    make_optimizer,
)
from vpo.train_config import TrainConfig


def sft_step(state: TrainState, batch, *, graphdef, tx):
    """Cross-entropy on demonstration completions given prompts (prompt tokens carry no loss).

    batch: {"prompt_BP", "prompt_mask_BP", "target_BT" int32, "target_mask_BT" bool}.
    A non-finite loss or gradient skips the update. Returns (state, {"loss", "skipped_updates"}).
    """

    def loss_fn(params):
        model = nnx.merge(graphdef, params)
        logp_B1T, _ = completion_logp(model, batch["prompt_BP"], batch["prompt_mask_BP"],
                                      batch["target_BT"][:, None])
        m_BT = batch["target_mask_BT"]
        return -_masked_mean(logp_B1T[:, 0], m_BT)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    finite = jnp.isfinite(loss) & _tree_finite(grads)
    updates, new_opt = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    new_state = state._replace(step=state.step + 1,
                               params=_select(finite, new_params, state.params),
                               opt_state=_select(finite, new_opt, state.opt_state))
    return new_state, {"loss": loss, "skipped_updates": (~finite).astype(jnp.int32)}


def demonstration_set(task: Task, num: int, num_answers: int, seed: int) -> dict[str, np.ndarray]:
    """`num` problems with one demonstration each, as padded arrays for `sft_step`."""
    problems = task.make_problems(seed, num)
    prompts, pmask = data_lib.prompt_arrays(task, problems, num_answers)
    rng = np.random.default_rng(seed)
    T = task.completion_len(num_answers)
    targets = [encode_completion(task.vocab, task.demonstrations(
        index_problem(problems, i), rng, num_answers), T) for i in range(num)]
    return dict(prompt_BP=prompts, prompt_mask_BP=pmask,
                target_BT=np.stack([t for t, _ in targets]),
                target_mask_BT=np.stack([m for _, m in targets]))


def _pad_answers(answers: list[list[int]], num: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """`num` answer slots of `length` ids (pad, mask False beyond the given answers)."""
    tokens = np.zeros((num, length), np.int32)
    for i, a in enumerate(answers[:num]):
        tokens[i, :len(a)] = a
    return tokens, tokens != vocab_lib.PAD


@functools.partial(jax.jit, static_argnames=("task", "num_answers"))
def _score_pairs(task, problems, parents_NKA, pmask_NKA, children_NT, cmask_NT, num_answers):
    """In-graph scores of parents (one answer each) and of the joined child completion →
    (parent_rewards_NKR, parent_valid_NK, parent_fitness_NK, child_valid_NM, child_fitness_NM)."""
    w_R = task.eval_weights_R
    rew_NKR, pvalid_NK = jax.vmap(functools.partial(search_ops.score_answers, task))(
        problems, parents_NKA, pmask_NKA)
    crew_NMR, cvalid_NM = jax.vmap(lambda p, c, m: task.reward(p, c, m, num_answers))(
        problems, children_NT, cmask_NT)
    return (rew_NKR, pvalid_NK, search_ops.fitness(rew_NKR, pvalid_NK, w_R), cvalid_NM,
            search_ops.fitness(crew_NMR, cvalid_NM, w_R))


def mutation_demonstration_set(task: Task, num: int, num_answers: int, num_parents: int,
                               seed: int, *, max_rounds: int = 4
                               ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """`num` mutation-prompt demonstrations as padded arrays for `sft_step`, and stats.

    Per problem, `task.mutation_demonstrations` proposes 1..K parents and m children; both are
    scored with `task.reward` (a parent as the one-answer completion `ans <eos>`, exactly as the
    search scores candidates; the children as one m-answer completion, duplicates masked). A pair
    is kept iff every parent and child is valid and min_j w*ᵀr(child_j) > max_k w*ᵀr(parent_k).
    The prompt is `task.mutation_prompt` over the K parent slots with their real rewards (absent
    slots dropped, so it equals the prompt of fewer parents, left-padded); the target is the
    children joined as `c_1 <sep> ... c_m <eos>`. Problems come from `make_problems(seed + r)`
    in rounds r until `num` pairs are kept.

    Returns (arrays, stats) with stats {"kept_fraction", "mean_parent_fitness",
    "mean_child_fitness", "mean_parents"}.
    """
    if task.mutation_demonstrations is None or task.is_host:
        raise ValueError(f"task {task.name!r} has no in-graph mutation_demonstrations; train "
                         "with mutation_fraction=0")
    K, M, A = num_parents, num_answers, task.answer_len
    T = task.completion_len(M)
    rng = np.random.default_rng(seed)
    prompt_fn = jax.jit(jax.vmap(lambda p, a, am, r: task.mutation_prompt(p, a, am, r, M)))
    rows: dict[str, list[np.ndarray]] = {k: [] for k in ("prompt_BP", "target_BT",
                                                          "target_mask_BT")}
    tried = kept = 0
    stats: dict[str, list[np.ndarray]] = {"parent": [], "child": [], "parents": []}
    for r in range(max_rounds):
        n = num if r == 0 else (num - kept) * 2 + 8  # later rounds top up the shortfall
        problems = task.make_problems(seed + r, n)
        par, pmask, tgt, tmask = [], [], [], []
        for i in range(n):
            parents, children = task.mutation_demonstrations(index_problem(problems, i), rng, K, M)
            p_KA, pm_KA = _pad_answers(parents, K, A)
            t_T, tm_T = encode_completion(task.vocab, join_answers(children), T)
            par.append(p_KA), pmask.append(pm_KA), tgt.append(t_T), tmask.append(tm_T)
        par, pmask, tgt, tmask = map(np.stack, (par, pmask, tgt, tmask))
        rew, pvalid, pfit, cvalid, cfit = map(np.asarray, _score_pairs(
            task, problems, par, pmask, tgt, tmask, num_answers=M))
        present = pmask.any(-1)
        keep = (present.any(-1) & np.all(pvalid | ~present, -1) & cvalid.all(-1)
                & (cfit.min(-1) > np.where(present, pfit, -np.inf).max(-1)))
        tried, kept = tried + n, kept + int(keep.sum())
        prompts = np.asarray(prompt_fn(problems, par, pmask, np.where(present[..., None], rew, 0)))
        rows["prompt_BP"].append(prompts[keep])
        rows["target_BT"].append(tgt[keep])
        rows["target_mask_BT"].append(tmask[keep])
        stats["parent"].append((np.where(present, pfit, 0).sum(-1) / present.sum(-1).clip(1))[keep])
        stats["child"].append(cfit.mean(-1)[keep])
        stats["parents"].append(present.sum(-1)[keep])
        if kept >= num:
            break
    if kept < num:
        raise ValueError(f"{task.name}: only {kept} of {tried} mutation demonstrations have "
                         f"children that beat their parents (want {num}); check the task's "
                         "mutation_demonstrations or lower num_demos")
    out = {k: np.concatenate(v)[:num] for k, v in rows.items()}
    out["prompt_mask_BP"] = out["prompt_BP"] != vocab_lib.PAD
    mean = lambda k: float(np.concatenate(stats[k])[:num].mean())  # noqa: E731
    return out, {"kept_fraction": kept / tried, "mean_parent_fitness": mean("parent"),
                 "mean_child_fitness": mean("child"), "mean_parents": mean("parents")}


def _left_pad(demos: dict[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
    """Prompts left-padded to `length` (positions count from the first real token, so padding
    changes nothing for the model)."""
    extra = length - demos["prompt_BP"].shape[1]
    pad = lambda x: np.pad(x, ((0, 0), (extra, 0)))  # noqa: E731  (pad id 0, mask False)
    return {**demos, "prompt_BP": pad(demos["prompt_BP"]),
            "prompt_mask_BP": pad(demos["prompt_mask_BP"])}


def run_sft(task: Task, model_cfg: ModelConfig, steps: int, *, batch_size: int = 32,
            learning_rate: float = 3e-3, num_answers: int = 1, num_demos: int = 1024,
            seed: int = 0, mesh=None, mutation_fraction: float = 0.5, mutation_parents: int = 2
            ) -> tuple[nnx.GraphDef, TrainState, list[float]]:
    """Supervised fine-tuning on the task's demonstrations → (graphdef, state, losses).

    mutation_fraction: share of every batch (rounded to whole rows) drawn from
      `mutation_demonstration_set` with `mutation_parents` parent slots (match
      `SearchConfig.parents`), so the policy learns to act as the search's mutation operator.
      Ignored (plain demonstrations only) for tasks without `mutation_demonstrations`
      (bandit, arithmetic), and with a warning when mutation prompt + completion do not fit
      `model_cfg.max_seq_len`; 0 turns it off.
    """
    if not 0.0 <= mutation_fraction <= 1.0:
        raise ValueError(f"mutation_fraction={mutation_fraction} must be in [0, 1]")
    mesh = sharding_lib.make_mesh(devices=jax.devices()[:1]) if mesh is None else mesh
    tcfg = TrainConfig(steps=steps, learning_rate=learning_rate, warmup_steps=min(20, steps // 10),
                       schedule="cosine", batch_size=batch_size)
    tx = make_optimizer(tcfg)
    graphdef, state, _ = init_state(model_cfg, tx, mesh, seed=seed)
    sets = [demonstration_set(task, num_demos, num_answers, seed)]
    n_mut = int(round(batch_size * mutation_fraction))
    if task.mutation_demonstrations is None or task.is_host:
        n_mut = 0
    need = task.mutation_prompt_len(mutation_parents) + task.completion_len(num_answers)
    if n_mut and need > model_cfg.max_seq_len:
        warnings.warn(f"run_sft: mutation demonstrations need model.max_seq_len >= {need} "
                      f"(mutation prompt + completion); got {model_cfg.max_seq_len}, so this "
                      "run trains on plain demonstrations only. Raise max_seq_len to include "
                      "them, or pass mutation_fraction=0 to silence this.", stacklevel=2)
        n_mut = 0
    if n_mut:
        # never more rows than the run can draw (short smoke runs stay cheap)
        mut, _ = mutation_demonstration_set(task, min(num_demos, steps * n_mut), num_answers,
                                            mutation_parents, seed + 1)
        sets = [_left_pad(sets[0], mut["prompt_BP"].shape[1]), mut]
    sizes = [batch_size - n_mut, n_mut]
    step = jax.jit(functools.partial(sft_step, graphdef=graphdef, tx=tx), donate_argnums=0)
    rng = np.random.default_rng(seed)
    losses = []
    pending = None
    for _ in range(steps):
        idx = [rng.integers(0, len(d["target_BT"]), size=b) for d, b in zip(sets, sizes)]
        batch = {k: jax.device_put(np.concatenate([d[k][i] for d, i in zip(sets, idx)]),
                                   sharding_lib.batch_sharding(mesh, sets[0][k].ndim))
                 for k in sets[0]}
        state, metrics = step(state, batch)
        if pending is not None:
            losses.append(float(pending["loss"]))
        pending = metrics
    losses.append(float(pending["loss"]))
    return graphdef, state, losses
