"""Config validation (vpo.config, vpo.config.run): every field of every section rejects bad
values at construction with a ConfigError naming the field; names are checked against their one
table; the run's size is checked against a memory estimate before anything is allocated.

No arrays are built here except by `device_memory` (a device query): the whole file runs in well
under a second.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from vpo import config as config_lib
from vpo.config import (
    ConfigError,
    DistributedConfig,
    ModelConfig,
    ObjectiveConfig,
    RopeScaling,
    RunConfig,
    SamplerConfig,
    SearchConfig,
    TrainConfig,
    apply_overrides,
    check_memory,
    from_dict,
    model_preset,
)

NAN, INF = math.nan, math.inf

# (section class, field, bad value, fragment the message must hold besides "section.field")
BAD = [
    # ModelConfig
    (ModelConfig, "vocab_size", 0, ">= 1"),
    (ModelConfig, "scan_layers", "yes", "true or false"),
    (ModelConfig, "decode_attention", "triton", "one of auto, pallas, xla"),
    (ModelConfig, "dim", -32, ">= 1"),
    (ModelConfig, "num_layers", 2.0, "an integer"),
    (ModelConfig, "num_heads", "4", "an integer"),
    (ModelConfig, "num_kv_heads", 3, "must divide model.num_heads"),
    (ModelConfig, "head_dim", 7, "even"),
    (ModelConfig, "mlp_dim", 0, ">= 1"),
    (ModelConfig, "rope_theta", 0.0, "> 0"),
    (ModelConfig, "rope_scaling", {"factor": 8.0}, "RopeScaling"),
    (ModelConfig, "norm_eps", NAN, "finite"),
    (ModelConfig, "qkv_bias", "yes", "true or false"),
    (ModelConfig, "qk_norm", 1, "true or false"),
    (ModelConfig, "tie_embeddings", None, "true or false"),
    (ModelConfig, "max_seq_len", 0, ">= 1"),
    (ModelConfig, "param_dtype", "float64", "one of float32, bfloat16, float16"),
    (ModelConfig, "dtype", "fp8", "one of float32, bfloat16, float16"),
    (ModelConfig, "lora_rank", 33, "in [0, 32]"),
    (ModelConfig, "lora_alpha", INF, "finite"),
    (ModelConfig, "lora_targets", ("q", "mlp"), "choose from q, k, v, o, gate, up, down"),
    # RopeScaling
    (RopeScaling, "factor", 0.5, ">= 1"),
    (RopeScaling, "low_freq_factor", -1.0, "> 0"),
    (RopeScaling, "high_freq_factor", 0.5, "must exceed low_freq_factor"),
    (RopeScaling, "original_max_position", 0, ">= 1"),
    # SamplerConfig
    (SamplerConfig, "max_new_tokens", 0, ">= 1"),
    (SamplerConfig, "num_samples", -4, ">= 1"),
    (SamplerConfig, "temperature", -0.5, ">= 0"),
    (SamplerConfig, "top_p", 1.5, "in (0, 1]"),
    (SamplerConfig, "top_k", -1, ">= 0"),
    (SamplerConfig, "num_slots", -1, ">= 0"),
    (SamplerConfig, "served_context", -1, ">= 0"),
    # ObjectiveConfig
    (ObjectiveConfig, "advantage", "ppo", "grpo, dr_grpo, rloo, maxrl, gdpo, vpo, maxk, passk"),
    (ObjectiveConfig, "grpo_scale", "global", "one of group, batch, none"),
    (ObjectiveConfig, "grpo_std", "sample", "one of unbiased, population"),
    (ObjectiveConfig, "num_weights", 0, ">= 1"),
    (ObjectiveConfig, "alpha", 0.0, "> 0"),
    (ObjectiveConfig, "weight_sampler", "sobol", "one of iid, lattice"),
    (ObjectiveConfig, "subset_k", 0, ">= 1"),
    (ObjectiveConfig, "clip_eps_low", NAN, "in (0, 1]"),
    (ObjectiveConfig, "clip_eps_high", -0.2, "in (0, 1]"),
    (ObjectiveConfig, "dual_clip", 1.0, "> 1"),
    (ObjectiveConfig, "ratio_level", "seq", "one of token, sequence"),
    (ObjectiveConfig, "agg", "token-sum", "token-mean, seq-mean-token-mean"),
    (ObjectiveConfig, "kl_coef", -1e-3, ">= 0"),
    (ObjectiveConfig, "kl_estimator", "k4", "one of k1, k2, k3"),
    (ObjectiveConfig, "entropy_coef", INF, "finite"),
    (ObjectiveConfig, "entropy_top_frac", 0.0, "in (0, 1]"),
    (ObjectiveConfig, "cov_control", "cov", "one of none, clip_cov, kl_cov"),
    (ObjectiveConfig, "clip_cov_ratio", 20.0, "in (0, 1]"),
    (ObjectiveConfig, "clip_cov_lb", 6.0, "must exceed clip_cov_lb"),
    (ObjectiveConfig, "clip_cov_ub", NAN, "finite"),
    (ObjectiveConfig, "kl_cov_ratio", 0.0, "in (0, 1]"),
    (ObjectiveConfig, "kl_cov_coef", -1.0, ">= 0"),
    (ObjectiveConfig, "cov_min_tokens", 0, ">= 1"),
    (ObjectiveConfig, "gppo", "yes", "true or false"),
    (ObjectiveConfig, "dynamic_sampling", "true", "true or false"),
    (ObjectiveConfig, "oversample", 2, "dynamic_sampling=true"),
    (ObjectiveConfig, "overlong_mask", 0, "true or false"),
    (ObjectiveConfig, "overlong_cache_len", -1, ">= 0"),
    (ObjectiveConfig, "overlong_max_len", 0, ">= 1"),
    (ObjectiveConfig, "rollout_is", "tis", "one of none, token_tis, seq_mis (or None)"),
    (ObjectiveConfig, "rollout_is_cap", 0.5, ">= 1"),
    # TrainConfig
    (TrainConfig, "remat", 1, "true or false"),
    (TrainConfig, "seed", -1, ">= 0"),
    (TrainConfig, "steps", 0, ">= 1"),
    (TrainConfig, "batch_size", 0, ">= 1"),
    (TrainConfig, "num_answers", 0, ">= 1"),
    (TrainConfig, "num_problems", 10**11, "in [1, 1e+07]"),
    (TrainConfig, "mutation_fraction", 1.5, "in [0, 1]"),
    (TrainConfig, "mutation_parents", 0, ">= 1"),
    (TrainConfig, "ppo_epochs", 0, ">= 1"),
    (TrainConfig, "num_minibatches", 0, ">= 1"),
    (TrainConfig, "grad_accum", 1.5, "an integer"),
    (TrainConfig, "learning_rate", INF, "finite number > 0"),
    (TrainConfig, "schedule", "linear", "one of constant, cosine"),
    (TrainConfig, "warmup_steps", -1, ">= 0"),
    (TrainConfig, "min_lr_ratio", 2.0, "in [0, 1]"),
    (TrainConfig, "weight_decay", -0.01, ">= 0"),
    (TrainConfig, "b1", 1.5, "in [0, 1)"),
    (TrainConfig, "b2", 1.0, "in [0, 1)"),
    (TrainConfig, "max_grad_norm", 0.0, "> 0"),
    (TrainConfig, "log_every", 0, ">= 1"),
    (TrainConfig, "profile_every", -1, ">= 0"),
    (TrainConfig, "sample_every", -1, ">= 0"),
    (TrainConfig, "checkpoint_every", 0, ">= 1"),
    (TrainConfig, "keep_checkpoints", 0, ">= 1"),
    (TrainConfig, "vocab_block", 0, ">= 1"),
    (TrainConfig, "logprob_impl", "triton", "one of auto, chunked, pallas, reference"),
    (TrainConfig, "max_skipped_updates", -1, ">= 0"),
    (TrainConfig, "pack_rows", -1, ">= 0"),
    (TrainConfig, "off_policy_steps", 2, "in [0, 1]"),
    # RunConfig (the run's own fields)
    (RunConfig, "model", {"dim": 32}, "ModelConfig section"),
    (RunConfig, "sampler", None, "SamplerConfig section"),
    (RunConfig, "objective", "grpo", "ObjectiveConfig section"),
    (RunConfig, "train", TrainConfig, "TrainConfig section"),
    (RunConfig, "task", "", "a task name"),
    (RunConfig, "task_kwargs", ["size", 5], "mapping"),
    (RunConfig, "mesh_data", 0, ">= 1 or -1"),
    (RunConfig, "mesh_fsdp", 0, ">= 1"),
    (RunConfig, "mesh_tensor", -1, ">= 1"),
    # DistributedConfig
    (DistributedConfig, "enabled", 1, "true or false"),
    (DistributedConfig, "coordinator", None, "a string"),
    (DistributedConfig, "num_processes", 0, ">= 1"),
    (DistributedConfig, "process_id", 2, "< num_processes"),
    (DistributedConfig, "cpu_collectives", 3, "a string"),
    # SearchConfig
    (SearchConfig, "islands", 0, ">= 1"),
    (SearchConfig, "members", 7, "multiple of search.num_answers"),
    (SearchConfig, "parents", 9, "<= search.members"),
    (SearchConfig, "children", 3, "multiple of search.num_answers"),
    (SearchConfig, "generations", 0, ">= 1"),
    (SearchConfig, "migration_interval", -1, ">= 0"),
    (SearchConfig, "migration_count", 5, "<= search.members / 2"),
    (SearchConfig, "reset_interval", 1.5, "an integer"),
    (SearchConfig, "reset_count", -2, ">= 0"),
    (SearchConfig, "fresh_rate", NAN, "in [0, 1]"),
    (SearchConfig, "selection", "roulette", "tournament, boltzmann"),
    (SearchConfig, "selection_temperature", 0.0, "> 0"),
    (SearchConfig, "tournament_size", 0, ">= 1"),
    (SearchConfig, "temperature", INF, ">= 0"),
    (SearchConfig, "top_p", 0.0, "in (0, 1]"),
    (SearchConfig, "num_answers", 0, ">= 1"),
    (SearchConfig, "num_slots", 2.5, "an integer"),
]
SECTION = {ModelConfig: "model", RopeScaling: "model.rope_scaling", SamplerConfig: "sampler",
           ObjectiveConfig: "objective", TrainConfig: "train", RunConfig: "",
           SearchConfig: "search", DistributedConfig: "distributed"}
# Fields whose bad value is reported under a sibling (the cross-field rule names the other).
REPORTED_AS = {(ModelConfig, "num_kv_heads"): "model.num_kv_heads",
               (ObjectiveConfig, "clip_cov_lb"): "objective.clip_cov_ub"}


def _field_name(cls, field):
    if (cls, field) in REPORTED_AS:
        return REPORTED_AS[cls, field]
    return f"{SECTION[cls]}.{field}".lstrip(".") if cls is not RunConfig else field


@pytest.mark.parametrize("cls, field, value, fragment", BAD,
                         ids=[f"{c.__name__}.{f}" for c, f, _, _ in BAD])
def test_bad_value_is_a_config_error_naming_the_field(cls, field, value, fragment):
    with pytest.raises(ConfigError) as err:
        cls(**{field: value})
    message = str(err.value)
    assert message.startswith(_field_name(cls, field) + ":"), message
    assert fragment in message, message


def test_every_field_of_every_section_is_covered():
    covered = {(cls, field) for cls, field, _, _ in BAD}
    for cls in SECTION:
        missing = [f.name for f in dataclasses.fields(cls) if (cls, f.name) not in covered]
        assert not missing, f"{cls.__name__}: add bad-value rows for {missing}"


def test_defaults_and_documented_good_values_construct():
    for cls in SECTION:
        cls()
    ObjectiveConfig(advantage="maxk", subset_k=3, dual_clip=3.0, clip_eps_low=1.0,
                    clip_eps_high=0.28, entropy_top_frac=1.0, cov_control="kl_cov",
                    clip_cov_ratio=1.0, kl_cov_coef=0.0, overlong_max_len=32,
                    overlong_cache_len=32)
    TrainConfig(b1=0.0, b2=0.0, learning_rate=1, mutation_fraction=1.0, min_lr_ratio=0.0,
                seed=0, warmup_steps=0)
    SamplerConfig(temperature=0, top_p=1, top_k=0)
    ModelConfig(head_dim=8, lora_rank=32, lora_targets="q,v")
    RunConfig(mesh_data=-1)


@pytest.mark.parametrize("override, fragment", [
    ("train.learning_rate=inf", "train.learning_rate: must be a finite number > 0; got inf"),
    ("objective.clip_eps_low=nan", "objective.clip_eps_low: must be a finite number in (0, 1]"),
    ("objective.clip_eps_high=-0.2", "objective.clip_eps_high: must be a finite number in"),
    ("train.b1=1.5", "train.b1: must be a finite number in [0, 1); got 1.5"),
    ("objective.agg=sum", "objective.agg: must be one of token-mean"),
    ("objective.kl_estimator=k5", "objective.kl_estimator: must be one of k1, k2, k3"),
    ("objective.grpo_scale=global", "objective.grpo_scale: must be one of group, batch, none"),
    ("objective.weight_sampler=sobol", "objective.weight_sampler: must be one of iid, lattice"),
    ("objective.advantage=max@k", "maxk, passk, rw_grpo"),
])
def test_bad_overrides_fail_at_construction(override, fragment):
    """The issue's cases: each is caught when the config is built, not deep inside jit."""
    with pytest.raises(ConfigError) as err:
        apply_overrides(RunConfig(), [override])
    assert fragment in str(err.value)


