"""RL step time split into sampling and update, and tokens/s, on the maze task.

Run:  python experiments/bench_train.py            (add --quick for one point)

For each (model preset, G): the fused `rl_step` (one jit: sample -> in-graph reward ->
advantages -> update) timed as a whole, and the same work split at the sampling boundary into
two jits (sampling alone; reward + advantages + update alone) to show where the time goes.
Medians over repetitions; compile time reported separately. tokens/s counts generated tokens
(before EOS) per second of the fused step. Baseline in the same run: the fused step with the
training forward materialising all [B, G, T, V] logits (`train.logprob_impl=reference`) against
the vocabulary-tiled default (`chunked`).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax

from vpo.model import sharding
from vpo.rl import step as step_lib
from vpo.rollout import rewards as rewards_lib
from vpo.run import data as data_lib
from vpo.run.loop import shard_batch


def get_config():
    # (model preset, G, extra overrides); the last point has a vocabulary of 8 tiles of 4096,
    # where the tiled training forward differs from the full-logits one (V = 64 is one tile)
    points = [(preset, G, []) for preset in ("tiny", "small") for G in (4, 8, 16)]
    return dict(points=points + [("tiny", 8, ["model.vocab_size=32768"])], batch_size=8,
                num_answers=3, repeats=5, advantage="vpo")


def _median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_point(preset: str, G: int, extra: list[str], cfg: dict):
    from vpo.launch import (
        assemble,  # here, not at the top: ab_tiny_step imports this module's timer
    )
    # under older checkouts of vpo, which have no vpo.launch.presets

    overrides = [f"model={preset}", f"sampler.num_samples={G}",
                 f"train.batch_size={cfg['batch_size']}",
                 f"train.num_answers={cfg['num_answers']}",
                 f"objective.advantage={cfg['advantage']}", *extra]
    plan = assemble.assemble_run("maze", None, overrides)
    run, task = plan.run, plan.task
    plan = assemble.assemble_run("maze", None,
                                             overrides + ["train.logprob_impl=reference"])
    ref_run, _ = plan.run, plan.task
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    tx = step_lib.make_optimizer(run.train)
    graphdef, state, _ = step_lib.init_state(run.model, tx, mesh)
    step_cfg = step_lib.step_config(run, task)
    it = data_lib.problem_iterator(task, run.train.batch_size, run.train.num_answers,
                                   num_problems=64, seed=0)
    batch = shard_batch(next(it), mesh)

    fused = jax.jit(functools.partial(step_lib.rl_step, graphdef=graphdef, tx=tx, task=task,
                                      cfg=step_cfg))
    fused_ref = jax.jit(functools.partial(step_lib.rl_step, graphdef=graphdef, tx=tx, task=task,
                                          cfg=step_lib.step_config(ref_run, task)))
    sample = step_lib.make_sample_step(graphdef, step_cfg)

    @jax.jit
    def update(state, batch, rollout):
        rewards, smask = rewards_lib.in_graph_rewards(task, batch["problems"], rollout.tokens_BGT,
                                                    rollout.mask_BGT, run.train.num_answers)
        return step_lib.update_from_rollout(state, batch, rollout, rewards, smask,
                                             graphdef=graphdef, tx=tx, task=task, cfg=step_cfg)

    t0 = time.perf_counter()
    _, metrics = jax.block_until_ready(fused(state, batch))
    compile_s = time.perf_counter() - t0
    rollout = jax.block_until_ready(sample(state, batch))
    jax.block_until_ready(update(state, batch, rollout))
    jax.block_until_ready(fused_ref(state, batch))
    reps = cfg["repeats"]
    t_fused = _median_time(lambda: fused(state, batch), reps)
    t_sample = _median_time(lambda: sample(state, batch), reps)
    t_update = _median_time(lambda: update(state, batch, rollout), reps)
    t_ref = _median_time(lambda: fused_ref(state, batch), reps)
    tokens = int(rollout.mask_BGT.sum())
    print(f"{preset:6s} V={run.model.vocab_size:<6d} ({run.model.num_params:>9,} params) "
          f"B={run.train.batch_size} G={G:2d} "
          f"m={run.train.num_answers} T={run.sampler.max_new_tokens} | step {t_fused:6.3f}s "
          f"(compile+first {compile_s:5.1f}s) | sampling {t_sample:6.3f}s "
          f"({t_sample / (t_sample + t_update):4.0%}) update {t_update:6.3f}s | "
          f"{tokens / t_fused:8,.0f} generated tok/s | full-logits step {t_ref:6.3f}s "
          f"(tiled/full {t_fused / t_ref:4.2f}) | loss {float(metrics['loss']):+.3f}",
          flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    cfg = get_config()
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; objective {cfg['advantage']}")
    for preset, G, extra in cfg["points"][:1] if args.quick else cfg["points"]:
        bench_point(preset, G, extra, cfg)


if __name__ == "__main__":
    main()
