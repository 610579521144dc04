"""In-graph evolutionary search with the policy as mutation operator (islands on the mesh).

Mind Evolution (Lee et al., arXiv 2501.09891) and the AlphaEvolve-style test-time search of VPO
(Bahlous-Boldi et al., arXiv 2605.22817): I islands of Q members. One generation, per island: select
parents (tournament / Boltzmann on fitness = w*ᵀr), build mutation prompts with
`task.mutation_prompt` (or, with probability `fresh_rate`, the plain task prompt), sample children
with the policy (m answers per call, each one candidate, read from the generated text as symbol
ids), score them with the task's in-graph reward, drop duplicates, keep the best Q of members ∪
children; every `migration_interval` generations the best `migration_count` of island i replace the
worst of island i+1 (ring); optionally the weakest islands are re-seeded from the global elites.
`lax.scan` over generations inside one jit, vmapped over problems, with the island axis sharded over
the mesh's data axes.

One shape, as evosax: `make_search(task, cfg, propose, mesh) -> (init, step)` with
`init(key, problem)` and `step(key, state)`, pure and traceable. The children come from
`propose(key, problem, parents_BUA, parent_mask_BUA, parent_rewards_BUR, fresh_B) ->
(answers_BMA, answer_mask_BMA)` (B policy calls, M = num_answers candidates each);
`lm_propose(model, ..., task=, cfg=)` samples the LM (`run_method` closes it over the model).
The baselines (best-of-N and sequential revision) use the same proposer and reward at the same
candidate budget, and every method returns the same `SearchTrace`. Budget: `evaluated` counts
every candidate slot the proposer returns (m per call), valid or not; it is exact: I·Q + g·I·C
after generation g. Host-scored tasks search through `vpo.search.host` (same operators).
"""
# size: one job, the island search as init / step; about 40 of its lines are the runnable
# example of a `propose` of your own in `make_search`'s docstring (tested).

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vpo.config import ConfigError, SearchConfig
from vpo.eval import metrics, plots
from vpo.model import sharding
from vpo.rollout.slots import generate_rollouts
from vpo.search import population as ops
from vpo.search.population import Population
from vpo.tasks.base import Record
from vpo.tasks.bound import BoundTask, HostTask
from vpo.types import Rollout

# propose(key, problem, parents_BUA, parent_mask_BUA, parent_rewards_BUR, fresh_B)
#   -> (answers_BMA, answer_mask_BMA): B calls, m candidates each (symbol ids of the task)
Propose = Callable[..., tuple[jax.Array, jax.Array]]

METHODS = ("search", "best_of_n", "revision")


class SearchState(NamedTuple):
    """Device state of one problem's search (a leading N axis when batched)."""

    population: Population  # [I, Q] slots
    evaluated: jax.Array  # int32, candidates scored so far (exact)
    generation: jax.Array  # int32
    best_tokens_A: jax.Array
    best_mask_A: jax.Array
    best_rewards_R: jax.Array
    best_fitness: jax.Array  # -inf until a valid candidate appears
    solved: jax.Array  # bool, some evaluated candidate satisfies task.solved
    problem: Any  # the problem searched (a row of `search_problems`), constant
    probe: jax.Array  # int32 [4], the last generation's `PROBE_FIELDS` counts


# The mechanism probe of one generation, counted over its policy calls that had parents
# selected: children of mutation prompts, how many beat the best of the parents shown to them,
# children of plain-prompt calls (`fresh_rate`), and how many beat the best of the parents
# selected for that call but not shown. "Beat" is w*ᵀr strictly above the parent's (an invalid
# child never beats). The two rates compare a child against an independent sample drawn in the
# same generation against the same kind of parents.
PROBE_FIELDS = ("mutated", "mutated_beat", "fresh", "fresh_beat")


class SearchTrace(NamedTuple):
    """Per-point curves [G + 1] (point 0 = after initialisation); [N, G + 1] when batched;
    `probe` [G + 1, 4] (`PROBE_FIELDS`; None from the host search)."""

    best_fitness: jax.Array
    solved: jax.Array
    diversity: jax.Array  # mean pairwise reward L1 distance inside islands (pools for baselines)
    evaluated: jax.Array
    probe: Any = None


