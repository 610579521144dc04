"""Evaluate policies on a task's problems at an equal candidate budget and write a report.

Budget-fair (VPO paper protocol, algorithms.md §1.3/§1.7): a policy answering m answers per
generation gets budget/m generations per problem, a single-answer policy budget generations, so
every arm has the same N candidates per problem. Metrics per arm: best@k and pass@k for each k,
reward-space diversity, Pareto fraction, E_w[max], distinct solutions, token entropy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vpo import evaluation, plots
from vpo.config import ConfigError, SamplerConfig
from vpo.model import Decoder
from vpo.rewards import host_rewards, in_graph_rewards
from vpo.sampler import sample
from vpo.tasks.bound import BoundTask


def default_ks(budget: int) -> list[int]:
    """1, 2, 4, ... up to the budget (the budget itself included)."""
    ks = [k for k in (1, 2, 3, 5, 10, 20, 30, 50, 100, 200) if k < budget]
    return ks + [budget]


def sample_pool(model: Decoder, task: BoundTask, records, *, num_answers: int, budget: int,
                key, temperature: float = 1.0, top_p: float = 1.0, chunk: int = 16):
    """Sample budget/m generations per problem → (pool, answers_PNA, answer_mask_PNA, entropy).

    `budget` must be a multiple of `num_answers`. Problems are processed `chunk` at a time.
    answers_PNA are symbol ids for in-graph tasks (distinct-solution counts); None for host
    tasks.
    """
    if budget % num_answers:
        raise ValueError(f"budget {budget} must be a multiple of num_answers {num_answers}")
    G = budget // num_answers
    T = task.completion_len(num_answers)
    prompts, pmask = task.prompt_arrays(records, num_answers)
    problems = task.problem_arrays(records)
    if prompts.shape[1] + T > model.cfg.max_seq_len:
        raise ConfigError(f"model.max_seq_len: {model.cfg.max_seq_len} < prompt "
                          f"{prompts.shape[1]} + {T} generated tokens for {task.name}; load the "
                          "policy with a larger max_seq_len")
    cfg = SamplerConfig(max_new_tokens=T, num_samples=G, temperature=temperature, top_p=top_p)
    tok = task.tokenizer
    if not task.is_host:
        parse = jax.jit(jax.vmap(jax.vmap(lambda t, m: task.parse(t, m, num_answers)[:2])))
        reward_fn = jax.jit(lambda p, t, m: in_graph_rewards(task, p, t, m, num_answers))
    outs = []
    for i, start in enumerate(range(0, prompts.shape[0], chunk)):
        sl = slice(start, start + chunk)
        sub = jax.tree.map(lambda x, sl=sl: np.asarray(x)[sl], problems)
        r = sample(model, prompts[sl], pmask[sl], jax.random.fold_in(key, i), cfg,
                   stop_ids=tok.stop_ids, pad_id=tok.pad_id)
        if task.is_host:
            rewards, smask = host_rewards(task, records[sl], {"index": np.arange(
                len(records[sl]))}, r, num_answers)
            answers = amask = np.zeros(smask.shape + (1,), np.int32)
        else:
            rewards, smask = reward_fn(sub, r.tokens_BGT, r.mask_BGT)
            answers, amask = parse(r.tokens_BGT, r.mask_BGT)
        ent = float(jnp.sum(r.entropy_BGT * r.mask_BGT)), float(jnp.sum(r.mask_BGT))
        outs.append((np.asarray(rewards), np.asarray(smask), np.asarray(answers),
                     np.asarray(amask), ent))
    cat = lambda j: np.concatenate([o[j] for o in outs])  # noqa: E731
    pool = evaluation.pool_candidates(cat(0), cat(1), task.eval_weights_R, task.solved)
    answers_PNA = amask_PNA = None
    if not task.is_host:
        answers_PNA = evaluation.flatten_generations(jnp.asarray(cat(2)))
        amask_PNA = evaluation.flatten_generations(jnp.asarray(cat(3)).astype(bool))
    entropy = sum(o[4][0] for o in outs) / max(sum(o[4][1] for o in outs), 1.0)
    return pool, answers_PNA, amask_PNA, entropy


def evaluate_policy(model: Decoder, task: BoundTask, records, *, num_answers: int, budget: int,
                    ks: Sequence[int], key, temperature: float = 1.0) -> dict[str, float]:
    """Problem-averaged metrics of one policy (see `evaluation.summarize_pool`) + entropy."""
    return evaluate_policy_per_problem(model, task, records, num_answers=num_answers,
                                       budget=budget, ks=ks, key=key, temperature=temperature)[0]


def evaluate_policy_per_problem(model: Decoder, task: BoundTask, records, *, num_answers: int,
                                budget: int, ks: Sequence[int], key, temperature: float = 1.0
                                ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """`evaluate_policy`'s metrics and per-problem arrays {"best_P": max_n w*ᵀr over the N
    candidates (0 if none valid), "solved_P": some candidate solves the problem}."""
    pool, answers, amask, entropy = sample_pool(model, task, records, num_answers=num_answers,
                                                budget=budget, key=key, temperature=temperature)
    out = evaluation.summarize_pool(pool, ks, key=jax.random.fold_in(key, 7), answers_PNA=answers,
                                    answer_mask_PNA=amask)
    out["entropy"] = entropy
    per_problem = {"best_P": np.asarray(jnp.max(pool.scores_PN, axis=-1)),
                   "solved_P": np.asarray(jnp.any(pool.correct_PN, axis=-1))}
    return out, per_problem


def write_report(out_dir: str, results: Mapping[str, Mapping[str, float]], ks: Sequence[int],
                 *, title: str = "") -> str:
    """eval.json, eval.md (a table) and best_at_k.png / pass_at_k.png; returns the table text."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "eval.json"), "w") as f:
        json.dump(results, f, indent=1)
    cols = [f"best@{k}" for k in ks] + [f"pass@{k}" for k in ks] + [
        "diversity", "pareto_fraction", "emax", "distinct", "valid_fraction", "entropy"]
    lines = [f"| arm | {' | '.join(cols)} |", "|---|" + "---|" * len(cols)]
    for arm, m in results.items():
        lines.append(f"| {arm} | " + " | ".join(f"{m.get(c, float('nan')):.3f}" for c in cols)
                     + " |")
    table = "\n".join(lines)
    with open(os.path.join(out_dir, "eval.md"), "w") as f:
        f.write((f"# {title}\n\n" if title else "") + table + "\n")
    for metric in ("best", "pass"):
        curves = {arm: (list(ks), [m[f"{metric}@{k}"] for k in ks])
                  for arm, m in results.items()}
        plots.plot_metric_vs_k(os.path.join(out_dir, f"{metric}_at_k.png"), curves,
                               metric=f"{metric}@k", title=title or None)
    return table
