"""RL step throughput, overlapped (`train.off_policy_steps=1`) against synchronous (0).

Run:  python experiments/bench_overlap.py                   (tiny model on maze, a few minutes)
      python experiments/bench_overlap.py --devices 8       (8 host-platform CPU devices)

Both arms are the loop's jitted step on the same run (maze, `--model`, B prompts × G samples,
data-parallel over `--devices` devices: `--xla_force_host_platform_device_count`): k = 0 is
`rl_step` (sample, then update on that rollout), k = 1 `vpo.rl.overlap.overlapped_rl_step`
(sample the next rollout with θ_t and update θ_t on the pending one, in one program, with the
proximal log-prob pass and token-level TIS). Each arm keeps its own state and data stream;
after one untimed step (compile), the arms alternate blocks of `--steps` steps for `--repeats`
rounds (a loaded machine slows both alike) and each block's time per step is recorded, the
state fetched at its end; medians, and the k = 1 / k = 0 throughput ratio; then what k = 1 adds
to the work, the proximal log-prob pass over the pending rollout, timed alone. The synchronous step
is one program too, so no dispatch is saved; on one device the two halves of the overlapped step
share its cores, and what it can gain is XLA running them side by side on units one half leaves
idle, while it always adds the proximal pass.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="a model preset (vpo.config.model)")
    parser.add_argument("--batch", type=int, default=8, help="B prompts per step")
    parser.add_argument("--G", type=int, default=8, help="samples per prompt")
    parser.add_argument("--devices", type=int, default=1, help="host-platform CPU devices")
    parser.add_argument("--steps", type=int, default=5, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=3, help="blocks per arm")
    args = parser.parse_args(argv)
    if args.devices > 1:  # before jax starts
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform"
                                   f"_device_count={args.devices}")
    import jax

    from vpo.launch import assemble
    from vpo.model import sharding
    from vpo.rl import overlap
    from vpo.rl import step as step_lib
    from vpo.run import data as data_lib
    from vpo.run.loop import shard_batch

    devices = jax.devices()[:args.devices]
    mesh = sharding.make_mesh(devices=devices)
    arms = {}
    for k in (0, 1):
        plan = assemble.assemble_run("maze", None, [
            f"model={args.model}", f"sampler.num_samples={args.G}",
            f"train.batch_size={args.batch}", f"train.off_policy_steps={k}"])
        run, task = plan.run, plan.task
        tx = step_lib.make_optimizer(run.train)
        graphdef, state, _ = step_lib.init_state(run.model, tx, mesh)
        cfg = step_lib.step_config(run, task)
        it = data_lib.problem_iterator(task, run.train.batch_size, run.train.num_answers,
                                       num_problems=256, seed=0)
        step = overlap.make_in_graph_step(graphdef, tx, task, cfg)
        if k:
            state = overlap.make_prime_step(graphdef, task, cfg)(state,
                                                                 shard_batch(next(it), mesh))
        t0 = time.perf_counter()
        state, metrics = jax.block_until_ready(step(state, shard_batch(next(it), mesh)))
        print(f"k={k}: compile + first step {time.perf_counter() - t0:.1f} s", flush=True)
        arms[k] = dict(state=state, it=it, step=step, times=[], tokens=[], graphdef=graphdef,
                       tcfg=run.train)
    print(f"jax {jax.__version__}, {len(devices)} {devices[0].platform} device(s), "
          f"{os.cpu_count()} CPUs; model {args.model} ({run.model.num_params:,} params); maze "
          f"B={args.batch} G={args.G} T={run.sampler.max_new_tokens}; {args.repeats} blocks of "
          f"{args.steps} steps per arm", flush=True)
    for _ in range(args.repeats):
        for arm in arms.values():
            batches = [shard_batch(next(arm["it"]), mesh) for _ in range(args.steps)]
            state, tokens = arm["state"], 0
            t0 = time.perf_counter()
            for batch in batches:
                state, metrics = arm["step"](state, batch)
                tokens += metrics["generated_tokens"]
            jax.block_until_ready(state)
            arm["times"].append((time.perf_counter() - t0) / args.steps)
            arm["tokens"].append(int(tokens) / args.steps)
            arm["state"] = state
    med = {k: statistics.median(a["times"]) for k, a in arms.items()}
    for k, arm in arms.items():
        print(f"k={k}: {med[k] * 1e3:8.1f} ms/step  {1 / med[k]:6.2f} steps/s  (blocks: "
              + ", ".join(f"{t * 1e3:.0f}" for t in arm["times"])
              + f" ms; {statistics.mean(arm['tokens']):.0f} generated tokens/step)")
    print(f"throughput k=1 / k=0: {med[0] / med[1]:.2f}x", flush=True)
    arm = arms[1]  # what k = 1 adds: the proximal log-prob pass over the pending rollout
    pending, tcfg = arm["state"].pending, arm["tcfg"]

    @jax.jit
    def proximal(state):
        return step_lib.completion_logp(
            step_lib.model_of(arm["graphdef"], state), pending["prompt_BP"],
            pending["prompt_mask_BP"], pending["rollout"]["tokens_BGT"],
            vocab_block=tcfg.vocab_block, impl=tcfg.logprob_impl)[0]

    jax.block_until_ready(proximal(arm["state"]))
    times = []
    for _ in range(args.repeats * args.steps):
        t0 = time.perf_counter()
        jax.block_until_ready(proximal(arm["state"]))
        times.append(time.perf_counter() - t0)
    print(f"the proximal log-prob pass alone: {statistics.median(times) * 1e3:.1f} ms "
          f"(k=1 − k=0: {(med[1] - med[0]) * 1e3:+.1f} ms/step)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
