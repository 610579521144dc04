"""Frozen configuration dataclasses, validated on construction with errors that name the field.

Sections: `ModelConfig` (the decoder's shapes), `SamplerConfig` (generation), `SearchConfig`
(test-time search), `DistributedConfig` (multi-host start-up); the objective, train and run
sections (`vpo.train_config`) validate with the same helper (`validate`) against the same name
tables. `MODEL_PRESETS` maps preset names to model shapes: `tiny` (tests), `small` (CPU
experiments) and the published shapes of Qwen2.5 / Qwen3 / Llama-3.2 models (for
accelerators; never instantiated in CPU tests).

Every name-valued field has one table of valid names here; the modules that act on a name
(`vpo.rewards.ESTIMATORS`, `vpo.objectives`) take their names from these tables, so an unknown
name is a `ConfigError` that lists the valid ones, raised before any array exists. This module
imports nothing heavy (no jax): the objective modules import their tables from it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from vpo.errors import ConfigError  # noqa: F401  (re-exported: vpo.config.ConfigError)

# -- name tables: the one list of valid names of each name-valued field ------------------------

DTYPES = ("float32", "bfloat16", "float16")
# Advantage estimators; `vpo.rewards.ESTIMATORS` maps each to its function, in this order.
ADVANTAGES = ("grpo", "dr_grpo", "rloo", "maxrl", "gdpo", "vpo", "maxk", "passk", "rw_grpo")
GRPO_SCALES = ("group", "batch", "none")
STD_MODES = ("unbiased", "population")
WEIGHT_SAMPLERS = ("iid", "lattice")
RATIO_LEVELS = ("token", "sequence")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
COV_CONTROLS = ("none", "clip_cov", "kl_cov")
SCHEDULES = ("constant", "cosine")
LOGPROB_IMPLS = ("chunked", "pallas", "reference")
SELECTIONS = ("tournament", "boltzmann")  # search parent selection


# -- validation: one helper for every section --------------------------------------------------

def _require(cond: bool, field: str, msg: str) -> None:
    """`ConfigError("field: msg")` unless `cond`: the one way a config reports a bad value."""
    if not cond:
        raise ConfigError(f"{field}: {msg}")


@dataclasses.dataclass(frozen=True)
class Rule:
    """What one field accepts. kind "int" / "real": a finite number in the range [lo, hi]
    (`lo_open` / `hi_open` make an end open; None: unbounded); "bool"; "text": a string;
    "name": one of `names`.
    `optional`: None is accepted too."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    names: tuple[str, ...] = ()
    optional: bool = False

    def describe(self) -> str:
        if self.kind == "bool":
            return "true or false"
        if self.kind == "text":
            return "a string" + (" (or None)" if self.optional else "")
        if self.kind == "name":
            return "one of " + ", ".join(self.names)
        what = "an integer" if self.kind == "int" else "a finite number"
        if self.lo is not None and self.hi is not None:
            lo, hi = "(["[not self.lo_open], ")]"[not self.hi_open]
            what += f" in {lo}{self.lo:g}, {self.hi:g}{hi}"
        elif self.lo is not None:
            what += f" {'>' if self.lo_open else '>='} {self.lo:g}"
        elif self.hi is not None:
            what += f" {'<' if self.hi_open else '<='} {self.hi:g}"
        return what + (" (or None)" if self.optional else "")

    def accepts(self, value) -> bool:
        if value is None:
            return self.optional
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "text":
            return isinstance(value, str)
        if self.kind == "name":
            return isinstance(value, str) and value in self.names
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        if self.kind == "int" and not isinstance(value, numbers.Integral):
            return False
        if not math.isfinite(value):
            return False
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)


def integer(lo: float | None = None, hi: float | None = None, *, optional: bool = False) -> Rule:
    return Rule("int", lo, hi, optional=optional)


def real(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
         hi_open: bool = False, optional: bool = False) -> Rule:
    return Rule("real", lo, hi, lo_open, hi_open, optional=optional)


def one_of(names: tuple[str, ...]) -> Rule:
    return Rule("name", names=tuple(names))


FLAG = Rule("bool")
TEXT = Rule("text")
POSITIVE = integer(1)  # sizes and counts
FRACTION = real(0.0, 1.0, lo_open=True)  # (0, 1]


