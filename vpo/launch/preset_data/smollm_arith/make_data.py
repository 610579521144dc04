"""Write prompts.jsonl for the smollm-arith preset: additions a + b (a, b in 1..12), one row each
with the prompt and the answer column the `correct` reward reads.

    python vpo/launch/preset_data/smollm_arith/make_data.py   # rewrites prompts.jsonl beside it
"""

import json
import os
import random


def rows(num: int = 512, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(num):
        a, b = rng.randint(1, 12), rng.randint(1, 12)
        out.append({"prompt": f"What is {a} + {b}? Answer with the number.", "answer": a + b})
    return out


if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows())
    print(f"wrote {path}")
