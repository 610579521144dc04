"""Compile a step ahead of its first call and give the memory XLA's compiler freed back to the OS.

XLA compiles in one thread and runs the executable on others. glibc's malloc keeps what a thread
frees in that thread's arena, so the gigabytes a large compile frees are not reused by the
run's buffers: they stack on top. SmolLM2-135M's fused GRPO step on CPU: 1.9 GB freed but kept
after the compile, peak resident memory 8.3 GB; with `malloc_trim(0)` between the compile and
the first call, 6.2 GB (`experiments/bench_peers.py`, `--sizes smollm2`). The step itself is
unchanged: the executable is the one `jax.jit` would have compiled on its first call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    """glibc's `malloc_trim`, or None (another C library: nothing to give back this way)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Return memory that malloc holds free to the OS (`malloc_trim(0)`). Returns whether the C
    library has the call (glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def compile_now(jitted, *args):
    """`jitted.lower(*args).compile()`, then `release_freed_memory()`: the compiled executable,
    called like `jitted` on arguments of the same shapes, dtypes and shardings (the persistent
    compilation cache applies as to a first call)."""
    compiled = jitted.lower(*args).compile()
    release_freed_memory()
    return compiled


def compiled_on_first_call(jitted):
    """A callable like `jitted` whose first call compiles it with `compile_now` (so the compiler's
    memory is given back before it runs); later calls run that executable, so their arguments
    must keep the first call's shapes, dtypes and shardings (a training loop's do)."""
    compiled = None

    def call(*args):
        nonlocal compiled
        if compiled is None:
            compiled = compile_now(jitted, *args)
        return compiled(*args)

    return call
