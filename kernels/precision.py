"""Products that accumulate in float32 whatever the operand dtype, on every backend.

XLA's CPU runtime has no bf16 × bf16 → f32 dot kernel: an unfused `dot_general` with bfloat16
operands and `preferred_element_type=float32` fails at run time ("Unsupported element type for
DotThunk::Execute: BF16 x BF16 = F32"). On CPU the operands are therefore upcast to float32
first; a product of two bfloat16 numbers is exact in float32, so the result is the same as the
mixed-precision dot an accelerator runs (up to accumulation order). Elsewhere the operands stay
in their dtype and the accelerator's mixed-precision unit accumulates in float32.

The platform is the one the program is built for: `platform="tpu"` / `"gpu"` / `"cpu"`, or
None for the process's default backend (`jax.default_backend()`). A program compiled ahead of
time for a TPU or GPU from a CPU host must pass it (see `vpo.kernels.hardware.platform_of`).
"""

from __future__ import annotations

import jax.numpy as jnp
from vpo.kernels.hardware import resolve_platform


def _upcast_on_cpu(*xs, platform: str | None = None):
    if resolve_platform(platform) != "cpu":
        return xs
    return tuple(x.astype(jnp.float32) if jnp.dtype(x.dtype).itemsize < 4 else x for x in xs)


def einsum_f32(spec: str, a, b, *, platform: str | None = None):
    """`jnp.einsum(spec, a, b)` accumulated and returned in float32 (see the module docstring)."""
    a, b = _upcast_on_cpu(a, b, platform=platform)
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def dot_f32(a, b, *, platform: str | None = None):
    """`jnp.dot(a, b)` accumulated and returned in float32 (see the module docstring)."""
    a, b = _upcast_on_cpu(a, b, platform=platform)
    return jnp.dot(a, b, preferred_element_type=jnp.float32)
