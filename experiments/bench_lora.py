"""LoRA vs full fine-tuning: RL update step time and training-state memory, in one run.

Run:  python experiments/bench_lora.py            (--quick: a smaller model, fewer repeats)

One decoder (default D=512, L=8, H=8, N=4, F=1536, V=4096: 27M params) on the bandit task,
B=4 prompts × G=4 samples, KL to the reference on. Full fine-tuning trains every weight and keeps
a copy as the KL reference; LoRA (rank 8, alpha 16, all seven projections, `vpo.model.lora`) trains
only the adapters on the same base, whose frozen weights are the reference. For each:

  * step time of the jitted update (log-probs, KL reference, loss, backward, AdamW) on the same
    fixed rollout, and of the fused `rl_step` (sampling included); the two arms alternate
    within every repeat; median and [q25, q75] over repeats;
  * exact bytes of the training state, from its trees: trainable params, frozen params,
    KL-reference copy, optimiser state;
  * XLA's view of the update as `rl_step` runs it (state donated), compiled but not run:
    `memory_analysis()` arguments, temporaries and peak (arguments + unaliased outputs +
    temporaries), and `cost_analysis()` FLOPs.

Timings use an undonated jit of the same update (the state is reused across repeats).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import numpy as np
from flax import nnx

from vpo.launch import assemble
from vpo.model import lora, sharding
from vpo.model.decoder import Decoder
from vpo.rl import step as step_lib
from vpo.rollout import rewards as rewards_lib
from vpo.run import data as data_lib
from vpo.run.loop import shard_batch


def get_config():
    return dict(model=dict(dim=512, num_layers=8, num_heads=8, num_kv_heads=4, mlp_dim=1536,
                           vocab_size=4096),
                batch_size=4, num_samples=4, num_answers=2, rank=8, kl_coef=0.05, repeats=9)


QUICK = dict(model=dict(dim=128, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=256,
                        vocab_size=1024), repeats=3)


def nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


def build(cfg: dict, rank: int):
    """(state, update jit, fused step jit, compiled update) of one arm."""
    overrides = [f"model.{k}={v}" for k, v in cfg["model"].items()] + [
        f"train.batch_size={cfg['batch_size']}", f"train.num_answers={cfg['num_answers']}",
        f"sampler.num_samples={cfg['num_samples']}", f"objective.kl_coef={cfg['kl_coef']}",
        f"model.lora_rank={rank}"]
    plan = assemble.assemble_run("bandit", None, overrides)
    run, task = plan.run, plan.task
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    tx = step_lib.make_optimizer(run.train)
    base = Decoder(lora.base_config(run.model), rngs=nnx.Rngs(0))  # the same base for both arms
    graphdef, state, _ = step_lib.state_from_model(
        lora.as_configured(base, run.model, seed=0), tx, mesh, with_ref=cfg["kl_coef"] > 0)
    step_cfg = step_lib.step_config(run, task)
    it = data_lib.problem_iterator(task, run.train.batch_size, run.train.num_answers,
                                   num_problems=64, seed=0)
    batch = shard_batch(next(it), mesh)

    def update(state, batch, rollout):
        rewards, smask = rewards_lib.in_graph_rewards(task, batch["problems"], rollout.tokens_BGT,
                                                    rollout.mask_BGT, run.train.num_answers)
        return step_lib.update_from_rollout(state, batch, rollout, rewards, smask,
                                             graphdef=graphdef, tx=tx, task=task, cfg=step_cfg)

    fused = jax.jit(functools.partial(step_lib.rl_step, graphdef=graphdef, tx=tx, task=task,
                                      cfg=step_cfg))
    rollout = jax.block_until_ready(step_lib.make_sample_step(graphdef, step_cfg)(state, batch))
    as_run = jax.jit(update, donate_argnums=0).lower(state, batch, rollout).compile()
    cost = as_run.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return dict(run=run, state=state, batch=batch, rollout=rollout,
                update=jax.jit(update).lower(state, batch, rollout).compile(), fused=fused,
                memory=as_run.memory_analysis(), flops=cost["flops"])


def _time(fn) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def _stats(xs) -> str:
    q1, med, q3 = np.percentile(xs, [25, 50, 75])
    return f"{med * 1e3:8.1f} ms [{q1 * 1e3:.1f}, {q3 * 1e3:.1f}]"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    cfg = get_config()
    if args.quick:
        cfg.update(QUICK)
    arms = {"full": build(cfg, 0), f"lora r={cfg['rank']}": build(cfg, cfg["rank"])}
    m = next(iter(arms.values()))["run"].model
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {jax.device_count()} device(s); "
          f"model D={m.dim} L={m.num_layers} H={m.num_heads} N={m.num_kv_heads} F={m.mlp_dim} "
          f"V={m.vocab_size}: {m.num_params:,} params; B={cfg['batch_size']} "
          f"G={cfg['num_samples']} T={next(iter(arms.values()))['run'].sampler.max_new_tokens}; "
          f"kl_coef {cfg['kl_coef']}")
    times: dict[str, dict[str, list[float]]] = {a: {"update": [], "rl_step": []} for a in arms}
    for a in arms.values():  # warm-up (the fused step compiles here)
        jax.block_until_ready(a["update"](a["state"], a["batch"], a["rollout"]))
        jax.block_until_ready(a["fused"](a["state"], a["batch"]))
    for _ in range(cfg["repeats"]):
        for name, a in arms.items():  # alternating arms within each repeat
            times[name]["update"].append(
                _time(lambda a=a: a["update"](a["state"], a["batch"], a["rollout"])))
            times[name]["rl_step"].append(_time(lambda a=a: a["fused"](a["state"], a["batch"])))
    mb = 2.0 ** 20
    print(f"\n{'arm':10s} | {'trainable':>9s} {'frozen':>8s} {'ref copy':>8s} {'opt state':>9s} "
          f"{'state':>8s} | {'XLA args':>8s} {'temp':>7s} {'peak':>7s} {'GFLOP':>6s} | "
          f"{'update (median [IQR])':>30s} | {'rl_step (median [IQR])':>30s}")
    rows = {}
    for name, a in arms.items():
        s, mem = a["state"], a["memory"]
        parts = [nbytes(s.params), nbytes(s.frozen), nbytes(s.ref_params), nbytes(s.opt_state)]
        peak = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
                + mem.temp_size_in_bytes)
        rows[name] = parts + [sum(parts), mem.temp_size_in_bytes, peak, a["flops"]]
        print(f"{name:10s} | {parts[0] / mb:7.1f}MB {parts[1] / mb:6.1f}MB {parts[2] / mb:6.1f}MB "
              f"{parts[3] / mb:7.1f}MB {sum(parts) / mb:6.1f}MB | "
              f"{mem.argument_size_in_bytes / mb:6.1f}MB {mem.temp_size_in_bytes / mb:5.1f}MB "
              f"{peak / mb:5.1f}MB {a['flops'] / 1e9:6.2f} | "
              f"{_stats(times[name]['update']):>30s} | {_stats(times[name]['rl_step']):>30s}")
    full, lo = (rows[n] for n in arms)
    tf, tl = (times[n] for n in arms)
    ratio_u = np.array(tl["update"]) / np.array(tf["update"])
    ratio_s = np.array(tl["rl_step"]) / np.array(tf["rl_step"])
    print(f"\nlora / full: state bytes {lo[4] / full[4]:.3f}, optimiser state "
          f"{lo[3] / full[3]:.4f}, XLA temp {lo[5] / full[5]:.3f}, peak {lo[6] / full[6]:.3f}, "
          f"update FLOPs {lo[7] / full[7]:.3f}; update time "
          f"{statistics.median(ratio_u):.2f} (pairs {ratio_u.min():.2f}-{ratio_u.max():.2f}), "
          f"rl_step time {statistics.median(ratio_s):.2f} "
          f"(pairs {ratio_s.min():.2f}-{ratio_s.max():.2f})")


if __name__ == "__main__":
    main()
