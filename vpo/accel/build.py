"""vpo's programs compiled for a target from abstract inputs: shapes, dtypes and shardings on
the target's mesh (`jax.ShapeDtypeStruct` with a `NamedSharding`), never weights.

Programs (`programs`): the fused RL step (or, for a task scored on the host, its sampling and
update halves; for an environment, its episode programs and update: `vpo.accel.env_build`),
the sampler alone, the SFT step, the in-graph island search, the island search that learns
(`vpo.search.learn`: a policy-gradient step per generation, all in one scan), and the two
Pallas kernels at the run's shapes. Each is `jax.jit(f).trace(*args).lower().compile()` under the
target's mesh; `compile_program` returns the compiled program or the compiler's error.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vpo.config import ConfigError, LearnConfig, RunConfig, SearchConfig, apply_overrides
from vpo.env.task import EnvTask
from vpo.model import lora as lora_lib
from vpo.model import sharding as sharding_lib
from vpo.tasks.bound import BoundTask, GraphTask, HostTask, for_kind

PROGRAMS = ("rl_step", "sampler", "sft_step", "search", "search_learn", "kernels")


@dataclasses.dataclass(frozen=True)
class Program:
    """A jitted function and the abstract arguments it is compiled for."""

    name: str
    fn: Callable  # a jax.jit-wrapped function
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)  # static arguments by name


@dataclasses.dataclass
class Built:
    """The outcome of one compile: the compiled program, or the error that stopped it."""

    name: str
    compiled: Any = None
    error: BaseException | None = None
    seconds: float = 0.0
    stage: str = "compile"  # where it stopped: "build" (inputs) or "compile"


def with_shardings(shapes, shardings):
    """ShapeDtypeStructs of `shapes` carrying the matching NamedShardings of `shardings`."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        shapes, shardings)


def abstract_state(model_cfg, tx, mesh, *, seed: int = 0, with_ref: bool = False):
    """(graphdef, abstract TrainState) of `vpo.rl.step.init_state` on `mesh`: the shapes and
    shardings a fresh (or LoRA) state would have, with nothing allocated."""
    from vpo.rl.step import init_state

    out = {}

    def create():
        graphdef, state, shardings = init_state(model_cfg, tx, mesh, seed=seed,
                                                with_ref=with_ref)
        out.update(graphdef=graphdef, shardings=shardings)
        return state

    shapes = jax.eval_shape(create)
    return out["graphdef"], with_shardings(shapes, out["shardings"])


def abstract_batch(arrays: dict, mesh) -> dict:
    """Abstract arrays of a host batch, leading axis over the mesh's data-parallel axes."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        np.shape(x), np.asarray(x).dtype,
        sharding=sharding_lib.batch_sharding(mesh, np.ndim(x))), arrays)


def data_parallel(mesh) -> int:
    """Devices the batch is split over (the mesh's "data" × "fsdp")."""
    return int(np.prod([mesh.shape[a] for a in sharding_lib.RULES["batch"] if a in mesh.shape]))


def check_batch(rows: int, mesh, what: str = "train.batch_size") -> None:
    dp = data_parallel(mesh)
    if rows % dp:
        raise ConfigError(f"{what}: {rows} rows do not split over the {dp} data-parallel "
                          f"devices of the mesh; use a multiple of {dp} or set mesh_data smaller")


def rl_batch(run: RunConfig, task: BoundTask, rows: int) -> dict:
    """A host batch of `rows` problems as `vpo.run.data` makes it (numpy): problems, prompts
    left-padded to the longest of max(rows, 64) problems, plain and mutation prompts alike."""
    from vpo.run.data import prompt_tables

    t = run.train
    records = task.make_problems(t.seed, max(rows, 64))
    tables = prompt_tables(task, records, t.num_answers, mutation_fraction=t.mutation_fraction,
                           mutation_parents=t.mutation_parents, seed=t.seed)
    problems = jax.tree.map(lambda x: np.asarray(x)[:rows], task.problem_arrays(records))
    return {"problems": problems, "prompt_BP": tables.prompts_NP[:rows],
            "prompt_mask_BP": tables.mask_NP[:rows]}


def rl_programs(run: RunConfig, task: BoundTask, mesh) -> list[Program]:
    """The RL step as `vpo.run.loop.train` builds it: one donated jit for an in-graph task;
    for a host-scored task its two jits ("rl_sample", "rl_update"); an environment run's is
    `vpo.accel.env_build.build_env_step`'s."""
    return for_kind(RL_PROGRAMS, task)(run, task, mesh)


def _rl_inputs(run: RunConfig, task: BoundTask, mesh):
    """(rows, optimiser, graphdef, abstract state, abstract batch, step config) of the RL
    step's programs."""
    from vpo.rl import step as step_lib

    rows = run.train.batch_size * run.objective.oversample
    check_batch(run.train.batch_size, mesh)
    check_batch(rows, mesh, "objective.oversample × train.batch_size")
    tx = step_lib.make_optimizer(run.train)
    graphdef, state = abstract_state(run.model, tx, mesh, seed=run.train.seed,
                                     with_ref=run.objective.kl_coef > 0)
    batch = abstract_batch(rl_batch(run, task, rows), mesh)
    return rows, tx, graphdef, state, batch, step_lib.step_config(run, task)


def _fused_rl_programs(run: RunConfig, task: BoundTask, mesh) -> list[Program]:
    """An in-graph task's step: one donated jit."""
    from vpo.rl.overlap import make_in_graph_step

    _, tx, graphdef, state, batch, cfg = _rl_inputs(run, task, mesh)
    return [Program("rl_step", make_in_graph_step(graphdef, tx, task, cfg), (state, batch))]


def _host_rl_programs(run: RunConfig, task: BoundTask, mesh) -> list[Program]:
    """A host-scored task's step: its sampling and its update, the score between them."""
    from vpo.rl import step as step_lib

    rows, tx, graphdef, state, batch, cfg = _rl_inputs(run, task, mesh)
    sample = step_lib.make_sample_step(graphdef, cfg)
    rollout = jax.eval_shape(sample, state, batch)
    rollout = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=sharding_lib.batch_sharding(mesh, x.ndim)), rollout)
    G, M, R = run.sampler.num_samples, run.train.num_answers, task.num_rewards
    rewards = abstract_batch({"r": np.zeros((rows, G, M, R), np.float32),
                              "m": np.zeros((rows, G, M), bool)}, mesh)
    update = jax.jit(functools.partial(step_lib.update_from_rollout, graphdef=graphdef, tx=tx,
                                       task=task, cfg=cfg), donate_argnums=0)
    return [Program("rl_sample", sample, (state, batch)),
            Program("rl_update", update, (state, batch, rollout, rewards["r"], rewards["m"]))]


