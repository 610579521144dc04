"""Multi-turn episodes: the policy and the environments take turns, the KV cache kept throughout.

Each of B dataset rows starts G episodes (one environment each, `make_env()`); the first
messages are rendered through the checkpoint's chat template and prefilled once, shared by the
row's G episodes (as `vpo.rollout.sampler.generate` shares a prompt). Then, until every
episode is over:

1. `advance_episodes` (one jitted `lax.while_loop`) decodes every episode whose turn is on
   until it emits a stop token (the end of its assistant message); observation tokens queued
   for an episode are fed through the same decode step first (forced, not sampled), so the
   conversation is never prefilled again: each token of every turn enters the cache once.
2. On the host, each episode that ended its turn hands its messages to `env.step`: the
   observation messages (tool output, a user's reply) are rendered through the chat template
   (the text the template adds after the assistant message, generation prompt included) and
   queued; `None`, the turn limit or the token budget ends the episode.
3. `score` sees the conversation the model saw: an observation the budget left no room for
   (or the cache slots ran out before it was fed in full) is not in `messages`; a score that
   takes `truncated=` (`vpo.env.base.score_episode`) learns whether the token budget cut the
   episode off (True) or the environment or the turn limit ended it (False).

Episodes advance in lock step over cache slots but not over positions: a slot where an
episode idled (its turn over, another's still running) is left out of its attention mask and
its rotary position is its own count of real tokens (`Decoder.extend_masked`), so an episode's
tokens are computed exactly as if they were contiguous. `Episodes.rollout` holds them
contiguous ([B, G, T], T the token budget per episode), `mask_BGT` on the assistant's tokens
only: the update recomputes log-probs over the whole conversation (observations included, as
context) and takes its loss on the assistant's tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vpo import prng as _prng
from vpo.env.base import (
    Environment,
    Message,
    check_messages,
    check_scores,
    on_row,
    row_label,
)
from vpo.env.workers import call_envs
from vpo.errors import ConfigError, EnvError
from vpo.io.tokenizer import Tokenizer, left_pad
from vpo.rollout.sampler import choose_tokens, step_kwargs
from vpo.tasks.base import ROW
from vpo.types import Rollout

if TYPE_CHECKING:
    from vpo.env.task import EnvTask

GENERATING, WAITING, DONE = 0, 1, 2  # an episode's status in the decode loop


class _Carry(NamedTuple):
    t: jax.Array  # the next cache slot (shared by every episode)
    logits_BGV: jax.Array
    cache: Any
    prefix: Any
    pos_BG: jax.Array  # each episode's real tokens so far (its next rotary position offset)
    status_BG: jax.Array
    fed_BG: jax.Array  # queued observation tokens already fed
    # [B, G, C]: one entry per cache slot (the cache holds `slots`; t is the next)
    tokens_BGC: jax.Array
    logp_BGC: jax.Array
    sample_logp_BGC: jax.Array
    entropy_BGC: jax.Array
    assistant_BGC: jax.Array  # the assistant's (sampled) tokens
    valid_BGC: jax.Array  # every real token: the assistant's and the observations'


@functools.partial(jax.jit, static_argnames=("graphdef", "group", "slots"))
def prefill_episodes(graphdef, params, prompts_BP, mask_BP, *, group: int, slots: int) -> _Carry:
    """Prefill the B prompts once → the loop's carry with an empty cache of `slots` slots."""
    model = nnx.merge(graphdef, params)
    hidden_BPD, prefix = model.prefill(prompts_BP, mask_BP)
    logits_BV = model.logits(hidden_BPD[:, -1])
    B = prompts_BP.shape[0]
    zeros = jnp.zeros((B, group, slots), jnp.float32)
    return _Carry(
        t=jnp.int32(0),
        logits_BGV=jnp.broadcast_to(logits_BV[:, None], (B, group, logits_BV.shape[-1])),
        cache=model.init_cache(B, group, slots), prefix=prefix,
        pos_BG=jnp.zeros((B, group), jnp.int32),
        status_BG=jnp.full((B, group), GENERATING, jnp.int32),
        fed_BG=jnp.zeros((B, group), jnp.int32),
        tokens_BGC=jnp.zeros((B, group, slots), jnp.int32), logp_BGC=zeros,
        sample_logp_BGC=zeros, entropy_BGC=zeros,
        assistant_BGC=jnp.zeros((B, group, slots), bool),
        valid_BGC=jnp.zeros((B, group, slots), bool))


