"""Slots that take new prompts between compiled chunks of decode steps: the sampler of a server.

`vpo.rollout.slots` refills rows from a pool fixed before the loop starts; a server's prompts
arrive while it decodes. Here the device state of S slots (`LiveSlots`: each slot's prompt
prefix, suffix cache, next-token logits, position, key and sampling settings) lives between
calls of two programs, each compiled once per shape and reused:

  - `admit`: prefill B new prompts ([B, P'] with P' ≤ P) and write each into its slot (its
    prefix left-padded to the slot capacity P, its last logits, t = 0, its key and settings);
  - `decode_chunk`: up to `steps` decode steps of every live slot in one `lax.while_loop`,
    returning the chunk's tokens, their log-probs and which slots stopped. It ends early when
    a request waits and a slot is free for it (asked of the host before every step through a
    callback, so a chunk can be long without keeping an arrival waiting), so the host can hand
    that slot the next request.

A slot's token at position t is drawn as `vpo.rollout.sampler.generate` draws it: the uniform
`vpo.prng.uniform_per_key(key, t)` inverted through the CDF of the filtered distribution
(`choose_tokens_rows`, `choose_tokens` with each row's own temperature / top-p / top-k), so a
request with the keys `vpo sample` splits from a seed gets the tokens `vpo sample` draws (up to
float rounding of the row step, as `vpo.rollout.slots`). The log-probs reported are the
temperature-1 log-probs of the model, the trainer's (`vpo.rl.step.completion_logp`).

Shapes: S slots, P prompt capacity, T suffix capacity (new tokens; a chunk's [S, T] arrays
hold the window of them its steps made), B prompts admitted at once, V vocabulary, J top
log-probs per token.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.experimental import io_callback

from vpo import prng as _prng
from vpo.model.decoder import KVCache, Prefix
from vpo.rollout.sampler import (
    _filter_logits,
    _first_crossing,
    _inverse_cdf_draw,
    _pick,
    step_kwargs,
)
from vpo.rollout.slots import check_slots_model

TOP_LOGPROBS = 20  # the most alternatives a token's log-prob comes with (OpenAI's limit)


class LiveSlots(NamedTuple):
    """The device state of S slots between calls (every array has S rows)."""

    prefix: Prefix  # each slot's prompt: keys/values [S, Z, P, E] per layer, mask [S, P]
    cache: KVCache  # [S, 1, Z, T, E] per layer
    logits_SV: jax.Array  # the logits of each slot's next token
    t_S: jax.Array  # int32, tokens the slot has generated
    live_S: jax.Array  # bool, the slot is decoding
    budget_S: jax.Array  # int32, the slot's max new tokens (≤ T)
    keys_S2: jax.Array  # uint32 [S, 2], the slot's key data (`jax.random.key_data`)
    temperature_S: jax.Array
    top_p_S: jax.Array
    top_k_S: jax.Array  # int32, 0: off
    top_n_S: jax.Array  # int32, top log-probs the slot's request wants (0: none)


class Chunk(NamedTuple):
    """What one `decode_chunk` produced: step i of slot s at [s, i] where mask_ST is True."""

    tokens_ST: jax.Array
    logp_ST: jax.Array  # temperature-1 log-prob of the token under the model
    mask_ST: jax.Array  # the slot was live and wrote this token
    stopped_S: jax.Array  # the slot ended in this chunk on a stop id
    ended_S: jax.Array  # the slot ended in this chunk (stop id or its budget)
    top_ids_STJ: jax.Array  # the J most likely tokens at each step (when a slot asked)
    top_logp_STJ: jax.Array


def choose_tokens_rows(logits_SV, u_S, temperature_S, top_p_S, top_k_S):
    """`vpo.rollout.sampler.choose_tokens` with each row's own settings → (token_S, logp_S).

    Row s draws what `choose_tokens` draws for it alone with (temperature_S[s], top_p_S[s],
    top_k_S[s]): greedy at temperature 0, the plain inverse-CDF draw on the model's softmax at
    temperature 1 without a filter, else the draw on the scaled, filtered logits. The scaled
    branch and the sort of the filter run only when some row needs them (`lax.cond` on the
    batch). logp_S is the temperature-1 log-prob of the token.
    """
    max_S1 = jnp.max(logits_SV, axis=-1, keepdims=True)
    e_SV = jnp.exp(logits_SV - max_S1)
    total_S = jnp.sum(e_SV, axis=-1)
    lse_S = jnp.log(total_S) + max_S1[..., 0]
    greedy_S = temperature_S <= 0
    plain_S = (temperature_S == 1.0) & (top_k_S <= 0) & (top_p_S >= 1.0)
    filter_S = (top_k_S > 0) | (top_p_S < 1.0)
    token_S = jnp.where(greedy_S, jnp.argmax(logits_SV, axis=-1).astype(jnp.int32),
                        _first_crossing(e_SV, u_S * total_S))

    def draw(_):
        scaled_SV = logits_SV / jnp.maximum(temperature_S, 1e-6)[:, None]
        filtered_SV = jax.lax.cond(
            jnp.any(filter_S & ~greedy_S),
            lambda x: jnp.where(filter_S[:, None],
                                _filter_logits(x, top_k_S[:, None], top_p_S[:, None]), x),
            lambda x: x, scaled_SV)
        return _inverse_cdf_draw(u_S, filtered_SV)[0]

    drawn_S = jax.lax.cond(jnp.any(~greedy_S & ~plain_S), draw, lambda _: token_S, None)
    token_S = jnp.where(greedy_S | plain_S, token_S, drawn_S)
    return token_S, _pick(logits_SV, token_S) - lse_S


def init_live(model, slots: int, prompt_len: int, max_new_tokens: int) -> LiveSlots:
    """S idle slots of capacity P prompt tokens and T new tokens (zeros; nothing live)."""
    check_slots_model(model)
    c = model.cfg
    shape = (slots, c.num_kv_heads, prompt_len, c.head_dim)
    if model.scanned:
        zeros = jnp.zeros((c.num_layers, *shape), model.dtype)
        k = v = zeros
    else:
        k = tuple(jnp.zeros(shape, model.dtype) for _ in range(c.num_layers))
        v = tuple(jnp.zeros(shape, model.dtype) for _ in range(c.num_layers))
    S = slots
    return LiveSlots(
        prefix=Prefix(k, v, jnp.zeros((S, prompt_len), bool), jnp.zeros((S,), jnp.int32)),
        cache=model.init_cache(S, 1, max_new_tokens),
        logits_SV=jnp.zeros((S, c.vocab_size), jnp.float32),
        t_S=jnp.zeros((S,), jnp.int32), live_S=jnp.zeros((S,), bool),
        budget_S=jnp.zeros((S,), jnp.int32), keys_S2=jnp.zeros((S, 2), jnp.uint32),
        temperature_S=jnp.ones((S,), jnp.float32), top_p_S=jnp.ones((S,), jnp.float32),
        top_k_S=jnp.zeros((S,), jnp.int32), top_n_S=jnp.zeros((S,), jnp.int32))


def admit(model, live: LiveSlots, tokens_BP, mask_BP, slot_B, keys_B2, temperature_B, top_p_B,
          top_k_B, budget_B, top_n_B) -> LiveSlots:
    """`live` with B new prompts (left-padded [B, P'], P' ≤ P) prefilled into slots slot_B; a
    row with slot_B = S (or more) is padding and writes nothing. Each admitted slot starts at
    t = 0 from its prompt's last logits."""
    S, P = live.prefix.mask_BP.shape
    B, Pa = tokens_BP.shape
    hidden_BPD, prefix = model.prefill(tokens_BP, mask_BP)
    logits_BV = model.logits(hidden_BPD[:, -1])
    ax = 1 if model.scanned else 0  # the row axis of a layer's prefix keys: [(L,) B, Z, P, E]

    def place(dst, src):  # src [.., B, Z, P', E] left-padded to P and written at slot_B
        pad = [(0, 0)] * src.ndim
        pad[ax + 2] = (P - Pa, 0)
        src = jnp.pad(src, pad)
        return dst.at[(slice(None),) * ax + (slot_B,)].set(src, mode="drop")

    def each(dst, src):
        return place(dst, src) if isinstance(dst, jax.Array) else tuple(map(place, dst, src))

    padded_BP = jnp.pad(prefix.mask_BP, [(0, 0), (P - Pa, 0)])
    new_prefix = Prefix(each(live.prefix.k_BZPE, prefix.k_BZPE),
                        each(live.prefix.v_BZPE, prefix.v_BZPE),
                        live.prefix.mask_BP.at[slot_B].set(padded_BP, mode="drop"),
                        live.prefix.length_B.at[slot_B].set(prefix.length_B, mode="drop"))

    def put(a, x):
        return a.at[slot_B].set(x.astype(a.dtype), mode="drop")

    return live._replace(
        prefix=new_prefix, logits_SV=put(live.logits_SV, logits_BV),
        t_S=put(live.t_S, jnp.zeros((B,), jnp.int32)), live_S=put(live.live_S,
                                                                jnp.ones((B,), bool)),
        budget_S=put(live.budget_S, budget_B), keys_S2=put(live.keys_S2, keys_B2),
        temperature_S=put(live.temperature_S, temperature_B),
        top_p_S=put(live.top_p_S, top_p_B), top_k_S=put(live.top_k_S, top_k_B),
        top_n_S=put(live.top_n_S, top_n_B))


def decode_chunk(model, live: LiveSlots, yield_free, *, steps: int,
                 stop_ids: tuple[int, ...], pad_id: int, waiting=None,
                 spare: bool = False) -> tuple[LiveSlots, Chunk]:
    """Up to `steps` decode steps of the live slots → (live, Chunk). A slot ends on a stop id
    (kept, as the sampler keeps it) or when it has made `budget` tokens; the loop ends early
    when no slot is live, or when the host has a request waiting and a slot is free for it:
    `waiting` (a host function → bool, asked before every step through `io_callback`) with
    a free slot among these (or `spare`: slots beyond these are free); without `waiting`, the
    traced bool `yield_free` (requests wait) after the step where a slot ended."""
    S = live.t_S.shape[0]
    T = live.cache.k_BGZCE[0].shape[3]
    J = min(TOP_LOGPROBS, live.logits_SV.shape[-1])
    stops = jnp.asarray(stop_ids, jnp.int32)
    zeros = jnp.zeros((S, steps), jnp.float32)
    chunk = Chunk(jnp.full((S, steps), pad_id, jnp.int32), zeros, jnp.zeros((S, steps), bool),
                  jnp.zeros((S,), bool), jnp.zeros((S,), bool),
                  jnp.zeros((S, steps, J), jnp.int32), jnp.zeros((S, steps, J), jnp.float32))
    weights = step_kwargs(model)

    def body(carry):
        i, s, out = carry
        u_S = _prng.uniform_per_key(s.keys_S2, s.t_S)
        tok_S, logp_S = choose_tokens_rows(s.logits_SV, u_S, s.temperature_S, s.top_p_S,
                                           s.top_k_S)
        tok_S = jnp.where(s.live_S, tok_S, pad_id)

        def top(logits_SV):
            vals_SJ, ids_SJ = jax.lax.top_k(logits_SV, J)
            lse_S1 = jax.nn.logsumexp(logits_SV, axis=-1, keepdims=True)
            return ids_SJ.astype(jnp.int32), vals_SJ - lse_S1

        want = jnp.any(s.live_S & (s.top_n_S > 0))
        ids_SJ, tlogp_SJ = jax.lax.cond(
            want, top, lambda _: (jnp.zeros((S, J), jnp.int32), jnp.zeros((S, J), jnp.float32)),
            s.logits_SV)
        stop_S = s.live_S & jnp.any(tok_S[:, None] == stops[None, :], axis=-1)
        ended_S = s.live_S & (stop_S | (s.t_S + 1 >= s.budget_S))
        out = out._replace(
            tokens_ST=out.tokens_ST.at[:, i].set(tok_S),
            logp_ST=out.logp_ST.at[:, i].set(jnp.where(s.live_S, logp_S, 0.0)),
            mask_ST=out.mask_ST.at[:, i].set(s.live_S),
            stopped_S=out.stopped_S | stop_S, ended_S=out.ended_S | ended_S,
            top_ids_STJ=out.top_ids_STJ.at[:, i].set(ids_SJ),
            top_logp_STJ=out.top_logp_STJ.at[:, i].set(tlogp_SJ))
        # every slot runs the step (an idle one at a position inside its cache, discarded)
        hidden_SD, cache = model.extend_rows(tok_S, s.prefix, s.cache, jnp.minimum(s.t_S, T - 1),
                                             **weights)
        s = s._replace(cache=cache, logits_SV=model.logits(hidden_SD),
                       t_S=jnp.where(s.live_S, s.t_S + 1, s.t_S), live_S=s.live_S & ~ended_S)
        return i + 1, s, out

    def cond(carry):
        i, s, out = carry
        if waiting is None:
            return (i < steps) & jnp.any(s.live_S) & ~(yield_free & jnp.any(out.ended_S))
        free = jnp.any(~s.live_S) | spare  # a slot a waiting request could take
        asked = io_callback(waiting, jax.ShapeDtypeStruct((), jnp.bool_), ordered=False)
        return (i < steps) & jnp.any(s.live_S) & ~(free & asked)

    _, live, chunk = jax.lax.while_loop(cond, body, (jnp.int32(0), live, chunk))
    return live, chunk


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("live",))
def admit_jit(graphdef, state, live, tokens_BP, mask_BP, slot_B, keys_B2, temperature_B,
              top_p_B, top_k_B, budget_B, top_n_B):
    """`admit` under jit on an `nnx.split` model; `live` is donated (updated in place)."""
    return admit(nnx.merge(graphdef, state), live, tokens_BP, mask_BP, slot_B, keys_B2,
                 temperature_B, top_p_B, top_k_B, budget_B, top_n_B)


