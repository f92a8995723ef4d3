"""The device mesh and how arrays are laid out on it.

Mesh axes: `data` (pure data parallelism), `fsdp` (data parallelism that also shards
parameters and optimizer state), `tensor` (splits heads, feed-forward and vocabulary).
Parameters carry logical axis names (tx.layers); `cfg.mesh.rules` maps those names to mesh
axes, and every sharding here is derived from the rules, never written per array.
"""

from __future__ import annotations

import math

import jax
import ml_collections
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


class MeshError(ValueError):
    """A mesh that does not fit the devices or the model."""


def mesh_shape(shape_cfg, num_devices: int) -> tuple[int, ...]:
    """(data, fsdp, tensor) sizes with the one -1 filled in from the device count."""
    sizes = [int(shape_cfg.get(a, 1)) for a in AXES]
    unknown = [a for a, s in zip(AXES, sizes, strict=True) if s == -1]
    if len(unknown) > 1:
        raise MeshError(f"only one mesh axis may be -1, got {unknown}")
    known = math.prod(s for s in sizes if s != -1)
    if unknown:
        if num_devices % known:
            raise MeshError(
                f"mesh.shape {dict(zip(AXES, sizes, strict=True))} does not divide "
                f"the {num_devices} devices"
            )
        sizes[AXES.index(unknown[0])] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise MeshError(
            f"mesh.shape {dict(zip(AXES, sizes, strict=True))} needs "
            f"{math.prod(sizes)} devices, {num_devices} are present"
        )
    return tuple(sizes)


def make_mesh(mesh_cfg: ml_collections.ConfigDict, devices=None) -> Mesh:
    """The (data, fsdp, tensor) mesh over `devices` (default: all devices of all processes)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(mesh_cfg.shape, len(devices))
    try:
        from jax.experimental import mesh_utils

        grid = mesh_utils.create_device_mesh(shape, devices=devices)
    except (ValueError, NotImplementedError, AssertionError):
        grid = np.array(devices).reshape(shape)
    return Mesh(grid, AXES)


def rules(mesh_cfg: ml_collections.ConfigDict) -> tuple:
    return tuple(
        (name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in mesh_cfg.rules
    )


def check_model_fits(mesh: Mesh, num_heads: int, d_ff: int, vocab_size: int) -> None:
    """Fails early when the tensor axis cannot split the model's dimensions evenly."""
    t = mesh.shape["tensor"]
    for name, size in (
        ("model.num_heads", num_heads),
        ("model.d_ff", d_ff),
        ("model.vocab_size", vocab_size),
    ):
        if size % t:
            raise MeshError(f"{name}={size} is not divisible by mesh.shape.tensor={t}")


def logical_shardings(abstract_boxed, mesh: Mesh, axis_rules) -> object:
    """NamedShardings for a tree whose leaves may be nn.LogicallyPartitioned boxes."""
    specs = nn.get_partition_spec(abstract_boxed)
    return nn.logical_to_mesh_sharding(specs, mesh, axis_rules)


def data_shards(mesh: Mesh) -> int:
    """How many ways a batch's rows are split (data x fsdp)."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows over (data, fsdp); positions replicated."""
    return NamedSharding(mesh, P(BATCH_AXES, None))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def global_batch(local: dict, mesh: Mesh) -> dict:
    """This process's rows -> global jax.Arrays sharded over (data, fsdp)."""
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local.items()}