@functools.partial(jax.jit, static_argnames=("graphdef", "stop_ids", "pad_id", "budget"),
                   donate_argnums=(2,))
def advance_episodes(graphdef, params, carry: _Carry, queued_BGW, queued_len_BG, keys_BG,
                     temperature, top_p, top_k, *, stop_ids: tuple[int, ...], pad_id: int,
                     budget: int) -> _Carry:
    """Decode until no episode is generating or has queued tokens left (or the slots run out).

    Per step, each episode: feeds its next queued observation token (not sampled, not the
    assistant's), or samples a token if its turn is on (`choose_tokens`, the uniform
    hash(key, slot) of its own key), or idles. A sampled stop token ends its turn (WAITING);
    reaching `budget` real tokens ends the episode (DONE, cut off)."""
    model = nnx.merge(graphdef, params)
    C = carry.tokens_BGC.shape[-1]
    W = queued_BGW.shape[-1]
    stops = jnp.asarray(stop_ids, jnp.int32)
    weights = step_kwargs(model)

    def busy(c: _Carry):
        feeding = c.fed_BG < queued_len_BG
        return (c.status_BG == GENERATING) & (feeding | (c.pos_BG < budget))

    def body(c: _Carry) -> _Carry:
        feeding = (c.fed_BG < queued_len_BG) & (c.status_BG == GENERATING)
        sampling = (c.status_BG == GENERATING) & ~feeding & (c.pos_BG < budget)
        real = feeding | sampling
        u_BG = _prng.uniform_per_key(keys_BG, c.t)
        tok, logp, slogp, ent = choose_tokens(c.logits_BGV, u_BG, temperature, top_p, top_k)
        queued = jnp.take_along_axis(queued_BGW, jnp.minimum(c.fed_BG, W - 1)[..., None],
                                     axis=-1)[..., 0]
        tok = jnp.where(feeding, queued, jnp.where(sampling, tok, pad_id))

        def write(a, x):
            return a.at[:, :, c.t].set(x)

        valid = write(c.valid_BGC, real)
        rope = model.rope(c.prefix.length_B[:, None, None] + c.pos_BG[:, :, None])
        hidden, cache = model.extend_masked(tok[:, :, None], c.prefix, c.cache, c.t,
                                          valid[:, :, None, :], rope, **weights)
        logits = jnp.where(real[..., None], model.logits(hidden[:, :, 0]), c.logits_BGV)
        pos = c.pos_BG + real
        stopped = sampling & jnp.any(tok[..., None] == stops[None, None, :], axis=-1)
        status = jnp.where(stopped, WAITING, c.status_BG)
        status = jnp.where((status == GENERATING) & ~feeding & (pos >= budget) & sampling,
                           DONE, status)
        return c._replace(
            t=c.t + 1, logits_BGV=logits, cache=cache, pos_BG=pos, status_BG=status,
            fed_BG=c.fed_BG + feeding, tokens_BGC=write(c.tokens_BGC, tok),
            logp_BGC=write(c.logp_BGC, jnp.where(sampling, logp, 0.0)),
            sample_logp_BGC=write(c.sample_logp_BGC, jnp.where(sampling, slogp, 0.0)),
            entropy_BGC=write(c.entropy_BGC, jnp.where(sampling, ent, 0.0)),
            assistant_BGC=write(c.assistant_BGC, sampling), valid_BGC=valid)

    def cond(c: _Carry):
        return (c.t < C) & jnp.any(busy(c))

    return jax.lax.while_loop(cond, body, carry)


class Episodes(NamedTuple):
    """B rows × G episodes after `run_episodes`."""

    rollout: Rollout  # [B, G, T]: the conversation after the prompt, contiguous; mask_BGT on
    #                   the assistant's tokens; finished_BG: ended by the environment
    prompt_BP: np.ndarray  # the rendered first messages, left-padded
    prompt_mask_BP: np.ndarray
    messages: list[list[list[Message]]]  # [B][G]: every message the model saw
    rewards_BGR: np.ndarray  # float32, 0 where a component did not apply
    applies_BGR: np.ndarray  # bool
    turns_BG: np.ndarray  # assistant messages
    observation_tokens_BG: np.ndarray  # tokens fed from the environment
    prefills: int  # prompt prefills run (1: the conversation was never prefilled again)