class SearchResult(NamedTuple):
    """What every search method returns, in the graph or on the host: the trace (leading N
    problems when batched), the final in-graph state (None on the host), and on the host the
    distinct answer texts seen and each problem's best answer (text, reward vector, w*ᵀr; None
    where no answer was valid)."""

    trace: SearchTrace
    state: SearchState | None = None
    texts: list[str] | None = None
    best: list | None = None


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ConfigError(f"method={method!r}: choose one of {', '.join(METHODS)}")


def _check_in_graph(task: BoundTask) -> None:
    if isinstance(task, HostTask):
        raise ValueError(f"task {task.name!r} scores on the host; in-graph search needs a "
                         "task with symbols and symbol_reward")


def search_problems(task: BoundTask, records: list[Record], num_answers: int) -> dict:
    """The problems as search reads them (numpy, leading N): {"task": the task's arrays,
    "head_P"/"head_mask_P": mutation-prompt heads, "prompt_P"/"prompt_mask_P": plain prompts}."""
    _check_in_graph(task)
    head, hmask = task.mutation_heads(records)
    prompt, pmask = task.prompt_arrays(records, num_answers)
    return {"task": task.problem_arrays(records)["task"], "head_P": head, "head_mask_P": hmask,
            "prompt_P": prompt, "prompt_mask_P": pmask}


def prompt_len(task: BoundTask, problems: dict, cfg: SearchConfig, num_parents: int) -> int:
    """P2, the static prompt length of a search call (mutation or plain prompt)."""
    return max(task.mutation_prompt_len(problems["head_P"].shape[-1], num_parents,
                                        cfg.num_answers), problems["prompt_P"].shape[-1])


def lm_prompts(task: BoundTask, cfg: SearchConfig, problem, parents_BUA, parent_mask_BUA,
               parent_rewards_BUR, fresh_B) -> tuple[jax.Array, jax.Array]:
    """Mutation prompts (or, where `fresh`, the plain prompt), left-padded to the same length
    → (prompts_BP, mask_BP), P = `prompt_len`."""
    m, U = cfg.num_answers, parents_BUA.shape[1]
    P2 = prompt_len(task, problem, cfg, U)
    pad = task.tokenizer.pad_id

    def to_len(t, msk):
        extra = P2 - t.shape[-1]
        return (jnp.concatenate([jnp.full((extra,), pad, jnp.int32), t.astype(jnp.int32)]),
                jnp.concatenate([jnp.zeros((extra,), bool), msk]))

    mut_BP, mmask_BP = jax.vmap(lambda a, am, r: to_len(*task.mutation_prompt(
        problem["head_P"], problem["head_mask_P"], a, am, r, m)))(
        parents_BUA, parent_mask_BUA, parent_rewards_BUR)
    plain_P, pmask_P = to_len(problem["prompt_P"], problem["prompt_mask_P"])
    prompts_BP = jnp.where(fresh_B[:, None], plain_P[None, :], mut_BP)
    return prompts_BP, jnp.where(fresh_B[:, None], pmask_P[None, :], mmask_BP)


def split_completions(task: BoundTask, cfg: SearchConfig, tokens_BT, mask_BT):
    """m answers of each generation as symbol ids → (answers_BMA, answer_mask_BMA); invalid and
    duplicate slots have all-False masks."""
    answers_BMA, amask_BMA, _ = jax.vmap(lambda t, msk: task.parse(t, msk, cfg.num_answers))(
        tokens_BT, mask_BT)
    return answers_BMA, amask_BMA


def lm_sample(model, key, problem, parents_BUA, parent_mask_BUA, parent_rewards_BUR, fresh_B,
              *, task, cfg: SearchConfig) -> tuple[jax.Array, jax.Array, Rollout]:
    """The policy's generations for B calls → (prompts_BP, prompt_mask_BP, rollout [B, G = 1]):
    one sampler call per row with key split(key, B)[b]; the rows decode through
    `cfg.num_slots` refilled slots when 0 < S < rows (`vpo.rollout.slots.generate_rollouts`,
    the same draws as every row at once)."""
    prompts_BP, mask_BP = lm_prompts(task, cfg, problem, parents_BUA, parent_mask_BUA,
                                     parent_rewards_BUR, fresh_B)
    B = prompts_BP.shape[0]
    keys_B1 = jax.random.split(key, B).reshape(B, 1)
    roll = generate_rollouts(model, prompts_BP, mask_BP, keys_B1, jnp.float32(cfg.temperature),
                             jnp.float32(cfg.top_p), jnp.int32(0),
                             max_new_tokens=task.completion_len(cfg.num_answers),
                             stop_ids=task.tokenizer.stop_ids, pad_id=task.tokenizer.pad_id,
                             num_slots=cfg.num_slots)
    return prompts_BP, mask_BP, roll


