"""The RL step of an environment run (`vpo train --env`, `vpo.rl.env_step`) compiled for a
target from abstract inputs: the programs one step runs, at the run's shapes.

    env_prefill              `vpo.env.episode.prefill_episodes`: the B prompts prefilled
                             once, an empty cache of 2·T slots for the B × G episodes
    env_advance (queue W)    `advance_episodes`: decode until every episode's turn is over, each
                             episode's queued observation tokens fed first through the same
                             step (`Decoder.extend_masked`, one token per cache slot: the
                             observation extend is this loop). A run compiles it once per queue
                             width W (`vpo.env.episode.queue_widths`); built here at the first
                             (8: the first turn) and the widest the token budget admits
    env_update               `vpo.rl.env_step.make_env_update` on [B, G, T] episodes, rewards
                             over sets of m episodes

B = train.batch_size × objective.oversample rows, G = sampler.num_samples, T =
sampler.max_new_tokens (an episode's token budget). The environment's calls (reset, step,
score) run on the host between these programs and are not compiled; the turn limit sets how
often `advance_episodes` runs, not its shapes.

Inputs as the step feeds them: the policy's parameters as the state holds them (sharded), the
update's batch over the data-parallel axes, host arrays (prompts, queues, episodes, rewards)
with no sharding (the compiler places them, as it places an uncommitted array), the sampling
keys replicated (drawn from the state's key), the carry in the layout the compiled prefill
returns.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
from flax import nnx

from vpo.accel.build import (
    Built,
    Program,
    abstract_batch,
    abstract_state,
    check_batch,
    compile_program,
    rl_batch,
)
from vpo.config import RunConfig
from vpo.env import episode
from vpo.env.task import EnvTask, check_env_run
from vpo.model import lora as lora_lib
from vpo.model import sharding as sharding_lib
from vpo.rl.env_step import make_env_update
from vpo.rl.step import make_optimizer, step_config
from vpo.types import Rollout


@dataclasses.dataclass(frozen=True)
class EpisodeShapes:
    """B rows × G episodes, T tokens per episode, C cache slots, the queue widths built."""

    rows: int
    group: int
    budget: int
    slots: int
    widths: tuple[int, ...]


def episode_shapes(run: RunConfig) -> EpisodeShapes:
    """The shapes `run_episodes` runs at for `run` (slots: its default 2·T); the widths built
    are the first and the widest of `episode.queue_widths`."""
    T = run.sampler.max_new_tokens
    widths = episode.queue_widths(T)
    return EpisodeShapes(run.train.batch_size * run.objective.oversample,
                         run.sampler.num_samples, T, 2 * T,
                         tuple(dict.fromkeys((widths[0], widths[-1]))))


def _host(shape, dtype) -> jax.ShapeDtypeStruct:
    """An abstract host array (numpy → jnp.asarray): no sharding, placed by the compiler."""
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))


@dataclasses.dataclass(frozen=True)
class EnvBuild:
    """What the episode programs share: the policy split as `run_episodes` splits it (graphdef,
    abstract params), the prompts, the shapes and the static settings."""

    graphdef: nnx.GraphDef
    params: nnx.State
    prompt_BP: jax.ShapeDtypeStruct
    mask_BP: jax.ShapeDtypeStruct
    shapes: EpisodeShapes
    stop_ids: tuple[int, ...]
    pad_id: int


def env_build(run: RunConfig, task: EnvTask, mesh) -> tuple[EnvBuild, Program]:
    """(the episode programs' inputs, the env_update program); a setting the run or the mesh
    refuses raises a ConfigError naming it."""
    shapes = episode_shapes(run)
    m = task.settings.episodes_per_set
    check_env_run(run, m)
    check_batch(run.train.batch_size, mesh)
    check_batch(shapes.rows, mesh, "objective.oversample × train.batch_size")
    tx = make_optimizer(run.train)
    graphdef, state = abstract_state(run.model, tx, mesh, seed=run.train.seed,
                                     with_ref=run.objective.kl_coef > 0)
    host = rl_batch(run, task, shapes.rows)
    model_def, params = nnx.split(lora_lib.merge(graphdef, state.params, state.frozen))
    tok = task.tokenizer
    ctx = EnvBuild(model_def, params, _host(host["prompt_BP"].shape, jnp.int32),
                   _host(host["prompt_mask_BP"].shape, bool), shapes,
                   tuple(int(i) for i in tok.stop_ids), int(tok.pad_id))
    B, G, T = shapes.rows, shapes.group, shapes.budget
    rollout = Rollout(_host((B, G, T), jnp.int32), _host((B, G, T), jnp.float32),
                      _host((B, G, T), jnp.float32), _host((B, G, T), jnp.float32),
                      _host((B, G, T), bool), _host((B, G), jnp.int32), _host((B, G), bool))
    update = Program("env_update", make_env_update(graphdef, tx, task, step_config(run, task)),
                     (state, abstract_batch(host, mesh), rollout,
                      _host((B, G, m, task.num_rewards), jnp.float32), _host((B, G, m), bool)))
    return ctx, update


def prefill_program(ctx: EnvBuild) -> Program:
    """`prefill_episodes` on the B prompts: the carry of B × G episodes with C empty slots."""
    s = ctx.shapes
    return Program("env_prefill", episode.prefill_episodes,
                   (ctx.graphdef, ctx.params, ctx.prompt_BP, ctx.mask_BP),
                   {"group": s.group, "slots": s.slots})


def carry_of(ctx: EnvBuild, prefill: Built, mesh):
    """The abstract carry `prefill_episodes` returns, in the layout of its compiled outputs
    (no layout where it did not compile: the compiler's choice)."""
    p = prefill_program(ctx)
    with jax.set_mesh(mesh):
        shapes = jax.eval_shape(lambda params, x, mask: p.fn(ctx.graphdef, params, x, mask,
                                                             **p.kwargs), *p.args[1:])
    if prefill.compiled is None:
        return shapes
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        shapes, prefill.compiled.output_shardings)


def advance_program(ctx: EnvBuild, carry, width: int, mesh) -> Program:
    """`advance_episodes` with observation queues `width` tokens wide, the carry donated;
    temperature, top-p and top-k are traced scalars (one program for any value)."""
    s = ctx.shapes
    B, G = s.rows, s.group
    keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), B * G).reshape(B, G))
    keys = jax.ShapeDtypeStruct(keys.shape, keys.dtype, sharding=sharding_lib.replicated(mesh))
    args = (ctx.graphdef, ctx.params, carry, _host((B, G, width), jnp.int32),
            _host((B, G), jnp.int32), keys, _host((), jnp.float32), _host((), jnp.float32),
            _host((), jnp.int32))
    return Program(f"env_advance (queue {width})", episode.advance_episodes, args,
                   {"stop_ids": ctx.stop_ids, "pad_id": ctx.pad_id, "budget": s.budget})


def build_env_step(run: RunConfig, task: EnvTask, mesh) -> list[Built]:
    """Compile the environment step's programs (the module docstring) in the order a step runs
    them; a setting refused while making the inputs is one Built with stage "build"."""
    t0 = time.perf_counter()
    try:
        ctx, update = env_build(run, task, mesh)
    except Exception as e:  # noqa: BLE001 - the refused setting is the result
        return [Built("rl_step", error=e, seconds=time.perf_counter() - t0, stage="build")]
    prefill = compile_program(prefill_program(ctx), mesh)
    carry = carry_of(ctx, prefill, mesh)
    advances = [compile_program(advance_program(ctx, carry, w, mesh), mesh)
                for w in ctx.shapes.widths]
    return [prefill, *advances, compile_program(update, mesh)]