def observation_ids(tokenizer: Tokenizer, before: list[Message], observation: list[Message],
                    stop_text: str = "") -> list[int]:
    """The tokens a conversation gains from `observation` after `before`, which ends with the
    assistant's message: its tokens up to the stop token it emitted (`stop_text`) are in the
    cache already. With a chat template: the template's rendering of before + observation
    with the generation prompt, from just after that stop token in its rendering of before
    (what the template writes after an assistant's end of turn, then the observation and the
    next assistant header). Without one: the contents, one per line."""
    if tokenizer.chat_template is None:
        return tokenizer.encode("".join("\n" + m["content"] for m in observation) + "\n")
    head = tokenizer.render_chat(before, add_generation_prompt=False)
    full = tokenizer.render_chat([*before, *observation], add_generation_prompt=True)
    if not full.startswith(head):
        raise EnvError("the chat template renders the conversation differently once the "
                       "observation is appended (it rewrites earlier turns): the episode "
                       "cannot continue from its cache; use a template that only appends")
    cut = head.rfind(stop_text) if stop_text else -1
    after_stop = head[cut + len(stop_text):] if cut >= 0 else ""
    return tokenizer.encode(after_stop + full[len(head):])


def _bucket(n: int) -> int:
    """The queued-token width compiled for n tokens: the next power of two, at least 8."""
    return max(8, 1 << max(n - 1, 0).bit_length())


def queue_widths(max_tokens: int) -> tuple[int, ...]:
    """The queued-observation widths `advance_episodes` is compiled for under a token budget of
    `max_tokens` (each is its own compile): 8 on the first turn, then `_bucket` of the turn's
    longest observation, which is queued only with room to answer after it (at most
    max_tokens − 2 tokens: its turn's answer held one at least)."""
    widths = [_bucket(1)]
    while widths[-1] < _bucket(max(max_tokens - 2, 1)):
        widths.append(2 * widths[-1])
    return tuple(widths)