def lm_propose(model, key, problem, parents_BUA, parent_mask_BUA, parent_rewards_BUR, fresh_B,
               *, task, cfg: SearchConfig):
    """The policy as mutation operator: `lm_sample`'s generations, m candidates from each."""
    _, _, roll = lm_sample(model, key, problem, parents_BUA, parent_mask_BUA,
                           parent_rewards_BUR, fresh_B, task=task, cfg=cfg)
    return split_completions(task, cfg, roll.tokens_BGT[:, 0], roll.mask_BGT[:, 0])


def _children(task, cfg, propose, problem, key, parents: Population, present_BU, fresh_B,
              evaluated, selected_BU=None) -> tuple[Population, jax.Array]:
    """Propose B·m candidates (one flat batch of calls) and score them → (children [N = B·m],
    the `PROBE_FIELDS` counts [4]). `present_BU`: the parents shown to each call;
    `selected_BU`: the parents each call is judged against (default: those shown; a fresh
    call's selected parents are judged against without being shown)."""
    ans_BMA, amask_BMA = propose(key, problem, parents.tokens_XA,
                                 parents.mask_XA & present_BU[..., None], parents.rewards_XR,
                                 fresh_B)
    B, M, A = ans_BMA.shape
    ans_NA, amask_NA = ans_BMA.reshape(B * M, A), amask_BMA.reshape(B * M, A)
    rewards_NR, valid_N = task.score_symbols(problem["task"], ans_NA, amask_NA)
    kids = ops.clear_invalid(Population(
        ans_NA.astype(jnp.int32), amask_NA, rewards_NR,
        ops.fitness(rewards_NR, valid_N, task.eval_weights_R), valid_N,
        jnp.zeros((B * M,), jnp.int32), evaluated + jnp.arange(B * M, dtype=jnp.int32)))
    selected_BU = present_BU if selected_BU is None else selected_BU
    return kids, probe_counts(kids.fitness_X.reshape(B, M), parents.fitness_X, selected_BU,
                              fresh_B)


def probe_counts(child_fitness_BM, parent_fitness_BU, selected_BU, fresh_B) -> jax.Array:
    """The `PROBE_FIELDS` counts [4] of one generation's B calls of M children each: a child
    beats when its fitness exceeds the best selected parent's (calls without a selected parent
    are not counted; invalid children have fitness -inf and never beat)."""
    best_B = jnp.max(jnp.where(selected_BU, parent_fitness_BU, -jnp.inf), axis=-1)
    has_B = jnp.any(selected_BU, axis=-1)
    beat_B = jnp.sum(child_fitness_BM > best_B[:, None], axis=-1)
    M = child_fitness_BM.shape[1]
    mut_B, fresh_B = has_B & ~fresh_B, has_B & fresh_B
    return jnp.stack([M * jnp.sum(mut_B), jnp.sum(jnp.where(mut_B, beat_B, 0)),
                      M * jnp.sum(fresh_B), jnp.sum(jnp.where(fresh_B, beat_B, 0))]
                     ).astype(jnp.int32)


def _record(task, state: SearchState, kids: Population) -> SearchState:
    """Count the flat children [N] and update best-so-far and the solved flag."""
    i = jnp.argmax(kids.fitness_X)
    better = kids.fitness_X[i] > state.best_fitness
    solved_N = kids.valid_X & jax.vmap(task.solved)(kids.rewards_XR)
    return state._replace(
        evaluated=state.evaluated + kids.valid_X.shape[0],
        best_tokens_A=jnp.where(better, kids.tokens_XA[i], state.best_tokens_A),
        best_mask_A=jnp.where(better, kids.mask_XA[i], state.best_mask_A),
        best_rewards_R=jnp.where(better, kids.rewards_XR[i], state.best_rewards_R),
        best_fitness=jnp.where(better, kids.fitness_X[i], state.best_fitness),
        solved=state.solved | jnp.any(solved_N))


