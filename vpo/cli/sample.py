"""`vpo sample`: a policy's answers (or an environment's episodes) on a few prompts, scored,
with tokens/s; the run is built in `vpo.launch.policy_runs` (`sample_run`)."""

from __future__ import annotations

import argparse
import time

from vpo.cli.arguments import (
    add_data_args,
    add_env_args,
    check_args,
    dataset_kwargs,
    env_kwargs,
)
from vpo.cli.policy import BUDGET_HELP, SLOTS_HELP
from vpo.tasks import TASK_NAMES as TASKS


def cmd_sample(args: argparse.Namespace) -> int:
    """Sample answers from a policy and score them with the task's vector reward; prints
    completions, rewards and tokens/s. --policy is a trained policy or a checkpoint (its own
    task and m by default; --data/--reward for your prompts); without it, a randomly
    initialised --preset model (a speed check)."""
    import jax
    import numpy as np

    from vpo.launch.policy_runs import EpisodeRun, sample_run
    from vpo.rollout import slots as sampler  # sample: every row at once, or refilled slots

    check_args(args, positive=("prompts", "samples", "answers", "max_new_tokens"))
    env = env_kwargs(args)
    dataset = None if env else dataset_kwargs(args)
    run = sample_run(args.policy, task_name=args.task, preset=args.preset, dataset=dataset,
                     env=env, answers=args.answers, prompts=args.prompts, seed=args.seed,
                     max_new_tokens=args.max_new_tokens, num_samples=args.samples,
                     temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                     num_slots=args.num_slots)
    if isinstance(run, EpisodeRun):
        return _sample_episodes(args, run)
    task, records, prompts, mask, M = run.task, run.records, run.prompts, run.mask, run.num_answers
    T, tok = run.sampler.max_new_tokens, task.tokenizer
    key = jax.random.key(args.seed)
    kw = dict(stop_ids=tok.stop_ids, pad_id=tok.pad_id)
    t0 = time.perf_counter()
    rollout = jax.block_until_ready(sampler.sample(run.model, prompts, mask, key, run.sampler,
                                                   **kw))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax.block_until_ready(sampler.sample(run.model, prompts, mask, jax.random.fold_in(key, 1),
                                         run.sampler, **kw))
    warm = time.perf_counter() - t0
    print(f"task {task.name}: {len(records)} prompts x {args.samples} samples x {M} answers, "
          f"{run.source}")
    tokens = np.asarray(rollout.tokens_BGT)
    gmask = np.asarray(rollout.mask_BGT)
    for b in range(len(records)):
        print(f"\nprompt {b}: {tok.decode(prompts[b][mask[b]])}")
        texts = task.completion_texts(tokens[b], gmask[b])
        rewards, valid = task.host_score([records[b]] * args.samples, tokens[b], gmask[b], M)
        for g in range(args.samples):
            scores = np.where(valid[g], rewards[g] @ task.eval_weights_R, 0.0)
            r = rewards[g][int(np.argmax(scores))]
            vector = ", ".join(f"{n} {v:.2f}" for n, v in zip(task.reward_names, r, strict=True))
            print(f"  sample {g}: {texts[g]!r}\n    valid answers {int(np.sum(valid[g]))}/{M}, "
                  f"best w*·r {float(np.max(scores)):.2f} (its rewards: {vector})")
    n_tok = int(gmask.sum())
    print(f"\ncompile + first call {first:.2f}s; warm call {warm * 1e3:.1f} ms "
          f"({len(records) * args.samples * T / warm:,.0f} tokens/s at the full budget T={T}; "
          f"{n_tok} tokens before a stop token)")
    return 0


def _sample_episodes(args: argparse.Namespace, run) -> int:
    """`vpo sample` on an environment: --samples episodes of each of --prompts rows, printed
    turn by turn with the environment's reward vector."""
    import jax
    import numpy as np

    from vpo.env.episode import task_episodes

    task, records, T = run.task, run.records, run.max_new_tokens
    settings = task.settings
    keys = jax.random.split(jax.random.key(args.seed), len(records) * args.samples)
    t0 = time.perf_counter()
    ep = task_episodes(run.model, task, run.factory, [dict(r) for r in records],
                       keys.reshape(len(records), args.samples), temperature=args.temperature,
                       top_p=args.top_p, top_k=args.top_k, max_tokens=T)
    seconds = time.perf_counter() - t0
    print(f"environment {settings.spec}: {len(records)} rows x {args.samples} episodes, up to "
          f"{settings.max_turns} turns and {T} tokens each, policy {args.policy}")
    w_R = np.asarray(task.eval_weights_R)
    for b in range(len(records)):
        for g in range(args.samples):
            msgs = ep.messages[b][g]
            print(f"\nrow {b}, episode {g}:")
            for m in msgs:
                print(f"  [{m['role']}] {m['content']!r}")
            r = ep.rewards_BGR[b, g]
            vector = ", ".join(f"{n} {v:.2f}" if a else f"{n} n/a" for n, v, a in zip(
                task.reward_names, r, ep.applies_BGR[b, g], strict=True))
            cut = "" if ep.rollout.finished_BG[b, g] else " (cut off: the token budget ran out)"
            print(f"  turns {int(ep.turns_BG[b, g])}{cut}, observation tokens "
                  f"{int(ep.observation_tokens_BG[b, g])}, w*·r {float(r @ w_R):.2f} ({vector})")
    n_tok = int(np.asarray(ep.rollout.mask_BGT).sum())
    print(f"\n{n_tok} assistant tokens in {seconds:.2f}s with compilation "
          f"({n_tok / seconds:,.0f} tokens/s)")
    return 0


def add_sample_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default=None, help="policy folder (vpo sft / vpo train --out), "
                   "hf:PATH or smollm2; default: a random --preset model")
    p.add_argument("--task", choices=TASKS, default=None,
                   help="default: the policy's task (maze without --policy)")
    p.add_argument("--preset", default="tiny", help="model preset without --policy: random "
                   "weights, built-in tasks (docs/usage.md#model-presets)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--answers", type=int, default=None, help="answers per generation (VPO's "
                   "m); default: the policy's (3 without --policy)")
    p.add_argument("--max-new-tokens", type=int, default=None, help=BUDGET_HELP)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--num-slots", type=int, default=0, help=SLOTS_HELP)
    p.add_argument("--seed", type=int, default=0)
    add_data_args(p)
    add_env_args(p)
