"""The device mesh and how arrays are laid out on it: the only module that builds layouts.

Mesh axes: `data` (pure data parallelism), `fsdp` (data parallelism that also shards
parameters and optimizer state), `tensor` (splits heads, feed-forward and vocabulary).
Parameters carry logical axis names (tx.model.layers); `cfg.mesh.rules` maps those names to mesh
axes, and every sharding (parameters, optimizer state, input batches, per-row values,
micro-batches) is derived from the rules by a `Layout`, never written per array.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import ml_collections
import numpy as np
from flax import linen as nn
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding

from tx.train.settings import AXES


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
        grid = mesh_utils.create_device_mesh(shape, devices=devices)
    except (ValueError, NotImplementedError, AssertionError):
        grid = np.array(devices).reshape(shape)
    return Mesh(grid, AXES)


def rules(mesh_cfg: ml_collections.ConfigDict) -> tuple:
    """`mesh.rules` as a tuple of (logical name, mesh axis or axes or None)."""
    return tuple(
        (name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in mesh_cfg.rules
    )


@dataclasses.dataclass(frozen=True)
class Layout:
    """A mesh and the rules mapping logical axis names onto it: every sharding of a run.

    Arrays are described by the logical names of their dimensions (tx.model.layers documents
    them), never by mesh axes, so changing a rule moves parameters, activations and input
    batches together.
    """

    mesh: Mesh
    rules: tuple

    @property
    def platform(self) -> str:
        """ "cpu", "gpu" or "tpu": what the mesh's devices are."""
        return self.mesh.devices.flat[0].platform

    def named(self, *logical: str | None) -> NamedSharding:
        """The sharding of an array whose dimensions carry these logical names."""
        return NamedSharding(self.mesh, nn.logical_to_mesh_axes(logical, self.rules))

    @property
    def batch(self) -> NamedSharding:
        """Input batches [rows, length]."""
        return self.named("batch", "length")

    @property
    def rows(self) -> NamedSharding:
        """One value per row [rows] (e.g. each sentence's maximum output length)."""
        return self.named("batch")

    @property
    def micro_batches(self) -> NamedSharding:
        """A batch split into micro-batches [k, rows / k, length]."""
        return self.named(None, "batch", "length")

    @property
    def data_shards(self) -> int:
        """How many ways a batch's rows are split: the mesh axes the `batch` rule uses."""
        return _batch_ways(self.rules, dict(self.mesh.shape))

    def tree(self, abstract_boxed) -> object:
        """NamedShardings for a tree whose leaves may be nn.LogicallyPartitioned boxes."""
        specs = nn.get_partition_spec(abstract_boxed)
        return nn.logical_to_mesh_sharding(specs, self.mesh, self.rules)

    def placed(self, abstract_boxed) -> object:
        """The same tree unboxed, as ShapeDtypeStructs carrying their shardings: a restore or
        compile target on this layout (nothing is allocated)."""
        return jax.tree_util.tree_map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            nn.meta.unbox(abstract_boxed),
            self.tree(abstract_boxed),
        )

    def process_rows(self, rows: int) -> np.ndarray:
        """The global rows of a [rows, ...] batch this process supplies, in the order
        `global_batch` / `global_rows` take them: every row block its addressable devices
        hold, by increasing global index (jax.make_array_from_process_local_data's layout).

        Read from the sharding itself, so it holds for any device order: a mesh that
        interleaves processes along the batch axis, or a `tensor` axis spanning processes
        (whose processes then supply the same rows). Every place that splits a global batch
        between processes (training input, dev loss, decoding) goes through here.
        """
        blocks = self.rows.addressable_devices_indices_map((rows,)).values()
        spans = sorted({(s.start or 0, rows if s.stop is None else s.stop) for (s,) in blocks})
        return np.concatenate([np.arange(a, b) for a, b in spans]).astype(np.int64)

    def global_batch(self, local: dict) -> dict:
        """This process's rows (`process_rows`) [rows, length] -> global jax.Arrays."""
        return {k: jax.make_array_from_process_local_data(self.batch, v) for k, v in local.items()}

    def global_rows(self, local: np.ndarray) -> jax.Array:
        """This process's per-row values (`process_rows`) [rows] -> a global jax.Array."""
        return jax.make_array_from_process_local_data(self.rows, local)


def _batch_ways(rules_: tuple, sizes: dict) -> int:
    axes = nn.logical_to_mesh_axes(("batch",), rules_)[0]
    axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
    return math.prod(sizes[a] for a in axes)


def data_shards(mesh_cfg: ml_collections.ConfigDict, num_devices: int) -> int:
    """How many ways batches are split on `num_devices` devices with this mesh config, without
    the devices (for planning a run on hardware this machine does not have)."""
    sizes = dict(zip(AXES, mesh_shape(mesh_cfg.shape, num_devices), strict=True))
    return _batch_ways(rules(mesh_cfg), sizes)


def layout(mesh_cfg: ml_collections.ConfigDict, devices=None) -> Layout:
    """The run's Layout from `cfg.mesh` over `devices` (default: every device)."""
    return Layout(make_mesh(mesh_cfg, devices), rules(mesh_cfg))


def check_sizes_fit(mesh: Mesh, sizes: dict[str, int]) -> None:
    """Fails early when the tensor axis cannot split these sizes ({config key: size}) evenly
    (each family's config lists its own: `tensor_split_sizes()`)."""
    t = mesh.shape["tensor"]
    for name, size in sizes.items():
        if size % t:
            raise MeshError(f"{name}={size} is not divisible by mesh.shape.tensor={t}")
