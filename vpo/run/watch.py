"""Signs in a run's metrics rows that it is not learning, each warned about once per run.

`RunWatch.check(row)` reads one metrics row (`vpo.run.metrics_log`) and returns the warnings it
newly raises, naming the setting to change:

- truncated completions: more than `truncation_limit` (a quarter) of the step's completions hit
  `sampler.max_new_tokens` without a stop token (`truncation_rate`);
- no learning signal: every group's rewards were equal (`zero_variance_frac` == 1, so every
  advantage and the policy gradient are zero) for `patience` logged steps in a row.

Pure: it keeps only its counters; the caller prints.
"""

from __future__ import annotations

from typing import Any

TRUNCATION_LIMIT = 0.25
PATIENCE = 5


class RunWatch:
    """Warns once about truncated completions and once about steps with no learning signal."""

    def __init__(self, max_new_tokens: int, *, truncation_limit: float = TRUNCATION_LIMIT,
                 patience: int = PATIENCE):
        self.max_new_tokens = max_new_tokens
        self.truncation_limit = truncation_limit
        self.patience = patience
        self.equal_run = 0  # logged steps in a row whose groups' rewards were all equal
        self.fired: set[str] = set()

    def check(self, row: dict[str, Any]) -> list[str]:
        """The warnings `row` raises that were not raised before in this run."""
        out = []
        rate = row.get("truncation_rate")
        if (rate is not None and rate > self.truncation_limit
                and "truncation" not in self.fired):
            self.fired.add("truncation")
            out.append(f"step {row['step']}: {rate:.0%} of completions hit "
                       f"sampler.max_new_tokens without a stop token (more than "
                       f"{self.truncation_limit:.0%}): their answers are cut off; raise "
                       f"sampler.max_new_tokens (now {self.max_new_tokens})")
        frac = row.get("zero_variance_frac")
        if frac is not None:
            self.equal_run = self.equal_run + 1 if frac >= 1.0 else 0
            if self.equal_run >= self.patience and "no_signal" not in self.fired:
                self.fired.add("no_signal")
                out.append(f"step {row['step']}: every group's rewards were equal for "
                           f"{self.equal_run} steps: no learning signal (zero advantages, zero "
                           "gradient); check your reward functions / the answer format / "
                           "temperature (sampler.temperature)")
        return out