def validate(section: str, config, rules: dict[str, Rule]) -> None:
    """Checks every field named in `rules` (a table per config class); the first bad value
    raises `ConfigError("section.field: must be ...; got value")` (just "field" when
    `section` is empty: the run's top-level fields)."""
    for field, rule in rules.items():
        value = getattr(config, field)
        _require(rule.accepts(value), f"{section}.{field}" if section else field,
                 f"must be {rule.describe()}; got {value!r}")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama-3 RoPE frequency scaling (`rope_type="llama3"` in HF configs)."""

    factor: float = 32.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self):
        validate("model.rope_scaling", self, {
            "factor": real(1.0), "low_freq_factor": real(0.0, lo_open=True),
            "high_freq_factor": real(0.0, lo_open=True), "original_max_position": POSITIVE})
        _require(self.high_freq_factor > self.low_freq_factor,
                 "model.rope_scaling.high_freq_factor",
                 f"must exceed low_freq_factor ({self.low_freq_factor}); got "
                 f"{self.high_freq_factor} (the llama3 rule divides by their difference)")


# LoRA targets: the name a config uses → the projection weight it adapts (`vpo.model`).
LORA_TARGETS: dict[str, str] = {"q": "wq", "k": "wk", "v": "wv", "o": "wo",
                                "gate": "w_gate", "up": "w_up", "down": "w_down"}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Decoder-only transformer shapes (Llama 3 / Qwen2 / Qwen2.5 / Qwen3 families).

    Dimension key: V vocab, D width, F MLP width, H query heads, N KV heads, E head dim, L layers.

    LoRA (Hu et al., 2021, arXiv 2106.09685; `vpo.lora`): `lora_rank` r > 0 adds low-rank
    adapters W' = W + (lora_alpha / r)·A·B to the projections named in `lora_targets` (keys of
    `LORA_TARGETS`; default all seven, as in QLoRA) and trains only those. `lora_alpha` defaults
    to 16 (r = 8 → scale 2, the common PEFT setting). `lora_targets` also reads a
    comma-separated string (`model.lora_targets=q,v`).
    """

    vocab_size: int = 64  # V
    dim: int = 32  # D
    num_layers: int = 2  # L
    num_heads: int = 4  # H
    num_kv_heads: int = 2  # N; H % N == 0 (grouped-query attention)
    head_dim: int | None = None  # E; defaults to D // H
    mlp_dim: int = 64  # F (SwiGLU hidden width)
    rope_theta: float = 10_000.0
    rope_scaling: RopeScaling | None = None
    norm_eps: float = 1e-6
    qkv_bias: bool = False  # Qwen2 / Qwen2.5
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k
    tie_embeddings: bool = True
    max_seq_len: int = 512  # longest prompt + completion the model may be asked to handle
    param_dtype: str = "float32"
    dtype: str = "float32"  # compute dtype (bfloat16 on accelerators)
    lora_rank: int = 0  # r; 0 = full fine-tuning (no adapters)
    lora_alpha: float = 16.0  # adapter scale alpha / r
    lora_targets: tuple[str, ...] | str = tuple(LORA_TARGETS)
    # Run the L blocks as one `lax.scan` (True) or unrolled (False, the default). Parameters
    # keep their per-layer layout either way. Off by default: on XLA:CPU (jax 0.10) the scanned
    # RL step of SmolLM2-135M compiled slower and needed more temporary memory than the
    # unrolled one (6 layers: 92 s / 1155 MiB vs 53 s / 826 MiB), and the scan stacks the
    # blocks' weights (one transient copy) every forward.
    scan_layers: bool = False

    def __post_init__(self):
        validate("model", self, {
            **dict.fromkeys(("vocab_size", "dim", "num_layers", "num_heads", "num_kv_heads",
                             "mlp_dim", "max_seq_len"), POSITIVE),
            "head_dim": integer(1, optional=True), "rope_theta": real(0.0, lo_open=True),
            "norm_eps": real(0.0, 1.0, lo_open=True), "qkv_bias": FLAG, "qk_norm": FLAG,
            "tie_embeddings": FLAG, "param_dtype": one_of(DTYPES), "dtype": one_of(DTYPES),
            "lora_alpha": real(0.0, lo_open=True), "scan_layers": FLAG})
        validate("model", self, {"lora_rank": integer(0, self.dim)})  # 0: full fine-tuning
        _require(self.rope_scaling is None or isinstance(self.rope_scaling, RopeScaling),
                 "model.rope_scaling", f"must be None or a RopeScaling; got {self.rope_scaling!r}")
        if self.head_dim is None:
            _require(self.dim % self.num_heads == 0, "model.num_heads",
                     f"must divide model.dim ({self.dim}) when model.head_dim is not set; "
                     f"got {self.num_heads}. Set model.head_dim or change the head count.")
            object.__setattr__(self, "head_dim", self.dim // self.num_heads)
        _require(self.head_dim % 2 == 0, "model.head_dim",
                 f"must be a positive even number (RoPE rotates pairs); got {self.head_dim}")
        _require(self.num_heads % self.num_kv_heads == 0, "model.num_kv_heads",
                 f"must divide model.num_heads ({self.num_heads}); got {self.num_kv_heads}")
        self._check_lora()

    def _check_lora(self):
        targets = self.lora_targets
        if isinstance(targets, str):
            targets = tuple(t.strip() for t in targets.split(",") if t.strip())
        object.__setattr__(self, "lora_targets", tuple(targets))
        bad = [t for t in self.lora_targets if t not in LORA_TARGETS]
        _require(not bad, "model.lora_targets", f"unknown target(s) {', '.join(map(repr, bad))}; "
                 f"choose from {', '.join(LORA_TARGETS)}")
        _require(len(set(self.lora_targets)) == len(self.lora_targets), "model.lora_targets",
                 f"names a projection twice: {self.lora_targets}")
        _require(self.lora_rank == 0 or len(self.lora_targets) > 0, "model.lora_targets",
                 f"is empty but model.lora_rank = {self.lora_rank}; name at least one of "
                 f"{', '.join(LORA_TARGETS)} or set lora_rank=0")

    @property
    def scan(self) -> bool:
        """Whether the decoder runs its blocks as one `lax.scan` (`scan_layers`)."""
        return self.scan_layers

    @property
    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        V, D, F, L = self.vocab_size, self.dim, self.mlp_dim, self.num_layers
        H, N, E = self.num_heads, self.num_kv_heads, self.head_dim
        attn = D * H * E + 2 * D * N * E + H * E * D
        attn += (H * E + 2 * N * E) if self.qkv_bias else 0
        attn += 2 * E if self.qk_norm else 0
        per_layer = attn + 3 * D * F + 2 * D
        head = 0 if self.tie_embeddings else V * D
        return V * D + L * per_layer + D + head

    @property
    def num_lora_params(self) -> int:
        """Adapter parameter count: L · Σ_targets r·(fan_in + fan_out); 0 without LoRA."""
        D, F, H, N, E = self.dim, self.mlp_dim, self.num_heads, self.num_kv_heads, self.head_dim
        fans = {"q": (D, H * E), "k": (D, N * E), "v": (D, N * E), "o": (H * E, D),
                "gate": (D, F), "up": (D, F), "down": (F, D)}
        per_layer = sum(self.lora_rank * sum(fans[t]) for t in self.lora_targets)
        return self.num_layers * per_layer


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """Generation settings. Temperature, top-p and top-k are traced: changing them never recompiles.

    `temperature == 0` is greedy decoding; `top_k == 0` and `top_p == 1` disable those filters.
    """

    max_new_tokens: int = 32  # T
    num_samples: int = 4  # G, samples per prompt sharing the prompt's KV cache
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        validate("sampler", self, {"max_new_tokens": POSITIVE, "num_samples": POSITIVE,
                                   "temperature": real(0.0), "top_p": FRACTION,
                                   "top_k": integer(0)})


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """Island-model search settings (`vpo.search`, `vpo.host_search`; library defaults, not a
    paper's setting)."""

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
    num_answers: int = 2  # m answers per policy call, each one candidate

    def __post_init__(self):
        validate("search", self, {
            **dict.fromkeys(("islands", "members", "parents", "children", "generations",
                             "num_answers", "tournament_size"), POSITIVE),
            **dict.fromkeys(("migration_interval", "migration_count", "reset_interval",
                             "reset_count"), integer(0)),
            "fresh_rate": real(0.0, 1.0), "selection": one_of(SELECTIONS),
            "selection_temperature": real(0.0, lo_open=True), "temperature": real(0.0),
            "top_p": FRACTION})
        _require(self.parents <= self.members, "search.parents",
                 f"must be <= search.members ({self.members}); got {self.parents}")
        m = self.num_answers
        _require(self.members % m == 0, "search.members",
                 f"must be a multiple of search.num_answers ({m}); got {self.members}")
        _require(self.children % m == 0, "search.children",
                 f"must be a multiple of search.num_answers ({m}); got {self.children}")
        _require(2 * self.migration_count <= self.members, "search.migration_count",
                 f"must be <= search.members / 2 ({self.members // 2}); got "
                 f"{self.migration_count}")
        _require(self.reset_count < self.islands or self.reset_interval == 0,
                 "search.reset_count", f"must be < search.islands ({self.islands}) when resets "
                 "are on")

    @property
    def budget(self) -> int:
        """Candidates evaluated by a whole run: I·Q (initial) + generations·I·C."""
        return self.islands * (self.members + self.generations * self.children)


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
        _require(self.process_id < self.num_processes, "distributed.process_id",
                 f"must be < num_processes ({self.num_processes}); got {self.process_id}")


_QWEN25 = dict(rope_theta=1_000_000.0, qkv_bias=True, norm_eps=1e-6, max_seq_len=32768,
               param_dtype="bfloat16", dtype="bfloat16")
_QWEN3 = dict(rope_theta=1_000_000.0, qk_norm=True, head_dim=128, norm_eps=1e-6,
              max_seq_len=40960, param_dtype="bfloat16", dtype="bfloat16")

MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=64, dim=32, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=64),
    "small": dict(vocab_size=64, dim=256, num_layers=4, num_heads=8, num_kv_heads=4,
                  mlp_dim=768),
    "qwen2.5-0.5b": dict(vocab_size=151936, dim=896, num_layers=24, num_heads=14,
                         num_kv_heads=2, mlp_dim=4864, tie_embeddings=True, **_QWEN25),
    "qwen2.5-1.5b": dict(vocab_size=151936, dim=1536, num_layers=28, num_heads=12,
                         num_kv_heads=2, mlp_dim=8960, tie_embeddings=True, **_QWEN25),
    "qwen3-0.6b": dict(vocab_size=151936, dim=1024, num_layers=28, num_heads=16, num_kv_heads=8,
                       mlp_dim=3072, tie_embeddings=True, **_QWEN3),
    "qwen3-1.7b": dict(vocab_size=151936, dim=2048, num_layers=28, num_heads=16, num_kv_heads=8,
                       mlp_dim=6144, tie_embeddings=True, **_QWEN3),
    "qwen3-4b": dict(vocab_size=151936, dim=2560, num_layers=36, num_heads=32, num_kv_heads=8,
                     mlp_dim=9728, tie_embeddings=True, **_QWEN3),
    "llama3.2-1b": dict(vocab_size=128256, dim=2048, num_layers=16, num_heads=32, num_kv_heads=8,
                        mlp_dim=8192, rope_theta=500_000.0, norm_eps=1e-5, tie_embeddings=True,
                        rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192), max_seq_len=131072,
                        param_dtype="bfloat16", dtype="bfloat16"),
}


