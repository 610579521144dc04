"""Environments in worker processes vs in this process, on an environment whose calls are slow.

Run:  python experiments/bench_env_workers.py                (~1 minute on a CPU)
      python experiments/bench_env_workers.py --delay 0.2 --workers 2,8

The workload: B rows × G episodes of up to `--turns` turns with the tiny HF fixture policy
(tests/fixtures/hf/qwen2_tied); the environment (`SlowEnv`, written to a temporary module so
that spawned workers import it) sleeps `--delay` seconds in every `step` and `score`, as a
sandboxed program, a search index or a simulator would take. The same keys every time, so
every setting runs the same episodes (checked: the same messages). Times are medians of
`--repeats` warm calls per setting (the first call, with compilation, is left out), measured
in one process; the ratio is in-process time / workers time.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

ENV = '''
import time

DELAY = {delay}
CALLS = []  # in this process: one entry per slow call

class SlowEnv:
    reward_names = ("replied",)
    weights = (1.0,)

    def reset(self, row):
        return [{{"role": "user", "content": f"Say something about {{row['n']}}."}}]

    def step(self, messages):
        CALLS.append(1)
        time.sleep(DELAY)
        return [{{"role": "user", "content": "Go on."}}]

    def score(self, messages):
        CALLS.append(1)
        time.sleep(DELAY)
        return [float(any(m["role"] == "assistant" and m["content"] for m in messages))]

def make_env():
    return SlowEnv()
'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--delay", type=float, default=0.05)
    p.add_argument("--workers", default="2,4,8")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    import jax

    from vpo.env.episode import run_episodes
    from vpo.env.workers import EnvWorkers
    from vpo.io import hf

    fixture = pathlib.Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf" / \
        "qwen2_tied"
    model, tok = hf.from_pretrained(fixture, dtype="float32"), hf.load_tokenizer(fixture)
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "slow_env.py")
    with open(path, "w") as f:
        f.write(ENV.format(delay=args.delay))
    sys.path.insert(0, folder)
    import slow_env

    B, G = args.rows, args.samples
    rows = [{"n": b} for b in range(B)]
    keys = jax.random.split(jax.random.key(0), B * G).reshape(B, G)

    def run(make):
        t0 = time.perf_counter()
        ep = run_episodes(model, tok, [[make() for _ in range(G)] for _ in range(B)], rows, keys,
                          max_tokens=args.max_new_tokens, max_turns=args.turns,
                          reward_names=("replied",))
        return time.perf_counter() - t0, ep

    def timed(make):
        run(make)  # compile (and start-up) left out
        times, eps = zip(*(run(make) for _ in range(args.repeats)), strict=True)
        return statistics.median(times), eps[0]

    base, ep0 = timed(slow_env.make_env)
    calls = len(slow_env.CALLS) // (1 + args.repeats)  # per batch, counted in-process
    print(f"{B} rows x {G} episodes, up to {args.turns} turns, {args.delay * 1e3:.0f} ms per "
          f"environment call, {calls} step and score calls per batch "
          f"({calls * args.delay:.1f} s of environment time in sequence)")
    print(f"in-process: {base:.2f} s per batch")
    for n in (int(x) for x in args.workers.split(",")):
        pool = EnvWorkers(f"{path}:make_env", n, timeout=60.0)
        try:
            t, ep = timed(pool.factory)
        finally:
            pool.close()
        same = ep.messages == ep0.messages
        print(f"--env-workers {n}: {t:.2f} s per batch, {base / t:.2f}x the in-process speed "
              f"(same episodes: {same})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