def rows_of(live: LiveSlots, rows: int, scanned: bool) -> LiveSlots:
    """The first `rows` slots of `live` (the row axis of a scanned model's stacked prefix and
    cache is 1, of everything else 0)."""
    def take(x, ax):
        return jax.lax.slice_in_dim(x, 0, rows, axis=ax)

    ax = 1 if scanned else 0
    kv = functools.partial(jax.tree.map, lambda x: take(x, ax))
    rest = live._replace(prefix=None, cache=None)
    return jax.tree.map(lambda x: take(x, 0), rest)._replace(
        prefix=Prefix(kv(live.prefix.k_BZPE), kv(live.prefix.v_BZPE),
                      take(live.prefix.mask_BP, 0), take(live.prefix.length_B, 0)),
        cache=KVCache(kv(live.cache.k_BGZCE), kv(live.cache.v_BGZCE)))


def with_rows(live: LiveSlots, part: LiveSlots, scanned: bool) -> LiveSlots:
    """`live` with its first slots replaced by `part` (`rows_of`'s inverse)."""
    ax = 1 if scanned else 0

    def put(x, y, axis):
        return jax.lax.dynamic_update_slice_in_dim(x, y, 0, axis=axis)

    kv = functools.partial(jax.tree.map, lambda x, y: put(x, y, ax))
    rest = jax.tree.map(lambda x, y: put(x, y, 0), live._replace(prefix=None, cache=None),
                        part._replace(prefix=None, cache=None))
    return rest._replace(
        prefix=Prefix(kv(live.prefix.k_BZPE, part.prefix.k_BZPE),
                      kv(live.prefix.v_BZPE, part.prefix.v_BZPE),
                      put(live.prefix.mask_BP, part.prefix.mask_BP, 0),
                      put(live.prefix.length_B, part.prefix.length_B, 0)),
        cache=KVCache(kv(live.cache.k_BGZCE, part.cache.k_BGZCE),
                      kv(live.cache.v_BGZCE, part.cache.v_BGZCE)))


@functools.partial(jax.jit, static_argnames=("graphdef", "rows", "steps", "stop_ids", "pad_id",
                                             "waiting"), donate_argnames=("live",))
def decode_chunk_jit(graphdef, state, live, yield_free, *, rows, steps, stop_ids, pad_id,
                     waiting=None):
    """`decode_chunk` under jit on an `nnx.split` model, over the first `rows` slots only (the
    rest idle: a step's work follows the slots in use, not all S); `live` is donated. The
    Chunk has `rows` rows."""
    model = nnx.merge(graphdef, state)
    kw = dict(steps=steps, stop_ids=stop_ids, pad_id=pad_id, waiting=waiting)
    if rows == live.t_S.shape[0]:
        return decode_chunk(model, live, yield_free, **kw)
    part, chunk = decode_chunk(model, rows_of(live, rows, model.scanned), yield_free,
                               spare=True, **kw)
    return with_rows(live, part, model.scanned), chunk


@functools.partial(jax.jit, donate_argnames=("live",))
def release(live: LiveSlots, free_S) -> LiveSlots:
    """`live` with the slots free_S (bool [S]) no longer decoding (a request cancelled, or
    ended by a stop string the host found)."""
    return live._replace(live_S=live.live_S & ~free_S)
