"""The island search that learns: test-time RL inside the in-graph search, one compiled program.

ThetaEvolve (Wang et al., arXiv 2511.23473) and TTT-Discover (Yuksekgonul et al., arXiv
2601.16175) train the policy on what its own search finds, on the problem at hand; Mind
Evolution (Lee et al., arXiv 2501.09891) is the island search itself (`vpo.search.ingraph`).
Here each generation of the island search is followed by one policy-gradient step on that
generation's children (`vpo.rl.search_update`: GRPO's group z-score, VPO's expected-max set
advantage, or TTT-Discover's entropic advantage; formulas there), and the next generation
samples from the updated parameters:

    init(keys_N, problems, params, frozen) -> LearnState   the initial populations (as
                                                            `make_search`'s init), Adam's state
    step(keys_N, state) -> LearnState                       select, sample with state.params,
                                                            score, replace, migrate (as
                                                            `make_search`'s step), then update

The step comes in as a `learner` (`vpo.rl.search_update.make_learner`, whose log-prob pass is
the trainer's), as the frozen search takes its proposer: this module sits beside `vpo.rl` and
imports nothing of it. `learning_run` scans `step` over the generations in one jit per shape
(`lax.scan`, the state in the carry). Keys: problem n's key, its init / run split and the
run's per-generation keys are `run_method`'s, and the update draws from a stream of its own
(`UPDATE_STREAM`), so at learning rate 0 the
populations and the trace are the frozen search's, bit for bit. The budget counts every
candidate as the frozen search does (I·Q + g·I·C after generation g).

The trained parameters are shared by the batch of problems (one policy, ThetaEvolve's setting;
TTT-Discover trains one per problem): one update per generation from the mean loss over every
problem's islands, so a batch of N problems costs one update, and the policy learns what
transfers across the problems it searches. `LearnConfig.lora_rank` > 0 trains LoRA adapters
(`vpo.model.lora`; the base weights stay frozen and are the KL reference), 0 every weight.
A host-scored task has no in-graph reward and is refused (`check_learning`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from vpo.config import ConfigError, LearnConfig, SearchConfig
from vpo.model import lora as lora_lib
from vpo.model import sharding
from vpo.objectives.entropic import MIN_GROUP
from vpo.search import ingraph
from vpo.search.ingraph import SearchState, SearchTrace
from vpo.tasks.bound import BoundTask, HostTask
from vpo.types import SearchCalls

# make_learner(graphdef, learn, weights_R) -> a learner with .init(params) -> opt_state and
# .update(params, frozen, ref, opt_state, learning_rate, calls, key) -> (params, opt_state,
# metrics): `vpo.rl.search_update.make_learner`
MakeLearner = Callable[..., Any]

UPDATE_STREAM = 0x1EA2  # fold_in constant of the update's keys (apart from the search's draws)


class LearnState(NamedTuple):
    """The device state of a learning search over N problems."""

    search: SearchState  # every problem's island search, leading N (generation: a scalar)
    params: nnx.State  # what is trained: the LoRA adapters, or every weight
    frozen: nnx.State | None  # LoRA: the base weights (no gradient)
    ref: nnx.State | None  # full weights with kl_coef > 0: the starting weights
    opt_state: optax.OptState
    learning_rate: jax.Array  # float32, traced
    updates: jax.Array  # int32, updates applied (skipped ones not counted)
    last: SearchCalls  # the last generation's calls [N·I, C / m, ...], as sampled


class LearnResult(NamedTuple):
    """`learning_run`'s output: the trace [N, G + 1] (the frozen search's fields), the final
    state and the update's metrics per generation ({name: [G]})."""

    trace: SearchTrace
    state: LearnState
    metrics: dict


