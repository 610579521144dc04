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

import functools

import jax
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _low_grad_einsum(spec: str, a, b):
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _low_grad_fwd(spec, a, b):
    return _low_grad_einsum(spec, a, b), (a, b)


def _low_grad_bwd(spec, res, g):
    a, b = res
    g = g.astype(jnp.promote_types(a.dtype, b.dtype))
    (da,) = jax.linear_transpose(lambda x: jnp.einsum(spec, x, b), a)(g)
    (db,) = jax.linear_transpose(lambda y: jnp.einsum(spec, a, y), b)(g)
    return da, db


_low_grad_einsum.defvjp(_low_grad_fwd, _low_grad_bwd)


def einsum_f32_low_grad(spec: str, a, b, *, platform: str | None = None):
    """`einsum_f32` whose gradient products run in the operands' dtype: the float32 cotangent
    is rounded to it first (for bf16 operands, the backward's two products are bf16 ones
    accumulated in float32, as a bf16 product's backward is, instead of float32 products that
    the float32 cotangent would promote them to). The forward is `einsum_f32`'s; for float32
    operands, and on CPU (where the operands are upcast), the gradient is its gradient too.
    Not for use inside a Pallas kernel body."""
    if resolve_platform(platform) == "cpu" or jnp.promote_types(a.dtype, b.dtype) == jnp.float32:
        return einsum_f32(spec, a, b, platform=platform)
    return _low_grad_einsum(spec, a, b)