def test_task_kwargs_override_is_a_json_object():
    run = apply_overrides(RunConfig(), ['task_kwargs={"size": 7, "demos": "partial"}'])
    assert run.task_kwargs == {"size": 7, "demos": "partial"}
    with pytest.raises(ConfigError, match="task_kwargs: cannot read"):
        apply_overrides(RunConfig(), ["task_kwargs=size=7"])


def test_json_values_of_the_wrong_type_name_the_field():
    for data, field in [({"train": {"steps": "6"}}, "train.steps"),
                        ({"objective": {"dynamic_sampling": "no"}}, "objective.dynamic_sampling"),
                        ({"sampler": {"top_p": True}}, "sampler.top_p"),
                        ({"model": {"rope_scaling": {"factor": -1.0}}},
                         "model.rope_scaling.factor")]:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            from_dict(RunConfig, data)


def test_subset_estimators_need_k_below_the_group_size():
    for advantage in ("maxk", "passk"):
        obj = ObjectiveConfig(advantage=advantage)
        assert obj.subset_size(8) == 4 and obj.subset_size(3) == 2
        RunConfig(objective=obj, sampler=SamplerConfig(num_samples=3))
        with pytest.raises(ConfigError, match=r"sampler\.num_samples: .* k = 2, G = "):
            RunConfig(objective=obj, sampler=SamplerConfig(num_samples=2))
        with pytest.raises(ConfigError, match=r"objective\.subset_k: .* k = 8"):
            RunConfig(objective=dataclasses.replace(obj, subset_k=8))
    RunConfig(objective=ObjectiveConfig(advantage="grpo", subset_k=8))  # ignored by grpo
    with pytest.raises(ConfigError, match="objective.overlong_cache_len: passk"):
        ObjectiveConfig(advantage="passk", overlong_cache_len=4)


