"""vpo: JAX-native RL post-training (GRPO family, Vector Policy Optimization) and in-graph search.

The names most users need, importable from the package (each is loaded on first use, so
`import vpo` stays light and `from vpo import vpo_advantages` pulls in only jax and numpy):

    objectives   vpo_advantages, grpo_advantages, get_estimator, policy_loss, LOSS_SETTINGS,
                 to_groups, from_groups, ... (`vpo.objectives`; docs/objective.md)
    evaluation   pass_at_k, best_at_k, reward_diversity
    tasks        Task, make_task, bind
    loading      load_model (tiny preset, run folder, hf:/GGUF), from_pretrained,
                 save_pretrained, load_tokenizer
    configs      RunConfig, TrainConfig, ObjectiveConfig, SamplerConfig, ModelConfig,
                 SearchConfig
    entry points run_training (`vpo.run.loop.train`), run_sft, evaluate_policy, make_search,
                 run_method, run_host_method, run_compare
    errors       ConfigError, CheckpointError, RewardError

An exported name never shadows a submodule: `from vpo import rl` is the subpackage `vpo.rl`, and
the training loop is exported as `run_training` (`from vpo import train` is an ImportError).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    **{name: "vpo.objectives" for name in (
        "vpo_advantages", "grpo_advantages", "rloo_advantages", "gdpo_advantages",
        "maxrl_advantages", "max_at_k_advantages", "pass_at_k_advantages",
        "random_weight_grpo_advantages", "dirichlet_weights", "policy_loss", "kl_estimate",
        "get_estimator", "LOSS_SETTINGS", "to_groups", "from_groups")},
    **{name: "vpo.eval.metrics" for name in ("pass_at_k", "best_at_k", "reward_diversity")},
    "Task": "vpo.tasks.base",
    "make_task": "vpo.tasks",
    "bind": "vpo.tasks.bound",
    "load_model": "vpo.io.policy_folder",
    "from_pretrained": "vpo.io.hf",
    "save_pretrained": "vpo.io.hf",
    "load_tokenizer": "vpo.io.tokenizer",
    **{name: "vpo.config" for name in ("SamplerConfig", "ModelConfig")},
    **{name: "vpo.config" for name in ("RunConfig", "TrainConfig", "ObjectiveConfig")},
    "SearchConfig": "vpo.config",
    "run_training": ("vpo.run.loop", "train"),
    "run_sft": "vpo.rl.sft",
    "evaluate_policy": "vpo.eval.policies",
    "make_search": "vpo.search.ingraph",
    "run_method": "vpo.search.ingraph",
    "run_host_method": "vpo.search.host",
    "run_compare": "vpo.compare.driver",
    **{name: "vpo.errors" for name in ("ConfigError", "CheckpointError", "RewardError")},
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Load an exported name's module on first use (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vpo' has no attribute {name!r}")
    module, attr = (_EXPORTS[name] if isinstance(_EXPORTS[name], tuple)
                    else (_EXPORTS[name], name))
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
