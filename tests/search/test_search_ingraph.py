"""In-graph evolutionary search: operators on hand-made populations, exact budget, search vs
best-of-N with a random-edit policy stand-in, 8-device island sharding, LM prompts (plain and
mutation, any pad id), the real LM path."""

import dataclasses
import functools
import json
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vpo.config import ConfigError, model_preset
from vpo.model import sharding
from vpo.model.decoder import Decoder
from vpo.search import ingraph, population
from vpo.tasks import answers as answers_lib
from vpo.tasks import base, make_task
from vpo.tasks.bound import bind, seq_len_for
from vpo.tasks.prompts import mutation_text
from vpo.tasks.words import task_word_tokenizer

A, SYM = 6, 10
SYMBOLS = tuple(f"s{i}" for i in range(SYM))


class MatchArrays(NamedTuple):
    target: np.ndarray  # int32 [N, A] symbol ids


def make_match_task() -> base.Task:
    """Guess a hidden string of A symbols; reward a = symbol a is right (known optimum)."""

    def make_problems(seed, num):
        rng = np.random.default_rng(seed)
        return [{"target": [int(s) for s in rng.integers(0, SYM, A)]} for _ in range(num)]

    def arrays(records):
        return MatchArrays(np.asarray([r["target"] for r in records], np.int32).reshape(-1, A))

    def symbol_reward(problem, symbols_A, mask_A):
        return ((symbols_A == jnp.asarray(problem.target)) & mask_A).astype(jnp.float32)

    def hits(record, words):
        return [float(i < len(words) and words[i] == SYMBOLS[t])
                for i, t in enumerate(record["target"])]

    def score(records, answers):
        return base.score_symbol_answers(records, answers, SYMBOLS, A, A, hits)

    def demonstrations(record, rng, num_answers):
        return [" ".join(SYMBOLS[(t + j) % SYM] for t in record["target"])
                for j in range(num_answers)]

    return base.Task(
        name="match", reward_names=tuple(f"pos{i}" for i in range(A)),
        eval_weights_R=np.full((A,), 1.0 / A), make_problems=make_problems,
        statement=lambda r: "Guess the hidden string.", answer_hint="a guess: six symbols",
        score=score, solved=lambda r: jnp.all(r >= 1.0), demonstrations=demonstrations,
        symbols=SYMBOLS, answer_len=A, arrays=arrays, symbol_reward=symbol_reward,
        max_answers=4)


MATCH = make_match_task()
TASK = bind(MATCH, task_word_tokenizer(MATCH))


def match_problems(seed, num, num_answers):
    return ingraph.search_problems(TASK, TASK.make_problems(seed, num), num_answers)


def edit_propose(model, key, problem, parents_BUA, pmask_BUA, prew_BKR, fresh_B, *, task, cfg):
    """Policy stand-in (symbol ids): a random string where fresh, else one random point edit of
    a parent."""
    B, K, _ = parents_BUA.shape
    M = cfg.num_answers
    k_sym, k_par, k_pos = jax.random.split(key, 3)
    rand_BMA = jax.random.randint(k_sym, (B, M, A), 0, SYM)
    logits_BMK = jnp.broadcast_to(jnp.where(jnp.any(pmask_BUA, -1), 0.0, -jnp.inf)[:, None, :],
                                  (B, M, K))
    pick_BM = jax.random.categorical(k_par, logits_BMK)
    base_BMA = jnp.take_along_axis(parents_BUA, pick_BM[..., None], axis=1)
    pos_BM = jax.random.randint(k_pos, (B, M), 0, A)
    edit = jnp.arange(A)[None, None, :] == pos_BM[..., None]
    out = jnp.where(fresh_B[:, None, None] | edit, rand_BMA, base_BMA)
    return out.astype(jnp.int32), jnp.ones((B, M, A), bool)