def check_learning(task: BoundTask, cfg: SearchConfig, learn: LearnConfig) -> None:
    """ConfigError unless the search can learn: an in-graph reward, m >= 2 answers per call
    for vpo (a set), and groups of calls the objective can compare (C / m >= 2, >= 3 for
    entropic, whose KL budget a group of 2 reaches only at beta -> inf)."""
    if isinstance(task, HostTask):
        raise ConfigError(f"--learn: task {task.name!r} scores on the host; the search learns "
                          "in one jit, from an in-graph reward (a task with symbols and "
                          "symbol_reward)")
    m = cfg.num_answers
    if learn.objective == "vpo" and m < 2:
        raise ConfigError(f"learn.objective: vpo scores the set of a call's m answers and "
                          f"needs search.num_answers >= 2; got {m} (use grpo or entropic, or "
                          "more answers)")
    calls, least = cfg.children // m, MIN_GROUP if learn.objective == "entropic" else 2
    if calls < least:
        raise ConfigError(f"learn.objective: {learn.objective} compares an island's calls of "
                          f"a generation and needs search.children / search.num_answers >= "
                          f"{least}; got {cfg.children} / {m} = {calls}")


def trainable_model(model, learn: LearnConfig):
    """`model` as trained: its own adapters, new ones of `learn.lora_rank` (seed 0; the
    model's outputs are unchanged), or every weight when the rank is 0."""
    if model.cfg.lora_rank or not learn.lora_rank:
        return model
    return lora_lib.with_adapters(model, learn.lora_rank)


def empty_generation(groups: int, calls: int, P: int, T: int, M: int, R: int) -> SearchCalls:  # noqa: N803
    """Zeros of a generation's shapes (the carry before the first generation)."""
    z = functools.partial(jnp.zeros, dtype=jnp.int32)
    return SearchCalls(z((groups, calls, P)), jnp.zeros((groups, calls, P), bool),
                      z((groups, calls, T)), jnp.zeros((groups, calls, T), bool),
                      jnp.zeros((groups, calls, T), jnp.float32),
                      jnp.zeros((groups, calls, M, R), jnp.float32),
                      jnp.zeros((groups, calls, M), bool))


def search_axes(axis):
    """vmap axes of a SearchState: `axis` for every field but the generation counter (shared
    by the problems, so migration stays a `lax.cond`)."""
    return SearchState(*([axis] * len(SearchState._fields)))._replace(generation=None)


def generation_calls(task, cfg: SearchConfig, mesh, model, key, state: SearchState):
    """One problem's generation, the frozen search's step with its samples kept → (state,
    calls): select parents, sample with `model` (`lm_sample` with the proposer's arguments),
    absorb the answers, migrate / reset; calls = (prompt_BP, prompt_mask_BP, tokens_BT,
    mask_BT, logp_BT, rewards_BMR, valid_BM) of the I·C/m calls, islands first."""
    idx_IBU, present_IBU, fresh_IB, k_prop = ingraph.select_step(cfg, state, key)
    parents, selected_BU, fresh_B = ingraph.mutation_calls(state, idx_IBU, present_IBU,
                                                           fresh_IB)
    shown_BUA = parents.mask_XA & (selected_BU & ~fresh_B[:, None])[..., None]
    prompt_BP, pmask_BP, roll = ingraph.lm_sample(
        model, k_prop, state.problem, parents.tokens_XA, shown_BUA, parents.rewards_XR, fresh_B,
        task=task, cfg=cfg)
    tokens_BT, mask_BT = roll.tokens_BGT[:, 0], roll.mask_BGT[:, 0]
    answers = ingraph.split_completions(task, cfg, tokens_BT, mask_BT)
    state = ingraph.absorb(task, cfg, mesh, lambda *_: answers, state, idx_IBU, present_IBU,
                           fresh_IB, k_prop)
    ans_BMA, amask_BMA = answers
    B, M, A = ans_BMA.shape
    rewards_NR, valid_N = task.score_symbols(state.problem["task"], ans_BMA.reshape(B * M, A),
                                             amask_BMA.reshape(B * M, A))
    calls = (prompt_BP, pmask_BP, tokens_BT, mask_BT, roll.logp_BGT[:, 0],
             rewards_NR.reshape(B, M, -1), valid_N.reshape(B, M))
    return ingraph.island_step(cfg, state, mesh), calls