def _episode_rl_programs(run: RunConfig, task: BoundTask, mesh) -> list[Program]:
    raise ValueError("an environment run's RL step is built by "
                     "vpo.accel.env_build.build_env_step")


# the RL step's programs of each task kind
RL_PROGRAMS = {GraphTask: _fused_rl_programs, HostTask: _host_rl_programs,
               EnvTask: _episode_rl_programs}


def sampler_program(run: RunConfig, task: BoundTask, mesh) -> Program:
    """The sampler alone (`vpo.rollout.slots.generate_rollouts`: all rows, or
    sampler.num_slots refilled slots): the policy's weights (no optimiser state),
    train.batch_size prompts, sampler.num_samples samples each, sampler.max_new_tokens."""
    from vpo.rl.step import make_optimizer
    from vpo.rollout.slots import generate_rollouts

    B, G, s = run.train.batch_size, run.sampler.num_samples, run.sampler
    check_batch(B, mesh)
    graphdef, state = abstract_state(run.model, make_optimizer(run.train), mesh,
                                     seed=run.train.seed)
    batch = rl_batch(run, task, B)
    prompts = abstract_batch({"p": batch["prompt_BP"], "m": batch["prompt_mask_BP"]}, mesh)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=sharding_lib.replicated(mesh))
    tok = task.tokenizer

    def sample(params, frozen, prompt_BP, mask_BP, key_data):
        keys_BG = jax.random.split(jax.random.wrap_key_data(key_data), B * G).reshape(B, G)
        return generate_rollouts(lora_lib.merge(graphdef, params, frozen), prompt_BP, mask_BP,
                                 keys_BG, jnp.float32(s.temperature), jnp.float32(s.top_p),
                                 jnp.int32(s.top_k), max_new_tokens=s.max_new_tokens,
                                 stop_ids=tok.stop_ids, pad_id=tok.pad_id,
                                 num_slots=s.num_slots)

    return Program("sampler", jax.jit(sample),
                   (state.params, state.frozen, prompts["p"], prompts["m"], key))


def sft_program(run: RunConfig, task: BoundTask, mesh) -> Program:
    """`vpo.rl.sft.sft_step` (donated) on train.batch_size demonstrations of
    sampler.max_new_tokens target tokens after the run's prompts."""
    from vpo.rl.sft import sft_step
    from vpo.rl.step import make_optimizer

    B, T = run.train.batch_size, run.sampler.max_new_tokens
    check_batch(B, mesh)
    tx = make_optimizer(run.train)
    graphdef, state = abstract_state(run.model, tx, mesh, seed=run.train.seed)
    prompts = rl_batch(run, task, B)
    batch = abstract_batch({"prompt_BP": prompts["prompt_BP"],
                            "prompt_mask_BP": prompts["prompt_mask_BP"],
                            "target_BT": np.zeros((B, T), np.int32),
                            "target_mask_BT": np.zeros((B, T), bool)}, mesh)
    step = jax.jit(functools.partial(sft_step, graphdef=graphdef, tx=tx), donate_argnums=0)
    return Program("sft_step", step, (state, batch))


