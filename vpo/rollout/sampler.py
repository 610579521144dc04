"""Jitted KV-cache sampler: prefill each prompt once, decode G samples per prompt in a while_loop.

The prompt's keys/values are computed once and shared by its G samples (`Decoder.extend` attends
to the shared prefix), so prefill work and prefix memory do not grow with G. Temperature, top-p
and top-k are traced scalars: changing them never recompiles. `temperature == 0` is greedy.
Every (prompt, sample) pair owns a key; the token at step t is drawn by inverting the sampling
distribution's CDF at the uniform hash(key, t) (`vpo.prng`, one random number per token), so
the same keys give the same tokens whatever the batch layout, mesh or group sharing.
Decoding runs in phases whose suffix cache doubles (`decode_windows`), so a step at position t
attends to O(t) cache slots, not to the whole budget of max_new_tokens.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from flax import nnx

from vpo import prng as _prng
from vpo.io.tokenizer import left_pad  # noqa: F401  (re-exported: sampler.left_pad)
from vpo.model.decoder import KVCache, decode_attention_impl
from vpo.types import Rollout


@runtime_checkable
class SamplerModel(Protocol):
    """What `generate` needs from a policy: `vpo.model.decoder.Decoder` is one; a model of your
    own works when it has these five methods (and is an `nnx.Module` for
    `vpo.rollout.slots.sample`, which also reads `model.cfg.max_seq_len` when there is one).
    Shapes: B prompts, P prompt tokens, G samples per prompt, O new tokens per call (1 while
    decoding), D hidden size, V vocabulary.

    - `prefill(tokens_BP, mask_BP) -> (hidden_BPD, prefix)`: the causal forward over the
      left-padded prompts (mask_BP True on real tokens). `prefix` is any pytree with
      `prefix.length_B`, the number of real prompt tokens (the position of the first new one).
    - `logits(hidden_xD) -> logits_xV`: the unembedding, float32.
    - `init_cache(batch, group, length, attention) -> cache`: an empty cache for `group`
      continuations of `batch` prompts with `length` slots; any pytree with
      `cache.grown(length) -> cache` (the same cache with at least `length` slots: decoding runs
      in phases of doubling length, `decode_windows`).
    - `rope(positions) -> r`: any pytree of arrays of shape positions.shape + (...,) (for RoPE,
      (cos, sin)); the loop slices each leaf at one step along axis 2 and hands it to `extend`.
      A model without rotary embeddings may return the positions themselves.
    - `extend(tokens_BGO, prefix, cache, start, rope=r, attention=attention) ->
      (hidden_BGOD, cache)`: the next O tokens of every continuation, at suffix slots
      `[start, start + O)`, attending to the prompt's prefix and to the suffix so far.

    `attention` is "xla" unless `decode_attention_impl` picks the decode kernel; a model may
    ignore it. A model may also have `loop_weights() -> dict`: keyword arguments made once
    before the decode loop and handed to every `extend` call in it (the decoder's products
    that share an input, concatenated on a GPU: `Decoder.loop_weights`). An optional
    `platform` attribute names the platform programs are built for, an optional
    `cfg.decode_attention` the choice ("auto" when absent). `generate` raises
    `SamplerModelError` naming the missing methods.
    """

    def prefill(self, tokens_BP, mask_BP) -> tuple[jax.Array, Any]: ...

    def logits(self, hidden_xD) -> jax.Array: ...

    def init_cache(self, batch: int, group: int, length: int, attention: str = "xla") -> Any: ...

    def rope(self, positions) -> Any: ...

    def extend(self, tokens_BGO, prefix, cache, start, rope=None,
               attention: str = "xla") -> tuple[jax.Array, Any]: ...


class SamplerModelError(TypeError):
    """The model handed to the sampler lacks methods of `SamplerModel`."""


SAMPLER_METHODS = ("prefill", "logits", "init_cache", "rope", "extend")


def step_kwargs(model) -> dict:
    """The keyword arguments a decode loop hands to every step of `model`: its
    `loop_weights()`, made here (call it before the loop); {} for a model without them."""
    made = getattr(model, "loop_weights", None)
    return {} if made is None else made()


def check_sampler_model(model) -> None:
    """Raises `SamplerModelError` naming every `SamplerModel` method `model` lacks."""
    missing = [m for m in SAMPLER_METHODS if not callable(getattr(model, m, None))]
    if missing:
        raise SamplerModelError(
            f"{type(model).__name__} cannot be sampled: it lacks {', '.join(missing)} (the "
            "sampler needs prefill / logits / init_cache / rope / extend, see "
            "vpo.rollout.sampler.SamplerModel; vpo.model.decoder.Decoder implements them)")


def _filter_logits(scaled_xV, top_k, top_p):
    """Keep the top_k highest logits (0: all), then the smallest set of mass ≥ top_p; rest -inf.

    Applied in this order as in common practice (top-p on the top-k-renormalised distribution).
    Ties at the threshold are kept.
    """
    sorted_xV = -jnp.sort(-scaled_xV, axis=-1)
    rank_xV = jax.lax.broadcasted_iota(jnp.int32, sorted_xV.shape, sorted_xV.ndim - 1)
    in_k = (top_k <= 0) | (rank_xV < top_k)
    sorted_xV = jnp.where(in_k, sorted_xV, -jnp.inf)
    probs = jax.nn.softmax(sorted_xV, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = in_k & (mass_before < top_p)
    last = jnp.maximum(keep.sum(axis=-1, keepdims=True) - 1, 0)
    threshold = jnp.take_along_axis(sorted_xV, last, axis=-1)
    return jnp.where(scaled_xV >= threshold, scaled_xV, -jnp.inf)


def _inverse_cdf_draw(u_BG, scores_BGV):
    """One draw per row from softmax(scores) by inverting its CDF with one uniform u per row.

    token = first v with q_v > 0 and cumsum(q)_v > u·sum(q), q = exp(scores - max). Exactly the
    categorical distribution (up to float32 rounding of the cumulative sums), but it needs one
    random number per row where Gumbel-max (`jax.random.categorical`) needs V, and on CPU the
    V per-row threefry draws dominated a decode step (V=4096: ~25% of the step). A zero-mass
    token (filtered out) is never returned. Returns (token_BG, log_normaliser_BG = logsumexp).
    The search is `_first_crossing` (on CPU without materialising the cumulative sums).
    """
    max_BG1 = jnp.max(scores_BGV, axis=-1, keepdims=True)
    q_BGV = jnp.exp(scores_BGV - max_BG1)
    total_BG = jnp.sum(q_BGV, axis=-1)
    token_BG = _first_crossing(q_BGV, u_BG * total_BG)
    return token_BG, max_BG1[..., 0] + jnp.log(total_BG)


def _first_crossing_cumsum(q_BGV, thr_BG):
    """The definition: first v with q_v > 0 and cumsum(q)_v > thr; when no v qualifies (float
    rounding: thr ≥ the last cumulative sum), the last v with q_v > 0 (V - 1 if none)."""
    V = q_BGV.shape[-1]
    above_BGV = (jnp.cumsum(q_BGV, axis=-1) > thr_BG[..., None]) & (q_BGV > 0)
    last_BG = V - 1 - jnp.argmax(q_BGV[..., ::-1] > 0, axis=-1)
    token_BG = jnp.where(jnp.any(above_BGV, axis=-1), jnp.argmax(above_BGV, axis=-1), last_BG)
    return token_BG.astype(jnp.int32)


# XLA:CPU rewrites a cumulative sum longer than this into blocks of this length
# (`ReduceWindowRewriter`, base length 16): the sums within each block run left to right, the
# block offsets are a left-to-right cumulative sum of the block totals, and each output is
# (sum within its block) + (its block's offset).
_CPU_SCAN_BLOCK = 16


def _first_crossing_blocked(q_BGV, thr_BG):
    """`_first_crossing_cumsum` with XLA:CPU's cumsum rounding, bit for bit, without the
    [.., V] cumulative sums (V ≤ 16·16).

    XLA:CPU's `jnp.cumsum` over V > 16 (see `_CPU_SCAN_BLOCK`) costs 16·V adds per row in
    reduce-window loops: at V = 201 (the word-level maze vocabulary) `choose_tokens` took
    ~42 µs of a ~230 µs tiny-model decode step on a 2-core CPU, ~22 µs with this. Here: the
    16-wide block totals (left to right, as XLA sums a block), their cumulative sums, which
    are exactly the cumulative sums at the block ends (with at most 16 blocks the offsets are
    one left-to-right scan, so block b's end = offset_b + total_b = offset_{b+1}), then the
    cumulative sums of the one block where the sum first exceeds thr. Sums of non-negative q
    never decrease, so "first index above thr" is a count of the sums ≤ thr, and the first sum
    above thr is at a q_v > 0 (adding a zero changes nothing), as the definition asks.
    """
    V, K = q_BGV.shape[-1], _CPU_SCAN_BLOCK
    nb = -(-V // K)
    nd = q_BGV.ndim
    tiles = jnp.pad(q_BGV, [(0, 0)] * (nd - 1) + [(0, nb * K - V)]).reshape(
        *q_BGV.shape[:-1], nb, K)  # [.., nb, K]: nb blocks of K tokens
    totals = tiles[..., 0]  # left to right, one add at a time (a reduce may reorder)
    for j in range(1, K):
        totals = totals + tiles[..., j]
    ends = jnp.cumsum(totals, axis=-1)  # ≤ 16 long: one left-to-right scan
    thr_BG1 = thr_BG[..., None]
    block_BG = jnp.minimum(jnp.sum(ends <= thr_BG1, axis=-1), nb - 1)
    offset_BG = jnp.take_along_axis(ends, jnp.maximum(block_BG - 1, 0)[..., None],
                                    axis=-1)[..., 0]
    tile_q = jnp.take_along_axis(tiles, block_BG[..., None, None], axis=-2)[..., 0, :]
    within = jnp.cumsum(tile_q, axis=-1)
    # block 0 has no offset (XLA adds an exact 0; adding 0.0 would too, for q ≥ 0)
    cum = jnp.where((block_BG > 0)[..., None], within + offset_BG[..., None], within)
    first_BG = block_BG * K + jnp.sum(cum <= thr_BG1, axis=-1)
    return _first_or_last(first_BG, ends[..., -1] > thr_BG, q_BGV)


# the tile of the two-level search for longer vocabularies on CPU (`_first_crossing_two_level`)
_CPU_TILE = 256


def _first_crossing_two_level(q_BGV, thr_BG):
    """`_first_crossing_cumsum` for V > 256 on CPU, without the [.., V] cumulative sums: the
    tile of `_CPU_TILE` tokens where the running sum of tile totals first exceeds thr, then
    the cumulative sums inside that one tile (offset by the tiles before it).

    XLA:CPU's `jnp.cumsum` over V = 49,152 (SmolLM2) is ~16·V scalar adds per row in nested
    reduce-window loops, ~8 ms of a ~100 ms decode step for 16 rows on a 2-core CPU; this
    costs one vectorised reduce over V. The sums are added in another order than XLA's
    cumsum, so a draw whose threshold falls within float32 rounding of a cumulative sum may
    pick a neighbour of the definition's token: the same categorical distribution up to
    float32 rounding of the CDF, as the definition. Guarantees kept: the token has q_v > 0
    (the tile's own sums can fall short of thr by rounding; then its last q_v > 0, which
    exists because the tile's total lifted the running sum past thr), and with no crossing
    at all (thr ≥ the sum) the last q_v > 0 (V - 1 if none).
    """
    V, K = q_BGV.shape[-1], _CPU_TILE
    nt = -(-V // K)
    nd = q_BGV.ndim
    tiles = jnp.pad(q_BGV, [(0, 0)] * (nd - 1) + [(0, nt * K - V)]).reshape(
        *q_BGV.shape[:-1], nt, K)  # [.., nt, K]: nt tiles of K tokens
    ends = jnp.cumsum(jnp.sum(tiles, axis=-1), axis=-1)
    thr_BG1 = thr_BG[..., None]
    tile_BG = jnp.minimum(jnp.sum(ends <= thr_BG1, axis=-1), nt - 1)
    offset_BG = jnp.where(tile_BG > 0, jnp.take_along_axis(
        ends, jnp.maximum(tile_BG - 1, 0)[..., None], axis=-1)[..., 0], 0.0)
    tile_q = jnp.take_along_axis(tiles, tile_BG[..., None, None], axis=-2)[..., 0, :]
    n_BG = jnp.sum(offset_BG[..., None] + jnp.cumsum(tile_q, axis=-1) <= thr_BG1, axis=-1)
    iota = jax.lax.broadcasted_iota(jnp.int32, tile_q.shape, nd - 1)
    last_in_tile_BG = jnp.max(jnp.where(tile_q > 0, iota, -1), axis=-1)
    first_BG = tile_BG * K + jnp.where(n_BG < K, n_BG, last_in_tile_BG)
    return _first_or_last(first_BG, ends[..., -1] > thr_BG, q_BGV)


def _first_or_last(first_BG, found_BG, q_BGV):
    """The searches' result: first_BG where the cumulative sum ends above thr (found_BG),
    else the last v with q_v > 0 (V - 1 if none), as `_first_crossing_cumsum`."""
    iota_BGV = jax.lax.broadcasted_iota(jnp.int32, q_BGV.shape, q_BGV.ndim - 1)
    last_pos_BG = jnp.max(jnp.where(q_BGV > 0, iota_BGV, -1), axis=-1)
    last_BG = jnp.where(last_pos_BG < 0, q_BGV.shape[-1] - 1, last_pos_BG)
    return jnp.where(found_BG, first_BG, last_BG).astype(jnp.int32)


def _first_crossing(q_BGV, thr_BG):
    """First v with q_v > 0 and cumsum(q)_v > thr (see `_first_crossing_cumsum`); q ≥ 0.

    On CPU with V ≤ 256 the blocked search (`_first_crossing_blocked`: the same tokens bit for
    bit, tested), with a longer V the two-level search (`_first_crossing_two_level`: the same
    distribution, tokens equal up to float32 rounding of the CDF); elsewhere the definition
    (other backends run a cumulative sum as a parallel scan)."""
    small = -(-q_BGV.shape[-1] // _CPU_SCAN_BLOCK) <= _CPU_SCAN_BLOCK
    return jax.lax.platform_dependent(
        q_BGV, thr_BG, cpu=_first_crossing_blocked if small else _first_crossing_two_level,
        default=_first_crossing_cumsum)


def choose_tokens(logits_BGV, u_BG, temperature, top_p, top_k):
    """Draw one token per row → (token_BG, logp_BG, sample_logp_BG, entropy_BG).

    u_BG: one uniform on [0, 1) per row (the row's random number for this step).
    logp / entropy are under softmax(logits) (temperature 1); sample_logp is under the sampled
    distribution softmax(filter(logits / temperature)), and 0 for greedy (temperature 0).
    One pass of exp over V serves the log-normaliser, the entropy
    (-Σ p log p = lse - Σ e·logits / Σ e, e = exp(logits - max)) and, at temperature 1 without
    a filter (the RL sampler), the draw itself (its q is e, bit for bit). Other temperatures
    and the top-k/top-p filter take a second pass (the sort runs only when a filter is on);
    greedy skips the draw (`lax.switch`).
    """
    max_BG1 = jnp.max(logits_BGV, axis=-1, keepdims=True)
    e_BGV = jnp.exp(logits_BGV - max_BG1)
    total_BG = jnp.sum(e_BGV, axis=-1)
    lse_BG = jnp.log(total_BG) + max_BG1[..., 0]
    entropy_BG = lse_BG - jnp.sum(e_BGV * logits_BGV, axis=-1) / total_BG

    def greedy(_):
        token_BG = jnp.argmax(logits_BGV, axis=-1).astype(jnp.int32)
        return token_BG, jnp.zeros(token_BG.shape, jnp.float32)

    def plain(_):  # softmax(logits): `_inverse_cdf_draw`'s q, sum and normaliser are e, total, lse
        token_BG = _first_crossing(e_BGV, u_BG * total_BG)
        return token_BG, _pick(logits_BGV, token_BG) - lse_BG

    def draw(_):
        scaled = logits_BGV / jnp.maximum(temperature, 1e-6)
        use_filter = (top_k > 0) | (top_p < 1.0)
        filtered = jax.lax.cond(use_filter, _filter_logits, lambda x, k, p: x, scaled, top_k,
                                top_p)
        token_BG, norm_BG = _inverse_cdf_draw(u_BG, filtered)
        return token_BG, _pick(filtered, token_BG) - norm_BG

    is_plain = (temperature == 1.0) & (top_k <= 0) & (top_p >= 1.0)
    branch = jnp.where(temperature <= 0, 0, jnp.where(is_plain, 1, 2))
    token_BG, sample_logp_BG = jax.lax.switch(branch, (greedy, plain, draw), None)
    return token_BG, _pick(logits_BGV, token_BG) - lse_BG, sample_logp_BG, entropy_BG


def _pick(x_BGV, token_BG):
    return jnp.take_along_axis(x_BGV, token_BG[..., None], axis=-1)[..., 0]


class _Loop(NamedTuple):
    t: jax.Array
    logits_BGV: jax.Array
    cache: KVCache
    done_BG: jax.Array
    out: Rollout


DECODE_BLOCK = 64  # the first decode window; see `decode_windows`


def decode_windows(max_new_tokens: int, block: int = DECODE_BLOCK) -> tuple[int, ...]:
    """Suffix-cache lengths of the decode phases: block, 2·block, 4·block, … capped at
    max_new_tokens.

    Steps t < windows[0] run with a windows[0]-slot cache, then steps windows[i-1] ≤ t <
    windows[i] with the cache grown to windows[i] slots (`KVCache.grown`): a step attends to
    fewer than 2·max(t + 1, block) slots, not to max_new_tokens. Each phase is one
    `lax.while_loop` (its own compiled body); `block ≥ max_new_tokens` gives one phase with the
    whole cache, the path before phases.
    """
    if block < 1:
        raise ValueError(f"decode block must be >= 1, got {block}")
    ends, end = [], block
    while end < max_new_tokens:
        ends.append(end)
        end *= 2
    return (*ends, max_new_tokens)


def generate(model: SamplerModel, prompts_BP, mask_BP, keys_BG, temperature, top_p, top_k, *,
             max_new_tokens: int, stop_ids: tuple[int, ...], pad_id: int,
             decode_block: int = DECODE_BLOCK) -> Rollout:
    """Pure sampling function (call it inside your own jit, or use `vpo.rollout.slots.sample`).

    Args:
      model: the policy, any `SamplerModel` (`vpo.model.decoder.Decoder` or your own; an NNX
        module: inside jit, `nnx.merge` it from graphdef + state).
      prompts_BP, mask_BP: left-padded prompt tokens and their validity mask.
      keys_BG: one PRNG key per (prompt, sample); G is taken from its shape.
      temperature, top_p, top_k: traced scalars.
      stop_ids: a sequence ends at the first of these tokens (which is kept and masked True);
        from the tokenizer (`Tokenizer.stop_ids`).
      pad_id: written after the end. It may be an ordinary token: `mask_BGT`, never the token
        value, says which positions were generated.
      decode_block: the first suffix-cache length (`decode_windows`); the cache doubles as
        decoding goes on. `decode_block >= max_new_tokens`: the whole cache at every step (one
        phase). The Pallas kernel (GPU / TPU) bounds its reads itself and runs one phase.
    Returns a `Rollout` with [B, G, T] arrays, T = max_new_tokens. The loop stops early once
    every sequence has emitted a stop token; later positions are pad and masked.
    """
    check_sampler_model(model)
    B, G = keys_BG.shape
    T = max_new_tokens
    attention = decode_attention_impl(
        platform=getattr(model, "platform", None), keys=prompts_BP.shape[1] + T,
        choice=getattr(getattr(model, "cfg", None), "decode_attention", "auto"))
    windows = decode_windows(T, T if attention != "xla" else decode_block)
    hidden_BPD, prefix = model.prefill(prompts_BP, mask_BP)
    logits_BV = model.logits(hidden_BPD[:, -1])
    zeros = jnp.zeros((B, G, T), jnp.float32)
    init = _Loop(
        t=jnp.int32(0),
        logits_BGV=jnp.broadcast_to(logits_BV[:, None], (B, G, logits_BV.shape[-1])),
        cache=model.init_cache(B, G, windows[0], attention),
        done_BG=jnp.zeros((B, G), bool),
        out=Rollout(jnp.full((B, G, T), pad_id, jnp.int32), zeros, zeros, zeros,
                    jnp.zeros((B, G, T), bool), jnp.zeros((B, G), jnp.int32),
                    jnp.zeros((B, G), bool)),
    )

    stops = jnp.asarray(stop_ids, jnp.int32)
    rope_B1TE = model.rope(prefix.length_B[:, None, None] + jnp.arange(T)[None, None, :])
    weights = step_kwargs(model)

    def body(s: _Loop) -> _Loop:
        u_BG = _prng.uniform_per_key(keys_BG, s.t)
        tok, logp, slogp, ent = choose_tokens(s.logits_BGV, u_BG, temperature, top_p, top_k)
        live = ~s.done_BG
        tok = jnp.where(live, tok, pad_id)
        write = lambda a, x: a.at[:, :, s.t].set(x)  # noqa: E731
        o = s.out
        out = o._replace(
            tokens_BGT=write(o.tokens_BGT, tok),
            logp_BGT=write(o.logp_BGT, jnp.where(live, logp, 0.0)),
            sample_logp_BGT=write(o.sample_logp_BGT, jnp.where(live, slogp, 0.0)),
            entropy_BGT=write(o.entropy_BGT, jnp.where(live, ent, 0.0)),
            mask_BGT=write(o.mask_BGT, live),
        )
        rope = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, s.t, 1, axis=2), rope_B1TE)
        hidden, cache = model.extend(tok[:, :, None], prefix, s.cache, s.t, rope=rope,
                                     attention=attention, **weights)
        stopped_BG = live & jnp.any(tok[:, :, None] == stops[None, None, :], axis=-1)
        return _Loop(s.t + 1, model.logits(hidden[:, :, 0]), cache, s.done_BG | stopped_BG, out)

    def cond(s: _Loop, end: int):
        return (s.t < end) & ~jnp.all(s.done_BG)

    final = init
    for end in windows:
        final = final._replace(cache=final.cache.grown(end))
        final = jax.lax.while_loop(functools.partial(cond, end=end), body, final)
    return final.out._replace(length_BG=final.out.mask_BGT.sum(-1).astype(jnp.int32),
                              finished_BG=final.done_BG)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "stop_ids", "pad_id",
                                             "decode_block"))
def generate_jit(graphdef, state, prompts_BP, mask_BP, keys_BG, temperature, top_p, top_k, *,
                  max_new_tokens, stop_ids, pad_id, decode_block=DECODE_BLOCK):
    return generate(nnx.merge(graphdef, state), prompts_BP, mask_BP, keys_BG, temperature,
                    top_p, top_k, max_new_tokens=max_new_tokens, stop_ids=stop_ids,
                    pad_id=pad_id, decode_block=decode_block)
