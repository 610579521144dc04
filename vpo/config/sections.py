"""Generation (`SamplerConfig`), evolutionary search (`SearchConfig`), the search's test-time
policy-gradient step (`LearnConfig`) and multi-host start-up (`DistributedConfig`) settings."""

from __future__ import annotations

import dataclasses

from vpo.config.fields import (
    FLAG,
    FRACTION,
    LEARN_OBJECTIVES,
    POSITIVE,
    SELECTIONS,
    TEXT,
    integer,
    one_of,
    real,
    require,
    validate,
)


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """Generation settings. Temperature, top-p and top-k are traced: changing them never recompiles.

    `temperature == 0` is greedy decoding; `top_k == 0` and `top_p == 1` disable those filters.
    `num_slots` S: 0 < S < B·G decodes the B·G rollouts through S rows that take the next
    rollout as soon as theirs stops (`vpo.rollout.slots`: a long completion no longer holds the
    batch; each rollout keeps its own key's draws); S ≥ B·G decodes every rollout in its own
    row; 0 (default) does so while the rows' KV caches fit a quarter of the devices' memory, and
    past it takes the most slots that fit (`vpo.rollout.slots.slots_for`).
    `served_context` C: under `vpo train --env` with a verifiers 0.4 environment, the positions
    (prompt + completion) of each slot of the policy served to it, which its KV cache holds
    (`vpo.rl.env_served`); 0 (default): the rows' prompt length + 2 T (the episode's budget T,
    and room for its turns to grow the prompt by as much), within the model's positions. A
    request whose prompt outgrows C - T ends the run with this field named.
    """

    max_new_tokens: int = 32  # T
    num_samples: int = 4  # G, samples per prompt sharing the prompt's KV cache
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    num_slots: int = 0  # S, rows decoding at once (0: all B·G where memory allows)
    served_context: int = 0  # C, positions per slot of the policy served under --env (0: auto)

    def __post_init__(self):
        validate("sampler", self, {"max_new_tokens": POSITIVE, "num_samples": POSITIVE,
                                   "temperature": real(0.0), "top_p": FRACTION,
                                   "top_k": integer(0), "num_slots": integer(0),
                                   "served_context": integer(0)})
        require(self.served_context == 0 or self.served_context > self.max_new_tokens,
                "sampler.served_context", f"{self.served_context} must exceed "
                f"sampler.max_new_tokens {self.max_new_tokens} (the served prompts need room), "
                "or be 0 (the rows' prompt length + 2 x max_new_tokens)")


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """Island-model search settings (`vpo.search.ingraph`, `vpo.search.host`; library defaults, not
    a paper's setting)."""

    islands: int = 4  # I
    members: int = 8  # Q, population per island
    parents: int = 2  # K, parents shown in one mutation prompt
    children: int = 8  # C, candidates per island per generation (C / num_answers policy calls)
    generations: int = 8
    migration_interval: int = 2  # 0: never migrate
    migration_count: int = 1
    reset_interval: int = 0  # 0: never reset
    reset_count: int = 0
    fresh_rate: float = 1 / 6  # probability that a call samples the plain task prompt
    selection: str = "boltzmann"
    selection_temperature: float = 0.1  # Boltzmann temperature on fitness
    tournament_size: int = 3
    temperature: float = 1.0  # sampler
    top_p: float = 1.0  # sampler
    num_slots: int = 0  # sampler rows decoding at once (`SamplerConfig.num_slots`)
    num_answers: int = 2  # m answers per policy call, each one candidate

    def __post_init__(self):
        validate("search", self, {
            **dict.fromkeys(("islands", "members", "parents", "children", "generations",
                             "num_answers", "tournament_size"), POSITIVE),
            **dict.fromkeys(("migration_interval", "migration_count", "reset_interval",
                             "reset_count", "num_slots"), integer(0)),
            "fresh_rate": real(0.0, 1.0), "selection": one_of(SELECTIONS),
            "selection_temperature": real(0.0, lo_open=True), "temperature": real(0.0),
            "top_p": FRACTION})
        require(self.parents <= self.members, "search.parents",
                 f"must be <= search.members ({self.members}); got {self.parents}")
        m = self.num_answers
        require(self.members % m == 0, "search.members",
                 f"must be a multiple of search.num_answers ({m}); got {self.members}")
        require(self.children % m == 0, "search.children",
                 f"must be a multiple of search.num_answers ({m}); got {self.children}")
        require(2 * self.migration_count <= self.members, "search.migration_count",
                 f"must be <= search.members / 2 ({self.members // 2}); got "
                 f"{self.migration_count}")
        require(self.reset_count < self.islands or self.reset_interval == 0,
                 "search.reset_count", f"must be < search.islands ({self.islands}) when resets "
                 "are on")

    @property
    def budget(self) -> int:
        """Candidates evaluated by a whole run: I·Q (initial) + generations·I·C."""
        return self.islands * (self.members + self.generations * self.children)


@dataclasses.dataclass(frozen=True)
class LearnConfig:
    """The island search that learns (`vpo.search.learn`): after each generation one
    policy-gradient step on that generation's children. `objective`: "grpo" (group z-score of
    each call's fitness), "vpo" (VPO's expected-max set advantage over a call's m answers),
    "entropic" (TTT-Discover's KL-budgeted exponential weights). `lora_rank` > 0: adapters of
    that rank are trained on a policy without them (a policy with adapters trains its own);
    0 trains every weight. `every` k > 1: the step runs after every k-th generation only, on
    that generation's children (the others' are not learned from), for about 1/k of the
    update's cost per generation."""

    objective: str = "grpo"
    learning_rate: float = 1e-4  # AdamW
    kl_coef: float = 0.0  # k3 KL to the starting policy, per completion token
    max_grad_norm: float = 1.0
    lora_rank: int = 8
    every: int = 1  # update after generations k, 2k, ... (1: after every generation)
    num_weights: int = 100  # vpo: Dirichlet weight draws K per group
    alpha: float = 1.0  # vpo: Dirichlet concentration
    eps: float = 1e-6  # grpo / vpo: z-score epsilon

    def __post_init__(self):
        validate("learn", self, {
            "objective": one_of(LEARN_OBJECTIVES), "learning_rate": real(0.0, lo_open=True),
            "kl_coef": real(0.0), "max_grad_norm": real(0.0, lo_open=True),
            "lora_rank": integer(0), "every": POSITIVE, "num_weights": POSITIVE,
            "alpha": real(0.0, lo_open=True), "eps": real(0.0, lo_open=True)})


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """Multi-host start-up through `jax.distributed.initialize` (nothing home-made).

    Leave `coordinator` empty on TPU / SLURM / Open MPI, where JAX discovers the cluster itself.
    """

    enabled: bool = False
    coordinator: str = ""  # "host:port" of process 0
    num_processes: int = 1
    process_id: int = 0
    cpu_collectives: str = "gloo"  # for multi-process CPU runs (tests, laptops)

    def __post_init__(self):
        validate("distributed", self, {"enabled": FLAG, "coordinator": TEXT,
                                       "num_processes": POSITIVE, "process_id": integer(0),
                                       "cpu_collectives": TEXT})
        require(self.process_id < self.num_processes, "distributed.process_id",
                 f"must be < num_processes ({self.num_processes}); got {self.process_id}")

