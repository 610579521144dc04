"""Do the shipped environments learn on SmolLM2-135M-Instruct with LoRA on a CPU? The calculator
(`vpo.env.calculator`) and the retrieval environment (`vpo.env.retrieval`), end to end through
the commands a user types:

1. a tool-use warm start that teaches the formats and the tool calls, not the answers:
   `vpo sft --data` on conversations in the environment's own messages, one row per assistant
   turn (the prompt is the conversation so far, ending with the user's or the tool's message;
   the completion is that turn). Conversation styles are mixed, so the warm start sometimes
   calls the tool and sometimes guesses, and RL has something to reinforce:
   - calculator: answer at once; check one expression with `calc:` and answer it; check a miss,
     then a hit, and answer the hit. A share `--correct` of the checked expressions reach the
     target (the others are well-formed misses);
   - retrieval: guess a country; search the person and guess; search the person, then the city,
     and answer the country naming the city (the full two hops);
2. `vpo train --env vpo.env.<env>:make_env --init <warm start> model.lora_rank=8` (GRPO; with
   `--objective vpo`, VPO over sets of 2 episodes from the same warm start);
3. the test, decided before the run: Kendall's τ of the training reward (w*ᵀr per episode,
   averaged over the step's episodes) against the step over every logged step, one-sided
   (rising) p < 0.025 (`vpo.eval.claims.kendall`); the unit is the step of one run, so the
   verdict is about this run, not about seeds. Also printed: the same for each component and
   the turns per episode.

    python experiments/env_learning.py --env calculator --out runs/env_calculator
    python experiments/env_learning.py --env retrieval --out runs/env_retrieval
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
from vpo.env.retrieval import RetrievalEnv
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


def play(env, row: dict, turns: list[str]) -> list[dict]:
    """The conversation of `turns` (the assistant's messages) in `env`, its observations
    included: [first messages, assistant, observation..., assistant, ...]."""
    messages = list(env.reset(row))
    for said in turns:
        messages.append({"role": "assistant", "content": said})
        seen = env.step(messages)
        if seen is None:
            break
        messages += seen
    return messages


def calculator_turns(row: dict, correct: float, rng: np.random.Generator,
                     tools: bool = True) -> list[str]:
    exprs = expressions(row["numbers"])
    hits = [e for e in exprs if evaluate(e)[0] == row["target"]]
    misses = [e for e in exprs if evaluate(e)[0] != row["target"]]
    hit = hits and rng.random() < correct
    pick = hits[rng.integers(len(hits))] if hit else misses[rng.integers(len(misses))]
    style = rng.integers(3) if tools else 0
    if style == 0:
        return [f"answer: {pick}"]
    if style == 1 or not hit:
        return [f"calc: {pick}", f"answer: {pick}"]
    miss = misses[rng.integers(len(misses))]
    return [f"calc: {miss}", f"calc: {pick}", f"answer: {pick}"]


def retrieval_turns(env: RetrievalEnv, row: dict, rng: np.random.Generator,
                    tools: bool = True) -> list[str]:
    person = row["person"]
    city, country = env.facts[person]
    countries = sorted({k for _, k in env.facts.values()})
    guess = countries[rng.integers(len(countries))]
    style = rng.integers(3) if tools else 0
    if style == 0:
        return [f"answer: {guess}"]
    if style == 1:
        return [f"search: {person}", f"{person} was born in {city}.\nanswer: {guess}"]
    return [f"search: {person}", f"search: {city} city",
            f"{person} was born in {city}, a city in {country}.\nanswer: {country}"]


def demonstrations(env_name: str, num: int, correct: float, seed: int, tools: bool = True
                   ) -> list[dict]:
    """SFT rows {prompt, completion} of `num` demonstrated conversations, a row per assistant
    turn: the prompt is the conversation before that turn. `tools=False`: one-line answers
    only (a format-only warm start that never shows the tool)."""
    env = CalculatorEnv() if env_name == "calculator" else RetrievalEnv()
    rng = np.random.default_rng(seed)
    rows = []
    for row in env.problems(seed, num):
        turns = (calculator_turns(row, correct, rng, tools) if env_name == "calculator"
                 else retrieval_turns(env, row, rng, tools))
        messages = play(env, row, turns)
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                rows.append({"prompt": messages[:i], "completion": m["content"]})
    return rows


def run(cmd: list[str]) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", choices=("calculator", "retrieval"), default="calculator")
    p.add_argument("--out", default=None, help="default: runs/env_<env>")
    p.add_argument("--demos", type=int, default=512)
    p.add_argument("--correct", type=float, default=0.3)
    p.add_argument("--sft-steps", type=int, default=120)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm-start", choices=("tools", "format"), default="tools",
                   help="format: one-line answer demonstrations only, never the tool")
    p.add_argument("--objective", choices=("grpo", "vpo"), default="grpo",
                   help="vpo: objective.advantage=vpo over sets of --env-set 2 episodes, from "
                   "the same warm start (out/vpo beside out/grpo)")
    args = p.parse_args()
    args.out = args.out or f"runs/env_{args.env}"
    os.makedirs(args.out, exist_ok=True)
    vpo = [sys.executable, "-m", "vpo.cli.main"]
    demos = os.path.join(args.out, "demos.jsonl")
    with open(demos, "w") as f:
        for row in demonstrations(args.env, args.demos, args.correct,
                                  seed=10_000 + args.seed, tools=args.warm_start == "tools"):
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
    rl = os.path.join(args.out, args.objective)
    arm = ["objective.advantage=vpo", "--env-set", "2"] if args.objective == "vpo" else []
    run([*vpo, "train", "--env", f"vpo.env.{args.env}:make_env", "--env-turns",
         str(args.turns), "--init", sft, *arm, "model.lora_rank=8", f"train.steps={args.steps}",
         f"train.batch_size={args.batch}", f"sampler.num_samples={args.samples}",
         f"sampler.max_new_tokens={args.max_new_tokens}", f"train.seed={args.seed}", "--out", rl,
         "--overwrite"])
    with open(os.path.join(rl, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    steps = [r["step"] for r in rows]
    print(f"{len(rows)} steps")
    names = CalculatorEnv.reward_names if args.env == "calculator" else RetrievalEnv.reward_names
    for key in ("reward", *(f"reward/{n}" for n in names), "env/turns", "env/observation_tokens"):
        values = [r.get(key, np.nan) for r in rows]
        tau, p_up, p_down = kendall(steps, values)
        first, last = np.nanmean(values[:5]), np.nanmean(values[-5:])
        print(f"{key}: first 5 steps {first:.3f}, last 5 {last:.3f}; Kendall τ {tau:+.3f}, "
              f"one-sided p rising {p_up:.4f}, falling {p_down:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
