"""Does a shipped environment learn on SmolLM2-135M-Instruct with LoRA on a CPU? The calculator
environment (`vpo.env.calculator`), end to end through the commands a user types:

1. a warm start that teaches the format, not the answers: `vpo sft --data` on demonstrations
   whose prompt is the environment's own first message and whose completion is one line
   `answer: <expression>` over some of the given numbers; a share `--correct` of them reach
   the target, the others are well-formed misses (so the warm start hits sometimes and RL has
   something to reinforce);
2. `vpo train --env vpo.env.calculator:make_env --init <warm start> model.lora_rank=8` (GRPO);
3. the test, decided before the run: Kendall's τ of the training reward (w*ᵀr per episode,
   averaged over the step's episodes) against the step over every logged step, one-sided
   (rising) p < 0.025 (`vpo.eval.claims.kendall`); the unit is the step of one run, so the
   verdict is about this run, not about seeds. Also printed: the same for `reward/hit`.

    python experiments/env_learning.py --out runs/env_learning   # ~30-40 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys

import numpy as np

from vpo.env.calculator import CalculatorEnv, evaluate
from vpo.eval.claims import kendall


def expressions(numbers: list[int]) -> list[str]:
    """Expressions a op b and (a op b) op c over distinct positions of `numbers`."""
    out = []
    ops = ("+", "-", "*")
    for i, j in itertools.permutations(range(len(numbers)), 2):
        a, b = numbers[i], numbers[j]
        out += [f"{a} {o} {b}" for o in ops]
        for k in set(range(len(numbers))) - {i, j}:
            c = numbers[k]
            out += [f"{a} {o1} {b} {o2} {c}" for o1 in ops for o2 in ops]
            out += [f"({a} {o1} {b}) {o2} {c}" for o1 in ops for o2 in ops]
    return out


def demonstrations(num: int, correct: float, seed: int) -> list[dict]:
    """`num` rows {prompt, completion}: the environment's first message and one answer line."""
    env, rng = CalculatorEnv(), np.random.default_rng(seed)
    rows = []
    for row in env.problems(seed, num):
        prompt = env.reset(row)[0]["content"]
        exprs = expressions(row["numbers"])
        hits = [e for e in exprs if evaluate(e)[0] == row["target"]]
        misses = [e for e in exprs if evaluate(e)[0] != row["target"]]
        pick = hits if hits and rng.random() < correct else misses
        rows.append({"prompt": prompt, "completion": f"answer: {pick[rng.integers(len(pick))]}"})
    return rows


def run(cmd: list[str]) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/env_learning")
    p.add_argument("--demos", type=int, default=512)
    p.add_argument("--correct", type=float, default=0.3)
    p.add_argument("--sft-steps", type=int, default=60)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    vpo = [sys.executable, "-m", "vpo.cli.main"]
    demos = os.path.join(args.out, "demos.jsonl")
    with open(demos, "w") as f:
        for row in demonstrations(args.demos, args.correct, seed=10_000 + args.seed):
            f.write(json.dumps(row) + "\n")
    reward = os.path.join(args.out, "format.py")  # `--data` reads rewards; SFT does not use it
    with open(reward, "w") as f:
        f.write("def answered(completions, **kw):\n"
                "    return [float('answer:' in str(c)) for c in completions]\n")
    sft = os.path.join(args.out, "sft")
    if not os.path.exists(os.path.join(sft, "policy.json")):
        run([*vpo, "sft", "--data", demos, "--reward", f"{reward}:answered", "--model",
             "smollm2", "--answers", "1", "--steps", str(args.sft_steps), "--batch", "8", "--seed",
             str(args.seed), "--out", sft, "--overwrite"])
    rl = os.path.join(args.out, "grpo")
    run([*vpo, "train", "--env", "vpo.env.calculator:make_env", "--env-turns", "2",
         "--init", sft, "model.lora_rank=8", f"train.steps={args.steps}",
         f"train.batch_size={args.batch}", f"sampler.num_samples={args.samples}",
         "sampler.max_new_tokens=64", f"train.seed={args.seed}", "--out", rl, "--overwrite"])
    with open(os.path.join(rl, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    steps = [r["step"] for r in rows]
    print(f"{len(rows)} steps")
    for key in ("reward", "reward/hit", "reward/given_only", "reward/few_calls", "env/turns"):
        values = [r.get(key, np.nan) for r in rows]
        tau, p_up, p_down = kendall(steps, values)
        first, last = np.nanmean(values[:5]), np.nanmean(values[-5:])
        print(f"{key}: first 5 steps {first:.3f}, last 5 {last:.3f}; Kendall τ {tau:+.3f}, "
              f"one-sided p rising {p_up:.4f}, falling {p_down:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
