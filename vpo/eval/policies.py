"""Evaluate policies on a task's problems at an equal candidate budget and write a report.

Budget-fair (the VPO paper's protocol, Bahlous-Boldi et al., arXiv 2605.22817): a policy answering m
answers per generation gets budget/m generations per problem, a single-answer policy budget
generations, so every arm has the same N candidates per problem. Metrics per arm: best@k and pass@k
for each k, reward-space diversity, Pareto fraction, E_w[max], distinct solutions, token entropy.

Every parsed answer is scored the same way for every arm: a repeat of an earlier answer in the
same generation is scored like any other answer (`score_all_answers`), exactly as a single-answer
policy's repeats across generations are, so no arm has its duplicates zeroed. (Training keeps
the paper's in-generation de-duplication, which Multi-RLVR's summed reward needs.)

`mutation_probe` measures a policy as the search's mutation operator on its own: format,
improvement over the parents and copying, on mutation prompts built from the task's weaker
parents.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vpo.config import ConfigError, SamplerConfig
from vpo.env.task import EnvTask, env_factory
from vpo.eval import metrics, plots
from vpo.model.decoder import Decoder
from vpo.rollout.rewards import in_graph_rewards
from vpo.rollout.slots import sample
from vpo.tasks.bound import BoundTask, GraphTask, HostTask, for_kind


def default_ks(budget: int) -> list[int]:
    """1, 2, 4, ... up to the budget (the budget itself included)."""
    ks = [k for k in (1, 2, 3, 5, 10, 20, 30, 50, 100, 200) if k < budget]
    return ks + [budget]


def read_all_answers(task: BoundTask, completion_T, mask_T, num_answers: int):
    """The m answers of one generation as symbol ids, repeats KEPT → (symbols_MA, mask_MA,
    valid_M) (`BoundTask.parse` without its duplicate removal)."""
    return task.parse(completion_T, mask_T, num_answers, dedup=False)


def score_all_answers(task: BoundTask, problems, tokens_BGT, mask_BGT, num_answers: int):
    """Every parsed answer of B problems × G generations scored by the task, repeats included →
    (rewards_BGMR, valid_BGM, symbols_BGMA, mask_BGMA)."""
    def one(problem, t_T, m_T):
        sym_MA, smask_MA, valid_M = read_all_answers(task, t_T, m_T, num_answers)
        rewards_MR, _ = task.score_symbols(problem, sym_MA, smask_MA)
        return jnp.where(valid_M[:, None], rewards_MR, 0.0), valid_M, sym_MA, smask_MA

    per_problem = jax.vmap(one, in_axes=(None, 0, 0))
    return jax.vmap(per_problem)(problems["task"], tokens_BGT, mask_BGT)


@functools.lru_cache(maxsize=32)
def _jitted_scorer(task: BoundTask, num_answers: int):
    """`score_all_answers` jitted once per (task, m): evaluation calls it for every policy."""
    return jax.jit(lambda p, t, m: score_all_answers(task, p, t, m, num_answers))


def host_score_all_answers(task: BoundTask, records, tokens_BGT, mask_BGT, num_answers: int
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Host tasks: every parsed answer of B problems × G generations scored on its own by the
    task's scorer (so a repeat inside a generation is not zeroed) → (rewards_BGMR, valid_BGM)."""
    tokens_BGT, mask_BGT = np.asarray(tokens_BGT), np.asarray(mask_BGT)
    B, G, T = tokens_BGT.shape
    texts = task.completion_texts(tokens_BGT.reshape(B * G, T), mask_BGT.reshape(B * G, T))
    slots = [a for t in texts for a in task.parse_text(t, num_answers)]
    rows = [records[b] for b in range(B) for _ in range(G * num_answers)]
    rewards, valid = task.task.score(rows, [[a] for a in slots])
    return (np.asarray(rewards, np.float32).reshape(B, G, num_answers, -1),
            np.asarray(valid, bool).reshape(B, G, num_answers))


