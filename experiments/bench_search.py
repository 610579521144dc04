"""Evolutionary search throughput: one jit (lax.scan over generations) vs a host-driven loop.

Run:  python experiments/bench_search.py            (add --quick for a short smoke run)

Both arms run the same search (same model, task, problem, config, keys and candidate budget) on
the program task, bound to its built-in word-level tokenizer, with a randomly initialised
decoder. The host arm is the usual driver: per generation, a jitted parent-selection +
prompt-building call, the library's jitted sampler (`vpo.rollout.sampler.generate` under jit), a
jitted answer-reading (symbol ids) + reward + replacement + migration call, and a device→host read
of the best fitness (logging / early stop). Compile time is measured separately (first
call); throughput = candidates evaluated per second, median over repetitions. No assertions.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
from bench_sampler import time_calls  # experiments/ is sys.path[0] when run as a script
from flax import nnx

from vpo.config import model_preset
from vpo.model.decoder import Decoder
from vpo.rollout.sampler import generate
from vpo.search import ingraph, population
from vpo.tasks import make_task
from vpo.tasks.bound import bind, seq_len_for
from vpo.tasks.words import task_word_tokenizer


def get_config(quick: bool):
    """Two points: a mid-size population, and a small one where per-generation work is tiny
    (so the host loop's per-generation dispatch and sync dominate)."""
    gens = 4 if quick else 16
    points = [dict(islands=4, members=8, children=8), dict(islands=2, members=2, children=2)]
    return dict(searches=[ingraph.SearchConfig(parents=2 if p["members"] > 2 else 1,
                                              generations=gens, migration_interval=2,
                                              migration_count=1, num_answers=2, **p)
                          for p in points[:1 if quick else 2]],
                preset="tiny", repeats=2 if quick else 5)


@functools.partial(jax.jit, static_argnames=("task", "cfg"))
def select_and_prompt(task, cfg, state, key, problem):
    idx_IBU, present_IBU, fresh_IB, k_prop = ingraph.select_step(cfg, state, key)
    I, B, K = idx_IBU.shape
    par = jax.vmap(population.take)(state.population, idx_IBU)
    flat = lambda x: x.reshape((I * B,) + x.shape[2:])  # noqa: E731
    prompts_BP, mask_BP = ingraph.lm_prompts(
        task, cfg, problem, flat(par.tokens_XA), flat(par.mask_XA & present_IBU[..., None]),
        flat(par.rewards_XR), flat(fresh_IB))
    keys_B1 = jax.random.split(k_prop, I * B).reshape(I * B, 1)
    return idx_IBU, present_IBU, fresh_IB, prompts_BP, mask_BP, keys_B1


@functools.partial(jax.jit, static_argnames=("task", "cfg"))
def score_and_replace(task, cfg, state, idx_IBU, present_IBU, fresh_IB, tokens_BT, mask_BT,
                      problem):
    answers = ingraph.split_completions(task, cfg, tokens_BT, mask_BT)
    state = ingraph.absorb(task, cfg, None, lambda *a: answers, state, idx_IBU, present_IBU,
                          fresh_IB, jax.random.key(0))
    return ingraph.island_step(cfg, state)


@functools.partial(jax.jit, static_argnames=("graphdef", "task", "cfg"))
def init_jit(graphdef, params, task, cfg, problem, key):
    propose = functools.partial(ingraph.lm_propose, nnx.merge(graphdef, params), task=task,
                                cfg=cfg)
    init, _ = ingraph.make_search(task, cfg, propose)
    return init(key, problem)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "stop_ids", "pad_id"))
def generate_jit(graphdef, params, prompts_BP, mask_BP, keys_BG, temperature, top_p, top_k, *,
                 max_new_tokens, stop_ids, pad_id):
    return generate(nnx.merge(graphdef, params), prompts_BP, mask_BP, keys_BG, temperature,
                    top_p, top_k, max_new_tokens=max_new_tokens, stop_ids=stop_ids,
                    pad_id=pad_id)


