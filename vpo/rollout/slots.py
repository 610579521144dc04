"""Rollouts through a few refilled slots: generation over a pool of N = B·G rollouts with
S ≤ N live rows.

`vpo.rollout.sampler.generate` decodes all B·G rows until the last one stops: a finished row
keeps its place and one long completion holds the whole batch. Here S slots decode in one
`lax.while_loop`; when a slot's rollout stops (a stop token or max_new_tokens) its tokens are
already in the [B, G, T] outputs and the slot takes the next rollout of the pool at the same
step, so the work of a decode step follows S rows, not the longest of N. This is
iteration-level scheduling (Orca, Yu et al., OSDI 2022; the continuous batching of vLLM) inside
one compiled loop, over a pool fixed in advance.

The rule, per step, for every slot holding rollout r = b·G + g at its own position t:
  1. draw the token from the slot's logits with u = `vpo.prng.uniform_per_key(keys_BG[b, g],
     t)` (`choose_tokens`), and write token, logp, sample_logp, entropy and mask at [b, g, t];
  2. the rollout stops on a stop id (finished) or at t = T - 1;
  3. every slot runs the next token through `Decoder.extend_rows` (its own slot t of its own
     suffix cache, its own prompt's prefix);
  4. stopped slots take the next rollouts of the pool in slot order (r = S, S + 1, …), start
     at t = 0 from their prompt's last prefill logits, and copy that prompt's prefix keys and
     values into their row (only on steps where a slot refills); a slot left without a rollout
     idles (its work is discarded) until every slot is idle.
Each rollout draws the uniforms of `generate` (same key, same position), so the same keys give
the same tokens as `generate` up to float rounding: the slot loop's row step (`extend` mapped
over rows) compiles to other fusions than `generate`'s step and rounds differently (its
attention alone by ~2e-7). The tiny preset's rollouts are equal bit for bit
(tests/rollout/test_rollout_slots.py); on
SmolLM2-135M (30 layers, 49,152 tokens) the last hidden states differ by ~2e-5, logp agrees to
~4e-5, and a draw whose uniform falls that close to a CDF boundary can flip, after which the
rollout is another sample of the same distribution (21-23 of 32 rollouts of 128 tokens were
identical, `experiments/bench_slots.py --preset smollm2`).

Memory: per slot a suffix cache of T slots and a copy of one prompt's prefix (L·Z·P·E keys and
values each), in place of `generate`'s B·G suffix caches. Time: a step costs S rows whose
attention reads P + T keys each (the cache is not grown in phases: slots sit at different
positions), so slots pay off when completion lengths spread (a long tail) and S is well below
N; with S ≥ N, `generate_rollouts` keeps `generate`.

Shapes: B prompts, P prompt length, G samples per prompt, N = B·G rollouts, S slots, T =
max_new_tokens, V vocabulary.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from vpo import prng as _prng
from vpo.config import ConfigError, SamplerConfig
from vpo.model.decoder import Decoder, KVCache, Prefix
from vpo.rollout.sampler import (
    DECODE_BLOCK,
    SamplerModelError,
    check_sampler_model,
    choose_tokens,
    generate,
    generate_jit,
    step_kwargs,
)
from vpo.types import Rollout

# `sampler.num_slots` = 0 gives every rollout its own row while the rollouts' KV caches take at
# most this share of the devices' memory (the rest holds the weights, the optimiser state and the
# update's activations); past it the sampler decodes through refilled slots instead of failing.
CACHE_SHARE = 0.25


def cache_bytes_per_row(model_cfg, seq_len: int) -> int:
    """Bytes of one row's keys and values over `seq_len` positions: 2·L·Z·E·seq_len elements
    of the compute dtype."""
    c = model_cfg
    return 2 * c.num_layers * c.num_kv_heads * c.head_dim * seq_len * jnp.dtype(c.dtype).itemsize


def device_memory() -> int | None:
    """The bytes the local devices can allocate together (`memory_stats()["bytes_limit"]`,
    summed: a data-parallel batch splits its rows over them), None where a device does not say
    (XLA:CPU)."""
    stats = [d.memory_stats() for d in jax.local_devices()]
    if not stats or any(not st or "bytes_limit" not in st for st in stats):
        return None
    return sum(int(st["bytes_limit"]) for st in stats)


def slots_for(num_slots: int, model_cfg, seq_len: int, rollouts: int, *,
              memory_bytes: int | None = None) -> int:
    """`sampler.num_slots` S as the sampler runs it, N = `rollouts`: a value the user set
    stands; 0 keeps every rollout in its own row (N rows) while N rows' caches
    (`cache_bytes_per_row` over `seq_len` = prompt + budget) fit `CACHE_SHARE` of
    `memory_bytes` (default `device_memory()`; None, unknown: N rows), else S = the most rows
    that do, rounded down to a multiple of 8 (at least 8). S is fixed at trace time from
    static shapes, so one compiled program serves the run."""
    if num_slots or model_cfg is None:
        return num_slots
    memory = device_memory() if memory_bytes is None else memory_bytes
    if memory is None:
        return 0
    fit = int(CACHE_SHARE * memory) // cache_bytes_per_row(model_cfg, seq_len)
    if fit >= rollouts:
        return 0
    slots = max(8, fit // 8 * 8)
    return slots if slots < rollouts else 0


def uses_slots(num_slots: int, rollouts: int) -> bool:
    """Whether `num_slots` slots decode `rollouts` rollouts through refills: 0 < S < N (0 or
    S ≥ N: every rollout has its own row, `generate`)."""
    return 0 < num_slots < rollouts


def check_slots_model(model) -> None:
    """`check_sampler_model`, and `extend_rows` (`vpo.model.decoder.Decoder.extend_rows`),
    which the slots need; raises `SamplerModelError`."""
    check_sampler_model(model)
    if not callable(getattr(model, "extend_rows", None)):
        raise SamplerModelError(
            f"{type(model).__name__} cannot decode in slots: it lacks extend_rows (one new "
            "token per row at each row's own position, see vpo.model.decoder.Decoder."
            "extend_rows); set sampler.num_slots=0")


class _Slots(NamedTuple):
    rollout_S: jax.Array  # int32, the rollout each slot decodes (N: none)
    t_S: jax.Array  # int32, the slot's position in its rollout
    next_r: jax.Array  # int32, the first rollout of the pool not yet started
    logits_SV: jax.Array
    prefix: Prefix  # the prompt of each slot's rollout: keys/values [S, Z, P, E] per layer
    cache: KVCache  # [S, 1, Z, T, E] per layer
    out: Rollout  # [N, T] arrays (reshaped to [B, G, T] at the end)


def _rows(prefix: Prefix, b_S, scanned: bool) -> Prefix:
    """The prefix of prompts b_S, one row per slot."""
    ax = 1 if scanned else 0
    take = functools.partial(jax.tree.map, lambda x: jnp.take(x, b_S, axis=ax))
    return Prefix(take(prefix.k_BZPE), take(prefix.v_BZPE), prefix.mask_BP[b_S],
                  prefix.length_B[b_S])


def _refill(rows: Prefix, prefix: Prefix, b_S, new_S, *, scanned: bool) -> Prefix:
    """`rows` with the slots new_S (bool [S]) holding the prefix of prompts b_S."""
    ax = 1 if scanned else 0
    fresh = _rows(prefix, b_S, scanned)

    def pick(old, x):
        shape = [1] * x.ndim
        shape[ax] = x.shape[ax]
        return jnp.where(new_S.reshape(shape), x, old)

    both = functools.partial(jax.tree.map, pick)
    return Prefix(both(rows.k_BZPE, fresh.k_BZPE), both(rows.v_BZPE, fresh.v_BZPE),
                  jnp.where(new_S[:, None], fresh.mask_BP, rows.mask_BP),
                  jnp.where(new_S, fresh.length_B, rows.length_B))


def generate_slots(model, prompts_BP, mask_BP, keys_BG, temperature, top_p, top_k, *,
                   max_new_tokens: int, stop_ids: tuple[int, ...], pad_id: int,
                   num_slots: int) -> Rollout:
    """Pure sampling function with `num_slots` refilled slots (the module docstring's rule);
    the arguments and the returned `Rollout` ([B, G, T]) are those of
    `vpo.rollout.sampler.generate`. The model needs `extend_rows` besides the `SamplerModel`
    methods. 1 ≤ num_slots ≤ B·G (more are clipped to B·G).

    Every prompt is prefilled once; slot s starts with rollout s. The loop ends when the pool
    is empty and every slot has stopped.
    """
    check_slots_model(model)
    B, G = keys_BG.shape
    N, T = B * G, max_new_tokens
    if num_slots < 1:
        raise ValueError(f"num_slots must be >= 1, got {num_slots}")
    S = min(num_slots, N)
    scanned = bool(getattr(model, "scanned", False))
    keys_N = keys_BG.reshape(N)
    hidden_BPD, prefix = model.prefill(prompts_BP, mask_BP)
    logits_BV = model.logits(hidden_BPD[:, -1])
    rollout_S = jnp.arange(S, dtype=jnp.int32)
    zeros = jnp.zeros((N, T), jnp.float32)
    init = _Slots(
        rollout_S=rollout_S, t_S=jnp.zeros((S,), jnp.int32), next_r=jnp.int32(S),
        logits_SV=logits_BV[rollout_S // G],
        prefix=_rows(prefix, rollout_S // G, scanned),
        cache=model.init_cache(S, 1, T),
        out=Rollout(jnp.full((N, T), pad_id, jnp.int32), zeros, zeros, zeros,
                    jnp.zeros((N, T), bool), jnp.zeros((N,), jnp.int32),
                    jnp.zeros((N,), bool)))
    stops = jnp.asarray(stop_ids, jnp.int32)
    weights = step_kwargs(model)

    def body(s: _Slots) -> _Slots:
        live_S = s.rollout_S < N
        r_S = jnp.minimum(s.rollout_S, N - 1)
        u_S = _prng.uniform_per_key(keys_N[r_S], s.t_S)
        tok_S, logp_S, slogp_S, ent_S = choose_tokens(
            s.logits_SV[:, None], u_S[:, None], temperature, top_p, top_k)
        tok_S, logp_S, slogp_S, ent_S = tok_S[:, 0], logp_S[:, 0], slogp_S[:, 0], ent_S[:, 0]
        at = (jnp.where(live_S, s.rollout_S, N), s.t_S)  # an idle slot writes nowhere

        def write(a, x):
            return a.at[at].set(x, mode="drop")

        o = s.out
        stop_S = live_S & jnp.any(tok_S[:, None] == stops[None, :], axis=-1)
        ended_S = live_S & (stop_S | (s.t_S == T - 1))
        out = o._replace(
            tokens_BGT=write(o.tokens_BGT, tok_S), logp_BGT=write(o.logp_BGT, logp_S),
            sample_logp_BGT=write(o.sample_logp_BGT, slogp_S),
            entropy_BGT=write(o.entropy_BGT, ent_S), mask_BGT=write(o.mask_BGT, live_S),
            length_BG=o.length_BG.at[at[0]].set(s.t_S + 1, mode="drop"),
            finished_BG=o.finished_BG.at[at[0]].set(stop_S, mode="drop"))
        hidden_SD, cache = model.extend_rows(tok_S, s.prefix, s.cache, s.t_S, **weights)
        logits_SV = model.logits(hidden_SD)
        # the stopped slots, in slot order, take the next rollouts of the pool
        order_S = jnp.cumsum(ended_S.astype(jnp.int32)) - 1
        taken_S = jnp.where(ended_S, s.next_r + order_S, s.rollout_S)
        new_S = ended_S & (taken_S < N)
        rollout_S = jnp.where(ended_S, jnp.minimum(taken_S, N), s.rollout_S)
        b_S = jnp.minimum(rollout_S, N - 1) // G
        refill = functools.partial(_refill, scanned=scanned)
        prefix_rows = jax.lax.cond(jnp.any(new_S), refill, lambda rows, *_: rows, s.prefix,
                                   prefix, b_S, new_S)
        return _Slots(
            rollout_S=rollout_S, t_S=jnp.where(ended_S, 0, s.t_S + 1),
            next_r=s.next_r + jnp.sum(ended_S.astype(jnp.int32)),
            logits_SV=jnp.where(new_S[:, None], logits_BV[b_S], logits_SV),
            prefix=prefix_rows, cache=cache, out=out)

    def cond(s: _Slots):
        return jnp.any(s.rollout_S < N)

    final = jax.lax.while_loop(cond, body, init).out
    return Rollout(*(x.reshape(B, G, *x.shape[1:]) for x in final))


def generate_rollouts(model, prompts_BP, mask_BP, keys_BG, temperature, top_p, top_k, *,
                      max_new_tokens: int, stop_ids: tuple[int, ...], pad_id: int,
                      num_slots: int = 0, decode_block: int = DECODE_BLOCK) -> Rollout:
    """The sampler for `sampler.num_slots`: `generate_slots` when 0 < S < B·G (`uses_slots`;
    S = 0 resolved by `slots_for`: slots only where the rows' caches would not fit memory),
    else `vpo.rollout.sampler.generate` (every rollout its own row).
    Pure; arguments and result as `generate`."""
    B, G = keys_BG.shape
    kw = dict(max_new_tokens=max_new_tokens, stop_ids=stop_ids, pad_id=pad_id)
    num_slots = slots_for(num_slots, getattr(model, "cfg", None),
                          prompts_BP.shape[1] + max_new_tokens, B * G)
    if uses_slots(num_slots, B * G):
        return generate_slots(model, prompts_BP, mask_BP, keys_BG, temperature, top_p, top_k,
                              num_slots=num_slots, **kw)
    return generate(model, prompts_BP, mask_BP, keys_BG, temperature, top_p, top_k,
                    decode_block=decode_block, **kw)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "stop_ids", "pad_id",
                                             "num_slots"))
def generate_slots_jit(graphdef, state, prompts_BP, mask_BP, keys_BG, temperature, top_p, top_k,
                       *, max_new_tokens, stop_ids, pad_id, num_slots):
    """`generate_slots` under jit on an `nnx.split` model."""
    return generate_slots(nnx.merge(graphdef, state), prompts_BP, mask_BP, keys_BG, temperature,
                          top_p, top_k, max_new_tokens=max_new_tokens, stop_ids=stop_ids,
                          pad_id=pad_id, num_slots=num_slots)


def sample_with_keys(model: Decoder, prompts_BP, mask_BP, keys_BG, cfg: SamplerConfig, *,
                     stop_ids: tuple[int, ...], pad_id: int) -> Rollout:
    """`vpo.rollout.sampler.generate` under jit with explicit per-(prompt, sample) keys; with
    0 < S < B·G (S = cfg.num_slots, 0 resolved by memory: `slots_for`), `generate_slots` (the
    same tokens through refilled rows)."""
    check_sampler_model(model)
    P, T = prompts_BP.shape[1], cfg.max_new_tokens
    max_len = getattr(getattr(model, "cfg", None), "max_seq_len", None)
    if max_len is not None and max_len < P + T:
        raise ConfigError(f"sampler.max_new_tokens: prompt length {P} + {T} new tokens exceeds "
                          f"model.max_seq_len {max_len}; lower one of them")
    graphdef, state = nnx.split(model)
    args = (graphdef, state, jnp.asarray(prompts_BP, jnp.int32), jnp.asarray(mask_BP, bool),
            keys_BG, jnp.float32(cfg.temperature), jnp.float32(cfg.top_p), jnp.int32(cfg.top_k))
    kw = dict(max_new_tokens=T, stop_ids=tuple(int(i) for i in stop_ids), pad_id=int(pad_id))
    num_slots = slots_for(cfg.num_slots, getattr(model, "cfg", None), P + T, keys_BG.size)
    if uses_slots(num_slots, keys_BG.size):
        check_slots_model(model)
        return generate_slots_jit(*args, num_slots=num_slots, **kw)
    return generate_jit(*args, **kw)


def sample(model: Decoder, prompts_BP, mask_BP, key, cfg: SamplerConfig, *,
           stop_ids: tuple[int, ...], pad_id: int) -> Rollout:
    """Sample `cfg.num_samples` completions per prompt. Same key, same output."""
    B, G = prompts_BP.shape[0], cfg.num_samples
    keys_BG = jax.random.split(key, B * G).reshape(B, G)
    return sample_with_keys(model, prompts_BP, mask_BP, keys_BG, cfg, stop_ids=stop_ids,
                            pad_id=pad_id)
