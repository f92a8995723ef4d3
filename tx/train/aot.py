"""Ahead-of-time check: compile the train step for the configured mesh before renting it.

`python -m tx compile --config configs/big.py [--topology v4:2x2x2]` lowers and compiles one
training step on abstract inputs (nothing is allocated) and reports per-device memory and the
step's FLOPs from XLA's cost analysis, next to the analytic model FLOPs.
"""

from __future__ import annotations

import math

import jax
import ml_collections
import numpy as np
from jax.experimental import topologies

from tx.data import dataset
from tx.model.counting import train_flops_per_step
from tx.train import trainer as trainer_lib


def topology_devices(topology: str):
    """Devices of a named TPU topology (e.g. "v4:2x2x2"), from libtpu, without the hardware."""
    try:
        return topologies.get_topology_desc(topology, "tpu").devices
    except Exception as e:  # noqa: BLE001 - libtpu missing or unknown topology: say so
        raise RuntimeError(
            f"cannot describe TPU topology {topology!r} here ({e}); install "
            "libtpu (pip install 'tx[tpu]') or run on a TPU VM"
        ) from e


def _bytes_per_device(tree) -> int:
    """Bytes of one device's shards of a tree of ShapeDtypeStructs with shardings."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shard = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shard) * np.dtype(leaf.dtype).itemsize
    return total


def compile_report(cfg: ml_collections.ConfigDict, devices=None) -> dict:
    """Compiles the train step on the largest bucket; returns memory and FLOPs per device."""
    trainer = trainer_lib.build(cfg, devices)
    mesh, mc = trainer.mesh, trainer.model.config
    state = trainer_lib.abstract_train_state(trainer)
    length = cfg.data.max_len if cfg.data.pack else cfg.data.bucket_lengths[-1]
    multiple = trainer.layout.data_shards * cfg.train.micro_batches
    # The largest batch the data can produce (2 x data.tokens_per_step padded tokens in real
    # rows, then empty rows up to a multiple of the data shards x micro-batches).
    spec = dataset.batch_spec(cfg.data, multiple)
    rows = spec.padded(spec.max_rows(length))
    batch = {
        k: jax.ShapeDtypeStruct((rows, length), np.int32, sharding=trainer.layout.batch)
        for k in ("inputs", "targets")
    }
    compiled = trainer_lib.jit_train_step(trainer).lower(state, batch).compile()
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    tokens = rows * length
    return {
        "mesh": dict(mesh.shape),
        "devices": mesh.size,
        "device_kind": getattr(mesh.devices.flat[0], "device_kind", "?"),
        "batch": {"rows": rows, "length": length, "micro_batches": cfg.train.micro_batches},
        "per_device_bytes": {
            "params": _bytes_per_device(state.params),
            "optimizer_state": _bytes_per_device(state.opt_state),
            "temporaries": int(getattr(memory, "temp_size_in_bytes", -1)),
            "arguments": int(getattr(memory, "argument_size_in_bytes", -1)),
            "outputs": int(getattr(memory, "output_size_in_bytes", -1)),
        },
        "xla_flops_per_device": float(cost.get("flops", -1.0)) if cost else None,
        "analytic_model_flops": train_flops_per_step(mc, tokens, tokens, length, length),
    }