def pop_of(rows, fitness, ids=None):
    """Hand-made population [X] of A-symbol answers (None = empty slot)."""
    X = len(rows)
    tok = np.zeros((X, A), np.int32)
    valid = np.array([r is not None for r in rows])
    for i, r in enumerate(rows):
        if r is not None:
            tok[i] = r
    f = np.where(valid, np.asarray(fitness, np.float32), -np.inf).astype(np.float32)
    ids = np.arange(X) if ids is None else np.asarray(ids)
    return population.Population(jnp.asarray(tok), jnp.asarray(np.repeat(valid[:, None], A, 1)),
                          jnp.asarray(np.repeat(f[:, None], 2, 1).clip(0)), jnp.asarray(f),
                          jnp.asarray(valid), jnp.zeros(X, jnp.int32),
                          jnp.asarray(np.where(valid, ids, -1), jnp.int32))


def row(v):
    return [v] * A


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="search.children"):
        ingraph.SearchConfig(children=3, num_answers=2)
    with pytest.raises(ConfigError, match="search.selection"):
        ingraph.SearchConfig(selection="roulette")
    with pytest.raises(ConfigError, match="search.migration_count"):
        ingraph.SearchConfig(members=4, migration_count=3)
    with pytest.raises(ConfigError, match="search.fresh_rate"):
        ingraph.SearchConfig(fresh_rate=1.5)
    assert ingraph.SearchConfig(islands=2, members=4, children=6, generations=3).budget == 44


def test_elitist_replacement_and_dedup():
    members = pop_of([row(5), row(6), None, row(7)], [0.5, 0.9, 0, 0.1], ids=[0, 1, 2, 3])
    # child 0 duplicates a member, child 2 duplicates child 1, child 3 is empty
    children = pop_of([row(6), row(8), row(8), None, row(9)], [0.9, 0.7, 0.7, 0, 0.3],
                      ids=[10, 11, 12, 13, 14])
    keep = np.asarray(population.dedup_children(members, children))
    assert keep.tolist() == [False, True, False, False, True]
    out = population.replace_elitist(members, children)
    assert np.asarray(out.id_X).tolist() == [1, 11, 0, 14]  # the best 4 distinct, best first
    np.testing.assert_allclose(out.fitness_X, [0.9, 0.7, 0.5, 0.3])
    assert np.asarray(out.age_X).tolist() == [1, 0, 1, 0]
    # a child tied with the worst member loses the tie
    full = pop_of([row(5), row(6), row(7), row(4)], [0.5, 0.9, 0.3, 0.3])
    same = population.replace_elitist(full, pop_of([row(9)], [0.3], ids=[20]))
    assert np.asarray(same.id_X).tolist() == [1, 0, 2, 3]
    # symbol id 0 is an ordinary symbol: answers differing only in a 0 are distinct, and the
    # same symbols under a shorter mask are a different (shorter) answer
    zeros = pop_of([row(0), [0] * (A - 1) + [1]], [0.5, 0.4])
    assert np.asarray(population.first_unique(zeros.tokens_XA, zeros.mask_XA,
                                       zeros.valid_X)).tolist() == [True, True]
    short = zeros._replace(tokens_XA=zeros.tokens_XA.at[1].set(0),
                           mask_XA=zeros.mask_XA.at[1, -1].set(False))
    assert np.asarray(population.first_unique(short.tokens_XA, short.mask_XA,
                                       short.valid_X)).tolist() == [True, True]


def test_selection_prefers_fitness_and_skips_empty_slots():
    f = jnp.array([0.1, 0.9, -jnp.inf, 0.5])
    v = jnp.array([True, True, False, True])
    for method, kw in [("boltzmann", dict(temperature=1e-3, tournament_size=1)),
                       ("tournament", dict(temperature=1.0, tournament_size=64))]:
        idx, present = population.select_parents(jax.random.key(0), f, v, num_calls=16,
                                                 num_parents=2, method=method, **kw)
        idx, present = np.asarray(idx), np.asarray(present)
        assert np.all(idx[:, 0] == 1) and np.all(present[:, 0])
        assert not np.any((idx == 2) & present)
    idx, present = population.select_parents(jax.random.key(1), f, v, num_calls=64, num_parents=4,
                                      method="boltzmann", temperature=1.0, tournament_size=1)
    assert np.asarray(present).sum(-1).tolist() == [3] * 64  # 3 valid distinct parents


