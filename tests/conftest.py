"""Test-wide JAX set-up: CPU backend, 8 fake devices, persistent compile cache, strict ranks.

Everything here must run before JAX initialises its backend, so it happens at import time.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
# The lean tests compile far more than they run: LLVM's lowest optimisation level cuts a cold
# compile by about a fifth (tests/run/test_rl_loop.py 84 s -> 67 s on 2 cores) and slows what
# runs (about +60% on a step); every number a test compares stays inside its tolerance.
# VPO_TEST_OPTIMIZED=1 (CI's slow set, whose real-checkpoint runs execute more than they
# compile) or a flag of your own keeps XLA's optimised code.
if "xla_backend_optimization_level" not in _flags and os.environ.get("VPO_TEST_OPTIMIZED") != "1":
    _flags += " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = _flags.strip()

import jax  # noqa: E402
import pytest  # noqa: E402

_CACHE = os.environ.get(
    "VPO_TEST_JAX_CACHE", os.path.join(os.path.dirname(os.path.dirname(__file__)), ".jax_cache")
)
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (the default run's): one worker per core, at most 4 (each holds a JAX runtime
    and its compiles, a few GB at the suite's peak)."""
    return max(1, min(os.cpu_count() or 1, 4))


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