def model_preset(name: str, **overrides: Any) -> ModelConfig:
    """`ModelConfig` of a named preset, with field overrides (e.g. `vocab_size=` of a task)."""
    if name not in MODEL_PRESETS:
        raise ConfigError(f"model.preset: unknown preset {name!r}; "
                          f"choose one of {', '.join(MODEL_PRESETS)}")
    return ModelConfig(**{**MODEL_PRESETS[name], **overrides})


# -- building configs from JSON and from `section.key=value` overrides -------------------------

def from_dict(cls, data: dict[str, Any]):
    """A (nested) config dataclass from a plain dict; unknown keys raise naming them."""
    import typing

    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(names))}")
    kwargs = {}
    for name, value in data.items():
        sub = _dataclass_in(hints[name])
        kwargs[name] = from_dict(sub, value) if sub and isinstance(value, dict) else value
    return cls(**kwargs)


def _dataclass_in(hint):
    """The dataclass type inside a hint such as `RopeScaling | None`, else None."""
    import typing

    for t in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(t):
            return t
    return None


def parse_value(text: str, hint, field: str):
    """Parse the text of an override for a field annotated `hint` (bool, int, float, str,
    optional variants); a value of the wrong type raises naming the field."""
    import types
    import typing

    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if text.lower() in ("none", "null") and type(None) in args:
        return None
    for t in args:
        if t is bool and text.lower() in ("true", "false", "1", "0"):
            return text.lower() in ("true", "1")
        if t is int and text.lstrip("-").isdigit():
            return int(text)
        if t is float:
            try:
                return float(text)
            except ValueError:
                pass
        if t is str:
            return text
    names = " or ".join(getattr(t, "__name__", str(t)) for t in args)
    raise ConfigError(f"{field}: cannot read {text!r} as {names}")


def apply_overrides(config, overrides: list[str]):
    """Apply `section.key=value` overrides to a nested config dataclass (returns a new one).

    Values are parsed by the field's annotated type; unknown sections or keys raise naming them.
    """
    import typing

    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected section.key=value, e.g. "
                              "train.steps=6")
        path, text = item.split("=", 1)
        config = _set(config, path.split("."), text, path, typing)
    return config


def _set(obj, keys, text, path, typing):
    hints = typing.get_type_hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    if keys[0] not in names:
        raise ConfigError(f"override {path}: unknown key {keys[0]!r} in {type(obj).__name__}; "
                          f"known: {', '.join(names)}")
    if len(keys) == 1:
        value = parse_value(text, hints[keys[0]], path)
    else:
        child = getattr(obj, keys[0])
        if not dataclasses.is_dataclass(child):
            raise ConfigError(f"override {path}: {keys[0]!r} is not a section")
        value = _set(child, keys[1:], text, path, typing)
    return dataclasses.replace(obj, **{keys[0]: value})