@dataclasses.dataclass(frozen=True)
class SearchSettings:
    """What the search programs are built for: `search.key=value` / `learn.key=value`
    overrides (a RunConfig has neither section) applied to `search_configs`' defaults, and the
    problems searched at once (the learning search's one update is over all of theirs)."""

    overrides: tuple[str, ...] = ()
    problems: int = 1


@dataclasses.dataclass(frozen=True)
class _SearchSections:  # what the overrides name: search.*, learn.*
    search: SearchConfig
    learn: LearnConfig


def search_configs(run: RunConfig, mesh, settings: SearchSettings | None = None
                   ) -> tuple[SearchConfig, LearnConfig]:
    """(SearchConfig, LearnConfig) of the search programs: by default max(4, data-parallel
    devices) islands, m = train.num_answers, 4m members and children, and `LearnConfig()`
    (grpo); then `settings.overrides`."""
    m = run.train.num_answers
    base = _SearchSections(SearchConfig(islands=max(4, data_parallel(mesh)), num_answers=m,
                                        members=4 * m, children=4 * m), LearnConfig())
    out = apply_overrides(base, list(settings.overrides if settings else ()))
    return out.search, out.learn


def _search_inputs(run: RunConfig, task: BoundTask, mesh, cfg: SearchConfig, model_cfg,
                   problems: int):
    """(graphdef, abstract params, frozen, problems [N, ...] and key data) of a search program
    of the policy `model_cfg` on `problems` problems (replicated)."""
    from vpo.rl.step import make_optimizer
    from vpo.search import ingraph

    dp = data_parallel(mesh)
    if cfg.islands % dp:
        raise ConfigError(f"search.islands: {cfg.islands} islands must divide evenly over the "
                          f"mesh's {dp} data-parallel devices")
    if isinstance(task, HostTask):
        raise ConfigError(f"task {task.name!r} scores on the host; the in-graph search needs an "
                          "in-graph task")
    task.check_num_answers(cfg.num_answers)
    graphdef, state = abstract_state(model_cfg, make_optimizer(run.train), mesh,
                                     seed=run.train.seed)
    records = task.make_problems(run.train.seed, problems)
    rep = sharding_lib.replicated(mesh)
    problems_N = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype,
                                                             sharding=rep),
                              ingraph.search_problems(task, records, cfg.num_answers))
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep)
    return graphdef, state.params, state.frozen, problems_N, key


def search_program(run: RunConfig, task: BoundTask, mesh, settings: SearchSettings | None = None
                   ) -> Program:
    """The in-graph island search (`vpo.search.ingraph`: init, then `generations` steps in one
    scan) on `settings.problems` problems (default one), the policy as mutation operator."""
    from vpo.search import ingraph

    cfg, _ = search_configs(run, mesh, settings)
    n = settings.problems if settings else 1
    graphdef, params, frozen, problems, key = _search_inputs(run, task, mesh, cfg, run.model, n)

    def search(params, frozen, problems_N, key_data):
        model = lora_lib.merge(graphdef, params, frozen)
        propose = functools.partial(ingraph.lm_propose, model, task=task, cfg=cfg)
        init, step = ingraph.make_search(task, cfg, propose, mesh)

        def one(problem, key):
            k_init, k_run = jax.random.split(key)
            s = init(k_init, problem)
            s, trace = jax.lax.scan(lambda s, k: _one_generation(step, s, k), s,
                                    jax.random.split(k_run, cfg.generations))
            return s.best_fitness, trace

        keys = jax.random.split(jax.random.wrap_key_data(key_data), n)
        return jax.vmap(one)(problems_N, keys)

    return Program("search", jax.jit(search), (params, frozen, problems, key))