def test_ring_migration_moves_exactly_the_best_k():
    isl = [pop_of([row(4 + 4 * i + j) for j in range(4)], [0.1, 0.4, 0.3, 0.2],
                  ids=[10 * i + j for j in range(4)]) for i in range(3)]
    pop = jax.tree.map(lambda *x: jnp.stack(x), *isl)
    out = population.migrate(pop, 2)
    ids = np.asarray(out.id_X)
    # island i receives ids {10(i-1)+1, 10(i-1)+2} into its two worst slots (0 and 3)
    for i in range(3):
        src = 10 * ((i - 1) % 3)
        assert sorted(ids[i].tolist()) == sorted([src + 1, src + 2, 10 * i + 1, 10 * i + 2])
        assert ids[i][1] == 10 * i + 1 and ids[i][2] == 10 * i + 2  # the best stay put
    # a migrant already present in the destination is skipped
    dup = pop._replace(tokens_XA=pop.tokens_XA.at[1, 0].set(pop.tokens_XA[0, 1]))
    ids = np.asarray(population.migrate(dup, 1).id_X)
    assert ids[1].tolist() == [10, 11, 12, 13]  # unchanged
    assert np.asarray(population.migrate(pop, 1).id_X)[1].tolist() == [1, 11, 12, 13]


def test_reset_seeds_weakest_island_with_global_elites():
    isl = [pop_of([row(4 + 4 * i + j) for j in range(4)], np.array([1, 2, 3, 4]) / (10 * (i + 1)),
                  ids=[10 * i + j for j in range(4)]) for i in range(3)]
    pop = jax.tree.map(lambda *x: jnp.stack(x), *isl)
    ids = np.asarray(population.reset_weakest(pop, 1).id_X)
    assert ids[0].tolist() == [0, 1, 2, 3] and ids[1].tolist() == [10, 11, 12, 13]
    assert ids[2].tolist() == [3, 2, 1, 13]  # global top-4 by fitness: .4, .3, .2, .2


CFG = ingraph.SearchConfig(islands=4, members=8, parents=2, children=8, generations=10,
                          migration_interval=2, migration_count=1, reset_interval=5,
                          reset_count=1, num_answers=2, selection="tournament")


@pytest.fixture(scope="module")
def match_runs():
    problems = match_problems(0, 4, CFG.num_answers)
    key = jax.random.key(0)
    return problems, {m: ingraph.run_method(key, m, None, TASK, problems, CFG,
                                           propose=edit_propose)
                      for m in ingraph.METHODS}


def test_probe_counts_children_against_their_best_selected_parent():
    # 3 calls of 2 children: a mutation call (parents 0.5 and 0.2), a fresh call judged against
    # its selected parent 0.4, a call without any parent (not counted)
    child_BM = jnp.array([[0.6, 0.5], [0.9, -jnp.inf], [1.0, 1.0]])
    parent_BU = jnp.array([[0.5, 0.2], [0.4, 0.0], [0.0, 0.0]])
    selected_BU = jnp.array([[True, True], [True, False], [False, False]])
    fresh_B = jnp.array([False, True, True])
    got = ingraph.probe_counts(child_BM, parent_BU, selected_BU, fresh_B)
    assert np.asarray(got).tolist() == [2, 1, 2, 1]  # 0.5 does not beat 0.5; -inf never beats


def test_the_search_trace_counts_every_call_with_parents(match_runs):
    _, runs = match_runs
    probe = np.asarray(runs["search"].trace.probe)  # [N, G + 1, 4]
    mutated, fresh = probe[..., 0], probe[..., 2]
    assert np.all(probe[:, 0] == 0)  # the initial population has no parents
    assert np.all(mutated[:, 1:] + fresh[:, 1:] == CFG.islands * CFG.children)
    assert np.all(probe[..., 1] <= mutated) and np.all(probe[..., 3] <= fresh)
    assert mutated.sum() > fresh.sum() > 0  # fresh_rate 1/6 of the calls
    assert not np.asarray(runs["best_of_n"].trace.probe).any()  # no parents, nothing counted


