"""Frozen configuration of RL / SFT training: objective, optimiser and loop, the whole run and
the static part of one RL step (`StepConfig`).

Validated on construction against the rule tables below (`vpo.config.validate`, the one helper;
names against the tables of `vpo.config`); errors name the field and the fix
(`vpo.config.ConfigError`). `RunConfig` is what `vpo.run.loop.train` takes and what a checkpoint
stores as JSON; its cross-section checks run where the run is complete, and
`RunConfig.memory_bytes` is the size check `vpo.rl.checks.check_run` makes before allocating.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vpo.config.fields import (
    ADVANTAGES,
    AGG_MODES,
    COV_CONTROLS,
    FLAG,
    FRACTION,
    GRPO_SCALES,
    KL_ESTIMATORS,
    LOGPROB_IMPLS,
    POSITIVE,
    RATIO_LEVELS,
    ROLLOUT_IS,
    SCHEDULES,
    STD_MODES,
    WEIGHT_SAMPLERS,
    ConfigError,
    integer,
    one_of,
    real,
    require,
    validate,
)
from vpo.config.model import ModelConfig, model_preset
from vpo.config.sections import SamplerConfig

SUBSET_ESTIMATORS = ("maxk", "passk")  # estimators over k-subsets of a group (objective.subset_k)


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
    """Advantage estimator and policy-loss controls (see `vpo.objectives`).

    GRPO-family estimators see the scalarised reward `sum_m w*ᵀ r_m` over valid answers (one
    answer when num_answers = 1; Multi-RLVR otherwise); "vpo" sees the reward vectors;
    "rw_grpo" the per-component sums over valid answers, scalarised by a fresh Dirichlet
    weight per prompt group and step; "passk" whether any valid answer solves the problem.
    Fields of other estimators are ignored here (one objective section serves several arms in
    `vpo compare`); `vpo train` refuses one given with a non-default value that its estimator
    does not read (`vpo.objectives.estimators.Estimator.reads`).

    Clip-Cov / KL-Cov (Cui et al., arXiv 2505.22617) select `max(floor(ratio · N_valid),
    cov_min_tokens)` tokens per loss call. The ratios default to the 7B recipe's 2e-3; the
    original rule's floor of 1 token makes the controls inert at CPU batch sizes (the default
    batch has at most 1024 response tokens: floor(2e-3 · 1024) = 2), hence the floor of 10
    (at the paper's 256 × 8 × 8k tokens the ratio decides; `cov_min_tokens=1` is the original).
    """

    advantage: str = "grpo"  # one of vpo.config.ADVANTAGES
    grpo_scale: str = "group"  # "group" | "batch" | "none" (dr_grpo forces "none")
    grpo_std: str = "unbiased"  # "unbiased" | "population" (also maxk's std normalisation)
    num_weights: int = 100  # K Dirichlet draws per prompt (vpo)
    alpha: float = 1.0  # Dirichlet concentration (vpo, rw_grpo)
    weight_sampler: str = "iid"  # "iid" | "lattice" (vpo)
    subset_k: int | None = None  # k of maxk / passk; None: max(2, G // 2)
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
    clip_cov_ratio: float = 2e-3  # fraction of valid tokens Clip-Cov detaches
    clip_cov_lb: float = 1.0  # Clip-Cov candidates: clip_cov_lb < cov < clip_cov_ub
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-3  # fraction of valid tokens KL-Cov penalises
    kl_cov_coef: float = 1.0  # KL-Cov's |log ratio| coefficient
    cov_min_tokens: int = 10  # floor of the Clip-Cov / KL-Cov token count per loss call
    # GPPO (Klear-Reasoner, arXiv 2508.07629): a PPO-clipped token keeps a bounded gradient,
    # (1 ± eps)·A·∇log π, instead of none; the loss values are PPO-clip's
    gppo: bool = False
    # DAPO (Yu et al., 2025, arXiv 2503.14476): dynamic sampling and overlong shaping
    dynamic_sampling: bool = False  # train only on groups whose rewards differ
    oversample: int = 1  # sample oversample × train.batch_size groups to choose from
    overlong_mask: bool = False  # truncated responses (no stop token) get zero loss weight
    overlong_cache_len: int = 0  # soft overlong penalty buffer L_cache in tokens (0: off)
    overlong_max_len: int | None = None  # L_max in tokens (None: sampler.max_new_tokens)
    # Correction of a rollout sampled by older parameters (`train.off_policy_steps` = 1;
    # `vpo.rl.offpolicy`): "token_tis" (truncated IS per token), "seq_mis" (sequences whose
    # geometric-mean ratio leaves [1/C, C] dropped), "none"; None: "token_tis" when
    # off_policy_steps = 1, "none" otherwise. C = rollout_is_cap.
    rollout_is: str | None = None
    rollout_is_cap: float = 2.0

    RULES = {
        "advantage": one_of(ADVANTAGES), "grpo_scale": one_of(GRPO_SCALES),
        "grpo_std": one_of(STD_MODES), "num_weights": POSITIVE, "alpha": real(0.0, lo_open=True),
        "weight_sampler": one_of(WEIGHT_SAMPLERS), "subset_k": integer(1, optional=True),
        "clip_eps_low": FRACTION, "clip_eps_high": FRACTION,
        "dual_clip": real(1.0, lo_open=True, optional=True), "ratio_level": one_of(RATIO_LEVELS),
        "agg": one_of(AGG_MODES), "kl_coef": real(0.0), "kl_estimator": one_of(KL_ESTIMATORS),
        "entropy_coef": real(0.0), "entropy_top_frac": real(0.0, 1.0, lo_open=True, optional=True),
        "cov_control": one_of(COV_CONTROLS), "clip_cov_ratio": FRACTION, "clip_cov_lb": real(),
        "clip_cov_ub": real(), "kl_cov_ratio": FRACTION, "kl_cov_coef": real(0.0),
        "cov_min_tokens": POSITIVE, "gppo": FLAG, "dynamic_sampling": FLAG, "oversample": POSITIVE,
        "overlong_mask": FLAG, "overlong_cache_len": integer(0),
        "overlong_max_len": integer(1, optional=True),
        "rollout_is": one_of(ROLLOUT_IS, optional=True),
        "rollout_is_cap": real(1.0),
    }

    def __post_init__(self):
        validate("objective", self, self.RULES)
        require(self.clip_cov_lb < self.clip_cov_ub, "objective.clip_cov_ub",
                 f"{self.clip_cov_ub} must exceed clip_cov_lb {self.clip_cov_lb} (Clip-Cov picks "
                 "tokens with lb < cov < ub)")
        require(self.oversample == 1 or self.dynamic_sampling, "objective.oversample",
                 f"{self.oversample} samples extra groups only dynamic sampling uses; set "
                 "objective.dynamic_sampling=true or oversample=1")
        require(self.overlong_max_len is None
                 or self.overlong_cache_len <= self.overlong_max_len,
                 "objective.overlong_cache_len", f"{self.overlong_cache_len} exceeds "
                 f"overlong_max_len {self.overlong_max_len}; the buffer lies inside L_max")
        require(self.advantage != "passk" or self.overlong_cache_len == 0,
                 "objective.overlong_cache_len", "passk trains on pass/fail, which has no room "
                 "for a length penalty; set overlong_cache_len=0 (or overlong_mask=true)")

    def subset_size(self, num_samples: int) -> int:
        """k of maxk / passk for groups of G = num_samples: subset_k or max(2, G // 2)."""
        return self.subset_k if self.subset_k is not None else max(2, num_samples // 2)


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
    learning_rate: float = 1e-3  # from scratch; `vpo.launch.rules.learning_rate` picks others
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
    # "auto": the Pallas kernel where the committed measurements show its gradient pass faster
    # than XLA's (`vpo.kernels.choice`; none yet), else "chunked" (lax.scan, any backend/mesh);
    # "pallas" | "reference" force a path
    logprob_impl: str = "auto"
    max_skipped_updates: int = 3  # stop after this many consecutive skipped updates (0: never)
    # training forward: recompute each decoder block in the backward pass (jax.checkpoint):
    # activation memory of one block instead of all L, for about a third more update FLOPs
    remat: bool = False
    # training forward: pack each prompt's completions into this many rows of T − 1 tokens
    # (`vpo.rl.packing`; 0: off, every completion padded to T). A micro-batch in which some
    # prompt's completions need more rows runs padded (logged as pack/packed < 1). Start from
    # R = ceil(G · mean length / T) + 1 and set it from the logged pack/rows_needed. `vpo train`
    # and `vpo compare` runs that leave it out get `vpo.launch.rules.pack_rows` (G/2 where it pays)
    pack_rows: int = 0
    # k: 0 samples and updates in turn (on-policy); 1 overlaps them, one step off: each step
    # samples the next rollout with the current parameters while it updates them on the
    # rollout the previous step sampled (`vpo.rl.offpolicy`, corrected by objective.rollout_is)
    off_policy_steps: int = 0

    RULES = {
        "seed": integer(0),
        # the problem set is built up front: 10 million records is already gigabytes
        "num_problems": integer(1, 10_000_000),
        **dict.fromkeys(("steps", "batch_size", "num_answers", "ppo_epochs",
                         "num_minibatches", "grad_accum", "log_every", "checkpoint_every",
                         "keep_checkpoints", "vocab_block", "mutation_parents"), POSITIVE),
        "mutation_fraction": real(0.0, 1.0), "learning_rate": real(0.0, lo_open=True),
        "schedule": one_of(SCHEDULES), "warmup_steps": integer(0),
        "min_lr_ratio": real(0.0, 1.0), "weight_decay": real(0.0),
        "b1": real(0.0, 1.0, hi_open=True), "b2": real(0.0, 1.0, hi_open=True),
        "max_grad_norm": real(0.0, lo_open=True), "profile_every": integer(0),
        "sample_every": integer(0), "logprob_impl": one_of(LOGPROB_IMPLS),
        "max_skipped_updates": integer(0), "remat": FLAG, "pack_rows": integer(0),
        "off_policy_steps": integer(0, 1),
    }

    def __post_init__(self):
        validate("train", self, self.RULES)
        split = self.num_minibatches * self.grad_accum
        require(self.batch_size % split == 0, "train.batch_size",
                 f"{self.batch_size} must be divisible by num_minibatches * grad_accum = {split} "
                 "(minibatches and micro-batches hold whole prompt groups)")

    @property
    def updates_per_step(self) -> int:
        return self.ppo_epochs * self.num_minibatches


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A whole training run: model, sampler, objective, loop, mesh, and the task by name.

    The task object itself is passed to `vpo.run.loop.train` (built by the CLI from `task` and
    `task_kwargs`); the names are kept here so the checkpointed config says what was trained.
    """

    model: ModelConfig = dataclasses.field(default_factory=lambda: model_preset("tiny"))
    sampler: SamplerConfig = dataclasses.field(default_factory=SamplerConfig)
    objective: ObjectiveConfig = dataclasses.field(default_factory=ObjectiveConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    task: str = "bandit"
    task_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    mesh_data: int = -1  # mesh axis sizes (see vpo.model.sharding.make_mesh); -1: remaining devices
    mesh_fsdp: int = 1
    mesh_tensor: int = 1

    def __post_init__(self):
        for field, cls in (("model", ModelConfig), ("sampler", SamplerConfig),
                           ("objective", ObjectiveConfig), ("train", TrainConfig)):
            require(isinstance(getattr(self, field), cls), field,
                     f"must be a {cls.__name__} section; got {getattr(self, field)!r}")
        require(isinstance(self.task, str) and bool(self.task), "task",
                 f"must be a task name; got {self.task!r}")
        require(isinstance(self.task_kwargs, dict), "task_kwargs",
                 f"must be a mapping of keyword arguments; got {self.task_kwargs!r}")
        require(self.mesh_data == -1 or integer(1).accepts(self.mesh_data), "mesh_data",
                 f"must be an integer >= 1 or -1 (the remaining devices); got {self.mesh_data!r}")
        validate("", self, {"mesh_fsdp": POSITIVE, "mesh_tensor": POSITIVE})
        obj, G = self.objective, self.sampler.num_samples
        require(self.train.pack_rows < G, "train.pack_rows",
                 f"must be < sampler.num_samples ({G}): {self.train.pack_rows} rows of "
                 "T − 1 tokens hold as much as the padded layout (0 turns packing off)")
        if obj.advantage in SUBSET_ESTIMATORS:
            k = obj.subset_size(G)
            require(k < G, "objective.subset_k" if obj.subset_k else "sampler.num_samples",
                     f"{obj.advantage} needs k < G (k = n makes every advantage 0): k = {k}, "
                     f"G = sampler.num_samples = {G}; raise num_samples or lower subset_k")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def memory_bytes(self, prompt_len: int) -> dict[str, int]:
        """A lower bound on the bytes one RL step of this run holds at once, by part: a run
        that needs more than its devices have cannot run (one below may still not fit).

        params: weights, plus gradients and two Adam moments of what is trained (and a KL
        reference copy under full fine-tuning); kv_cache: keys and values of every layer for
        the B' = oversample · batch_size prompts (P tokens, shared by a group) and their G
        completions (T tokens each); rollout: tokens, log-probs, entropies and masks of the
        B'·G·T sampled tokens; activations: per micro-batch, the hidden state of every layer
        (D wide) and one vocabulary tile of logits for each of its tokens.
        """
        m, s, t, o = self.model, self.sampler, self.train, self.objective
        G, T, P = s.num_samples, s.max_new_tokens, int(prompt_len)
        B = t.batch_size * o.oversample
        cbytes, pbytes = _DTYPE_BYTES[m.dtype], _DTYPE_BYTES[m.param_dtype]
        trained = m.num_lora_params if m.lora_rank else m.num_params
        ref = m.num_params if (o.kl_coef > 0 and not m.lora_rank) else 0
        kv_per_token = 2 * m.num_layers * m.num_kv_heads * m.head_dim * cbytes
        micro_tokens = t.batch_size // (t.num_minibatches * t.grad_accum) * G * T
        return {
            "params": (m.num_params + ref + 3 * trained) * pbytes,
            "kv_cache": kv_per_token * B * (P + G * T),
            "rollout": B * G * T * (4 + 4 + 4 + 1),
            "activations": micro_tokens * (m.num_layers * m.dim * cbytes
                                           + min(t.vocab_block, m.vocab_size) * 4),
        }


def check_memory(run: RunConfig, prompt_len: int, available_bytes: int, where: str) -> None:
    """ConfigError naming `sampler.num_samples` (and the other sizes) when the run's lower-bound
    memory (`RunConfig.memory_bytes`) exceeds `available_bytes` (`where`: the devices)."""
    parts = run.memory_bytes(prompt_len)
    need = sum(parts.values())
    if need <= available_bytes:
        return
    s, t = run.sampler, run.train
    detail = ", ".join(f"{k} {_gib(v)}" for k, v in parts.items())
    raise ConfigError(
        f"sampler.num_samples: {s.num_samples} samples per prompt × train.batch_size "
        f"{t.batch_size} prompts × (prompt {prompt_len} + sampler.max_new_tokens "
        f"{s.max_new_tokens}) tokens need at least {need} bytes ({_gib(need)}: {detail}), more "
        f"than the {available_bytes} bytes ({_gib(available_bytes)}) of {where}; lower "
        "sampler.num_samples, train.batch_size or sampler.max_new_tokens (or raise "
        "train.grad_accum)")


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """The static part of one RL step (hashable: part of the jit cache key): the run's sections
    and the tokenizer's stop and pad ids (`vpo.rl.step.step_config` builds it)."""

    sampler: SamplerConfig
    objective: ObjectiveConfig
    train: TrainConfig
    stop_ids: tuple[int, ...]  # from the tokenizer
    pad_id: int

    def __post_init__(self):
        require(len(self.stop_ids) > 0 and all(isinstance(i, int) and i >= 0
                                                for i in self.stop_ids),
                 "step.stop_ids", f"must be a non-empty tuple of token ids; got {self.stop_ids}")
        require(isinstance(self.pad_id, int) and self.pad_id >= 0, "step.pad_id",
                 f"must be a token id >= 0; got {self.pad_id}")


# -- `vpo compare`: the arms and the comparison run ---------------------------------------