def no_update(shapes: dict) -> dict:
    """The metrics of a generation without an update, of `shapes` (the update's): NaN where
    the update logs a float, 0 where it logs a count."""
    return jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan if jnp.issubdtype(
        s.dtype, jnp.floating) else 0, s.dtype), shapes)


def learning_generation(task, cfg: SearchConfig, graphdef, learner, mesh, keys_N,
                        state: LearnState, every: int = 1) -> tuple[LearnState, dict]:
    """One generation on every problem, then `learner.update` on its calls when the
    generation's number is a multiple of `every` (`LearnConfig.every`; a `lax.cond`, so a
    generation without it does not pay for it) → (state, the update's metrics, `no_update`'s
    on the other generations; `updated`: 1 where it ran). keys_N: each problem's key of this
    generation."""
    model = lora_lib.merge(graphdef, state.params, state.frozen)
    one = functools.partial(generation_calls, task, cfg, mesh, model)
    search, calls = jax.vmap(one, in_axes=(0, search_axes(0)),
                             out_axes=(search_axes(0), 0))(keys_N, state.search)
    calls_per_island = cfg.children // cfg.num_answers
    gen = SearchCalls(*jax.tree.map(
        lambda x: x.reshape((-1, calls_per_island) + x.shape[2:]), calls))
    key = jax.random.fold_in(keys_N[0], UPDATE_STREAM)

    def update(params, opt_state):
        params, opt_state, metrics = learner.update(params, state.frozen, state.ref, opt_state,
                                                    state.learning_rate, gen, key)
        return params, opt_state, {**metrics, "updated": jnp.int32(1)}

    if every == 1:
        params, opt_state, metrics = update(state.params, state.opt_state)
    else:
        shapes = jax.eval_shape(update, state.params, state.opt_state)[2]
        params, opt_state, metrics = jax.lax.cond(
            search.generation % every == 0, update,
            lambda p, o: (p, o, no_update(shapes)), state.params, state.opt_state)
    updates = state.updates + metrics["updated"] - metrics["skipped"]
    return state._replace(search=search, params=params, opt_state=opt_state, updates=updates,
                          last=gen), metrics


def make_learning_search(task: BoundTask, cfg: SearchConfig, graphdef, learn: LearnConfig,
                         make_learner: MakeLearner, mesh=None
                         ) -> tuple[Callable[..., LearnState], Callable[..., LearnState]]:
    """The learning island search over a batch of N problems as two pure functions (module
    docstring): `init(keys_N, problems, params, frozen=None)` (`problems`: `search_problems`'
    rows with their leading N; `params`, `frozen`: `vpo.model.lora.split` of the trained model,
    `trainable_model`) and `step(keys_N, state)` (`learning_generation` without its metrics).
    `graphdef`: the trained model's; `make_learner`: `vpo.rl.search_update.make_learner`.
    Traceable; jit or scan them."""
    learner = make_learner(graphdef, learn, task.eval_weights_R)

    def init(keys_N, problems, params, frozen=None) -> LearnState:
        model = lora_lib.merge(graphdef, params, frozen)
        propose = functools.partial(ingraph.lm_propose, model, task=task, cfg=cfg)
        search_init, _ = ingraph.make_search(task, cfg, propose, mesh)
        search = jax.vmap(search_init, out_axes=search_axes(0))(keys_N, problems)
        P = ingraph.prompt_len(task, jax.tree.map(lambda x: x[0], problems), cfg, cfg.parents)
        last = empty_generation(keys_N.shape[0] * cfg.islands, cfg.children // cfg.num_answers,
                                P, task.completion_len(cfg.num_answers), cfg.num_answers,
                                task.num_rewards)
        ref = jax.tree.map(jnp.copy, params) if learn.kl_coef and frozen is None else None
        return LearnState(search, params, frozen, ref, learner.init(params),
                          jnp.float32(learn.learning_rate), jnp.int32(0), last)

    def step(keys_N, state: LearnState) -> LearnState:
        return learning_generation(task, cfg, graphdef, learner, mesh, keys_N, state,
                                   learn.every)[0]

    return init, step


