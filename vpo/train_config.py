"""Frozen configuration of RL / SFT training: objective, optimiser and loop, and the whole run.

Validated on construction; errors name the field and the fix (`vpo.config.ConfigError`).
`RunConfig` is what `vpo.train.train` takes and what a checkpoint stores as JSON.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vpo.config import ConfigError, ModelConfig, SamplerConfig, model_preset

ADVANTAGES = ("grpo", "dr_grpo", "rloo", "maxrl", "gdpo", "vpo")


def _require(cond: bool, field: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{field}: {msg}")


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
    """Advantage estimator and policy-loss controls (see `vpo.objectives`).

    GRPO-family estimators see the scalarised reward `sum_m w*ᵀ r_m` over valid answers (one
    answer when num_answers = 1; Multi-RLVR otherwise); "vpo" sees the reward vectors.
    """

    advantage: str = "grpo"  # one of ADVANTAGES
    grpo_scale: str = "group"  # "group" | "batch" | "none" (dr_grpo forces "none")
    grpo_std: str = "unbiased"  # "unbiased" | "population"
    num_weights: int = 100  # K Dirichlet draws per prompt (vpo)
    alpha: float = 1.0  # Dirichlet concentration (vpo)
    weight_sampler: str = "iid"  # "iid" | "lattice" (vpo)
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    dual_clip: float | None = None
    ratio_level: str = "token"  # "token" | "sequence" (GSPO)
    agg: str = "token-mean"
    kl_coef: float = 0.0  # > 0 keeps a frozen reference copy of the initial params
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    entropy_top_frac: float | None = None
    cov_control: str = "none"  # "none" | "clip_cov" | "kl_cov"
    # DAPO (Yu et al., 2025, arXiv 2503.14476): dynamic sampling and overlong shaping
    dynamic_sampling: bool = False  # train only on groups whose rewards differ
    oversample: int = 1  # sample oversample × train.batch_size groups to choose from
    overlong_mask: bool = False  # truncated responses (no stop token) get zero loss weight
    overlong_cache_len: int = 0  # soft overlong penalty buffer L_cache in tokens (0: off)
    overlong_max_len: int | None = None  # L_max in tokens (None: sampler.max_new_tokens)

    def __post_init__(self):
        _require(self.advantage in ADVANTAGES, "objective.advantage",
                 f"must be one of {', '.join(ADVANTAGES)}; got {self.advantage!r}")
        _require(self.num_weights > 0, "objective.num_weights", "must be positive")
        _require(self.alpha > 0, "objective.alpha", "must be positive")
        _require(self.kl_coef >= 0, "objective.kl_coef", "must be >= 0")
        _require(self.oversample >= 1, "objective.oversample", "must be >= 1")
        _require(self.oversample == 1 or self.dynamic_sampling, "objective.oversample",
                 f"{self.oversample} samples extra groups only dynamic sampling uses; set "
                 "objective.dynamic_sampling=true or oversample=1")
        _require(self.overlong_cache_len >= 0, "objective.overlong_cache_len", "must be >= 0")
        _require(self.overlong_max_len is None or self.overlong_max_len > 0,
                 "objective.overlong_max_len", "must be positive (or None)")
        _require(self.overlong_max_len is None
                 or self.overlong_cache_len <= self.overlong_max_len,
                 "objective.overlong_cache_len", f"{self.overlong_cache_len} exceeds "
                 f"overlong_max_len {self.overlong_max_len}; the buffer lies inside L_max")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Loop, batch and optimiser settings.

    One RL step: `batch_size` prompts × G samples, then `ppo_epochs` × `num_minibatches`
    optimiser updates; each minibatch (whole prompt groups) is split into `grad_accum`
    micro-batches whose gradients are summed exactly (global loss denominator).
    """

    seed: int = 0
    steps: int = 100
    batch_size: int = 8  # B prompts per step (global, over all processes)
    num_answers: int = 1  # M answers requested per generation
    num_problems: int = 4096  # size of the problem set the data pipeline cycles through
    mutation_fraction: float = 0.0  # share of prompts that are search mutation prompts
    mutation_parents: int = 2  # parent slots of those prompts (match search.parents)
    ppo_epochs: int = 1
    num_minibatches: int = 1
    grad_accum: int = 1
    learning_rate: float = 1e-3
    schedule: str = "constant"  # "constant" | "cosine" (after warmup)
    warmup_steps: int = 0  # in optimiser updates
    min_lr_ratio: float = 0.1  # cosine floor, as a fraction of learning_rate
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    max_grad_norm: float = 1.0
    log_every: int = 1
    profile_every: int = 10  # time sampling vs update every this many steps (0: never)
    sample_every: int = 10  # log prompts, completions, rewards to samples.jsonl (0: never)
    checkpoint_every: int = 50  # steps; also saved at exit
    keep_checkpoints: int = 3
    vocab_block: int = 4096  # training forward: vocabulary tile of the log-prob/entropy scan
    logprob_impl: str = "chunked"  # "chunked" (lax.scan, any backend/mesh) | "pallas" | "reference"

    def __post_init__(self):
        for name in ("steps", "batch_size", "num_answers", "num_problems", "ppo_epochs",
                     "num_minibatches", "grad_accum", "log_every", "checkpoint_every",
                     "keep_checkpoints", "vocab_block", "mutation_parents"):
            _require(getattr(self, name) > 0, f"train.{name}", "must be a positive integer")
        _require(0.0 <= self.mutation_fraction <= 1.0, "train.mutation_fraction",
                 f"{self.mutation_fraction} must be in [0, 1]")
        split = self.num_minibatches * self.grad_accum
        _require(self.batch_size % split == 0, "train.batch_size",
                 f"{self.batch_size} must be divisible by num_minibatches * grad_accum = {split} "
                 "(minibatches and micro-batches hold whole prompt groups)")
        _require(self.schedule in ("constant", "cosine"), "train.schedule",
                 f"must be 'constant' or 'cosine'; got {self.schedule!r}")
        _require(self.profile_every >= 0, "train.profile_every", "must be >= 0 (0: never)")
        _require(self.sample_every >= 0, "train.sample_every", "must be >= 0 (0: never)")
        _require(self.learning_rate > 0, "train.learning_rate", "must be positive")
        _require(self.warmup_steps >= 0, "train.warmup_steps", "must be >= 0")
        _require(self.max_grad_norm > 0, "train.max_grad_norm", "must be positive")
        _require(self.logprob_impl in ("chunked", "pallas", "reference"), "train.logprob_impl",
                 "must be 'chunked', 'pallas' (GPU/TPU, one device) or 'reference' (full "
                 f"logits); got {self.logprob_impl!r}")

    @property
    def updates_per_step(self) -> int:
        return self.ppo_epochs * self.num_minibatches


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A whole training run: model, sampler, objective, loop, mesh, and the task by name.

    The task object itself is passed to `vpo.train.train` (built by the CLI from `task` and
    `task_kwargs`); the names are kept here so the checkpointed config says what was trained.
    """

    model: ModelConfig = dataclasses.field(default_factory=lambda: model_preset("tiny"))
    sampler: SamplerConfig = dataclasses.field(default_factory=SamplerConfig)
    objective: ObjectiveConfig = dataclasses.field(default_factory=ObjectiveConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    task: str = "bandit"
    task_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    mesh_data: int = -1  # mesh axis sizes (see vpo.sharding.make_mesh); -1: remaining devices
    mesh_fsdp: int = 1
    mesh_tensor: int = 1

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
