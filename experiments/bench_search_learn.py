"""The cost of learning inside the island search: the wall time of one frozen generation
(`vpo.search.ingraph.make_search`'s step, vmapped over the problems) and of one learning
generation (`vpo.search.learn.learning_generation`: the same step with its samples kept, then
one policy-gradient step on them) at the quickstart's search shapes, in the same run.

Run:  python experiments/bench_search_learn.py [--objective grpo] [--problems 32] [--quick]
                                              [--every K]

The quickstart (`vpo compare`, docs/usage.md): the codeword task on its word-level tokenizer,
the tiny preset, island search with I = 2 islands of Q = 6, U = 2 parents, C = 6 children,
m = 1, over 32 problems (a randomly initialised policy here: the cost does not depend on the
weights). LoRA rank 8 adapters are trained (`LearnConfig`'s default). Each generation is
compiled once (first call, reported apart), then timed as the median of `--repeats` calls
from the same state, the generations timed in turn round by round. Prints both times and
their ratio (the goal: at most 2x). With `--every K` (`LearnConfig.every`: an update after
every K-th generation only) it times a generation with the update and one without it (the
`lax.cond` not taken) and prints the ratio per generation over K of them, (with + (K - 1) x
without) / (K x frozen).
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vpo.config import LearnConfig, SearchConfig, model_preset
from vpo.model import lora as lora_lib
from vpo.model.decoder import Decoder
from vpo.rl.search_update import make_learner
from vpo.search import ingraph
from vpo.search import learn as learn_lib
from vpo.tasks import make_task
from vpo.tasks.bound import bind, seq_len_for
from vpo.tasks.words import task_word_tokenizer

QUICKSTART = SearchConfig(islands=2, members=6, parents=2, children=6, generations=19,
                          num_answers=1, temperature=0.7)


def timed(fns: dict, repeats: int) -> dict:
    """{name: (first call seconds, median of `repeats` further calls)}, results blocked on;
    after the first calls the functions are timed in turn, round by round, so a change in the
    machine's load between them shifts every median alike (the ratios stay comparable)."""
    first, times = {}, {name: [] for name in fns}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        first[name] = time.perf_counter() - t0
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t0)
    return {name: (first[name], float(np.median(times[name]))) for name in fns}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--objective", default="grpo", choices=("grpo", "vpo", "entropic"))
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="4 problems, 2 repeats")
    ap.add_argument("--every", type=int, default=1, help="LearnConfig.every (default 1)")
    args = ap.parse_args()
    n, repeats = (4, 2) if args.quick else (args.problems, args.repeats)
    cfg = QUICKSTART if args.objective != "vpo" else SearchConfig(
        **{**QUICKSTART.__dict__, "num_answers": 2})  # vpo: a set of m >= 2 answers per call
    learn = LearnConfig(objective=args.objective, every=args.every)
    codeword = make_task("codeword")
    task = bind(codeword, task_word_tokenizer(codeword))
    records = task.make_problems(0, n)
    problems = jax.tree.map(jnp.asarray, ingraph.search_problems(task, records,
                                                                 cfg.num_answers))
    need = seq_len_for(task, records, cfg.num_answers, num_parents=cfg.parents)
    model = Decoder(model_preset("tiny", vocab_size=task.tokenizer.size, max_seq_len=need),
                    rngs=nnx.Rngs(0))
    graphdef, params, frozen = lora_lib.split(learn_lib.trainable_model(model, learn))
    init, _ = learn_lib.make_learning_search(task, cfg, graphdef, learn, make_learner)
    keys_N = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(n))
    state = jax.jit(init)(keys_N, problems, params, frozen)
    step_keys_N = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys_N, 1)
    axes = learn_lib.search_axes(0)

    @jax.jit
    def frozen_generation(params, frozen, keys_N, search):
        model = lora_lib.merge(graphdef, params, frozen)
        propose = functools.partial(ingraph.lm_propose, model, task=task, cfg=cfg)
        _, step = ingraph.make_search(task, cfg, propose)
        return jax.vmap(step, in_axes=(0, axes), out_axes=axes)(keys_N, search)

    learner = make_learner(graphdef, learn, task.eval_weights_R)
    learning_generation = jax.jit(functools.partial(learn_lib.learning_generation, task, cfg,
                                                    graphdef, learner, None, every=args.every))
    print(f"device={jax.devices()[0].platform} cores={jax.local_device_count()} preset=tiny "
          f"task=codeword N={n} I={cfg.islands} Q={cfg.members} C={cfg.children} "
          f"m={cfg.num_answers} learn={args.objective} lora_rank={learn.lora_rank} "
          f"every={args.every}")
    # the generation counter before the step: K - 1 makes the step's generation K (an update);
    # 0 makes it generation 1, without its update when K > 1
    due = state._replace(search=state.search._replace(
        generation=jnp.int32(args.every - 1)))
    fns = {"frozen": lambda: frozen_generation(state.params, state.frozen, step_keys_N,
                                               state.search),
           "learning": lambda: learning_generation(step_keys_N, due)}
    if args.every > 1:
        fns["without"] = lambda: learning_generation(step_keys_N, state)
    t = timed(fns, repeats)
    (f_first, f_med), (l_first, l_med) = t["frozen"], t["learning"]
    print(f"  frozen generation    first call {f_first:7.2f}s  median {f_med * 1e3:8.1f} ms")
    print(f"  learning generation  first call {l_first:7.2f}s  median {l_med * 1e3:8.1f} ms")
    print(f"  RATIO learning / frozen generation: {l_med / f_med:.2f}x (goal <= 2x)")
    if args.every > 1:
        s_med = t["without"][1]
        per = (l_med + (args.every - 1) * s_med) / args.every
        print(f"  generation without its update       median {s_med * 1e3:8.1f} ms")
        print(f"  RATIO per generation over {args.every} (every={args.every}): "
              f"{per / f_med:.2f}x (goal <= 2x)")


if __name__ == "__main__":
    main()
