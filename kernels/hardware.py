"""The target a kernel is built for: its platform and the on-chip memory that sizes its blocks.

A platform is "tpu", "gpu" or "cpu" ("cuda" and "rocm" read as "gpu"). It comes from an
explicit argument, or from the devices a program is compiled for (`platform_of(mesh)`), and
only when neither is given from the process's default backend: a program built ahead of time
for a TPU mesh on a CPU host must not take the CPU branches.

Limits the block sizes are derived from (per kernel: `block_sizes_for`):
  * TPU: 16 MiB of scoped VMEM (Mosaic's default limit on v4 / v5e / v5p; v6e has 32 MiB), of
    which a kernel plans for `TPU_VMEM_BUDGET_BYTES`; the last two dims of a block are multiples
    of (8, 128) or the whole array dim.
  * GPU (Triton lowering): every loaded tile has a power-of-two element count of at most 2^20;
    an H100 gives a block 232,448 bytes of shared memory (opt-in), of which a kernel plans for
    `GPU_SMEM_BUDGET_BYTES`, matmul operands at least 16 × 16.
"""

from __future__ import annotations

import jax

TPU_SCOPED_VMEM_BYTES = 16 * 2**20
TPU_VMEM_BUDGET_BYTES = 12 * 2**20  # leave room for Mosaic's own temporaries
GPU_SMEM_BYTES = 232_448  # H100, per block, opt-in
GPU_SMEM_BUDGET_BYTES = 160 * 2**10
TRITON_MAX_ELEMENTS = 2**20

_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def resolve_platform(platform: str | None = None) -> str:
    """`platform` normalised to "tpu" / "gpu" / "cpu"; None → `jax.default_backend()`."""
    name = jax.default_backend() if platform is None else str(platform).lower()
    name = _ALIASES.get(name, name)
    if name not in ("tpu", "gpu", "cpu"):
        raise ValueError(f"unknown platform {platform!r}: expected 'tpu', 'gpu' or 'cpu'")
    return name


def platform_of(target) -> str:
    """Platform of the devices a program is built for: a Mesh, a Sharding, a device, or a
    sequence of devices (all of one platform)."""
    if isinstance(target, jax.sharding.Mesh):
        devices = list(target.devices.flat)
    elif isinstance(target, jax.sharding.Sharding):
        devices = list(target.device_set)
    elif hasattr(target, "platform"):
        devices = [target]
    else:
        devices = list(target)
    platforms = {resolve_platform(d.platform) for d in devices}
    if len(platforms) != 1:
        raise ValueError(f"expected devices of one platform, got {sorted(platforms)}")
    return platforms.pop()


def triton_available() -> bool:
    """Whether this jax still lowers Pallas to Triton (deprecated from jax 0.11)."""
    try:
        from jax.experimental.pallas import triton  # noqa: F401
    except ImportError:
        return False
    return True


def pallas_supported(platform: str | None = None) -> bool:
    """Whether the kernels here compile for `platform` (not counting `interpret=True`, which
    runs anywhere): TPU (Mosaic), GPU while jax has the Triton lowering; never CPU. Callers
    that get False take the XLA path."""
    name = resolve_platform(platform)
    return name == "tpu" or (name == "gpu" and triton_available())


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def pow2_ceil(x: int) -> int:
    """Smallest power of two ≥ x (x ≥ 1)."""
    return 1 << max(int(x) - 1, 0).bit_length()


def pow2_factor(x: int) -> int:
    """Largest power of two dividing x (x ≥ 1)."""
    return x & -x


def compiler_params(platform: str, *, dimension_semantics=None, num_warps: int = 4,
                    num_stages: int = 2):
    """Pallas compiler parameters for a compiled (not interpreted) kernel on `platform`: Mosaic
    TPU with the grid's dimension semantics, or Triton on GPU (chosen per call, whatever
    `jax_pallas_use_mosaic_gpu` says)."""
    if platform == "tpu":
        from jax.experimental.pallas import tpu as pltpu
        return pltpu.CompilerParams(dimension_semantics=dimension_semantics)
    if platform == "gpu":
        from jax.experimental.pallas import triton as pltriton
        return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
    return None
