"""How often a random answer hits a target of the two-target countdown task (`countdown2`).

For each generator setting, over 500 problems (seed 0):

- uniform: the exact probability that a uniformly random fully parenthesised expression over the
  given numbers (each at most once, at least one operator) hits t1 or t2
  (`countdown2.random_hit_rate`), mean and 10/50/90th percentiles over problems;
- check: the same probability estimated by sampling those expressions (2,000 per problem on the
  first 50 problems) and scoring them with the task's own scorer;
- all-K: the probability that a random expression over ALL K numbers (random order, bracketing and
  operators, `arithmetic.random_expression`) hits t1 or t2 (2,000 per problem, first 50 problems);
- pass@12 and cover@12 of 12 independent uniform random answers: the mean over problems of
  1 - (1 - p)^12 and of 1 - (1 - p1)^12 - (1 - p2)^12 + (1 - p)^12 (both targets hit), where p1,
  p2 are the per-target rates and p = p1 + p2.

Run:  PYTHONPATH=. .venv/bin/python experiments/countdown2_hit_rate.py
"""

from __future__ import annotations

import time

import numpy as np

from vpo.tasks import arithmetic, countdown2

SETTINGS = (
    {},  # the defaults: K=4, numbers 1..15, targets 10..99, min_ops=2
    {"min_ops": 1},
    {"num_numbers": 4, "max_number": 25, "max_target": 199},
    {"num_numbers": 5},
    {"num_numbers": 5, "max_number": 25, "max_target": 199},
    {"num_numbers": 3, "max_number": 12, "max_target": 99},
)


def uniform_samples(record, rng, draws):
    """`draws` uniformly random fully parenthesised expressions over the given numbers."""
    nums = record["numbers"]
    counts = countdown2.expression_counts(nums)
    per_value, total = countdown2.compound_counts(counts)
    values = list(per_value)
    p = np.array([per_value[v] for v in values], np.float64) / total
    picks = rng.choice(len(values), size=draws, p=p)
    return [countdown2.sample_expression(nums, counts, values[i], rng) for i in picks]


def main():
    for kwargs in SETTINGS:
        task = countdown2.make_countdown2_task(**kwargs)
        t0 = time.perf_counter()
        records = task.make_problems(0, 500)
        ms = 1000 * (time.perf_counter() - t0) / len(records)
        rates = np.array([countdown2.random_hit_rate(r) for r in records])
        p1, p2 = np.array([countdown2.random_hit_rates(r) for r in records]).T
        cover = np.mean(1 - (1 - p1) ** 12 - (1 - p2) ** 12 + (1 - rates) ** 12)
        rng = np.random.default_rng(1)
        check, all_k = [], []
        for r in records[:50]:
            texts = [" ".join(w) for w in uniform_samples(r, rng, 2000)]
            rew, _ = countdown2.make_countdown2_task(**kwargs).score([r] * len(texts),
                                                                      [[t] for t in texts])
            check.append(float(np.mean(rew[:, 0, :2].max(-1))))
            hits = 0
            for _ in range(2000):
                order = [r["numbers"][i] for i in rng.permutation(len(r["numbers"]))]
                value, _ = arithmetic.parse(arithmetic.random_expression(rng, order))
                hits += value in r["targets"]
            all_k.append(hits / 2000)
        q10, q50, q90 = np.percentile(rates, [10, 50, 90])
        print(f"{kwargs or 'defaults'}: uniform {rates.mean():.4f} (p10 {q10:.4f} p50 {q50:.4f} "
              f"p90 {q90:.4f}), check {np.mean(check):.4f} vs exact "
              f"{rates[:50].mean():.4f}, all-K {np.mean(all_k):.4f}, pass@12 "
              f"{np.mean(1 - (1 - rates) ** 12):.3f}, cover@12 {cover:.3f}; {ms:.1f} ms/problem; "
              f"e.g. {records[0]}")


if __name__ == "__main__":
    main()