def test_name_tables_are_the_ones_the_code_uses():
    from vpo import objectives
    from vpo.objectives import common as _common
    from vpo.objectives import estimators

    assert tuple(estimators.ESTIMATORS) == config_lib.ADVANTAGES
    assert set(_common.STD_DDOF) == set(config_lib.STD_MODES)
    assert objectives.AGG_MODES is config_lib.AGG_MODES


def test_memory_estimate_rejects_a_group_that_cannot_fit():
    from vpo.rl.checks import device_memory

    available, where = device_memory()
    run = RunConfig()
    assert sum(run.memory_bytes(prompt_len=20).values()) < 10 * 2**20  # the tiny default
    check_memory(run, 20, available, where)
    huge = dataclasses.replace(run, sampler=SamplerConfig(num_samples=10**8))
    need = sum(huge.memory_bytes(prompt_len=20).values())
    assert need > available
    with pytest.raises(ConfigError) as err:
        check_memory(huge, 20, available, where)
    message = str(err.value)
    assert message.startswith("sampler.num_samples: 100000000 samples per prompt")
    assert f"need at least {need} bytes" in message and str(available) in message
    # the estimate grows with each size it depends on
    base = sum(run.memory_bytes(20).values())
    for section, change in [("sampler", dict(max_new_tokens=64)), ("train", dict(batch_size=16)),
                            ("model", dict(num_layers=4))]:
        bigger = dataclasses.replace(run, **{section: dataclasses.replace(
            getattr(run, section), **change)})
        assert sum(bigger.memory_bytes(20).values()) > base, section
    lora = dataclasses.replace(run, model=model_preset("tiny", lora_rank=2))
    assert lora.memory_bytes(20)["params"] < run.memory_bytes(20)["params"]


def test_overrides_are_validated_together_whatever_their_order():
    """Cross-field rules see the final values: lowering search_pool below the preset's
    search_problems is fine when search_problems comes down in the same command, in either
    order; a later override of the same key wins."""
    from vpo.compare.config import make_config

    for order in (["search_pool=2", "search_problems=1"], ["search_problems=1", "search_pool=2"]):
        cfg = make_config("smollm", order)
        assert (cfg.search_pool, cfg.search_problems) == (2, 1)
    run = apply_overrides(RunConfig(), ["train.steps=5", "model.dim=64", "train.steps=7"])
    assert run.train.steps == 7 and run.model.dim == 64
    with pytest.raises(ConfigError, match="search_problems"):
        make_config("smollm", ["search_pool=2"])  # the preset's 3 hard problems from a pool of 2