def test_budget_accounting_is_exact_and_equal_across_methods(match_runs):
    problems, runs = match_runs
    want = [CFG.islands * (CFG.members + g * CFG.children) for g in range(CFG.generations + 1)]
    for method, (trace, state, _, _) in runs.items():
        assert np.asarray(trace.evaluated).tolist() == [want] * 4, method
        assert np.asarray(state.evaluated).tolist() == [CFG.budget] * 4
        best = np.asarray(trace.best_fitness)
        assert np.all(np.diff(best, axis=-1) >= 0), method  # best-so-far never drops
    state = runs["search"].state
    pop = state.population
    np.testing.assert_array_equal(np.asarray(pop.fitness_X).max(axis=(1, 2)),
                                  np.asarray(state.best_fitness))  # elitism keeps the best
    ids = np.asarray(pop.id_X)
    assert np.all((ids >= 0) & (ids < CFG.budget))
    for n in range(4):  # no duplicates inside an island
        for i in range(CFG.islands):
            keys = {tuple(t) for t in np.asarray(pop.tokens_XA[n, i])}
            assert len(keys) == CFG.members
    # members are symbol ids whose in-graph rewards equal the task's host scorer on their text
    tok, msk = np.asarray(pop.tokens_XA[0]), np.asarray(pop.mask_XA[0])
    assert np.all((tok >= 0) & (tok < SYM)) and msk.all()
    records = TASK.make_problems(0, 4)
    texts = [[TASK.symbols_text(t, m)] for t, m in zip(tok.reshape(-1, A), msk.reshape(-1, A),
                                                         strict=True)]
    host, valid = MATCH.score([records[0]] * len(texts), texts)
    assert valid.all()
    np.testing.assert_array_equal(host[:, 0], np.asarray(pop.rewards_XR[0]).reshape(-1, A))


def test_make_search_init_and_step_are_the_search_run_method_runs():
    """The evosax shape: init(key, problem) then step(key, state) per generation, jitted,
    give the final state of run_search's one-jit scan (same keys)."""
    cfg = ingraph.SearchConfig(islands=2, members=4, parents=2, children=4, generations=2,
                              migration_interval=1, num_answers=2)
    problems = match_problems(0, 1, cfg.num_answers)
    want = ingraph.run_search(jax.random.key(0), None, TASK,
                             jax.tree.map(lambda x: x[0], problems), cfg,
                             propose=edit_propose).state
    init, step = ingraph.make_search(TASK, cfg, functools.partial(edit_propose, None, task=TASK,
                                                                 cfg=cfg))
    k_init, k_run = jax.random.split(jax.random.fold_in(jax.random.key(0), 0))
    state = jax.jit(init)(k_init, jax.tree.map(lambda x: jnp.asarray(x)[0], problems))
    step = jax.jit(step)
    for k in jax.random.split(k_run, cfg.generations):
        state = step(k, state)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_search_beats_best_of_n_at_equal_budget(match_runs):
    _, runs = match_runs
    s, b = runs["search"].trace, runs["best_of_n"].trace
    assert np.asarray(s.solved)[:, -1].sum() > np.asarray(b.solved)[:, -1].sum()
    assert np.asarray(s.best_fitness)[:, -1].mean() > np.asarray(b.best_fitness)[:, -1].mean()
    assert np.all(np.asarray(s.diversity) >= 0)


def test_islands_sharded_on_8_devices_match_single_device():
    cfg = ingraph.SearchConfig(islands=8, members=4, parents=2, children=4, generations=3,
                              migration_interval=1, num_answers=2)
    problems = match_problems(1, 2, cfg.num_answers)
    mesh = sharding.make_mesh()
    key = jax.random.key(3)
    one = ingraph.run_method(key, "search", None, TASK, problems, cfg, propose=edit_propose)
    many = ingraph.run_method(key, "search", None, TASK, problems, cfg, propose=edit_propose,
                             mesh=mesh)
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(many), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    tok = many.state.population.tokens_XA
    assert len(tok.sharding.device_set) == 8 and not tok.sharding.is_fully_replicated
    with pytest.raises(ConfigError, match="search.islands"):
        ingraph.run_method(key, "search", None, TASK, problems,
                          ingraph.SearchConfig(islands=4, members=4, children=4),
                          propose=edit_propose, mesh=mesh)


