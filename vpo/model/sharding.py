"""Device mesh, the logical-axis → mesh-axis rules table, and multi-host start-up.

Parameters carry `logical_axes` metadata (see `vpo.model.decoder`); `RULES` maps each logical name
to mesh axes. A rule naming an axis the mesh lacks, or one that does not divide the dimension,
leaves that dimension replicated, so one table serves 1 CPU, 8 fake CPU devices, a GPU host and a
TPU slice.
"""

from __future__ import annotations

import math

import jax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vpo.config import DistributedConfig

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis → mesh axes (tuple: sharded over their product, in order)
RULES: dict[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp"),
    "vocab": ("tensor",),
    "embed": ("fsdp",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "mlp": ("tensor",),
    "head_dim": (),
    "lora_rank": (),  # LoRA adapters' rank axis (small): replicated
}


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None) -> jax.sharding.Mesh:
    """Mesh over axes ("data", "fsdp", "tensor"); `data=-1` takes the remaining devices.

    Axes are `Auto` (sharding propagates through jit from the inputs' shardings).
    """
    devices = jax.devices() if devices is None else devices
    n = len(devices)
    if data == -1:
        if n % (fsdp * tensor):
            raise ValueError(f"mesh: fsdp*tensor = {fsdp * tensor} must divide the {n} devices")
        data = n // (fsdp * tensor)
    if data * fsdp * tensor != n:
        raise ValueError(f"mesh: data*fsdp*tensor = {data * fsdp * tensor} but there are {n} "
                         "devices; set the sizes so that their product is the device count")
    return jax.make_mesh((data, fsdp, tensor), MESH_AXES, devices=devices,
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)


def logical_spec(axes, shape, mesh, rules=RULES) -> P:
    """PartitionSpec for a tensor of `shape` whose dimensions carry logical names `axes`."""
    used: set[str] = set()
    spec = []
    for name, size in zip(axes, shape, strict=True):
        mesh_axes = tuple(a for a in rules.get(name, ()) if a in mesh.shape and a not in used)
        total = math.prod(mesh.shape[a] for a in mesh_axes)
        if not mesh_axes or total == 1 or size % total:
            spec.append(None)
            continue
        used.update(mesh_axes)
        spec.append(mesh_axes if len(mesh_axes) > 1 else mesh_axes[0])
    return P(*spec)


def param_shardings(state: nnx.State, mesh, rules=RULES):
    """NamedSharding for every array of an NNX state, from its variables' `logical_axes`."""

    def one(v):
        axes = v.get_metadata("logical_axes") if v.has_metadata("logical_axes") else None
        value = v.get_value()
        spec = P() if axes is None else logical_spec(axes, value.shape, mesh, rules)
        return v.replace(NamedSharding(mesh, spec))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh, ndim: int) -> NamedSharding:
    """Leading (batch) dimension over the mesh's data-parallel axes, the rest replicated.

    The batch size must be divisible by the product of those axes' sizes.
    """
    axes = tuple(a for a in RULES["batch"] if a in mesh.shape and mesh.shape[a] > 1)
    lead = None if not axes else axes if len(axes) > 1 else axes[0]
    return NamedSharding(mesh, P(lead, *([None] * (ndim - 1))))


def shard_model(model: nnx.Module, mesh, rules=RULES) -> nnx.Module:
    """Place a model's parameters on `mesh` according to the rules (in place; returns it)."""
    state = nnx.state(model)
    shardings = param_shardings(state, mesh, rules)
    nnx.update(model, jax.device_put(state, shardings))
    return model


def initialize_distributed(cfg: DistributedConfig) -> None:
    """Start JAX's multi-process runtime when configured; a no-op for single-process runs."""
    if not cfg.enabled:
        return
    # Only config updates before `initialize`: querying devices or the backend here would start
    # the runtime single-process and make the call fail.
    if cfg.cpu_collectives:
        jax.config.update("jax_cpu_collectives_implementation", cfg.cpu_collectives)
    if cfg.coordinator:
        jax.distributed.initialize(coordinator_address=cfg.coordinator,
                                   num_processes=cfg.num_processes, process_id=cfg.process_id)
    else:
        jax.distributed.initialize()


def host_local_batch(global_batch: int) -> slice:
    """The rows of a global batch this process feeds (process-major, contiguous)."""
    n, i = jax.process_count(), jax.process_index()
    if global_batch % n:
        raise ValueError(f"global batch {global_batch} must divide evenly over {n} processes")
    per = global_batch // n
    return slice(i * per, (i + 1) * per)


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, P())

