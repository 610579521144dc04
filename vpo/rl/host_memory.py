"""Compile a step ahead of its first call and give the memory XLA's compiler freed back to the OS.

XLA compiles in one thread and runs the executable on others. glibc's malloc keeps what a thread
frees in that thread's arena, so the gigabytes a large compile frees are not reused by the
run's buffers: they stack on top. SmolLM2-135M's fused GRPO step on CPU: 1.9 GB freed but kept
after the compile, peak resident memory 8.3 GB; with `malloc_trim(0)` between the compile and
the first call, 6.2 GB (`experiments/bench_peers.py`, `--sizes smollm2`). The step itself is
unchanged: the executable is the one `jax.jit` would have compiled on its first call.

XLA:CPU also allocates each call's temporaries with malloc (2.4 GB for that step). glibc serves a
block over 32 MB with a fresh `mmap` and unmaps it on free, so every step page-faulted 2.4 GB of
new zeroed pages: 595k faults and 3.5 s of kernel time per 10 s step. `keep_freed_memory`
makes glibc keep and reuse freed memory instead; `vpo train` calls it for a policy of 50M
parameters or more (`keep_freed_memory_for`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import jax


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -2, -4, -8


def keep_freed_memory(top_pad_bytes: int = 1 << 30) -> bool:
    """Make glibc's malloc keep what the process frees and reuse it: one arena for every thread
    (XLA allocates on its worker threads), no `mmap` for large blocks (they come from the heap
    and return to it), no automatic trim, and the heap grown `top_pad_bytes` at a time. Call it
    before jax starts its threads. What the process has freed stays resident (its peak does not
    grow; `release_freed_memory` still gives memory back when asked). Returns whether it applied
    (glibc); another C library is left as it is."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1),  # -1: never
                (_M_TOP_PAD, int(top_pad_bytes)))
    return all(libc.mallopt(param, value) == 1 for param, value in settings)


# Below this many policy parameters a call's temporaries stay small (under glibc's 32 MB mmap
# threshold) and the single arena's lock costs more than the reuse saves: the tiny maze RL step
# took 88 instead of 53 ms with `keep_freed_memory`.
KEEP_FREED_MIN_PARAMS = 50_000_000


def keep_freed_memory_for(num_params: int) -> bool:
    """`keep_freed_memory()` for a policy of at least `KEEP_FREED_MIN_PARAMS` parameters (what
    `vpo train` calls before jax starts); returns whether it applied."""
    return num_params >= KEEP_FREED_MIN_PARAMS and keep_freed_memory()


def release_freed_memory() -> bool:
    """Return memory that malloc holds free to the OS (`malloc_trim(0)`). Returns whether the C
    library has the call (glibc)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True


def compile_now(jitted, *args):
    """`jitted.lower(*args).compile()`, then `release_freed_memory()`: the compiled executable,
    called like `jitted` on arguments of the same shapes, dtypes and shardings (the persistent
    compilation cache applies as to a first call)."""
    compiled = jitted.lower(*args).compile()
    release_freed_memory()
    return compiled


def _signature(args) -> tuple:
    """The shapes, dtypes and shardings of a call's arguments (what an executable is for)."""
    leaves, treedef = jax.tree.flatten(args)
    return treedef, tuple((getattr(x, "shape", None), str(getattr(x, "dtype", type(x))),
                           getattr(x, "sharding", None)) for x in leaves)


def compiled_per_signature(jitted):
    """`compiled_on_first_call` for callers whose argument shapes may differ between calls (runs
    of one process sharing a step whose prompt length depends on the run's problems): one
    `compile_now` executable per distinct signature of shapes, dtypes and shardings, reused
    for every later call with that signature."""
    compiled: dict[tuple, object] = {}

    def call(*args):
        sig = _signature(args)
        if sig not in compiled:
            compiled[sig] = compile_now(jitted, *args)
        return compiled[sig](*args)

    return call


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
