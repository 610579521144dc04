"""Evaluate a served policy with a plain OpenAI client: pass@1 and pass@n on a JSONL file.

    vpo serve --model smollm2 &            # or --policy runs/mine, --preset tiny
    python examples/serve/eval_client.py --data prompts.jsonl --n 4 --out results.jsonl

Each row of --data has a `prompt` (text, or chat messages) and a `solution`; a completion is
correct when the solution's text appears in it (swap `correct` for your own check). Every
row is one chat request with n samples and seed = the row's index, so a second run returns the
same completions. It needs only the `openai` package (`pip install -e '.[serve]'` installs it);
nothing here is specific to vpo, so the script runs against any OpenAI-compatible server
(--base-url).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from concurrent.futures import ThreadPoolExecutor

import openai


def correct(completion: str, row: dict) -> bool:
    return str(row["solution"]) in completion


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of n samples with c correct (Chen et al. 2021)."""
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--model", default=None, help="default: the server's first model")
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--clients", type=int, default=8, help="requests in flight at once")
    p.add_argument("--out", default=None, help="write each row's completions here (JSONL)")
    args = p.parse_args(argv)
    with open(args.data, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    client = openai.OpenAI(base_url=args.base_url, api_key="none", timeout=600)
    model = args.model or client.models.list().data[0].id

    def ask(i: int) -> dict:
        prompt = rows[i]["prompt"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return client.chat.completions.create(
            model=model, messages=messages, n=args.n, max_tokens=args.max_tokens, seed=i,
            temperature=args.temperature).model_dump()

    with ThreadPoolExecutor(args.clients) as pool:
        answers = list(pool.map(ask, range(len(rows))))
    results = []
    for row, answer in zip(rows, answers, strict=True):
        texts = [c["message"]["content"] for c in answer["choices"]]
        results.append({"prompt": row["prompt"], "completions": texts,
                        "correct": [correct(t, row) for t in texts]})
    n = args.n
    p1 = sum(pass_at_k(n, sum(r["correct"]), 1) for r in results) / len(results)
    pn = sum(pass_at_k(n, sum(r["correct"]), n) for r in results) / len(results)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in results)
    print(json.dumps({"model": model, "rows": len(results), "n": n, "pass@1": p1,
                      f"pass@{n}": pn}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
