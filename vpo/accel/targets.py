"""Named accelerator targets: a chip (v5e, v5p, v6e, h100), a device count, their devices as
libtpu / the CUDA plugin describe them (nothing is opened) and a mesh over them.

Spellings: `v5e` (one chip), `v5e:2x2` (a TPU topology: 4 chips), `v5e-8` or `v5ex8` (8 chips),
`h100`, `h100x8` (8 GPUs on one host).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re

from vpo.config import ConfigError
from vpo.kernels.aot_check import H100


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator: its platform, high-bandwidth memory per chip and topology family."""

    name: str
    platform: str  # "tpu" | "gpu"
    hbm_bytes: int
    dims: int = 2  # TPU topology rank (v5p: 3); 0 for GPUs


GIB = 2**30
CHIPS: dict[str, Chip] = {
    "v5e": Chip("v5e", "tpu", 16 * GIB),
    "v5p": Chip("v5p", "tpu", 95 * GIB, dims=3),
    "v6e": Chip("v6e", "tpu", 32 * GIB),
    "h100": Chip("h100", "gpu", 84_929_347_584, dims=0),  # H100 80GB HBM3 (the CUDA plugin)
}


@dataclasses.dataclass(frozen=True)
class Target:
    """A chip and a device count; `topology` is the TPU slice (or GPU host) whose first
    `n_devices` devices the programs are built for."""

    chip: Chip
    n_devices: int
    topology: str

    @property
    def name(self) -> str:
        if self.n_devices == 1:
            return self.chip.name
        return f"{self.chip.name}{'x' if self.platform == 'gpu' else '-'}{self.n_devices}"

    @property
    def platform(self) -> str:
        return self.chip.platform


