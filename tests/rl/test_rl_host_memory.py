"""`vpo.rl.host_memory`: the ahead-of-time compiled step is the jitted one, and glibc's trim
runs."""

import jax
import jax.numpy as jnp
import numpy as np

from vpo.rl.host_memory import compile_now, compiled_on_first_call, release_freed_memory


def test_compile_now_runs_the_jitted_function_with_its_donation():
    def step(state, x):
        return state + x.sum(), state * 2

    jitted = jax.jit(step, donate_argnums=0)
    state, x = jnp.arange(4.0), jnp.ones((3, 2))
    want = jitted(jnp.arange(4.0), x)
    compiled = compile_now(jitted, state, x)
    got = compiled(state, x)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    assert state.is_deleted()  # donated, as the jitted step donates it


def test_release_freed_memory_runs_on_glibc():
    # this project runs on Linux/glibc (CI, the GPU hosts); elsewhere it answers False
    assert release_freed_memory() is True


def test_compiled_on_first_call_compiles_once_then_trims_then_runs(monkeypatch):
    from vpo.rl import host_memory

    events = []
    monkeypatch.setattr(host_memory, "release_freed_memory", lambda: events.append("trim"))

    def step(state, x):
        events.append("trace")
        return state + x, (state * x).sum()

    call = compiled_on_first_call(jax.jit(step, donate_argnums=0))
    state, want = jnp.zeros(3), jnp.zeros(3)
    for i in range(3):
        x = jnp.full(3, float(i))
        state, _ = call(state, x)
        want = want + x
        np.testing.assert_array_equal(state, want)
    # one trace and compile, the compiler's memory given back once, then the executable
    assert events == ["trace", "trim"]


_REUSE = """
import ctypes, resource, sys
from vpo.rl import host_memory
applied = host_memory.keep_freed_memory() if sys.argv[1] == "keep" else None
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
n = 64 << 20  # 64 MB: over glibc's largest mmap threshold (32 MB), as XLA's temporaries are
def touch():
    p = libc.malloc(n); libc.memset(p, 1, n); libc.free(p)
touch()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
touch()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def test_keep_freed_memory_reuses_a_freed_block_without_new_page_faults():
    # by default glibc unmaps a large freed block and the next one faults in fresh pages (what
    # made every SmolLM2 step fault in its 2.4 GB of temporaries); kept, the block is reused
    import subprocess
    import sys

    def run(mode):
        out = subprocess.run([sys.executable, "-c", _REUSE, mode], capture_output=True,
                             text=True, check=True).stdout.split()
        return out[0], int(out[1])

    (_, default_faults), (applied, kept_faults) = run("default"), run("keep")
    pages = (64 << 20) // 4096
    assert default_faults > pages // 2  # fresh pages: about one fault per 4 KB page
    assert applied == "True" and kept_faults < pages // 20


def test_keep_freed_memory_for_applies_only_to_large_policies(monkeypatch):
    from vpo.rl import host_memory

    calls = []
    monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: calls.append(1) or True)
    assert host_memory.keep_freed_memory_for(4_200_000) is False and calls == []
    assert host_memory.keep_freed_memory_for(134_515_008) is True and calls == [1]
