"""Test-wide JAX set-up: CPU backend, 8 fake devices, persistent compile cache, strict ranks.

Everything here must run before JAX initialises its backend, so it happens at import time.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

_CACHE = os.environ.get(
    "VPO_TEST_JAX_CACHE", os.path.join(os.path.dirname(os.path.dirname(__file__)), ".jax_cache")
)
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(scope="session")
def load_experiment():
    """`load_experiment("bench_accel")`: experiments/<name>.py imported as a module (the scripts
    are not a package), once per session."""
    import importlib.util

    folder = os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments")
    loaded = {}

    def load(name: str):
        if name not in loaded:
            spec = importlib.util.spec_from_file_location(
                name, os.path.join(folder, f"{name}.py"))
            loaded[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(loaded[name])
        return loaded[name]

    return load
