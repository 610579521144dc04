"""Command line: `vpo <command> [options]`. The commands are the one dict at the bottom.

    vpo sample [--task maze] [--preset tiny] [--prompts 4] [--samples 4] [--answers 3]
               [--temperature 1.0] [--top-p 1.0] [--top-k 0] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time

TASKS = ("maze", "program", "bandit", "arithmetic")


def _make_task(name: str):
    from vpo.tasks import arithmetic, bandit, maze, program

    factories = {"maze": maze.make_maze_task, "program": program.make_program_task,
                 "bandit": bandit.make_bandit_task, "arithmetic": arithmetic.make_arithmetic_task}
    return factories[name]()


def cmd_sample(args: argparse.Namespace) -> int:
    """Sample answers for a task's problems from a (randomly initialised) preset policy and
    score them with the task's vector reward; prints completions, rewards and tokens/s."""
    import jax
    import numpy as np
    from flax import nnx

    from vpo import sampler
    from vpo.config import SamplerConfig, model_preset
    from vpo.model import Decoder
    from vpo.tasks import base

    task = _make_task(args.task)
    M = args.answers
    T = task.completion_len(M)
    problems = task.make_problems(args.seed, args.prompts)
    prompts = jax.vmap(lambda p: task.prompt_tokens(p, M))(problems)
    mask = prompts != task.vocab.pad_id
    model_cfg = model_preset(args.preset, vocab_size=task.vocab.size,
                             max_seq_len=task.prompt_len + T)
    model = Decoder(model_cfg, rngs=nnx.Rngs(args.seed))
    cfg = SamplerConfig(max_new_tokens=T, num_samples=args.samples,
                        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    key = jax.random.key(args.seed)
    kw = dict(eos_id=task.vocab.eos_id, pad_id=task.vocab.pad_id)
    t0 = time.perf_counter()
    rollout = jax.block_until_ready(sampler.sample(model, prompts, mask, key, cfg, **kw))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax.block_until_ready(sampler.sample(model, prompts, mask, jax.random.fold_in(key, 1), cfg,
                                         **kw))
    warm = time.perf_counter() - t0
    print(f"task {task.name}: {args.prompts} prompts x {args.samples} samples x {M} answers, "
          f"policy '{args.preset}' ({model_cfg.num_params:,} params, random init, seed "
          f"{args.seed})")
    for b in range(args.prompts):
        problem = base.index_problem(problems, b)
        print(f"\nprompt {b}: {task.vocab.decode(np.asarray(prompts[b]))}")
        for g in range(args.samples):
            toks = np.asarray(rollout.tokens_BGT[b, g])[np.asarray(rollout.mask_BGT[b, g])]
            text = task.vocab.decode(toks, strict=False)
            if task.is_host:
                rewards, valid = task.host_reward(problem, text, M)
            else:
                rewards, valid = task.reward(problem, rollout.tokens_BGT[b, g],
                                             rollout.mask_BGT[b, g], M)
            scores = np.asarray(rewards) @ task.eval_weights_R
            best = float(np.max(np.where(np.asarray(valid), scores, 0.0)))
            print(f"  sample {g}: {text}\n    valid answers {int(np.sum(valid))}/{M}, "
                  f"best w*·r {best:.2f}")
    n_tok = int(rollout.mask_BGT.sum())
    print(f"\ncompile + first call {first:.2f}s; warm call {warm * 1e3:.1f} ms "
          f"({args.prompts * args.samples * T / warm:,.0f} tokens/s at the full budget T={T}; "
          f"{n_tok} tokens before EOS)")
    return 0


def _add_sample(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", choices=TASKS, default="maze")
    p.add_argument("--preset", default="tiny", help="model preset (vpo.config.MODEL_PRESETS)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--answers", type=int, default=3, help="answers per generation (VPO's m)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)


COMMANDS = {
    "sample": (cmd_sample, _add_sample),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vpo", description="GRPO and VPO post-training in JAX")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (fn, add_args) in COMMANDS.items():
        p = sub.add_parser(name, help=fn.__doc__.splitlines()[0], description=fn.__doc__)
        add_args(p)
        p.set_defaults(fn=fn)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
