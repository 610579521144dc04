"""`vpo serve` against the offline sampler: requests/s and tokens/s at 1, 8 and 64 concurrent
clients, and the offline sampler's tokens/s on the same prompts, in one run.

Run:  python experiments/bench_serve.py                       (SmolLM2-135M-Instruct, CPU)
      python experiments/bench_serve.py --model tiny --quick  (a smoke run on the tiny preset)

The server is `vpo serve --model smollm2 --slots 64 --warmup` in a subprocess (its compiles
done before timing), the clients threads of this process, each sending chat requests one after
another (a closed loop) with `httpx`; tokens are the completion tokens the responses report.
The offline sampler (`vpo.rollout.sampler.generate_jit`, what `vpo sample` runs) decodes the
same requests' prompts with the same keys in batches of the concurrency (64 clients: batches of
64 rows), warm, in this process, right after each server run at that concurrency while the
server idles (the two never decode at once). `--rounds` pairs of the two, in turn, so a change
in the machine's other load falls on both; the table gives medians and the per-round ratio's
range. Every request asks for `--max-tokens` new tokens at temperature 1;
a completion ends at its end-of-turn token or at the budget. Prints one table row per
concurrency: requests/s and tokens/s of the server, tokens/s of the offline sampler and the
ratio.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import subprocess
import sys
import time

import httpx
import jax
import numpy as np
from flax import nnx

from vpo.rollout.sampler import generate_jit
from vpo.serve.engine import request_keys

TOPICS = ("the sea", "a city at night", "an old clock", "winter", "a robot", "bread",
          "a long train ride", "the moon", "a garden", "mathematics", "a lost key", "rain",
          "a library", "mountains", "a small dog", "coffee")


def prompts(n: int) -> list[list[dict]]:
    """n chat requests: a short text about one of `TOPICS` (cycled, numbered)."""
    return [[{"role": "user", "content": f"Write a few sentences about {TOPICS[i % len(TOPICS)]}"
              f" (request {i})."}] for i in range(n)]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"vpo serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"vpo serve did not answer in {timeout:.0f}s")


def run_clients(url: str, model: str, messages: list, clients: int, max_tokens: int):
    """(seconds, completion tokens) of sending `messages` (request i with seed i) from
    `clients` closed-loop clients."""
    todo = list(range(len(messages)))
    tokens = []

    def client():
        with httpx.Client(base_url=url, timeout=3600) as http:
            while todo:
                try:
                    i = todo.pop(0)
                except IndexError:
                    return
                r = http.post("/v1/chat/completions", json={
                    "model": model, "messages": messages[i], "max_tokens": max_tokens,
                    "seed": i, "temperature": 1.0})
                r.raise_for_status()
                tokens.append(r.json()["usage"]["completion_tokens"])

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(client) for _ in range(clients)]:
            f.result()
    return time.perf_counter() - t0, sum(tokens)


def offline(model, tokenizer, messages: list, batch: int, max_tokens: int):
    """(seconds, generated tokens) of the offline sampler over `messages` in batches of
    `batch` rows, request i with the key the server gives seed i (compiled first)."""
    graphdef, state = nnx.split(model)
    ids = [tokenizer.prompt_ids(m) for m in messages]
    P = max(len(i) for i in ids)  # one shape for every batch: one compile

    def call(rows):
        tokens = np.full((len(rows), P), tokenizer.pad_id, np.int32)
        mask = np.zeros((len(rows), P), bool)
        for a, i in enumerate(rows):
            tokens[a, P - len(ids[i]):], mask[a, P - len(ids[i]):] = ids[i], True
        keys = jax.random.wrap_key_data(np.stack([request_keys(i, 1)[0] for i in rows]))
        ro = generate_jit(graphdef, state, tokens, mask, keys.reshape(len(rows), 1),
                          np.float32(1.0), np.float32(1.0), np.int32(0),
                          max_new_tokens=max_tokens, stop_ids=tokenizer.stop_ids,
                          pad_id=tokenizer.pad_id)
        return int(np.asarray(ro.mask_BGT).sum())

    batches = [list(range(s, min(s + batch, len(messages))))
               for s in range(0, len(messages), batch)]
    call(batches[0])  # compile (--requests are multiples of --clients: every batch full)
    t0 = time.perf_counter()
    n = sum(call(rows) for rows in batches)
    return time.perf_counter() - t0, n


def load(model_name: str, prompt_tokens: int, max_tokens: int):
    """(model, tokenizer) as `vpo serve` loads them (`vpo.cli.serve.served_model`)."""
    from vpo.cli.serve import served_model

    preset = model_name in ("tiny", "small")
    args = argparse.Namespace(policy=None if preset else model_name, preset=model_name,
                              task="maze", served_name=None, max_prompt_tokens=prompt_tokens,
                              max_tokens=max_tokens, seed=0)
    return served_model(args)[:2]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="smollm2, hf:PATH or a preset (tiny)")
    p.add_argument("--clients", default="1,8,64")
    p.add_argument("--requests", default="6,16,128", help="requests per concurrency level")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-prompt-tokens", type=int, default=64)
    p.add_argument("--chunk", type=int, default=32)
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--rounds", type=int, default=3, help="server and offline runs in turn")
    p.add_argument("--quick", action="store_true", help="clients 1,4 with 4 and 8 requests")
    args = p.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    counts = [int(c) for c in args.requests.split(",")]
    if args.quick:
        clients, counts, args.rounds = [1, 4], [4, 8], 1
    slots = max(clients)
    url = f"http://127.0.0.1:{args.port}"
    served = "tiny" if args.model in ("tiny", "small") else "model"
    cmd = [sys.executable, "-m", "vpo.cli.main", "serve", "--port", str(args.port),
           "--slots", str(slots), "--max-tokens", str(args.max_tokens),
           "--max-prompt-tokens", str(args.max_prompt_tokens), "--chunk", str(args.chunk),
           "--queue", str(max(256, max(counts))), "--served-name", served, "--warmup"]
    cmd += (["--preset", args.model] if args.model in ("tiny", "small")
            else ["--model", args.model])
    print(" ".join(cmd[1:]), flush=True)
    model, tokenizer = load(args.model, args.max_prompt_tokens, args.max_tokens)
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    rows = []
    try:
        wait_ready(url, proc, timeout=3600)
        for c, n in zip(clients, counts, strict=True):
            run_clients(url, served, prompts(c), c, args.max_tokens)  # warm the client path
            offline(model, tokenizer, prompts(n), c, args.max_tokens)  # and the offline compile
            rounds = []
            for r in range(args.rounds):  # server, then offline with the server idle (no CPU)
                s, tok = run_clients(url, served, prompts(n), c, args.max_tokens)
                off_s, off_tok = offline(model, tokenizer, prompts(n), c, args.max_tokens)
                rounds.append((n / s, tok / s, off_tok / off_s, (tok / s) / (off_tok / off_s)))
                print(f"{c} clients, round {r}: server {n} requests in {s:.1f}s ({tok} tokens), "
                      f"offline {off_s:.1f}s ({off_tok} tokens)", flush=True)
            rows.append((c, n, rounds))
    finally:
        proc.terminate()
        proc.wait()
    print(f"\nmodel {args.model}, {args.max_tokens} new tokens per request at most, server "
          f"--slots {slots} --chunk {args.chunk}; {os.cpu_count()} CPU cores; medians of "
          f"{args.rounds} rounds (the ratio's range in brackets)\n")
    print("| clients | requests | server requests/s | server tokens/s | offline tokens/s "
          "(batch = clients) | server / offline |")
    print("|---|---|---|---|---|---|")
    for c, n, rounds in rows:
        rps, tps, off, ratio = (statistics.median(x) for x in zip(*rounds, strict=True))
        lo, hi = min(r[3] for r in rounds), max(r[3] for r in rounds)
        print(f"| {c} | {n} | {rps:.2f} | {tps:.1f} | {off:.1f} | {ratio:.2f} "
              f"[{lo:.2f}, {hi:.2f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