def sample_pool(model: Decoder, task: BoundTask, records, *, num_answers: int, budget: int,
                key, temperature: float = 1.0, top_p: float = 1.0, chunk: int = 16,
                max_new_tokens: int | None = None, progress: bool = False, desc: str = "eval",
                num_slots: int = 0):
    """Sample budget/m generations per problem → (pool, answers_BNA, answer_mask_BNA, entropy).

    `budget` must be a multiple of `num_answers`. Problems are processed `chunk` at a time.
    Every parsed answer is a scored candidate (`score_all_answers`, `host_score_all_answers`;
    on an environment each candidate is an episode, `_episode_pool`). answers_BNA are symbol
    ids for in-graph tasks (distinct-solution counts); None for host tasks. `max_new_tokens`:
    the generation budget of host-scored tasks (default: the task's for m answers;
    `vpo.launch.rules.completion_budget` is the commands' rule). `progress`: a bar over the
    chunks on stderr, labelled `desc`. `num_slots`: `SamplerConfig.num_slots` (rows decoding
    at once per chunk; 0: all).
    """
    return for_kind(POOLS, task)(model, task, records, num_answers=num_answers, budget=budget,
                                 key=key, temperature=temperature, top_p=top_p, chunk=chunk,
                                 max_new_tokens=max_new_tokens, progress=progress, desc=desc,
                                 num_slots=num_slots)


def _check_budget(budget: int, num_answers: int) -> None:
    if budget % num_answers:
        raise ValueError(f"budget {budget} must be a multiple of num_answers {num_answers}")


def _graph_pool(model: Decoder, task: BoundTask, records, *, num_answers: int, budget: int,
                max_new_tokens: int | None, **kw):
    """`sample_pool` on an in-graph task: its answers read and scored in one jit, at its own
    answer budget."""
    _check_budget(budget, num_answers)
    T = task.completion_len(num_answers)
    if max_new_tokens is not None and max_new_tokens != T:
        raise ConfigError(f"max_new_tokens: the {task.name} task's answers are read in one "
                          f"jit with their own budget ({T}); it sets the budget of "
                          "host-scored tasks only")
    score_fn = _jitted_scorer(task, num_answers)

    def score(sub, rows, r):
        del rows
        return score_fn(sub, r.tokens_BGT, r.mask_BGT)

    pool, answers, amask, entropy = _generation_pool(model, task, records, T, score,
                                                     num_answers=num_answers, budget=budget,
                                                     **kw)
    return (pool, metrics.flatten_generations(jnp.asarray(answers)),
            metrics.flatten_generations(jnp.asarray(amask).astype(bool)), entropy)


def _host_pool(model: Decoder, task: BoundTask, records, *, num_answers: int, budget: int,
               max_new_tokens: int | None, **kw):
    """`sample_pool` on a host-scored task: the generations' text scored by the task's scorer,
    at `max_new_tokens` (default: the task's answer budget)."""
    _check_budget(budget, num_answers)
    T = task.completion_len(num_answers)
    if max_new_tokens is not None:
        T = max_new_tokens

    def score(sub, rows, r):
        del sub
        rewards, smask = host_score_all_answers(task, rows, r.tokens_BGT, r.mask_BGT,
                                                num_answers)
        answers = np.zeros(smask.shape + (1,), np.int32)
        return rewards, smask, answers, answers

    pool, _, _, entropy = _generation_pool(model, task, records, T, score,
                                           num_answers=num_answers, budget=budget, **kw)
    return pool, None, None, entropy


def _generation_pool(model: Decoder, task: BoundTask, records, T: int, score, *,
                     num_answers: int, budget: int, key, temperature: float, top_p: float,
                     chunk: int, progress: bool, desc: str, num_slots: int):
    """budget/m generations of at most T tokens per problem, `chunk` problems at a time, each
    chunk scored by `score(problems, records, rollout)` → (rewards, valid, answers,
    answer_mask) → (pool, answers, answer masks (concatenated), entropy)."""
    import tqdm

    G = budget // num_answers
    prompts, pmask = task.prompt_arrays(records, num_answers)
    problems = task.problem_arrays(records)
    if prompts.shape[1] + T > model.cfg.max_seq_len:
        raise ConfigError(f"model.max_seq_len: {model.cfg.max_seq_len} < prompt "
                          f"{prompts.shape[1]} + {T} generated tokens for {task.name}; load the "
                          "policy with a larger max_seq_len")
    cfg = SamplerConfig(max_new_tokens=T, num_samples=G, temperature=temperature, top_p=top_p,
                        num_slots=num_slots)
    tok = task.tokenizer
    outs = []
    starts = range(0, prompts.shape[0], chunk)
    for i, start in enumerate(tqdm.tqdm(starts, desc=desc, unit="chunk", disable=not progress)):
        sl = slice(start, start + chunk)
        sub = jax.tree.map(lambda x, sl=sl: np.asarray(x)[sl], problems)
        r = sample(model, prompts[sl], pmask[sl], jax.random.fold_in(key, i), cfg,
                   stop_ids=tok.stop_ids, pad_id=tok.pad_id)
        rewards, smask, answers, amask = score(sub, records[sl], r)
        ent = float(jnp.sum(r.entropy_BGT * r.mask_BGT)), float(jnp.sum(r.mask_BGT))
        outs.append((np.asarray(rewards), np.asarray(smask), np.asarray(answers),
                     np.asarray(amask), ent))
    cat = lambda j: np.concatenate([o[j] for o in outs])  # noqa: E731
    pool = metrics.pool_candidates(cat(0), cat(1), task.eval_weights_R, task.solved)
    entropy = sum(o[4][0] for o in outs) / max(sum(o[4][1] for o in outs), 1.0)
    return pool, cat(2), cat(3), entropy