def search_learn_program(run: RunConfig, task: BoundTask, mesh,
                         settings: SearchSettings | None = None) -> Program:
    """The island search that learns (`vpo.search.learn.learning_program`: init, then
    `generations` of search and one policy-gradient step each, in one scan) on
    `settings.problems` problems, as `vpo search --learn` runs it: the adapters of
    model.lora_rank, else new ones of learn.lora_rank (0: every weight trained); the learning
    rate a traced argument. Outputs: the final state, the trace and the update's metrics."""
    from vpo.rl.search_update import make_learner
    from vpo.search import learn as learn_lib

    cfg, learn = search_configs(run, mesh, settings)
    learn_lib.check_learning(task, cfg, learn)
    n = settings.problems if settings else 1
    model_cfg = run.model
    if not model_cfg.lora_rank and learn.lora_rank:  # `vpo.search.learn.trainable_model`
        model_cfg = dataclasses.replace(lora_lib.base_config(model_cfg), lora_rank=learn.lora_rank)
    graphdef, params, frozen, problems, key = _search_inputs(run, task, mesh, cfg, model_cfg, n)
    rate = jax.ShapeDtypeStruct((), jnp.float32, sharding=sharding_lib.replicated(mesh))

    def search_learn(params, frozen, problems_N, key_data, learning_rate):
        key = jax.random.wrap_key_data(key_data)
        keys_N = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(n))
        return learn_lib.learning_program(graphdef, params, frozen, task, cfg, learn,
                                          make_learner, mesh, problems_N, keys_N, learning_rate)

    return Program("search_learn", jax.jit(search_learn), (params, frozen, problems, key, rate))


def _one_generation(step, state, key):
    from vpo.search.ingraph import trace_point

    state = step(key, state)
    return state, trace_point(state)


def kernel_shapes(run: RunConfig, prompt_len: int, *, decode: bool = True) -> list[tuple]:
    """The two kernels' cells (`vpo.kernels.aot_check`) at the run's shapes: the log-prob
    forward and gradient on one micro-batch's completion rows, decode attention on the
    sampler's batch (`decode=False`: without it, for a run whose sampling does not use it)."""
    m, t, s = run.model, run.train, run.sampler
    B, G, T = t.batch_size, s.num_samples, s.max_new_tokens
    rows = (B // (t.num_minibatches * t.grad_accum)) * G * T
    dtype = m.dtype
    cells = [("logprob_entropy", "fwd", (rows, m.dim, m.vocab_size), dtype),
             ("logprob_entropy", "grad", (rows, m.dim, m.vocab_size), dtype)]
    if decode:
        cells.append(("decode_attention", "fwd", (B, G, m.num_kv_heads,
                                                  m.num_heads // m.num_kv_heads, m.head_dim,
                                                  prompt_len, T), dtype))
    return cells


def compile_program(program: Program, mesh) -> Built:
    """`program.fn.trace(*args, **kwargs).lower().compile()` under `mesh`; a failure is
    returned."""
    t0 = time.perf_counter()
    try:
        with jax.set_mesh(mesh):
            compiled = program.fn.trace(*program.args, **program.kwargs).lower().compile()
    except Exception as e:  # noqa: BLE001 - the compiler's error is the result
        return Built(program.name, error=e, seconds=time.perf_counter() - t0)
    return Built(program.name, compiled=compiled, seconds=time.perf_counter() - t0)


def make_programs(name: str, run: RunConfig, task: BoundTask, mesh,
                  search: SearchSettings | None = None) -> list[Program]:
    """The programs of `name` (one of `PROGRAMS` except "kernels"; `search`: the search
    programs' settings); an environment run's RL step is `vpo.accel.env_build.build_env_step`'s."""
    if name == "rl_step":
        return rl_programs(run, task, mesh)
    if name in ("search", "search_learn"):
        maker = search_program if name == "search" else search_learn_program
        return [maker(run, task, mesh, search)]
    makers = {"sampler": sampler_program, "sft_step": sft_program}
    if name not in makers:
        raise ValueError(f"unknown program {name!r}; choose from {', '.join(PROGRAMS)}")
    return [makers[name](run, task, mesh)]


def build(name: str, run: RunConfig, task: BoundTask, mesh,
          search: SearchSettings | None = None) -> list[Built]:
    """Make and compile the programs of `name` (`search`: the search programs' settings); an
    error while making the inputs (a setting the mesh refuses) is a Built with stage "build".
    The RL step of an environment run (the episode programs and the update) is
    `vpo.accel.env_build.build_env_step`'s."""
    t0 = time.perf_counter()
    try:
        programs = make_programs(name, run, task, mesh, search)
    except Exception as e:  # noqa: BLE001
        return [Built(name, error=e, seconds=time.perf_counter() - t0, stage="build")]
    return [compile_program(p, mesh) for p in programs]


def build_kernels(run: RunConfig, task: BoundTask, devs, n_devices: int = 1, *,
                  decode: bool = True) -> list[dict]:
    """The kernels alone at the run's shapes (`vpo.kernels.aot_check.compile_cell`) on the
    target's first `n_devices` devices; one row per cell (`kernel_shapes`)."""
    from vpo.kernels.aot_check import compile_cell

    prompt_len = rl_batch(run, task, run.train.batch_size)["prompt_BP"].shape[1]
    return [compile_cell(devs, *cell, n_devices=n_devices)
            for cell in kernel_shapes(run, prompt_len, decode=decode)]