@functools.partial(jax.jit, static_argnames=("graphdef", "task", "cfg", "learn", "make_learner",
                                             "mesh"))
def learning_program(graphdef, params, frozen, task, cfg, learn, make_learner, mesh, problems,
                     keys_N, learning_rate):
    """`learning_run`'s one jit: init, then the `generations` scan of `learning_generation` →
    (final LearnState, trace [N, G + 1], metrics {name: [G]}); keys_N: each problem's key (what
    `vpo plan --programs search_learn` compiles ahead of time)."""
    init, _ = make_learning_search(task, cfg, graphdef, learn, make_learner, mesh)
    learner = make_learner(graphdef, learn, task.eval_weights_R)
    k_init_N, k_run_N = jax.vmap(jax.random.split, out_axes=1)(keys_N)
    state = init(k_init_N, problems, params, frozen)._replace(learning_rate=learning_rate)
    keys_GN = jax.vmap(lambda k: jax.random.split(k, cfg.generations), out_axes=1)(k_run_N)
    point = jax.vmap(ingraph.trace_point, in_axes=(search_axes(0),))

    def body(s, k_N):
        s, metrics = learning_generation(task, cfg, graphdef, learner, mesh, k_N, s,
                                         learn.every)
        return s, (point(s.search), metrics)

    first = point(state.search)
    final, (trace, metrics) = jax.lax.scan(body, state, keys_GN)
    trace = jax.tree.map(lambda a, b: jnp.concatenate([a[:, None], jnp.swapaxes(b, 0, 1)], 1),
                         first, trace)
    return final, trace, metrics


def learning_run(key, model, task: BoundTask, problems, cfg: SearchConfig, learn: LearnConfig,
                 make_learner: MakeLearner, *, mesh=None, learning_rate=None) -> LearnResult:
    """The learning island search on a BATCH of problems (`search_problems`, leading N) in one
    jit → `LearnResult`. Keys: fold_in(key, problem), as `vpo.search.ingraph.run_method`.
    `model`: the policy (`trainable_model` adds the adapters it trains); `make_learner`:
    `vpo.rl.search_update.make_learner`. `learning_rate`: the
    rate the run uses (a traced value; default `learn.learning_rate`; 0 is the frozen search,
    which the config refuses as a setting)."""
    check_learning(task, cfg, learn)
    task.check_num_answers(cfg.num_answers)
    if mesh is not None:
        d = int(np.prod([mesh.shape[a] for a in sharding.RULES["batch"] if a in mesh.shape]))
        if cfg.islands % d:
            mesh = None  # islands must split evenly over the data devices; else one device
    need = ingraph.prompt_len(task, problems, cfg, cfg.parents)
    need += task.completion_len(cfg.num_answers)
    if need > model.cfg.max_seq_len:
        raise ConfigError(f"model.max_seq_len: search needs {need} positions (mutation prompt "
                          f"+ completion); got {model.cfg.max_seq_len}")
    graphdef, params, frozen = lora_lib.split(trainable_model(model, learn))
    problems = jax.tree.map(jnp.asarray, problems)
    n = jax.tree.leaves(problems)[0].shape[0]
    keys_N = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(n))
    rate = learn.learning_rate if learning_rate is None else learning_rate
    state, trace, metrics = learning_program(graphdef, params, frozen, task, cfg, learn,
                                             make_learner, mesh, problems, keys_N,
                                             jnp.float32(rate))
    return LearnResult(trace, state, metrics)
