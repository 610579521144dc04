"""Supervised warm start: cross-entropy on a task's demonstrations, prompt tokens masked.

RL needs a base policy that already produces well-formed answers; `run_sft` trains one from the
task's `demonstrations` (diverse valid answers, e.g. maze routes via gold, via diamond, direct).
Given several answer counts (`num_answers=(1, 3)`) every batch mixes 1-answer and m-answer
prompts, so one warm start serves single- and multi-answer RL arms (`vpo compare`).
Evolutionary search (`vpo.search.ingraph`) also uses the policy as its mutation operator, so by
default a fraction of every batch are mutation-prompt demonstrations (`mutation_demonstration_set`):
U weaker parents with their real rewards in `task.mutation_prompt` → m children that each score
strictly higher than every parent under the task's reward.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vpo.config import ConfigError, ModelConfig, TrainConfig
from vpo.model import lora as lora_lib
from vpo.model import sharding as sharding_lib
from vpo.rl.host_memory import compiled_on_first_call
from vpo.rl.step import (
    TrainState,
    completion_logp,
    init_state,
    make_optimizer,
    state_from_model,
)
from vpo.tasks.bound import BoundTask
from vpo.tree_ops import all_finite, masked_mean, update_if


def sft_step(state: TrainState, batch, *, graphdef, tx):
    """Cross-entropy on demonstration completions given prompts (prompt tokens carry no loss).

    batch: {"prompt_BP", "prompt_mask_BP", "target_BT" int32, "target_mask_BT" bool}.
    A non-finite loss or gradient skips the update. Returns (state, {"loss", "skipped_updates"}).
    Under LoRA (`state.frozen` set) only the adapters in `state.params` are trained.
    """

    def loss_fn(params):
        model = lora_lib.merge(graphdef, params, state.frozen)
        logp_B1T, _ = completion_logp(model, batch["prompt_BP"], batch["prompt_mask_BP"],
                                      batch["target_BT"][:, None])
        m_BT = batch["target_mask_BT"]
        return -masked_mean(logp_B1T[:, 0], m_BT)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    finite = jnp.isfinite(loss) & all_finite(grads)
    params, opt_state = update_if(finite, tx, grads, state.opt_state, state.params)
    new_state = state._replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, {"loss": loss, "skipped_updates": (~finite).astype(jnp.int32)}


def _right_pad(rows: list[list[int]], length: int, pad_id: int, what: str
               ) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.full((len(rows), length), pad_id, np.int32)
    mask = np.zeros((len(rows), length), bool)
    for i, r in enumerate(rows):
        if len(r) > length:
            raise ValueError(f"{what} {i} has {len(r)} tokens, more than the generation budget "
                             f"{length}")
        tokens[i, :len(r)] = r
        mask[i, :len(r)] = True
    return tokens, mask


def demonstration_set(task: BoundTask, num: int, num_answers: int, seed: int
                      ) -> dict[str, np.ndarray]:
    """`num` problems with one demonstration each (answers in tags, then the stop token), as
    padded arrays for `sft_step`; targets up to the task's answer budget (free text, your
    data's `completion` column: up to the longest demonstration)."""
    records = task.make_problems(seed, num)
    prompts, pmask = task.prompt_arrays(records, num_answers)
    rng = np.random.default_rng(seed)
    targets = [task.demonstration_ids(r, rng, num_answers) for r in records]
    length = task.completion_len(num_answers)
    if task.task.symbols is None and not task.task.words:  # free text (your data): as written
        length = max([length, *map(len, targets)])
    target, tmask = _right_pad(targets, length, task.tokenizer.pad_id, "demonstration")
    return dict(prompt_BP=prompts, prompt_mask_BP=pmask, target_BT=target, target_mask_BT=tmask)