def run_episodes(model, tokenizer: Tokenizer, envs: Sequence[Sequence[Environment]],
                 rows: Sequence[dict[str, Any]], keys_BG, *, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, max_tokens: int, max_turns: int,
                 reward_names: Sequence[str], where: str = "--env",
                 timeout: float | None = None, row_ids: Sequence[int] | None = None,
                 slots: int | None = None,
                 prompts: tuple[np.ndarray, np.ndarray] | None = None) -> Episodes:
    """Run B × G episodes (`envs[b][g]` on `rows[b]`) → `Episodes`.

    max_tokens: the token budget of an episode after its first messages (the assistant's and
    the observations'; T of the rollout). max_turns: assistant messages per episode.
    slots: cache slots shared by the episodes in lock step (default 2·max_tokens): an episode
    idles while others finish their turn, so a conversation may use fewer than max_tokens
    tokens before the slots run out (it is then cut off, `finished_BG` False).
    A cut-off episode's `messages` end with what the model saw (an observation it was never
    fed is left out) and its score is called with `truncated=True` where the environment's
    score takes that keyword.
    keys_BG: one key per episode. Every environment call goes through `call_envs` (named
    errors, `timeout`; a turn's calls run in parallel for environments in worker processes).
    prompts: (prompt_BP, mask_BP) already rendered from the rows' first messages (the RL
    step's batch); default: rendered here from `reset`."""
    if max_turns < 1 or max_tokens < 1:
        raise ConfigError(f"env: max_turns and max_tokens must be >= 1, got {max_turns}, "
                          f"{max_tokens}")
    B, G = len(rows), len(envs[0])
    T, C = max_tokens, slots or 2 * max_tokens
    row_ids = [row_label(r, i) for r, i in zip(
        rows, range(B) if row_ids is None else row_ids, strict=True)]
    messages: list[list[list[Message]]] = []
    prompt_ids = []
    for b, row in enumerate(rows):
        first = [check_messages(m, where, "reset", row_ids[b], False)
                 for m in call_envs(where, "reset", envs[b], [(row,)] * len(envs[b]),
                                    timeout=timeout, rows=[row_ids[b]] * len(envs[b]))]
        if any(f != first[0] for f in first[1:]):
            raise EnvError(f"{where}: reset{on_row(row_ids[b])} gave different first "
                           "messages to the episodes of one row; reset must depend on the row "
                           "only (the episodes share its prompt)")
        messages.append([list(f) for f in first])
        if prompts is None:
            prompt_ids.append(tokenizer.prompt_ids(first[0]))
    if prompts is None:
        prompt_BP, prompt_mask_BP = left_pad(prompt_ids, None, tokenizer.pad_id)
    else:
        prompt_BP, prompt_mask_BP = prompts
    graphdef, params = nnx.split(model)
    carry = prefill_episodes(graphdef, params, jnp.asarray(prompt_BP, jnp.int32),
                   jnp.asarray(prompt_mask_BP, bool), group=G, slots=C)
    queued = np.zeros((B, G, 8), np.int32)
    queued_len = np.zeros((B, G), np.int32)
    turns = np.zeros((B, G), np.int32)
    obs_tokens = np.zeros((B, G), np.int32)
    ended = np.zeros((B, G), bool)  # by the environment or the turn limit
    unseen: dict[tuple[int, int], int] = {}  # observation messages queued, not yet fed in full
    last = np.full((B, G), "", object)  # the stop token that ended each episode's last turn
    stop_ids = tuple(int(i) for i in tokenizer.stop_ids)
    start_t = 0
    while True:
        carry = advance_episodes(graphdef, params, carry, jnp.asarray(queued),
                                 jnp.asarray(queued_len), keys_BG, jnp.float32(temperature),
                                 jnp.float32(top_p), jnp.int32(top_k), stop_ids=stop_ids,
                                 pad_id=int(tokenizer.pad_id), budget=T)
        t = int(carry.t)
        unseen = _still_unseen(unseen, np.asarray(carry.fed_BG), queued_len)
        status = np.asarray(carry.status_BG).copy()
        pos = np.asarray(carry.pos_BG)
        tokens = np.asarray(carry.tokens_BGC)
        assistant = np.asarray(carry.assistant_BGC)
        for b, g in np.ndindex(B, G):  # every turn that ended or was cut off in this call
            turn = tokens[b, g, start_t:t][assistant[b, g, start_t:t]]
            if turn.size:
                messages[b][g].append({"role": "assistant",
                                       "content": tokenizer.decode(turn.tolist())})
                turns[b, g] += 1
                last[b, g] = tokenizer.decode(turn[-1:].tolist(), skip_special_tokens=False)
        start_t = t
        waiting = list(zip(*np.nonzero(status == WAITING), strict=True))
        if not waiting:
            break
        queue: dict[tuple[int, int], list[int]] = {}
        asked = [(b, g) for b, g in waiting if turns[b, g] < max_turns]
        answers = dict(zip(asked, call_envs(
            where, "step", [envs[b][g] for b, g in asked],
            [([dict(m) for m in messages[b][g]],) for b, g in asked], timeout=timeout,
            rows=[row_ids[b] for b, _ in asked]), strict=True))
        for b, g in waiting:
            obs = None
            if (b, g) in answers:
                obs = check_messages(answers[b, g], where, "step", row_ids[b], True)
            if obs is None:
                status[b, g], ended[b, g] = DONE, True
                continue
            ids = observation_ids(tokenizer, messages[b][g], obs, last[b, g])
            if pos[b, g] + len(ids) >= T:  # no room to answer after it: cut off, not shown
                status[b, g] = DONE
                continue
            messages[b][g].extend(obs)
            unseen[(b, g)] = len(obs)
            queue[(b, g)] = ids
            status[b, g] = GENERATING
        width = _bucket(max((len(v) for v in queue.values()), default=1))
        queued = np.zeros((B, G, width), np.int32)
        queued_len = np.zeros((B, G), np.int32)
        for (b, g), ids in queue.items():
            queued[b, g, :len(ids)] = ids
            queued_len[b, g] = len(ids)
            obs_tokens[b, g] += len(ids)
        carry = carry._replace(status_BG=jnp.asarray(status),
                               fed_BG=jnp.zeros((B, G), jnp.int32))
        if t >= C or not queue:
            break
    fed_BG = np.asarray(carry.fed_BG)
    for (b, g), n in _still_unseen(unseen, fed_BG, queued_len).items():  # the slots ran out
        del messages[b][g][-n:]
        obs_tokens[b, g] -= queued_len[b, g] - fed_BG[b, g]
    rollout = _contiguous(carry, T, ended, int(tokenizer.pad_id))
    R = len(reward_names)
    rewards = np.zeros((B, G, R), np.float32)
    applies = np.zeros((B, G, R), bool)
    every = list(np.ndindex(B, G))
    scores = call_envs(where, "score", [envs[b][g] for b, g in every],
                       [([dict(m) for m in messages[b][g]], not ended[b, g]) for b, g in every],
                       timeout=timeout, rows=[row_ids[b] for b, _ in every])
    for (b, g), value in zip(every, scores, strict=True):
        for r, v in enumerate(check_scores(value, reward_names, where, row_ids[b])):
            if v is not None:
                rewards[b, g, r], applies[b, g, r] = v, True
    return Episodes(rollout, prompt_BP, prompt_mask_BP, messages, rewards, applies, turns,
                    obs_tokens, prefills=1)