def test_host_scored_task_is_refused():
    task = make_task("arithmetic")
    task = bind(task, task_word_tokenizer(task))
    with pytest.raises(ValueError, match="scores on the host"):
        ingraph.run_method(jax.random.key(0), "search", None, task, {}, CFG, propose=edit_propose)
    with pytest.raises(ValueError, match="scores on the host"):
        ingraph.search_problems(task, task.make_problems(0, 2), 2)


@pytest.fixture(scope="module")
def program_task():
    task = make_task("program", difficulty="easy")
    return bind(task, task_word_tokenizer(task))


def _words(text):
    """The words of a text as the word-level tokenizer splits it (answer tags first)."""
    tags = "(" + "|".join(re.escape(t) for t in answers_lib.tag_strings()) + ")"
    return [w for piece in re.split(tags, text) for w in piece.split()]


def _pad_is_first_word(bound):
    """The same words without BOS, the pad id an ordinary word: the first word of every prompt
    (so no mask can be recovered from token values)."""
    tok = bound.tokenizer
    first = tok.encode(bound.task.statement(bound.make_problems(0, 1)[0]))[0]
    return bind(bound.task, dataclasses.replace(tok, add_bos=False, bos_id=None, pad_id=first))


@pytest.mark.parametrize("pad", ["<pad>", "first word"])
def test_lm_prompts_are_plain_prompts_or_mutation_text(program_task, pad):
    task = program_task if pad == "<pad>" else _pad_is_first_word(program_task)
    tok = task.tokenizer
    m, K = 2, 3
    cfg = ingraph.SearchConfig(members=6, parents=K, children=6, num_answers=m)
    records = task.make_problems(5, 1)
    problems = ingraph.search_problems(task, records, m)
    problem = jax.tree.map(lambda x: jnp.asarray(x[0]), problems)
    rng = np.random.default_rng(0)
    demos = task.task.demonstrations(records[0], rng, 3)
    # row 0 fresh (its parents are ignored); row 1 three parents; row 2 the middle slot absent
    # (a repeated pick); row 3 only the last slot; row 4 no parent at all but not fresh
    slots = [demos, demos[::-1], [demos[0], None, demos[2]], [None, None, demos[1]],
             [None] * K]
    fresh_B = np.array([True, False, False, False, False])
    sym_BUA, mask_BKA = task.parent_symbols([[d or "" for d in s] for s in slots], K)
    rew_BKR = (rng.integers(0, 11, (len(slots), K, task.num_rewards)) / 10
               + rng.uniform(-0.03, 0.03, (len(slots), K, task.num_rewards))).astype(np.float32)
    rew_BKR[1, :2] = np.arange(0.05, 1.0, 0.1).reshape(2, 5)  # half-way tenths, as float32
    build = jax.jit(functools.partial(ingraph.lm_prompts, task, cfg))
    prompts_BP, mask_BP = (np.asarray(x) for x in build(problem, sym_BUA, mask_BKA, rew_BKR,
                                                        fresh_B))
    P = ingraph.prompt_len(task, problems, cfg, K)
    assert prompts_BP.shape == mask_BP.shape == (len(slots), P)
    for b, row_slots in enumerate(slots):
        n = int(mask_BP[b].sum())
        assert mask_BP[b].tolist() == [False] * (P - n) + [True] * n, b  # left-padded
        assert np.all(prompts_BP[b][~mask_BP[b]] == tok.pad_id), b
        ids = prompts_BP[b][mask_BP[b]].tolist()
        if fresh_B[b]:
            assert ids == task.prompt_ids(records[0], m)
            assert ids == problems["prompt_P"][0][problems["prompt_mask_P"][0]].tolist()
            continue
        parents = [(d, rew_BKR[b, k].tolist()) for k, d in enumerate(row_slots) if d]
        text = mutation_text(task.task, records[0], parents, m)
        assert _words(tok.decode(ids)) == _words(text), b
        assert ids == tok.prompt_ids(text), b
        for k, (d, _) in enumerate(parents, 1):  # present parents are numbered 1, 2, ...
            assert f"Answer {k}: {d} | scores:" in text