def _episode_pool(model: Decoder, task: EnvTask, records, *, num_answers: int, budget: int,
                  key, temperature: float, top_p: float, chunk: int,
                  max_new_tokens: int | None, progress: bool, desc: str, num_slots: int = 0):
    """`sample_pool` on an environment task (`vpo train --env`): each candidate is one
    multi-turn episode (`vpo.env.episode.run_episodes`), scored by the environment, budget
    episodes per row; its reward vector is the episode's (components that did not apply: 0),
    and every episode is a valid candidate. One answer per candidate (m = 1): VPO's sets of m
    episodes (`--env-set`) are sets of these candidates, so best@k / pass@k over episodes
    compare at the same budget. (`num_slots` does not apply: episodes decode every row.)"""
    import tqdm

    from vpo.env.episode import task_episodes

    if num_answers != 1:
        raise ConfigError(f"--answers {num_answers}: an environment's candidate is one episode "
                          "(m = 1); a policy trained with --env-set m is evaluated on the "
                          "same episodes, drop --answers")
    factory = env_factory(task)
    T = max_new_tokens or task.completion_len(1)
    outs = []
    starts = range(0, len(records), chunk)
    for i, start in enumerate(tqdm.tqdm(starts, desc=desc, unit="chunk", disable=not progress)):
        rows = [dict(r) for r in records[start:start + chunk]]
        keys_BG = jax.random.split(jax.random.fold_in(key, i),
                                   len(rows) * budget).reshape(len(rows), budget)
        ep = task_episodes(model, task, factory, rows, keys_BG, temperature=temperature,
                           top_p=top_p, max_tokens=T, row_offset=start)
        r = ep.rollout
        ent = float(jnp.sum(r.entropy_BGT * r.mask_BGT)), float(jnp.sum(r.mask_BGT))
        outs.append((ep.rewards_BGR[:, :, None, :], np.ones(ep.rewards_BGR.shape[:2] + (1,),
                                                             bool), ent))
    cat = lambda j: np.concatenate([o[j] for o in outs])  # noqa: E731
    pool = metrics.pool_candidates(cat(0), cat(1), task.eval_weights_R, task.solved)
    entropy = sum(o[2][0] for o in outs) / max(sum(o[2][1] for o in outs), 1.0)
    return pool, None, None, entropy


# the evaluation pool of each task kind (`sample_pool`'s keywords)
POOLS = {GraphTask: _graph_pool, HostTask: _host_pool, EnvTask: _episode_pool}


def evaluate_policy(model: Decoder, task: BoundTask, records, *, num_answers: int, budget: int,
                    ks: Sequence[int], key, temperature: float = 1.0,
                    max_new_tokens: int | None = None, progress: bool = False,
                    desc: str = "eval", num_slots: int = 0) -> dict[str, float]:
    """Problem-averaged metrics of one policy (see `metrics.summarize_pool`) + entropy;
    `max_new_tokens`, `progress`, `desc`, `num_slots` as in `sample_pool`."""
    return evaluate_policy_per_problem(model, task, records, num_answers=num_answers,
                                       budget=budget, ks=ks, key=key, temperature=temperature,
                                       max_new_tokens=max_new_tokens, progress=progress,
                                       desc=desc, num_slots=num_slots)[0]


