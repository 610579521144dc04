"""Population operators of the evolutionary search (pure jnp, one problem, no config), shared by
the in-graph search (`vpo.search.ingraph`) and the host-scored one (`vpo.search.host`).

A `Population` holds candidate slots; its suffix X stands for the slot axes, which the caller
names: [Q] members of one island, [I, Q] all islands, [N] a flat batch of children. A
candidate is one answer as symbol ids of the task's alphabet (`Task.symbols`; for host search,
the id of its text), with a mask. Empty slots have `valid = False`, `fitness = -inf`, `id = -1`
and zero symbols. Two candidates are the same when their symbols (under their masks) agree.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Population(NamedTuple):
    """Candidate slots over the slot axes X ([Q], [I, Q], [C], ...)."""

    tokens_XA: jax.Array  # int32 answer symbol ids, 0 outside the mask
    mask_XA: jax.Array  # bool
    rewards_XR: jax.Array  # float32, zero rows for empty slots
    fitness_X: jax.Array  # float32 w*ᵀr, -inf for empty slots
    valid_X: jax.Array  # bool
    age_X: jax.Array  # int32 generations survived
    id_X: jax.Array  # int32 evaluation index of the candidate, -1 for empty slots


def empty_population(lead: tuple[int, ...], answer_len: int, num_rewards: int) -> Population:
    """All-empty slots of shape `lead` (e.g. (I, Q))."""
    return Population(
        jnp.zeros((*lead, answer_len), jnp.int32),
        jnp.zeros((*lead, answer_len), bool), jnp.zeros((*lead, num_rewards), jnp.float32),
        jnp.full(lead, -jnp.inf, jnp.float32), jnp.zeros(lead, bool),
        jnp.zeros(lead, jnp.int32), jnp.full(lead, -1, jnp.int32))


def clear_invalid(pop: Population) -> Population:
    """Empty every slot whose `valid` is False (zero symbols and rewards, -inf fitness, id -1)."""
    v = pop.valid_X
    return Population(
        jnp.where(v[..., None] & pop.mask_XA, pop.tokens_XA, 0),
        v[..., None] & pop.mask_XA, jnp.where(v[..., None], pop.rewards_XR, 0.0),
        jnp.where(v, pop.fitness_X, -jnp.inf), v, jnp.where(v, pop.age_X, 0),
        jnp.where(v, pop.id_X, -1))


def fitness(rewards_XR: jax.Array, valid_X: jax.Array, weights_R) -> jax.Array:
    """w*ᵀr for valid candidates, -inf for the rest."""
    f_X = jnp.einsum("...r,r->...", rewards_XR.astype(jnp.float32),
                     jnp.asarray(weights_R, jnp.float32))
    return jnp.where(valid_X, f_X, -jnp.inf)


def _keys(tokens_XA, mask_XA):
    return jnp.where(mask_XA, tokens_XA, -1)


def same_answers(tokens_XA, mask_XA, tokens_YA, mask_YA) -> jax.Array:
    """[X, Y] True where candidate x and y have identical answers."""
    a, b = _keys(tokens_XA, mask_XA), _keys(tokens_YA, mask_YA)
    return jnp.all(a[:, None, :] == b[None, :, :], axis=-1)


def first_unique(tokens_XA, mask_XA, valid_X) -> jax.Array:
    """valid_X with later duplicates of an earlier valid candidate removed."""
    X = valid_X.shape[0]
    same_XX = same_answers(tokens_XA, mask_XA, tokens_XA, mask_XA)
    earlier_XX = jnp.arange(X)[None, :] < jnp.arange(X)[:, None]  # [j, i]: i < j
    return valid_X & ~jnp.any(same_XX & earlier_XX & valid_X[None, :], axis=-1)


def dedup_children(members: Population, children: Population) -> jax.Array:
    """valid_C of the children that differ from every valid member and every earlier child."""
    in_members_X = jnp.any(same_answers(children.tokens_XA, children.mask_XA,
                                        members.tokens_XA, members.mask_XA)
                           & members.valid_X[None, :], axis=-1)
    unique_X = first_unique(children.tokens_XA, children.mask_XA, children.valid_X)
    return unique_X & ~in_members_X


def take(pop: Population, idx) -> Population:
    """Slots `idx` (any shape of indices into the leading axis)."""
    return jax.tree.map(lambda x: x[idx], pop)


def replace_elitist(members: Population, children: Population) -> Population:
    """The best Q of members ∪ (de-duplicated) children; ties keep members, then earlier slots.

    Survivors age by one generation; children enter with age 0.
    """
    keep_X = dedup_children(members, children)
    children = clear_invalid(children._replace(valid_X=keep_X))
    both = jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=0), members, children)
    both = both._replace(age_X=jnp.concatenate([members.age_X + 1, children.age_X]))
    Q = members.valid_X.shape[0]
    _, idx_Q = jax.lax.top_k(both.fitness_X, Q)  # lower index first on ties
    return clear_invalid(take(both, idx_Q))


def select_parents(key, fitness_Q, valid_Q, *, num_calls: int, num_parents: int,
                   method: str, temperature: float, tournament_size: int
                   ) -> tuple[jax.Array, jax.Array]:
    """Parents of `num_calls` mutations → (idx_BU int32, present_BU bool).

    boltzmann: U distinct members drawn without replacement with probability ∝
      softmax(fitness / temperature) (Gumbel top-K). tournament: each parent is the fittest of
      `tournament_size` members drawn uniformly (with replacement) among the valid ones; a parent
      picked twice in one call is kept once. Empty slots are never present.
    """
    Q, B, U = fitness_Q.shape[0], num_calls, num_parents
    if method == "boltzmann":
        logits_Q = jnp.where(valid_Q, fitness_Q / temperature, -jnp.inf)
        g_BQ = jax.random.gumbel(key, (B, Q))
        _, idx_BU = jax.lax.top_k(logits_Q[None, :] + g_BQ, U)
    else:
        log_valid_Q = jnp.where(valid_Q, 0.0, -jnp.inf)
        entrant_logits = jnp.broadcast_to(log_valid_Q, (B, U, tournament_size, Q))
        entrants = jax.random.categorical(key, entrant_logits)
        best_BU = jnp.argmax(fitness_Q[entrants], axis=-1)
        idx_BU = jnp.take_along_axis(entrants, best_BU[..., None], axis=-1)[..., 0]
    idx_BU = idx_BU.astype(jnp.int32)
    earlier_UU = jnp.arange(U)[None, :] < jnp.arange(U)[:, None]
    repeat_BU = jnp.any((idx_BU[:, :, None] == idx_BU[:, None, :]) & earlier_UU[None], axis=-1)
    return idx_BU, valid_Q[idx_BU] & ~repeat_BU


def migrate(pop: Population, count: int) -> Population:
    """Ring migration over islands: the best `count` of island i replace the worst `count` of
    island i+1 (mod I). A migrant that is empty or already present in the destination is skipped
    (the destination keeps that slot)."""
    k = count
    order_IQ = jnp.argsort(-pop.fitness_X, axis=-1, stable=True)
    best_Ik, worst_Ik = order_IQ[:, :k], order_IQ[:, ::-1][:, :k]
    migrants = jax.tree.map(lambda x: jnp.take_along_axis(
        x, best_Ik.reshape(best_Ik.shape + (1,) * (x.ndim - 2)), axis=1), pop)
    incoming = jax.tree.map(lambda x: jnp.roll(x, 1, axis=0), migrants)
    present_Ik = jax.vmap(lambda a, am, b, bm, bv: jnp.any(
        same_answers(a, am, b, bm) & bv[None, :], axis=-1))(
        incoming.tokens_XA, incoming.mask_XA, pop.tokens_XA, pop.mask_XA, pop.valid_X)
    write_Ik = incoming.valid_X & ~present_Ik

    def put(dst, src):
        cur = jnp.take_along_axis(dst, worst_Ik.reshape(worst_Ik.shape + (1,) * (dst.ndim - 2)),
                                  axis=1)
        w = write_Ik.reshape(write_Ik.shape + (1,) * (dst.ndim - 2))
        new = jnp.where(w, src, cur)
        return jax.vmap(lambda d, i, n: d.at[i].set(n))(dst, worst_Ik, new)

    return jax.tree.map(put, pop, incoming)


def reset_weakest(pop: Population, count: int) -> Population:
    """Re-seed the `count` islands of lowest mean member fitness (empty islands first) with the
    global elites: the Q best distinct candidates over all islands."""
    I, Q = pop.valid_X.shape
    n_I = jnp.sum(pop.valid_X.astype(jnp.float32), axis=-1)
    mean_I = jnp.sum(jnp.where(pop.valid_X, pop.fitness_X, 0.0), axis=-1) / jnp.maximum(n_I, 1)
    mean_I = jnp.where(n_I > 0, mean_I, -jnp.inf)
    weakest = jnp.argsort(mean_I, stable=True)[:count]
    reset_I = jnp.zeros((I,), bool).at[weakest].set(True)
    flat = jax.tree.map(lambda x: x.reshape((I * Q,) + x.shape[2:]), pop)
    flat = clear_invalid(flat._replace(
        valid_X=first_unique(flat.tokens_XA, flat.mask_XA, flat.valid_X)))
    _, idx_Q = jax.lax.top_k(flat.fitness_X, Q)
    elites = take(flat, idx_Q)
    return jax.tree.map(
        lambda x, e: jnp.where(reset_I.reshape((I,) + (1,) * (x.ndim - 1)), e[None], x),
        pop, elites)