def _constrain(pop: Population, mesh) -> Population:
    if mesh is None:
        return pop
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(
        x, sharding.batch_sharding(mesh, x.ndim)), pop)


def trace_point(state: SearchState, diversity=None) -> SearchTrace:
    """One point of the curves (diversity: default, the mean pairwise reward distance inside
    the islands)."""
    if diversity is None:
        diversity = jnp.mean(metrics.reward_diversity(state.population.rewards_XR,
                                                         state.population.valid_X))
    return SearchTrace(state.best_fitness, state.solved, diversity, state.evaluated,
                       state.probe)


def _empty_state(task, lead, problem) -> SearchState:
    A, R = task.answer_len, task.num_rewards
    return SearchState(ops.empty_population(lead, A, R), jnp.int32(0), jnp.int32(0),
                       jnp.zeros((A,), jnp.int32), jnp.zeros((A,), bool),
                       jnp.zeros((R,), jnp.float32), jnp.float32(-jnp.inf), jnp.bool_(False),
                       problem, jnp.zeros((len(PROBE_FIELDS),), jnp.int32))


def mutation_calls(state: SearchState, idx_IBU, present_IBU, fresh_IB
                   ) -> tuple[Population, jax.Array, jax.Array]:
    """The I·B calls of a generation, islands first → (parents [I·B, U], selected_BU,
    fresh_B). `propose` sees (parents.tokens_XA, parents.mask_XA & shown_BU[..., None],
    parents.rewards_XR, fresh_B) with shown_BU = selected_BU & ~fresh_B[:, None]."""
    I, B, U = idx_IBU.shape
    parents = jax.vmap(ops.take)(state.population, idx_IBU)  # [I, B, U]
    parents = jax.tree.map(lambda x: x.reshape((I * B,) + x.shape[2:]), parents)
    return parents, present_IBU.reshape(I * B, U), fresh_IB.reshape(I * B)


def absorb(task, cfg, mesh, propose, state: SearchState, idx_IBU, present_IBU, fresh_IB, key
           ) -> SearchState:
    """Propose children for every island from the selected parents (`present_IBU`; shown to
    the calls that are not `fresh_IB`), score, replace."""
    pop = state.population
    parents, selected_BU, fresh_B = mutation_calls(state, idx_IBU, present_IBU, fresh_IB)
    kids, probe = _children(task, cfg, propose, state.problem, key, parents,
                            selected_BU & ~fresh_B[:, None], fresh_B, state.evaluated,
                            selected_BU)
    state = _record(task, state, kids)._replace(probe=probe)
    I = idx_IBU.shape[0]
    kids_IX = _constrain(jax.tree.map(lambda x: x.reshape((I, -1) + x.shape[1:]), kids), mesh)
    return state._replace(population=_constrain(jax.vmap(ops.replace_elitist)(pop, kids_IX),
                                                mesh))


def select_step(cfg: SearchConfig, state: SearchState, key):
    """Parents of every island's C / m calls → (idx_IBU, present_IBU, fresh_IB, proposal key);
    `present_IBU` are the selected parents, shown to the calls that are not `fresh_IB`."""
    pop = state.population
    I, B = cfg.islands, cfg.children // cfg.num_answers
    k_sel, k_fresh, k_prop = jax.random.split(key, 3)
    select = functools.partial(
        ops.select_parents, num_calls=B, num_parents=cfg.parents, method=cfg.selection,
        temperature=cfg.selection_temperature, tournament_size=cfg.tournament_size)
    idx_IBU, present_IBU = jax.vmap(select)(jax.random.split(k_sel, I), pop.fitness_X,
                                            pop.valid_X)
    fresh_IB = jax.random.bernoulli(k_fresh, cfg.fresh_rate, (I, B)) | ~jnp.any(present_IBU, -1)
    return idx_IBU, present_IBU, fresh_IB, k_prop


def island_step(cfg: SearchConfig, state: SearchState, mesh=None) -> SearchState:
    """End of a generation: ring migration and island resets when due; count the generation."""
    g = state.generation + 1
    pop = state.population
    # lax.cond: the generation counter is not batched over problems, so off-generations skip
    # the migration / reset work instead of computing it and discarding it.
    if cfg.migration_interval and cfg.migration_count and cfg.islands > 1:
        pop = jax.lax.cond(g % cfg.migration_interval == 0,
                           lambda p: ops.migrate(p, cfg.migration_count), lambda p: p, pop)
    if cfg.reset_interval and cfg.reset_count:
        pop = jax.lax.cond(g % cfg.reset_interval == 0,
                           lambda p: ops.reset_weakest(p, cfg.reset_count), lambda p: p, pop)
    return state._replace(population=_constrain(pop, mesh), generation=g)


