"""Every frozen config of a run, validated on construction (errors name the field and the fix).

    fields     name tables, `Rule`, `validate`, `require`
    model      `ModelConfig`, `RopeScaling`, `LORA_TARGETS`, `MODEL_PRESETS`, `model_preset`
               (`preset_list`, `PRESETS_DOC`: the errors' pointer to the documented list)
    sections   `SamplerConfig`, `SearchConfig`, `LearnConfig`, `DistributedConfig`
    run        `ObjectiveConfig`, `TrainConfig`, `RunConfig` (what a run and its checkpoint
               hold), `StepConfig`, `check_memory`
    overrides  `from_dict` (JSON), `apply_overrides` (`section.key=value`)

The package re-exports every public name, so `from vpo.config import RunConfig` is the path.
"""

from vpo.config.fields import *  # noqa: F403
from vpo.config.fields import ConfigError, Rule, integer, one_of, real, require, validate  # noqa: F401
from vpo.config.model import (  # noqa: F401
    LORA_TARGETS,
    MODEL_PRESETS,
    PRESETS_DOC,
    PRESETS_NOTE,
    PRETRAINED_CHOICES,
    ModelConfig,
    RopeScaling,
    model_preset,
    preset_list,
)
from vpo.config.overrides import apply_overrides, from_dict, parse_value  # noqa: F401
from vpo.config.run import (  # noqa: F401
    SUBSET_ESTIMATORS,
    ObjectiveConfig,
    RunConfig,
    StepConfig,
    TrainConfig,
    check_memory,
)
from vpo.config.sections import (  # noqa: F401
    DistributedConfig,
    LearnConfig,
    SamplerConfig,
    SearchConfig,
)
