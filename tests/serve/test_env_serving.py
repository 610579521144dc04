"""The policy served to a verifiers 0.4 environment under `vpo train --env`
(`vpo.rl.env_served`): its slots sized by the episode's budget or `sampler.served_context`,
not the model's positions (the episodes themselves run in tests/env/test_env_verifiers_v1.py,
with verifiers installed)."""

import pytest

from vpo.config import ConfigError
from vpo.config.sections import SamplerConfig
from vpo.rl.env_served import served_capacity


def test_the_served_slots_hold_the_episode_budget_not_the_models_positions():
    """C = the rows' prompt length + 2 T by default (within the model's positions), or
    sampler.served_context; named errors when it cannot hold the prompts and T."""
    assert served_capacity(40, 32, 0, 8192) == (72, 32)  # SmolLM2: not 8160
    assert served_capacity(40, 32, 200, 8192) == (168, 32)
    assert served_capacity(100, 16, 0, 128) == (112, 16)  # capped at the positions
    with pytest.raises(ConfigError, match="served_context 9000: the model has 8192"):
        served_capacity(40, 32, 9000, 8192)
    with pytest.raises(ConfigError, match="need 72 positions"):
        served_capacity(40, 32, 70, 8192)
    with pytest.raises(ConfigError, match="need 144 positions"):
        served_capacity(120, 24, 0, 128)
    assert SamplerConfig(served_context=100).served_context == 100
    for bad in (-1, 2.5, 16):
        with pytest.raises(ConfigError, match="sampler.served_context"):
            SamplerConfig(max_new_tokens=32, served_context=bad)