def make_search(task: BoundTask, cfg: SearchConfig, propose: Propose, mesh=None
                ) -> tuple[Callable[..., SearchState], Callable[..., SearchState]]:
    """The island search on one problem as two pure functions (traceable; jit or scan them):

        init(key, problem) -> SearchState   I·Q candidates from the plain task prompt
                                            (Q / m calls per island), de-duplicated per island
        step(key, state)   -> SearchState   one generation on all islands: select parents,
                                            mutate, score, replace, then migrate / reset when due

    `propose(key, problem, parents_BUA, parent_mask_BUA, parent_rewards_BUR, fresh_B) ->
    (answers_BMA, answer_mask_BMA)` is the mutation operator with the policy closed over, e.g.
    `functools.partial(lm_propose, model, task=task, cfg=cfg)`. `problem` is one row of
    `search_problems` (no N axis); the state carries it. `mesh` shards the island axis.
    Shapes: B proposals per island, U parents, M = cfg.num_answers answers per proposal, A =
    the task's answer_len symbol ids (of its `symbols`), R reward components; `fresh_B` is
    True where a proposal starts from the plain prompt (no parents). A `propose` of your own,
    here random point edits instead of a policy:

    ```python
    import jax, jax.numpy as jnp
    from vpo.config import SearchConfig
    from vpo.search.ingraph import make_search, search_problems
    from vpo.tasks import make_task
    from vpo.tasks.bound import bind
    from vpo.tasks.words import task_word_tokenizer

    maze = make_task("maze")
    task = bind(maze, task_word_tokenizer(maze))
    cfg = SearchConfig(islands=2, members=4, parents=2, children=4, generations=2,
                       num_answers=2)

    def propose(key, problem, parents_BUA, parent_mask_BUA, parent_rewards_BUR, fresh_B):
        B, U, A = parents_BUA.shape
        M, S = cfg.num_answers, len(maze.symbols)
        k_sym, k_par, k_pos = jax.random.split(key, 3)
        random_BMA = jax.random.randint(k_sym, (B, M, A), 0, S)
        pick_BM = jax.random.randint(k_par, (B, M), 0, U)
        parent_BMA = jnp.take_along_axis(parents_BUA, pick_BM[..., None], axis=1)
        edit_BMA = jnp.arange(A) == jax.random.randint(k_pos, (B, M, 1), 0, A)
        out_BMA = jnp.where(fresh_B[:, None, None] | edit_BMA, random_BMA, parent_BMA)
        return out_BMA.astype(jnp.int32), jnp.ones((B, M, A), bool)

    init, step = make_search(task, cfg, propose)
    problem = jax.tree.map(lambda x: jnp.asarray(x)[0],
                           search_problems(task, task.make_problems(0, 1), cfg.num_answers))
    state = jax.jit(init)(jax.random.key(0), problem)
    step = jax.jit(step)
    for k in jax.random.split(jax.random.key(1), cfg.generations):
        state = step(k, state)
    print(state.best_fitness, state.best_rewards_R)
    ```
    """
    I, U = cfg.islands, cfg.parents

    def init(key, problem) -> SearchState:
        B = cfg.members // cfg.num_answers
        state = _empty_state(task, (I, cfg.members), problem)
        state = state._replace(population=_constrain(state.population, mesh))
        return absorb(task, cfg, mesh, propose, state, jnp.zeros((I, B, U), jnp.int32),
                      jnp.zeros((I, B, U), bool), jnp.ones((I, B), bool), key)

    def step(key, state: SearchState) -> SearchState:
        idx_IBU, present_IBU, fresh_IB, k_prop = select_step(cfg, state, key)
        state = absorb(task, cfg, mesh, propose, state, idx_IBU, present_IBU, fresh_IB, k_prop)
        return island_step(cfg, state, mesh)

    return init, step