@pytest.mark.slow
@pytest.mark.heavy  # ~7 min on 2 loaded cores (a program-task SFT warm start, then search)
def test_lm_end_to_end_on_program_task(program_task, tmp_path):
    task = program_task
    cfg = ingraph.SearchConfig(islands=2, members=2, parents=1, children=2, generations=2,
                              migration_interval=1, num_answers=2, temperature=1.0)
    records = task.make_problems(0, 2)
    problems = ingraph.search_problems(task, records, cfg.num_answers)
    need = seq_len_for(task, records, cfg.num_answers, num_parents=cfg.parents)
    model = Decoder(model_preset("tiny", vocab_size=task.tokenizer.size, max_seq_len=need),
                    rngs=nnx.Rngs(0))
    key = jax.random.key(0)
    traces = {}
    for method in ingraph.METHODS:
        trace, state, _, _ = ingraph.run_method(key, method, model, task, problems, cfg)
        assert np.asarray(trace.evaluated).tolist() == [[4, 8, 12]] * 2
        assert np.asarray(state.evaluated).tolist() == [cfg.budget] * 2
        traces[method] = trace
    trace, state, _, _ = ingraph.run_search(key, model, task,
                                           jax.tree.map(lambda x: x[0], problems), cfg)
    pop = state.population
    assert pop.tokens_XA.shape == (2, 2, task.answer_len) and int(state.evaluated) == 12
    f, v = np.asarray(pop.fitness_X), np.asarray(pop.valid_X)
    assert np.all(np.where(v, (f >= 0) & (f <= 1), np.isneginf(f)))
    tok, msk = np.asarray(pop.tokens_XA), np.asarray(pop.mask_XA)
    assert np.all((tok >= 0) & (tok < len(task.task.symbols)))
    for i, q in zip(*np.nonzero(v), strict=True):  # valid members: host score of their text
        host, ok = task.task.score([records[0]], [[task.symbols_text(tok[i, q], msk[i, q])]])
        assert ok[0, 0]
        np.testing.assert_array_equal(host[0, 0], np.asarray(pop.rewards_XR[i, q]))
    json_path, png = ingraph.write_search_traces(str(tmp_path), traces)
    with open(json_path) as fh:
        summary = json.load(fh)
    assert summary["search"]["evaluated"] == [4, 8, 12]
    assert png == str(tmp_path / "search_solved.png") and (tmp_path / "search_solved.png").exists()
    with pytest.raises(ConfigError, match="max_seq_len"):
        small = Decoder(model_preset("tiny", vocab_size=task.tokenizer.size,
                                     max_seq_len=need - 1), rngs=nnx.Rngs(0))
        ingraph.run_method(key, "search", small, task, problems, cfg)


@pytest.mark.slow
def test_lm_search_through_refilled_slots_gives_the_same_population(program_task, monkeypatch):
    """`search.num_slots` reaches the mutation operator's sampler: 1 slot for the 2 rows of a
    generation is refilled and gives the population of every row at once."""
    from vpo.rollout import slots

    task = program_task
    cfg = ingraph.SearchConfig(islands=2, members=2, parents=1, children=2, generations=2,
                              migration_interval=1, num_answers=2, temperature=1.0)
    records = task.make_problems(0, 2)
    problems = jax.tree.map(lambda x: x[0], ingraph.search_problems(task, records,
                                                                   cfg.num_answers))
    need = seq_len_for(task, records, cfg.num_answers, num_parents=cfg.parents)
    model = Decoder(model_preset("tiny", vocab_size=task.tokenizer.size, max_seq_len=need),
                    rngs=nnx.Rngs(0))
    key = jax.random.key(0)
    pop = ingraph.run_search(key, model, task, problems, cfg)[1].population
    traced = []
    real = slots.generate_slots
    monkeypatch.setattr(slots, "generate_slots", lambda *a, **k: traced.append(
        k["num_slots"]) or real(*a, **k))
    slot_pop = ingraph.run_search(key, model, task, problems,
                                 dataclasses.replace(cfg, num_slots=1))[1].population
    assert traced and set(traced) == {1}
    np.testing.assert_array_equal(np.asarray(slot_pop.tokens_XA), np.asarray(pop.tokens_XA))