def _tpu_topology(chip: Chip, n: int) -> str:
    """A slice of at least `n` chips (n a power of two): 2x2 for 1..4, then a x b (or 2x2xk)."""
    if n <= 4:
        return f"{chip.name}:2x2x1" if chip.dims == 3 else f"{chip.name}:2x2"
    if chip.dims == 3:
        return f"{chip.name}:2x2x{n // 4}"
    a = 2 ** (int(math.log2(n)) // 2)
    return f"{chip.name}:{a}x{n // a}"


def parse_target(spec: str) -> Target:
    """`v5e`, `v5e:2x2`, `v5e-8` / `v5ex8`, `h100`, `h100x8` → Target."""
    text = str(spec).strip().lower()
    m = re.fullmatch(r"([a-z0-9]+?)(?::(\d+(?:x\d+)*)|[-x](\d+))?", text)
    chip = CHIPS.get(m.group(1)) if m else None
    if chip is None:
        raise ConfigError(f"--target {spec}: expected a chip ({', '.join(CHIPS)}) optionally "
                          "with a TPU topology (v5e:2x2) or a device count (v5e-8, h100x8)")
    if m.group(2):
        if chip.platform != "tpu":
            raise ConfigError(f"--target {spec}: a topology is for TPUs; for GPUs give a count "
                              "(h100x8)")
        n = math.prod(int(x) for x in m.group(2).split("x"))
        return Target(chip, n, f"{chip.name}:{m.group(2)}")
    n = int(m.group(3) or 1)
    if n < 1 or n & (n - 1) or (chip.platform == "gpu" and n > 8):
        raise ConfigError(f"--target {spec}: the device count must be a power of two"
                          + (" up to 8 (one host)" if chip.platform == "gpu" else ""))
    if chip.platform == "gpu":
        return Target(chip, n, f"1x1x{n}")
    return Target(chip, n, _tpu_topology(chip, n))


def missing_wheels(platform: str) -> str | None:
    """None when this interpreter can compile for `platform` ("tpu": libtpu; "gpu": jax's CUDA
    plugin); else the command that installs what is missing."""
    import jax

    module = {"tpu": "libtpu", "gpu": "jax_plugins.xla_cuda12"}[platform]
    try:
        if importlib.util.find_spec(module) is not None:
            return None
    except ImportError:  # no jax_plugins package at all
        pass
    return (f"compiling for {'TPU' if platform == 'tpu' else 'an NVIDIA GPU'} needs libtpu and "
            "the CUDA plugin of jax's own version (no TPU, GPU or CUDA libraries); install "
            f"them with: pip install \"jax[tpu,cuda12-local]=={jax.__version__}\" (vpo's "
            "`aot` extra, pinned to this jax), here or in a venv of their own as .ci/run makes "
            ".venv-aot")


# XLA:GPU's Triton GEMM emitter finds no tiling for the RL step's small f32[L, 64|128, 3] dots
# ("Couldn't find output tile sizes"): every H100 RL step of the fit table failed with it, every
# one compiled without it (docs/accelerators.md). vpo's commands build GPU programs with XLA's
# other GEMM paths unless XLA_FLAGS sets the flag itself; the flag is inert on CPU and TPU.
GPU_XLA_FLAGS = ("--xla_gpu_enable_triton_gemm=false",)


def default_xla_flags() -> str:
    """Add `GPU_XLA_FLAGS` to XLA_FLAGS where it does not set them (before the backend starts;
    afterwards XLA has read its flags) → the resulting XLA_FLAGS."""
    flags = os.environ.get("XLA_FLAGS", "")
    for flag in GPU_XLA_FLAGS:
        if flag.partition("=")[0] not in flags:
            flags = f"{flags} {flag}".strip()
    os.environ["XLA_FLAGS"] = flags
    return flags


def set_up_env(target: Target | None = None) -> None:
    """Environment for a device-less build: the CPU backend as default, no CUDA device opened,
    no CUDA version check, no TPU metadata query, libtpu loadable by several processes, vpo's
    XLA:GPU flags (`default_xla_flags`); for a TPU target what libtpu otherwise asks a TPU VM's
    metadata server for (`tpu_host_env`). A variable the caller set is kept."""
    default_xla_flags()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # builds in parallel processes
    if target is not None and target.platform == "tpu":
        for name, value in tpu_host_env(target.topology).items():
            os.environ.setdefault(name, value)


# Cloud TPU accelerator-type names: v5e slices are "v5litepod-N"; v5p counts TensorCores (2 per
# chip), the others chips.
_ACCELERATOR_TYPE = {"v5e": ("v5litepod", 1), "v5p": ("v5p", 2), "v6e": ("v6e", 1)}


def tpu_host_env(topology: str) -> dict[str, str]:
    """The variables libtpu reads on a TPU VM, for a build on this host alone: one worker
    (localhost, id 0) and the slice's accelerator type (`v6e:2x2` → v6e-4). Without them libtpu
    logs `INVALID_ARGUMENT: unexpected worker hostname` and `Failed to find host bounds` on
    stderr, which read as failures though the build goes on."""
    chip, _, shape = topology.partition(":")
    name, per_chip = _ACCELERATOR_TYPE[chip]
    chips = math.prod(int(x) for x in shape.split("x"))
    return {"TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0",
            "TPU_ACCELERATOR_TYPE": f"{name}-{chips * per_chip}"}


def devices(target: Target) -> list:
    """The target's `n_devices` devices, described by libtpu / the CUDA plugin, not opened."""
    from jax.experimental import topologies

    if target.platform == "gpu":
        topo = topologies.get_topology_desc(platform="cuda", target_config=H100,
                                            topology=target.topology)
    else:
        topo = topologies.get_topology_desc(target.topology, "tpu")
    found = list(topo.devices)
    if len(found) < target.n_devices:
        raise ConfigError(f"--target {target.name}: topology {target.topology} has "
                          f"{len(found)} devices, fewer than {target.n_devices}")
    return found[:target.n_devices]


def mesh(target: Target, data: int = -1, fsdp: int = 1, tensor: int = 1):
    """The ("data", "fsdp", "tensor") mesh of `vpo.model.sharding.make_mesh` over the target's
    devices (a RunConfig's mesh_data / mesh_fsdp / mesh_tensor)."""
    from vpo.model import sharding

    try:
        return sharding.make_mesh(data, fsdp, tensor, devices=devices(target))
    except ValueError as e:
        raise ConfigError(f"mesh_data / mesh_fsdp / mesh_tensor on {target.name} "
                          f"({target.n_devices} devices): {e}") from None