def _search(model, task, cfg, propose, mesh, problem, key):
    init, step = make_search(task, cfg, functools.partial(propose, model, task=task, cfg=cfg),
                             mesh)
    k_init, k_run = jax.random.split(key)
    state = init(k_init, problem)

    def body(s, k):
        s = step(k, s)
        return s, trace_point(s)

    final, trace = jax.lax.scan(body, state, jax.random.split(k_run, cfg.generations))
    return final, jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), trace_point(state),
                               trace)


def _pool_state(task, state, kids_N):
    """Best-of-N step: count and record a pool of fresh candidates."""
    return _record(task, state, kids_N), metrics.reward_diversity(
        kids_N.rewards_XR[None], kids_N.valid_X[None])[0]


def _best_of_n(model, task, cfg, propose, mesh, problem, key):
    """Independent samples from the plain prompt, in chunks matching the search's generations."""
    propose = functools.partial(propose, model, task=task, cfg=cfg)
    U = cfg.parents
    A, R = task.answer_len, task.num_rewards

    def chunk(state, calls, k):
        dummy = ops.empty_population((calls, U), A, R)
        kids, probe = _children(task, cfg, propose, problem, k, dummy,
                                jnp.zeros((calls, U), bool), jnp.ones((calls,), bool),
                                state.evaluated)
        state, div = _pool_state(task, state._replace(probe=probe), kids)
        return state, trace_point(state, div)

    k_init, k_run = jax.random.split(key)
    state, first = chunk(_empty_state(task, (1, 1), problem),
                         cfg.islands * cfg.members // cfg.num_answers, k_init)
    calls = cfg.islands * cfg.children // cfg.num_answers
    final, trace = jax.lax.scan(lambda s, k: chunk(s, calls, k), state,
                                jax.random.split(k_run, cfg.generations))
    return final, jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), first, trace)


def _revision(model, task, cfg, propose, mesh, problem, key):
    """Sequential revision: H = I·Q/m lineages start from fresh samples (best of the call's m);
    each step makes I·C/m calls, round-robin over lineages, feeding the lineage's best back as
    the single parent of `mutation_prompt`; a lineage keeps its best candidate. The lineages'
    best form one population, a slot X per lineage (the children compared with them: Y)."""
    propose = functools.partial(propose, model, task=task, cfg=cfg)
    m, A, R = cfg.num_answers, task.answer_len, task.num_rewards
    H, B = cfg.islands * cfg.members // m, cfg.islands * cfg.children // m
    k_init, k_run = jax.random.split(key)
    state = _empty_state(task, (H, 1), problem)
    kids, _ = _children(task, cfg, propose, problem, k_init,
                        ops.empty_population((H, 1), A, R), jnp.zeros((H, 1), bool),
                        jnp.ones((H,), bool), state.evaluated)
    state = _record(task, state, kids)
    best_X = ops.take(jax.tree.map(lambda x: x.reshape((H, m) + x.shape[1:]), kids),
                      (jnp.arange(H), jnp.argmax(kids.fitness_X.reshape(H, m), axis=-1)))

    def step(carry, xs):
        state, lines = carry
        t, k = xs
        line_B = (t * B + jnp.arange(B)) % H
        parents = jax.tree.map(lambda x: x[line_B][:, None], lines)  # [B, 1]
        kids, probe = _children(task, cfg, propose, problem, k, parents, parents.valid_X,
                                ~parents.valid_X[:, 0], state.evaluated)
        state = _record(task, state, kids)._replace(probe=probe)
        own_XY = jnp.repeat(line_B[None, :] == jnp.arange(H)[:, None], m, axis=1)
        cand_XY = jnp.where(own_XY, kids.fitness_X[None, :], -jnp.inf)
        j_X = jnp.argmax(cand_XY, axis=-1)
        better_X = jnp.max(cand_XY, axis=-1) > lines.fitness_X
        lines = jax.tree.map(lambda old, new: jnp.where(
            better_X.reshape((H,) + (1,) * (old.ndim - 1)), new[j_X], old), lines, kids)
        div = metrics.reward_diversity(lines.rewards_XR[None], lines.valid_X[None])[0]
        return (state, lines), trace_point(state, div)

    first = trace_point(state, metrics.reward_diversity(best_X.rewards_XR[None],
                                                      best_X.valid_X[None])[0])
    (final, _), trace = jax.lax.scan(step, (state, best_X),
                                     (jnp.arange(cfg.generations),
                                      jax.random.split(k_run, cfg.generations)))
    return final, jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), first, trace)


