"""Search on host-scored tasks (a user's reward functions, arithmetic): the island search of
`vpo.search.ingraph` with the scorer between generations instead of inside the graph.

The algorithm and the budget are those of `vpo.search.ingraph` (Mind Evolution, Lee et al., arXiv
2501.09891): I islands of Q members, parents chosen by `population.select_parents`, children
written by the policy from a text mutation prompt (`tasks.prompts.mutation_text`: the parents and
their scores written out), elitist replacement, ring migration and resets, all through the same
population operators. What differs is where a candidate lives: its answer text is kept on the
host, and the population holds its id in a table of distinct texts (an answer of one "symbol"),
so identical texts are the same candidate and de-duplication works unchanged. One generation is
one batched sampler call for all problems and islands, one batched call of the task's scorer,
and small jitted population updates. Baselines at the same candidate budget: best-of-N (fresh
prompts only) and sequential revision (one lineage's best as the single parent).

Returns the same `SearchResult` as the in-graph search (`vpo.search.ingraph.run_method`), so
`summarize` and `write_search_traces` serve both; `vpo.search.methods.run_all_methods` dispatches.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vpo.config import SamplerConfig
from vpo.env.task import EnvTask
from vpo.errors import ConfigError
from vpo.eval import metrics
from vpo.rollout.slots import sample_with_keys
from vpo.search import population as ops
from vpo.search.episodes import EpisodeProposer
from vpo.search.ingraph import SearchConfig, SearchResult, SearchTrace, check_method
from vpo.search.padding import left_pad_rows
from vpo.search.population import Population
from vpo.tasks.base import Record
from vpo.tasks.bound import BoundTask, for_kind
from vpo.tasks.prompts import mutation_text, prompt_text

Parents = Sequence[tuple[str, Sequence[float]]]


class TextTable:
    """Distinct answer texts ↔ int32 ids (the population's one-symbol answers)."""

    def __init__(self):
        self.texts: list[str] = []
        self._ids: dict[str, int] = {}

    def id_of(self, text: str) -> int:
        if text not in self._ids:
            self._ids[text] = len(self.texts)
            self.texts.append(text)
        return self._ids[text]



class Proposer:
    """The policy as mutation operator on text: prompts → m answers each, scored on the host.

    `__call__(records, parents, key)` takes one record and one parent list per call (an empty
    list asks with the plain task prompt) → (ids_Bm int32, rewards_BmR, valid_Bm), flattened
    over calls then answers.
    """

    def __init__(self, model, task: BoundTask, table: TextTable, cfg: SearchConfig,
                 max_new_tokens: int):
        self.model, self.task, self.table, self.cfg = model, task, table, cfg
        self.sampler = SamplerConfig(max_new_tokens=max_new_tokens, num_samples=1,
                                     temperature=cfg.temperature, top_p=cfg.top_p,
                                     num_slots=cfg.num_slots)

    @staticmethod
    def check_answers(task: BoundTask, num_answers: int) -> None:
        """A ConfigError unless the task takes m answers per generation."""
        task.check_num_answers(num_answers)

    def prompt(self, record: Record, parents: Parents) -> list[int]:
        m, task = self.cfg.num_answers, self.task.task
        content = (mutation_text(task, record, parents, m) if parents
                   else prompt_text(task, record, m))
        return self.task.tokenizer.prompt_ids(content)

    def __call__(self, records: Sequence[Record], parents: Sequence[Parents], key):
        m, tok = self.cfg.num_answers, self.task.tokenizer
        rows = [self.prompt(r, p) for r, p in zip(records, parents, strict=True)]
        prompts_BP, mask_BP = left_pad_rows(rows, tok.pad_id, self.model.cfg.max_seq_len,
                                            self.sampler.max_new_tokens)
        B = len(rows)
        keys_B1 = jax.random.split(key, B).reshape(B, 1)
        roll = sample_with_keys(self.model, prompts_BP, mask_BP, keys_B1, self.sampler,
                                stop_ids=tok.stop_ids, pad_id=tok.pad_id)
        texts = self.task.completion_texts(np.asarray(roll.tokens_BGT[:, 0]),
                                           np.asarray(roll.mask_BGT[:, 0]))
        answers = [self.task.parse_text(t, m) for t in texts]
        rewards_BMR, valid_BM = self.task.task.score(list(records), answers)
        rewards_BMR = np.asarray(rewards_BMR, np.float32).reshape(B, m, -1)
        valid_BM = np.asarray(valid_BM, bool).reshape(B, m)
        ids_BM = np.full((B, m), -1, np.int32)
        for b in range(B):
            for j in range(m):
                if valid_BM[b, j]:
                    ids_BM[b, j] = self.table.id_of(answers[b][j].strip())
        return ids_BM.reshape(-1), rewards_BMR.reshape(B * m, -1), valid_BM.reshape(-1)


def _population(ids_X, rewards_XR, valid_X, weights_R, first_id: int) -> Population:
    """Candidates as population slots (answer = its text id, one symbol)."""
    X = ids_X.shape[0]
    return ops.clear_invalid(Population(
        jnp.maximum(ids_X, 0)[:, None], valid_X[:, None], rewards_XR,
        ops.fitness(rewards_XR, valid_X, weights_R), valid_X, jnp.zeros((X,), jnp.int32),
        first_id + jnp.arange(X, dtype=jnp.int32)))


@functools.partial(jax.jit, static_argnames=("num_calls", "cfg"))
def _select_parents(keys_NI, fitness_NIQ, valid_NIQ, *, num_calls: int, cfg: SearchConfig):
    """Parents of every problem's and island's calls → (idx_NIBU, present_NIBU, fresh_NIB)."""
    select = functools.partial(
        ops.select_parents, num_calls=num_calls, num_parents=cfg.parents, method=cfg.selection,
        temperature=cfg.selection_temperature, tournament_size=cfg.tournament_size)
    idx, present = jax.vmap(jax.vmap(select))(keys_NI, fitness_NIQ, valid_NIQ)
    k_fresh = jax.vmap(jax.vmap(lambda k: jax.random.fold_in(k, 1)))(keys_NI)
    fresh = jax.vmap(jax.vmap(lambda k: jax.random.bernoulli(k, cfg.fresh_rate, (num_calls,))))(
        k_fresh) | ~jnp.any(present, -1)
    return idx, present & ~fresh[..., None], fresh


_replace_all = jax.jit(jax.vmap(jax.vmap(ops.replace_elitist)))


@functools.partial(jax.jit, static_argnames=("migrate", "reset", "cfg"))
def _island_ops(pop: Population, *, migrate: bool, reset: bool, cfg: SearchConfig):
    if migrate:
        pop = jax.vmap(lambda p: ops.migrate(p, cfg.migration_count))(pop)
    if reset:
        pop = jax.vmap(lambda p: ops.reset_weakest(p, cfg.reset_count))(pop)
    return pop


class _Tracker:
    """Best-so-far, solved flag and candidates evaluated per problem; the trace points."""

    def __init__(self, task: BoundTask, n: int, bar=None):
        self.task, self.n, self.bar = task, n, bar  # bar: ticked once per trace point
        self.best_N = np.full((n,), -np.inf, np.float32)
        self.best_id_N = np.full((n,), -1, np.int64)  # the best answer's TextTable id
        self.best_rewards_NR = np.zeros((n, task.num_rewards), np.float32)
        self.solved_N = np.zeros((n,), bool)
        self.evaluated = 0
        self.points: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]] = []

    def record(self, ids_NX, rewards_NXR, valid_NX):
        fit_NX = np.where(valid_NX, rewards_NXR @ self.task.eval_weights_R, -np.inf)
        j_N = fit_NX.argmax(-1)
        rows = np.arange(self.n)
        better = fit_NX[rows, j_N] > self.best_N
        self.best_id_N[better] = np.asarray(ids_NX)[rows, j_N][better]
        self.best_rewards_NR[better] = np.asarray(rewards_NXR)[rows, j_N][better]
        self.best_N = np.maximum(self.best_N, fit_NX.max(-1))
        solved = np.asarray(jax.vmap(jax.vmap(self.task.solved))(jnp.asarray(rewards_NXR)))
        self.solved_N |= np.any(solved & valid_NX, -1)
        self.evaluated += valid_NX.shape[1]

    def point(self, diversity_N):
        self.points.append((self.best_N.copy(), self.solved_N.copy(), np.asarray(diversity_N),
                            self.evaluated))
        if self.bar is not None:
            self.bar.set_postfix(solved=f"{int(self.solved_N.sum())}/{self.n}", refresh=False)
            self.bar.update(1)

    def best_answers(self, texts: Sequence[str]) -> list[dict | None]:
        """Per problem the best answer found: its text, reward vector and w*ᵀr (None: no
        valid answer)."""
        return [None if i < 0 else {"answer": texts[i], "fitness": float(self.best_N[n]),
                                    "rewards": self.best_rewards_NR[n].tolist()}
                for n, i in enumerate(self.best_id_N)]

    def trace(self) -> SearchTrace:
        best, solved, div, ev = zip(*self.points, strict=True)
        return SearchTrace(np.stack(best, 1), np.stack(solved, 1), np.stack(div, 1),
                           np.tile(np.asarray(ev, np.int32), (self.n, 1)))