def evaluate_policy_per_problem(model: Decoder, task: BoundTask, records, *, num_answers: int,
                                budget: int, ks: Sequence[int], key, temperature: float = 1.0,
                                max_new_tokens: int | None = None, progress: bool = False,
                                desc: str = "eval", num_slots: int = 0,
                                per_problem: Sequence[str] = ()
                                ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """`evaluate_policy`'s metrics (with cover@k for every k when the task has
    `cover_components`) and per-problem arrays {"best_P": max_n w*ᵀr over the N candidates (0 if
    none valid), "solved_P": some candidate solves the problem}, plus "<metric>_P" for each
    metric named in `per_problem` ("pass@k", "cover@k", "best@k", "diversity"): the [P] values
    the metric averages (for the claims paired over problems)."""
    pool, answers, amask, entropy = sample_pool(model, task, records, num_answers=num_answers,
                                                budget=budget, key=key, temperature=temperature,
                                                max_new_tokens=max_new_tokens,
                                                progress=progress, desc=desc,
                                                num_slots=num_slots)
    out = metrics.summarize_pool(pool, ks, key=jax.random.fold_in(key, 7), answers_BNA=answers,
                                    answer_mask_BNA=amask)
    cover = task.task.cover_components
    if cover:  # a set covering modes no single answer joins (countdown2: both targets)
        out |= {f"cover@{k}": float(jnp.mean(metrics.cover_at_k(
            pool.rewards_BNR, pool.valid_BN, k, cover))) for k in ks}
    out["entropy"] = entropy
    per = {"best_P": np.asarray(jnp.max(pool.scores_BN, axis=-1)),
           "solved_P": np.asarray(jnp.any(pool.correct_BN, axis=-1))}
    return out, per | {f"{name}_P": np.asarray(_per_problem(pool, name, cover))
                       for name in per_problem}


def _per_problem(pool, name: str, cover) -> jax.Array:
    """[P] values of one pool metric ("pass@k", "cover@k", "best@k", "diversity"); a ValueError
    names one this module does not compute per problem."""
    what, _, k = name.partition("@")
    if name == "diversity":
        return metrics.reward_diversity(pool.rewards_BNR, pool.valid_BN)
    if what == "pass" and k:
        return metrics.pass_at_k(pool.correct_BN, int(k))
    if what == "best" and k:
        return metrics.best_at_k(pool.scores_BN, int(k))
    if what == "cover" and k and cover:
        return metrics.cover_at_k(pool.rewards_BNR, pool.valid_BN, int(k), cover)
    raise ValueError(f"per_problem: {name!r} is not computed per problem (pass@k, best@k, "
                     "diversity, or cover@k on a task with cover components)")


_LEGEND = """\
best@k: expected best w*ᵀr among k of the candidates; pass@k: chance that one of k is solved, as
the task defines it (maze: w*ᵀr >= 0.75, bandit: >= 0.6, program, arithmetic and your data:
w*ᵀr = 1, so on your data every weighted reward component must reach 1 and a component that never
does keeps pass@k at 0); diversity: mean pairwise L1 distance of the valid candidates' reward
vectors; pareto_fraction: their non-dominated share; emax: E_w[max] over w ~ Dirichlet(1);
distinct: distinct valid candidates per problem (nan for host-scored tasks, your data and
arithmetic, which have no symbol ids to compare); valid_fraction: answers that parse; entropy:
mean token entropy of the samples.
"""


def write_eval_table(out_dir: str, results: Mapping[str, Mapping[str, float]],
                     ks: Sequence[int], *, title: str = "") -> str:
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
        f.write((f"# {title}\n\n" if title else "") + table + "\n\n" + _LEGEND)
    for metric in ("best", "pass"):
        curves = {arm: (list(ks), [m[f"{metric}@{k}"] for k in ks])
                  for arm, m in results.items()}
        plots.plot_metric_vs_k(os.path.join(out_dir, f"{metric}_at_k.png"), curves,
                               metric=f"{metric}@k", title=title or None)
    return table


def mutation_probe_inputs(task: BoundTask, records, *, num_answers: int, num_parents: int,
                          seed: int = 0) -> dict[str, np.ndarray]:
    """The probe's mutation prompts (built once, shared by every policy probed): per problem
    the task's weaker parents (`task.mutation_demonstrations`, 1..U of them, drawn with
    `seed`) with their real rewards in the search's mutation prompt
    (`BoundTask.mutation_prompt_arrays`) → its arrays plus parent symbols "parents_BUA" /
    "parent_mask_BUA" and the problems' "task" arrays."""
    if not task.has_mutation_demonstrations:  # host-scored tasks have none
        raise ValueError(f"task {task.name!r} has no in-graph mutation prompts to probe")
    M, U = num_answers, num_parents
    rng = np.random.default_rng(seed)
    parents = [task.task.mutation_demonstrations(r, rng, U, M)[0] for r in records]
    mut = task.mutation_prompt_arrays(records, parents, M, U)
    sym_BUA, pmask_BUA = task.parent_symbols(parents, U)
    return {**mut, "parents_BUA": sym_BUA,
            "parent_mask_BUA": pmask_BUA & mut["parent_valid_BU"][..., None],
            "task": task.problem_arrays(records)["task"]}


@functools.lru_cache(maxsize=32)
def _probe_scorer(task: BoundTask, num_answers: int):
    """Children of the probe scored as the search scores them, jitted once per (task, m) →
    per-slot (valid_BGM, fitness_BGM, copy_BGM), distinct_B and per-slot solved_BGM."""
    M = num_answers
    w_R = jnp.asarray(task.eval_weights_R, jnp.float32)

    def score(inputs, tokens_BGT, mask_BGT):
        rewards_BGMR, valid_BGM = in_graph_rewards(task, inputs, tokens_BGT, mask_BGT, M)
        sym_BGMA, smask_BGMA = jax.vmap(jax.vmap(lambda t, m: task.parse(t, m, M)[:2]))(
            tokens_BGT, mask_BGT)
        fit_BGM = jnp.where(valid_BGM, rewards_BGMR @ w_R, 0.0)
        child_BGMA = jnp.where(smask_BGMA, sym_BGMA, -1)
        parent_BUA = jnp.where(inputs["parent_mask_BUA"], inputs["parents_BUA"], -1)
        same_BGMU = jnp.all(child_BGMA[:, :, :, None, :] == parent_BUA[:, None, None], -1)
        present_BU = jnp.any(inputs["parent_mask_BUA"], -1)
        copy_BGM = valid_BGM & jnp.any(same_BGMU & present_BU[:, None, None, :], -1)
        B, G = valid_BGM.shape[:2]
        flat = lambda x: x.reshape((B, G * M) + x.shape[3:])  # noqa: E731
        distinct_B = metrics.distinct_solutions(flat(sym_BGMA), flat(smask_BGMA),
                                                   flat(valid_BGM))
        solved_BGM = valid_BGM & jax.vmap(jax.vmap(jax.vmap(task.solved)))(rewards_BGMR)
        return valid_BGM, fit_BGM, copy_BGM, distinct_B, solved_BGM

    return jax.jit(score)


def mutation_probe(model: Decoder, task: BoundTask, inputs: dict[str, np.ndarray], *,
                   num_answers: int, key, temperature: float = 1.0, samples: int = 4
                   ) -> dict[str, float]:
    """The policy as the search's mutation operator, measured without a search around it.

    On the mutation prompts of `mutation_probe_inputs` (weaker parents with their rewards) the
    policy writes `samples` generations of m children each, scored as the search scores them
    (a repeat inside a generation is invalid). Problem-averaged fractions of child SLOTS:

      valid      well-formed, new within its generation        (format kept?)
      improve    valid and w*ᵀr(child) > max_k w*ᵀr(parent_k)  (does mutation help?)
      copy       valid and equal to one of the prompt's parents (copying instead of mutating)
      distinct   distinct valid children / slots, over all of a problem's generations
                 (collapse onto one answer?)
      solved     valid and solving the problem (`task.solved`)
    and child_fitness (mean w*ᵀr over slots, invalid 0), parent_fitness (mean best parent),
    entropy (mean token entropy of the children).
    """
    M = num_answers
    T = task.completion_len(M)
    prompts, pmask = inputs["prompt_BP"], inputs["prompt_mask_BP"]
    if prompts.shape[1] + T > model.cfg.max_seq_len:
        raise ConfigError(f"model.max_seq_len: {model.cfg.max_seq_len} < mutation prompt "
                          f"{prompts.shape[1]} + {T} generated tokens")
    cfg = SamplerConfig(max_new_tokens=T, num_samples=samples, temperature=temperature)
    tok = task.tokenizer
    r = sample(model, prompts, pmask, key, cfg, stop_ids=tok.stop_ids, pad_id=tok.pad_id)
    valid, fit, copy, distinct, solved = _probe_scorer(task, M)(
        {k: inputs[k] for k in ("task", "parents_BUA", "parent_mask_BUA")},
        r.tokens_BGT, r.mask_BGT)
    w_R = np.asarray(task.eval_weights_R, np.float32)
    pfit_BU = np.where(inputs["parent_valid_BU"], inputs["parent_rewards_BUR"] @ w_R, -np.inf)
    best_parent_B = pfit_BU.max(-1)
    valid, fit = np.asarray(valid), np.asarray(fit)
    return {"valid": float(valid.mean()),
            "improve": float((valid & (fit > best_parent_B[:, None, None])).mean()),
            "copy": float(np.asarray(copy).mean()), "solved": float(np.asarray(solved).mean()),
            "distinct": float(np.mean(np.asarray(distinct) / (valid.shape[1] * M))),
            "child_fitness": float(fit.mean()),
            "parent_fitness": float(np.where(np.isfinite(best_parent_B), best_parent_B,
                                             0.0).mean()),
            "entropy": float(jnp.sum(r.entropy_BGT * r.mask_BGT)
                             / jnp.maximum(jnp.sum(r.mask_BGT), 1.0))}
