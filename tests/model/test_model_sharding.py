"""The mesh and the logical-axis rules table on 8 fake CPU devices: mesh sizes, specs that fall
back to replicated where an axis is missing or does not divide, model placement, batch rows."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vpo.config import model_preset
from vpo.model import sharding
from vpo.model.decoder import Decoder


def test_make_mesh_sizes_and_errors():
    mesh = sharding.make_mesh(tensor=2)
    assert dict(mesh.shape) == {"data": 4, "fsdp": 1, "tensor": 2}
    assert dict(sharding.make_mesh().shape) == {"data": 8, "fsdp": 1, "tensor": 1}
    with pytest.raises(ValueError, match="must divide"):
        sharding.make_mesh(tensor=3)
    with pytest.raises(ValueError, match="product is the device count"):
        sharding.make_mesh(data=2, fsdp=2, tensor=1)


@pytest.mark.parametrize("axes,shape,mesh_kw,want", [
    (("vocab", "embed"), (64, 16), dict(data=2, fsdp=2, tensor=2), P("tensor", "fsdp")),
    (("vocab", "embed"), (63, 16), dict(data=2, fsdp=2, tensor=2), P(None, "fsdp")),  # 63 % 2
    (("batch", None), (8, 3), dict(data=4, fsdp=2), P(("data", "fsdp"), None)),
    (("batch", None), (6, 3), dict(data=4, fsdp=2), P(None, None)),  # 6 % 8
    (("heads", "mlp"), (4, 4), dict(data=4, tensor=2), P("tensor", None)),  # tensor used once
    (("lora_rank", "head_dim"), (8, 8), dict(data=2, tensor=4), P(None, None)),
])
def test_logical_spec(axes, shape, mesh_kw, want):
    assert sharding.logical_spec(axes, shape, sharding.make_mesh(**mesh_kw)) == want


def test_shard_model_places_every_parameter_by_its_rule():
    """Each parameter's placement is the spec its own `logical_axes` give under `RULES`
    (replicated where it has none), and the tensor axis is used."""
    mesh = sharding.make_mesh(data=2, tensor=4)
    model = sharding.shard_model(Decoder(model_preset("tiny"), rngs=nnx.Rngs(0)), mesh)
    variables = jax.tree.leaves(nnx.state(model, nnx.Param),
                                is_leaf=lambda x: isinstance(x, nnx.Variable))
    specs = []
    for v in variables:
        value = v.get_value()
        axes = v.get_metadata("logical_axes") if v.has_metadata("logical_axes") else None
        want = P() if axes is None else sharding.logical_spec(axes, value.shape, mesh)
        assert value.sharding.is_equivalent_to(NamedSharding(mesh, want), value.ndim), (
            axes, value.shape, value.sharding.spec, want)
        specs.append(want)
    assert len(variables) > 5 and any("tensor" in spec for spec in specs)


def test_batch_sharding_and_host_rows():
    mesh = sharding.make_mesh(data=4, fsdp=2)
    x = jax.device_put(np.zeros((16, 3), np.float32), sharding.batch_sharding(mesh, 2))
    assert {s.data.shape for s in x.addressable_shards} == {(2, 3)}
    assert sharding.host_local_batch(8) == slice(0, 8)  # one process: every row
    assert sharding.replicated(mesh).is_fully_replicated