def _island_diversity(pop_NIQ: Population):
    return np.asarray(jnp.mean(jax.vmap(metrics.reward_diversity)(
        pop_NIQ.rewards_XR, pop_NIQ.valid_X), axis=-1))


def _propose_grid(propose: Proposer, records, parent_lists, key, lead: tuple[int, ...]):
    """One sampler call for every (problem, ...) row of `parent_lists` (flattened in C order
    with the records repeated) → Population with leading `lead` + (calls·m,)."""
    n = len(records)
    per = len(parent_lists) // n
    recs = [records[i // per] for i in range(len(parent_lists))]
    ids_X, rewards_XR, valid_X = propose(recs, parent_lists, key)
    m, R = propose.cfg.num_answers, rewards_XR.shape[-1]
    shape = (*lead, per // int(np.prod(lead[1:], dtype=int)) * m)
    return (ids_X.reshape(shape), rewards_XR.reshape(*shape, R), valid_X.reshape(shape))


def _parents_of(table: TextTable, pop_NIQ: Population, idx_NIBU, present_NIBU):
    """Parent lists (text, rewards) of every call, in (N, I, B) order."""
    tokens = np.asarray(pop_NIQ.tokens_XA[..., 0])
    rewards = np.asarray(pop_NIQ.rewards_XR)
    N, I, B, U = idx_NIBU.shape
    out = []
    for n in range(N):
        for i in range(I):
            for b in range(B):
                out.append([(table.texts[tokens[n, i, idx_NIBU[n, i, b, k]]],
                             rewards[n, i, idx_NIBU[n, i, b, k]].tolist())
                            for k in range(U) if present_NIBU[n, i, b, k]])
    return out


def _search(propose: Proposer, records, cfg: SearchConfig, key, tracker: _Tracker):
    N, I, m = len(records), cfg.islands, cfg.num_answers
    w = propose.task.eval_weights_R
    table = propose.table
    k_init, k_run = jax.random.split(key)
    ids, rew, val = _propose_grid(propose, records, [[]] * (N * I * (cfg.members // m)), k_init,
                                  (N, I))
    tracker.record(ids.reshape(N, -1), rew.reshape(N, -1, rew.shape[-1]), val.reshape(N, -1))
    kids = jax.vmap(jax.vmap(lambda a, r, v: _population(a, r, v, w, 0)))(ids, rew, val)
    empty = jax.tree.map(lambda x: jnp.broadcast_to(x, (N, I) + x.shape),
                         ops.empty_population((cfg.members,), 1, rew.shape[-1]))
    pop = _replace_all(empty, kids)
    tracker.point(_island_diversity(pop))
    B = cfg.children // m
    for g, k in enumerate(jax.random.split(k_run, cfg.generations), 1):
        k_sel, k_prop = jax.random.split(k)
        keys_NI = jax.random.split(k_sel, N * I).reshape(N, I)
        idx, present, fresh = jax.device_get(_select_parents(keys_NI, pop.fitness_X, pop.valid_X,
                                                        num_calls=B, cfg=cfg))
        parents = _parents_of(table, pop, idx, present & ~fresh[..., None])
        ids, rew, val = _propose_grid(propose, records, parents, k_prop, (N, I))
        tracker.record(ids.reshape(N, -1), rew.reshape(N, -1, rew.shape[-1]),
                       val.reshape(N, -1))
        kids = jax.vmap(jax.vmap(lambda a, r, v: _population(a, r, v, w, 0)))(ids, rew, val)
        pop = _replace_all(pop, kids)
        pop = _island_ops(
            pop, migrate=bool(cfg.migration_interval and cfg.migration_count and I > 1
                              and g % cfg.migration_interval == 0),
            reset=bool(cfg.reset_interval and cfg.reset_count and g % cfg.reset_interval == 0),
            cfg=cfg)
        tracker.point(_island_diversity(pop))


def _pool_diversity(rew_NXR, val_NX):
    return np.asarray(metrics.reward_diversity(jnp.asarray(rew_NXR), jnp.asarray(val_NX)))


def _best_of_n(propose: Proposer, records, cfg: SearchConfig, key, tracker: _Tracker):
    N, m = len(records), cfg.num_answers
    k_init, k_run = jax.random.split(key)
    calls = [cfg.islands * cfg.members // m] + [cfg.islands * cfg.children // m] * cfg.generations
    for c, k in zip(calls, [k_init, *jax.random.split(k_run, cfg.generations)], strict=True):
        ids, rew, val = _propose_grid(propose, records, [[]] * (N * c), k, (N,))
        tracker.record(ids, rew, val)
        tracker.point(_pool_diversity(rew, val))


def _revision(propose: Proposer, records, cfg: SearchConfig, key, tracker: _Tracker):
    """H = I·Q/m lineages from fresh samples (best of each call's m); each step I·C/m calls,
    round-robin over lineages, the lineage's best as the single parent; a lineage keeps its
    best candidate."""
    N, m = len(records), cfg.num_answers
    H, B = cfg.islands * cfg.members // m, cfg.islands * cfg.children // m
    w = propose.task.eval_weights_R
    k_init, k_run = jax.random.split(key)
    ids, rew, val = _propose_grid(propose, records, [[]] * (N * H), k_init, (N,))
    tracker.record(ids, rew, val)
    fit = np.where(val, rew @ w, -np.inf).reshape(N, H, m)
    j = fit.argmax(-1)
    pick = lambda x: np.take_along_axis(x.reshape(N, H, m, *x.shape[2:]),  # noqa: E731
                                        j.reshape(N, H, 1, *([1] * (x.ndim - 2))), 2)[:, :, 0]
    line_ids, line_rew, line_fit = pick(ids), pick(rew), fit.max(-1)
    tracker.point(_pool_diversity(line_rew, np.isfinite(line_fit)))
    for t, k in enumerate(jax.random.split(k_run, cfg.generations)):
        line_B = (t * B + np.arange(B)) % H
        parents = [[(propose.table.texts[line_ids[n, h]], line_rew[n, h].tolist())]
                   if np.isfinite(line_fit[n, h]) else [] for n in range(N) for h in line_B]
        ids, rew, val = _propose_grid(propose, records, parents, k, (N,))
        tracker.record(ids, rew, val)
        fit_NX = np.where(val, rew @ w, -np.inf)
        for b, h in enumerate(line_B):
            sl = slice(b * m, (b + 1) * m)
            jb = fit_NX[:, sl].argmax(-1)
            better = fit_NX[:, sl].max(-1) > line_fit[:, h]
            line_ids[better, h] = ids[:, sl][better, jb[better]]
            line_rew[better, h] = rew[:, sl][better, jb[better]]
            line_fit[better, h] = fit_NX[:, sl].max(-1)[better]
        tracker.point(_pool_diversity(line_rew, np.isfinite(line_fit)))


_METHODS = {"search": _search, "best_of_n": _best_of_n, "revision": _revision}

# the mutation operator of each task kind: text answers scored by the task (any task), or on
# an environment one episode per candidate (`vpo.search.episodes`)
PROPOSERS = {BoundTask: Proposer, EnvTask: EpisodeProposer}


def run_host_method(key, method: str, model, task: BoundTask, records: Sequence[Record],
                    cfg: SearchConfig, *, max_new_tokens: int | None = None,
                    progress: bool = False) -> SearchResult:
    """Run `method` ("search" | "best_of_n" | "revision") on the host-scored `task` for every
    record at the budget `cfg.budget` → `SearchResult`: the trace with leading N, the distinct
    answer texts seen, and per record the best answer found (`_Tracker.best_answers`: text,
    reward vector, w*ᵀr; None when none was valid).

    `max_new_tokens`: the generation budget (default: the task's budget for m answers;
    `vpo.launch.rules.completion_budget` is the commands' rule; on an environment task
    (`vpo.search.episodes`) an episode's token budget, each candidate one episode).
    `progress`: a bar over the generations on stderr (the initial population counts as one).
    """
    import tqdm

    check_method(method)
    make = for_kind(PROPOSERS, task)
    make.check_answers(task, cfg.num_answers)
    T = max_new_tokens or task.completion_len(cfg.num_answers)
    table = TextTable()
    propose = make(model, task, table, cfg, T)
    # a parent is an answer the policy wrote (≤ T tokens), so this bounds every prompt
    empty = [("", [0.0] * task.num_rewards)] * cfg.parents
    need = max(len(propose.prompt(r, empty)) for r in records) + cfg.parents * T + T
    if need > model.cfg.max_seq_len:
        raise ConfigError(f"model.max_seq_len: search prompts with {cfg.parents} parents of up "
                          f"to {T} tokens, plus {T} new tokens, need {need} positions; got "
                          f"{model.cfg.max_seq_len} (lower search.parents or the generation "
                          "budget)")
    with tqdm.tqdm(total=cfg.generations + 1, desc=method, unit="gen",
                   disable=not progress) as bar:
        tracker = _Tracker(task, len(records), bar)
        _METHODS[method](propose, list(records), cfg, key, tracker)
    return SearchResult(tracker.trace(), texts=table.texts,
                        best=tracker.best_answers(table.texts))