def task_episodes(model, task: EnvTask, factory: Callable[[], Environment],
                  rows: Sequence[dict[str, Any]], keys_BG, *, temperature: float,
                  top_p: float = 1.0, top_k: int = 0, max_tokens: int,
                  prompts: tuple[np.ndarray, np.ndarray] | None = None,
                  row_offset: int = 0) -> Episodes:
    """`run_episodes` of an environment task: B = len(rows) rows × G episodes, keys_BG [B, G]
    one key per episode, one new environment `factory()` per (row, sample) (`factory`:
    `vpo.env.task.env_factory(task)`, made once by the caller); the task's tokenizer, reward
    names and settings (max_turns, timeout, its spec naming errors); row b is named by its
    `ROW` (default `row_offset + b`). prompts: as in `run_episodes`."""
    settings, G = task.settings, keys_BG.shape[1]
    return run_episodes(model, task.tokenizer, [[factory() for _ in range(G)] for _ in rows],
                        rows, keys_BG, temperature=temperature, top_p=top_p, top_k=top_k,
                        max_tokens=max_tokens, max_turns=settings.max_turns,
                        reward_names=task.reward_names, where=settings.spec,
                        timeout=settings.timeout, prompts=prompts,
                        row_ids=[int(r.get(ROW, row_offset + b)) for b, r in enumerate(rows)])


def _still_unseen(unseen: dict[tuple[int, int], int], fed_BG: np.ndarray,
                  queued_len_BG: np.ndarray) -> dict[tuple[int, int], int]:
    """The entries of `unseen` (episode → its last observation's message count) whose queued
    tokens the cache has not yet taken in full."""
    return {bg: n for bg, n in unseen.items() if fed_BG[bg] < queued_len_BG[bg]}


def _contiguous(carry: _Carry, T: int, ended_BG: np.ndarray, pad_id: int) -> Rollout:
    """Each episode's real tokens moved to slots [0, n) of a [B, G, T] rollout (their order
    kept; idle slots dropped), the assistant's tokens masked in."""
    valid = np.asarray(carry.valid_BGC)
    arrays = [np.asarray(x) for x in (carry.tokens_BGC, carry.logp_BGC, carry.sample_logp_BGC,
                                      carry.entropy_BGC, carry.assistant_BGC)]
    B, G, _ = valid.shape
    # a stable sort on "not valid" brings the real slots to the front in their order
    order_BGT = np.argsort(~valid, axis=-1, kind="stable")[..., :T]
    keep_BGT = np.take_along_axis(valid, order_BGT, axis=-1)
    tokens, logp, slogp, ent, assistant = (np.take_along_axis(a, order_BGT, axis=-1)
                                           for a in arrays)
    if order_BGT.shape[-1] < T:  # fewer slots than the budget: pad
        pad = [(0, 0), (0, 0), (0, T - order_BGT.shape[-1])]
        keep_BGT, tokens, logp, slogp, ent, assistant = (np.pad(a, pad) for a in (
            keep_BGT, tokens, logp, slogp, ent, assistant))
    tokens = np.where(keep_BGT, tokens, pad_id)
    mask = assistant & keep_BGT
    return Rollout(jnp.asarray(tokens, jnp.int32), jnp.asarray(np.where(mask, logp, 0.0)),
                   jnp.asarray(np.where(mask, slogp, 0.0)), jnp.asarray(np.where(mask, ent, 0.0)),
                   jnp.asarray(mask), jnp.asarray(mask.sum(-1), jnp.int32),
                   jnp.asarray(ended_BG))