def mutation_demonstration_set(task: BoundTask, num: int, num_answers: int, num_parents: int,
                               seed: int, *, max_rounds: int = 4
                               ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """`num` mutation-prompt demonstrations as padded arrays for `sft_step`, and stats.

    Per problem, `task.mutation_demonstrations` proposes 1..U parents and m children; the
    parents are scored one by one and the children as one m-answer generation (duplicates
    invalid), by the task's scorer. A pair is kept iff every parent and child is valid and
    min_j w*ᵀr(child_j) > max_k w*ᵀr(parent_k). The prompt is the search's mutation prompt
    (`BoundTask.mutation_prompt`) over the parents with their real rewards; the target is the
    children in answer tags, then the stop token. Problems come from `make_problems(seed + r)`
    in rounds r until `num` pairs are kept.

    Returns (arrays, stats) with stats {"kept_fraction", "mean_parent_fitness",
    "mean_child_fitness", "mean_parents"}.
    """
    if not task.has_mutation_demonstrations:
        raise ValueError(f"task {task.name!r} has no in-graph mutation_demonstrations; train "
                         "with mutation_fraction=0")
    U, M = num_parents, num_answers
    w_R = task.eval_weights_R
    rng = np.random.default_rng(seed)
    rows: dict[str, list[np.ndarray]] = {"prompt_BP": [], "prompt_mask_BP": [], "target": []}
    tried = kept = 0
    stats: dict[str, list[float]] = {"parent": [], "child": [], "parents": []}
    for r in range(max_rounds):
        n = num if r == 0 else (num - kept) * 2 + 8  # later rounds top up the shortfall
        records = task.make_problems(seed + r, n)
        pairs = [task.task.mutation_demonstrations(rec, rng, U, M) for rec in records]
        parents = [p for p, _ in pairs]
        children = [c for _, c in pairs]
        mut = task.mutation_prompt_arrays(records, parents, M, U)
        crew_NMR, cvalid_NM = task.task.score(records, children)
        cfit_NM = np.asarray(crew_NMR) @ w_R
        pfit_NU = mut["parent_rewards_BUR"] @ w_R
        present_NU = np.array([[k < len(p) for k in range(U)] for p in parents])
        for i in range(n):
            tried += 1
            pv, pk = mut["parent_valid_BU"][i], present_NU[i]
            if not (pk.any() and np.all(pv | ~pk) and np.all(cvalid_NM[i])
                    and len(children[i]) == M
                    and cfit_NM[i].min() > pfit_NU[i][pk].max()):
                continue
            kept += 1
            rows["prompt_BP"].append(mut["prompt_BP"][i])
            rows["prompt_mask_BP"].append(mut["prompt_mask_BP"][i])
            rows["target"].append(task.answers_ids(children[i]))
            stats["parent"].append(float(pfit_NU[i][pk].mean()))
            stats["child"].append(float(cfit_NM[i].mean()))
            stats["parents"].append(float(pk.sum()))
            if kept == num:
                break
        if kept >= num:
            break
    if kept < num:
        raise ValueError(f"{task.name}: only {kept} of {tried} mutation demonstrations have "
                         f"children that beat their parents (want {num}); check the task's "
                         "mutation_demonstrations or lower num_demos")
    target, tmask = _right_pad(rows["target"], task.completion_len(M), task.tokenizer.pad_id,
                               "mutation demonstration")
    out = {"prompt_BP": np.stack(rows["prompt_BP"]),
           "prompt_mask_BP": np.stack(rows["prompt_mask_BP"]),
           "target_BT": target, "target_mask_BT": tmask}
    return out, {"kept_fraction": kept / tried, "mean_parent_fitness": np.mean(stats["parent"]),
                 "mean_child_fitness": np.mean(stats["child"]),
                 "mean_parents": np.mean(stats["parents"])}


def _pad_to(demos: dict[str, np.ndarray], prompt_len: int, target_len: int, pad_id: int
            ) -> dict[str, np.ndarray]:
    """Prompts left-padded to `prompt_len` (positions count from the first real token, so padding
    changes nothing for the model), targets right-padded to `target_len` (masked out)."""
    extra = prompt_len - demos["prompt_BP"].shape[1]
    more = target_len - demos["target_BT"].shape[1]
    return {"prompt_BP": np.pad(demos["prompt_BP"], ((0, 0), (extra, 0)),
                                constant_values=pad_id),
            "prompt_mask_BP": np.pad(demos["prompt_mask_BP"], ((0, 0), (extra, 0))),
            "target_BT": np.pad(demos["target_BT"], ((0, 0), (0, more)), constant_values=pad_id),
            "target_mask_BT": np.pad(demos["target_mask_BT"], ((0, 0), (0, more)))}


def _split_rows(total: int, parts: int) -> list[int]:
    """`total` rows over `parts` sets as evenly as possible (earlier sets get the remainder)."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def run_sft(task: BoundTask, model_cfg: ModelConfig, steps: int, *, batch_size: int = 32,
            learning_rate: float = 3e-3, num_answers: int | Sequence[int] = 1,
            num_demos: int = 1024, seed: int = 0, mesh=None, mutation_fraction: float = 0.5,
            mutation_parents: int = 2, init=None, consume_init: bool = False,
            progress: bool = False) -> tuple[nnx.GraphDef, TrainState, list[float]]:
    """Supervised fine-tuning on the task's demonstrations → (graphdef, state, losses).

    num_answers: m, or several m (e.g. (1, 3)): then every batch mixes the m-answer prompts in
      equal shares, so ONE warm start serves single- and multi-answer arms alike (as every
      method in the VPO paper starts from the same base model).
    mutation_fraction: share of every batch (rounded to whole rows) drawn from
      `mutation_demonstration_set` (for each m, in equal shares) with `mutation_parents` parent
      slots (match `SearchConfig.parents`), so the policy learns to act as the search's mutation
      operator. Ignored (plain demonstrations only) for tasks without
      `mutation_demonstrations` (bandit, arithmetic), and with a warning when mutation prompt +
      completion do not fit `model_cfg.max_seq_len`; 0 turns it off.
    init: a `Decoder` to start from (a pretrained checkpoint); None starts from random weights.
      LoRA: with `model_cfg.lora_rank` > 0 (a fresh model, or a plain `init`, which then gets
      model_cfg's adapters) or an `init` that has adapters, only the adapters train
      (`vpo.model.lora`); export the plain policy with `vpo.rl.step.policy_of`.
    consume_init: hand init's arrays to the train state (`state_from_model(consume=True)`: the
      weights are not held twice; `init` is unusable afterwards).
    progress: a bar over the steps on stderr (the loss of the step before, as it is read).
    """
    import tqdm

    if not 0.0 <= mutation_fraction <= 1.0:
        raise ValueError(f"mutation_fraction={mutation_fraction} must be in [0, 1]")
    ms = sorted({int(num_answers)} if np.ndim(num_answers) == 0 else set(num_answers))
    if not ms or ms[0] < 1:
        raise ValueError(f"num_answers={num_answers!r}: want m >= 1 or a non-empty list of them")
    mesh = sharding_lib.make_mesh(devices=jax.devices()[:1]) if mesh is None else mesh
    tcfg = TrainConfig(steps=steps, learning_rate=learning_rate, warmup_steps=min(20, steps // 10),
                       schedule="cosine", batch_size=batch_size)
    tx = make_optimizer(tcfg)
    if init is None:
        graphdef, state, _ = init_state(model_cfg, tx, mesh, seed=seed)
    else:
        if model_cfg.lora_rank and not init.cfg.lora_rank:
            init = lora_lib.as_configured(init, model_cfg, seed=seed)
        graphdef, state, _ = state_from_model(init, tx, mesh, seed=seed, consume=consume_init)
        model_cfg = init.cfg
    plain = [demonstration_set(task, num_demos, m, seed + 7919 * i) for i, m in enumerate(ms)]
    need = max(d["prompt_BP"].shape[1] + d["target_BT"].shape[1] for d in plain)
    if need > model_cfg.max_seq_len:
        raise ConfigError(f"model.max_seq_len: {model_cfg.max_seq_len} < {need} (prompt + "
                          "demonstration); raise it")
    n_mut = int(round(batch_size * mutation_fraction)) if task.has_mutation_demonstrations else 0
    mut = []
    if n_mut > 0:
        # never more rows than the run can draw (short smoke runs stay cheap)
        mut = [mutation_demonstration_set(task, min(num_demos, steps * n_mut), m,
                                          mutation_parents, seed + 1 + 7919 * i)[0]
               for i, m in enumerate(ms)]
        need = max(d["prompt_BP"].shape[1] + d["target_BT"].shape[1] for d in mut)
        if need > model_cfg.max_seq_len:
            warnings.warn(f"run_sft: mutation demonstrations need model.max_seq_len >= {need} "
                          f"(mutation prompt + completion); got {model_cfg.max_seq_len}, so "
                          "this run trains on plain demonstrations only. Raise max_seq_len to "
                          "include them, or pass mutation_fraction=0 to silence this.",
                          stacklevel=2)
            mut, n_mut = [], 0
    sets = plain + mut
    P = max(d["prompt_BP"].shape[1] for d in sets)
    T = max(d["target_BT"].shape[1] for d in sets)
    sets = [_pad_to(d, P, T, task.tokenizer.pad_id) for d in sets]
    sizes = _split_rows(batch_size - n_mut, len(plain)) + (_split_rows(n_mut, len(mut))
                                                           if mut else [])
    step = compiled_on_first_call(  # the compiler's freed memory given back before it runs
        jax.jit(functools.partial(sft_step, graphdef=graphdef, tx=tx), donate_argnums=0))
    rng = np.random.default_rng(seed)
    losses = []
    pending = None
    bar = tqdm.tqdm(range(steps), desc="sft", unit="step", disable=not progress)
    for _ in bar:
        idx = [rng.integers(0, len(d["target_BT"]), size=b) for d, b in zip(sets, sizes,
                                                                              strict=True)]
        batch = {k: jax.device_put(
                     np.concatenate([d[k][i] for d, i in zip(sets, idx, strict=True)]),
                     sharding_lib.batch_sharding(mesh, sets[0][k].ndim))
                 for k in sets[0]}
        state, metrics = step(state, batch)
        if pending is not None:
            losses.append(float(pending["loss"]))
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
        pending = metrics
    bar.close()
    losses.append(float(pending["loss"]))
    return graphdef, state, losses