_METHOD_FNS = {"search": _search, "best_of_n": _best_of_n, "revision": _revision}


@functools.partial(jax.jit, static_argnames=("method", "graphdef", "task", "cfg", "propose",
                                             "mesh"))
def _run_jit(method, graphdef, params, task, cfg, propose, mesh, problems, keys_N):
    model = None if graphdef is None else nnx.merge(graphdef, params)
    fn = functools.partial(_METHOD_FNS[method], model, task, cfg, propose, mesh)
    return jax.vmap(fn)(problems, keys_N)


def run_method(key, method: str, model, task, problems, cfg: SearchConfig, *,
               propose=lm_propose, mesh=None) -> SearchResult:
    """Run `method` ("search" | "best_of_n" | "revision") on a BATCH of problems (leading N axis)
    in one jit → `SearchResult` (trace and final state, both with a leading N axis). Keys:
    fold_in(key, problem)."""
    check_method(method)
    _check_in_graph(task)
    task.check_num_answers(cfg.num_answers)
    if mesh is not None:
        d = int(np.prod([mesh.shape[a] for a in sharding.RULES["batch"] if a in mesh.shape]))
        if cfg.islands % d:
            raise ConfigError(f"search.islands: {cfg.islands} islands must divide evenly over "
                              f"the mesh's {d} data-parallel devices")
    graphdef = params = None
    if model is not None:
        need = prompt_len(task, problems, cfg, cfg.parents if method == "search" else 1)
        need += task.completion_len(cfg.num_answers)
        if need > model.cfg.max_seq_len:
            raise ConfigError(f"model.max_seq_len: search needs {need} positions (mutation "
                              f"prompt + completion); got {model.cfg.max_seq_len}")
        graphdef, params = nnx.split(model)
    problems = jax.tree.map(lambda x: jnp.asarray(x), problems)
    n = jax.tree.leaves(problems)[0].shape[0]
    keys_N = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(n))
    state, trace = _run_jit(method, graphdef, params, task, cfg, propose, mesh, problems, keys_N)
    return SearchResult(trace, state)


def run_search(key, model, task, problem, cfg: SearchConfig, *, propose=lm_propose, mesh=None
               ) -> SearchResult:
    """Evolutionary search on ONE problem (no leading axis) → `SearchResult` (trace [G + 1])."""
    problems = jax.tree.map(lambda x: jnp.asarray(x)[None], problem)
    out = run_method(key, "search", model, task, problems, cfg, propose=propose, mesh=mesh)
    return SearchResult(*jax.tree.map(lambda x: x[0], (out.trace, out.state)))


def summarize(traces: dict[str, SearchTrace]) -> dict:
    """JSON-ready per-point curves of batched traces: solved count, mean best fitness, ...,
    and the mechanism probe's counts summed over problems (`PROBE_FIELDS`)."""
    out = {}
    for name, t in traces.items():
        t = jax.tree.map(np.asarray, t)
        best = np.where(np.isfinite(t.best_fitness), t.best_fitness, 0.0)
        out[name] = {"evaluated": t.evaluated[0].tolist(),
                     "solved_count": t.solved.sum(0).astype(int).tolist(),
                     "mean_best_fitness": best.mean(0).tolist(),
                     "mean_diversity": t.diversity.mean(0).tolist(),
                     "best_fitness_per_problem": best.tolist()}
        if t.probe is not None:  # [N, G + 1, 4] → per point, summed over problems
            out[name]["probe"] = dict(zip(PROBE_FIELDS, t.probe.sum(0).T.tolist(), strict=True))
    return out


def write_search_traces(out_dir: str, traces: dict[str, SearchTrace], *,
                        title: str | None = None) -> tuple[str, str]:
    """`search_traces.json` and `search_solved.png` (solved problems vs candidates evaluated)."""
    summary = summarize(traces)
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, "search_traces.json")
    with open(json_path, "w") as f:
        json.dump(summary, f, indent=1)
    curves = {n: (s["evaluated"], s["solved_count"]) for n, s in summary.items()}
    png = plots.plot_metric_vs_k(os.path.join(out_dir, "search_solved.png"), curves,
                                 metric="solved problems", log_x=False,
                                 title=title or "solved problems vs candidates evaluated")
    return json_path, png