def host_loop(model, task, problem, cfg, key):
    """The same search, one Python iteration (3 dispatches + 1 host read) per generation."""
    graphdef, params = nnx.split(model)
    k_init, k_run = jax.random.split(jax.random.fold_in(key, 0))
    state = init_jit(graphdef, params, task, cfg, problem, k_init)
    best = []
    for k in jax.random.split(k_run, cfg.generations):
        idx, present, fresh, prompts, mask, keys = select_and_prompt(task, cfg, state, k, problem)
        roll = generate_jit(graphdef, params, prompts, mask, keys, jnp.float32(cfg.temperature),
                             jnp.float32(cfg.top_p), jnp.int32(0),
                             max_new_tokens=task.completion_len(cfg.num_answers),
                             stop_ids=task.tokenizer.stop_ids, pad_id=task.tokenizer.pad_id)
        state = score_and_replace(task, cfg, state, idx, present, fresh, roll.tokens_BGT[:, 0],
                                  roll.mask_BGT[:, 0], problem)
        best.append(float(state.best_fitness))  # the host read a Python driver does
    return state


def sampler_only(model, task, problem, cfg, key):
    """The host loop's sampler calls alone (generation-0 prompts, G calls): the part of a
    generation that no driver can avoid, so host / this bounds what fusing the rest can buy."""
    graphdef, params = nnx.split(model)
    k_init, k_run = jax.random.split(jax.random.fold_in(key, 0))
    state = init_jit(graphdef, params, task, cfg, problem, k_init)
    *_, prompts, mask, keys = select_and_prompt(task, cfg, state, k_run, problem)
    roll = None
    for _ in range(cfg.generations):
        roll = generate_jit(graphdef, params, prompts, mask, keys, jnp.float32(cfg.temperature),
                             jnp.float32(cfg.top_p), jnp.int32(0),
                             max_new_tokens=task.completion_len(cfg.num_answers),
                             stop_ids=task.tokenizer.stop_ids, pad_id=task.tokenizer.pad_id)
    return roll.tokens_BGT


def timed(fn, repeats):
    """(result, first-call seconds, median seconds) with bench_sampler's timing helper."""
    first, median = time_calls(fn, repeats)
    return fn(), first, median


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    conf = get_config(args.quick)
    text_task = make_task("program", difficulty="easy")
    task = bind(text_task, task_word_tokenizer(text_task))
    records = task.make_problems(0, 1)
    seq_len = max(seq_len_for(task, records, c.num_answers, num_parents=c.parents)
                  for c in conf["searches"])
    model = Decoder(model_preset(conf["preset"], vocab_size=task.tokenizer.size,
                                 max_seq_len=seq_len), rngs=nnx.Rngs(0))
    key = jax.random.key(0)
    rows = []
    for cfg in conf["searches"]:
        problems = ingraph.search_problems(task, records, cfg.num_answers)
        problem = jax.tree.map(lambda x: jnp.asarray(x[0]), problems)
        print(f"device={jax.devices()[0].platform} preset={conf['preset']} I={cfg.islands} "
              f"Q={cfg.members} C={cfg.children} m={cfg.num_answers} G={cfg.generations} "
              f"budget={cfg.budget} candidates")
        (_, g_state, _, _), g_first, g_med = timed(
            lambda cfg=cfg, problems=problems: ingraph.run_method(key, "search", model, task,
                                                                 problems, cfg),
            conf["repeats"])
        h_state, h_first, h_med = timed(
            lambda cfg=cfg, problem=problem: host_loop(model, task, problem, cfg, key),
            conf["repeats"])
        assert int(g_state.evaluated[0]) == int(h_state.evaluated) == cfg.budget
        same = bool(jnp.array_equal(g_state.population.id_X[0], h_state.population.id_X))
        for name, first, med in [("in-graph (1 jit)", g_first, g_med),
                                 ("host loop", h_first, h_med)]:
            print(f"  {name:18s} first call {first:7.2f}s  median {med * 1e3:8.1f} ms  "
                  f"{cfg.budget / med:9.0f} candidates/s")
        _, _, s_med = timed(
            lambda cfg=cfg, problem=problem: sampler_only(model, task, problem, cfg, key),
            conf["repeats"])
        print(f"  same final population ids in both arms: {same}")
        print(f"  host loop: sampler calls alone {s_med * 1e3:.1f} ms = "
              f"{100 * s_med / h_med:.0f}% of its time; the rest (dispatch, selection, "
              f"scoring, sync) is {max(h_med - s_med, 0) * 1e3:.1f} ms")
        print(f"  RATIO in-graph vs host loop (candidates/s): {h_med / g_med:.2f}x "
              f"(target >= 3x)")
        rows.append((cfg, h_med / g_med))
    print("summary: " + "; ".join(f"I={c.islands} Q={c.members} C={c.children} "
                                  f"G={c.generations}: {r:.2f}x" for c, r in rows))


if __name__ == "__main__":
    main()
