"""Ahead-of-time check: compile the train step for a slice before renting it.

`python -m tx compile --config configs/big.py [--topology v5p:2x2x2] [--layouts auto]` lowers
and compiles one training step on abstract inputs (nothing is allocated) with XLA's compiler
for that chip (libtpu from PyPI compiles for TPUs on a CPU host), and reports per chip: the
memory of parameters, optimizer state and temporaries against the chip's HBM (tx.train.chips),
XLA's flops and bytes accessed, and a step time: the compiler's own cost model
(`optimal_seconds`, which the TPU compiler gives) or else a roofline from flops and bytes,
saying which. From the step time: tokens per second, the MFU ceiling (the analytic model FLOPs
over the chips' peak in that time: no real run can do better than the model says) and hours
for the config's `train.num_steps`. These are estimates from a cost model, not measurements.

`--layouts auto` compiles the sensible meshes of the slice (all data parallel, fsdp, tensor
parallel over 2 and 4 chips) with 1, 2 or 4 micro-batches, and lists them best first; a layout
that does not fit is a line saying by how much.
"""

from __future__ import annotations

import copy
import math
import os

import jax
import ml_collections
import numpy as np
from jax.experimental import topologies

from tx.data import dataset
from tx.model.counting import train_flops_per_step
from tx.train import trainer as trainer_lib
from tx.train.chips import by_name
from tx.train.chips import chip as chip_of

# XLA's GPU target description (its gpu_specs format) of a Hopper SXM part: what the GPU
# compiler needs to compile without the device. Hopper H100 and H200 share the SM (132 cores,
# compute capability 9.0); they differ in memory size and bandwidth (tx.train.chips).
_HOPPER = """gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: {bandwidth} l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: {memory} shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 }} registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 }}
runtime_version {{ major: 12 minor: 8 patch: 0 }}
device_description_str: "{kind}"
"""
GPUS = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"}


def gpu_devices(name: str, count: int):
    """`count` GPUs of one node (h100 / h200) described for XLA's GPU compiler, without the
    hardware: needs jax's CUDA plugin (pip install 'tx-transformer[cuda]'); nothing runs on a
    GPU."""
    # The plugin checks the CUDA driver when it starts: deviceless there is none to check.
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
    spec = by_name(name)
    config = _HOPPER.format(
        bandwidth=int(spec.hbm_tbytes_per_sec * 1e12), memory=spec.hbm_bytes, kind=GPUS[name]
    )
    try:
        topology = topologies.get_topology_desc(
            platform="cuda", target_config=config, topology=f"1x1x{count}"
        )
    except Exception as e:  # noqa: BLE001 - no CUDA plugin, or jax's GPU topology refused
        raise RuntimeError(
            f"cannot describe {count} x {name} here ({type(e).__name__}: {e}); install jax's "
            "CUDA plugin (pip install 'tx-transformer[cuda]'), and compile before anything else "
            "starts jax"
        ) from e
    return topology.devices


def topology_devices(topology: str):
    """Devices of a named topology without the hardware: a TPU slice ("v5p:2x2x1", from
    libtpu) or one GPU node ("h100:8", "h200:8", from jax's CUDA plugin)."""
    kind, _, count = topology.partition(":")
    if kind.lower() in GPUS:
        if not count.isdigit() or int(count) < 1:
            raise RuntimeError(f"--topology {topology}: give {kind}:N, N GPUs of one node")
        return gpu_devices(kind.lower(), int(count))
    # libtpu asks the VM's metadata server what it runs on; deviceless, say it outright.
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5p-8")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    # Describing a slice touches no chip: other processes (a second compile, the test suite's
    # workers) may load libtpu at the same time.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        return topologies.get_topology_desc(topology, "tpu").devices
    except Exception as e:  # noqa: BLE001 - libtpu missing or unknown topology: say so
        raise RuntimeError(
            f"cannot describe TPU topology {topology!r} here ({e}); install "
            "libtpu (pip install 'tx-transformer[tpu]') or run on a TPU VM"
        ) from e


def _devices_per_chip(devices) -> int:
    """Deviceless v4 slices list each TensorCore as a device (two per chip); later chips one."""
    chips = {tuple(getattr(d, "coords", ()) or (d.id,)) for d in devices}
    return max(len(devices) // max(len(chips), 1), 1)


def _bytes_per_device(tree) -> int:
    """Bytes of one device's shards of a tree of ShapeDtypeStructs with shardings."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shard = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shard) * np.dtype(leaf.dtype).itemsize
    return total


# Custom-call targets of fused attention: Mosaic (Pallas on TPU), cuDNN's fused attention.
KERNELS = ("tpu_custom_call", "__cudnn$fmha")


def lower_train_step(cfg: ml_collections.ConfigDict, devices=None):
    """(trainer, abstract state, batch [rows, length], the train step lowered for them) on the
    largest bucket: traced through model, loss and optimizer, not yet compiled by XLA."""
    trainer = trainer_lib.build(cfg, devices)
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
    return trainer, state, batch, trainer_lib.jit_train_step(trainer).lower(state, batch)


def compile_report(cfg: ml_collections.ConfigDict, devices=None) -> dict:
    """Compiles the train step on the largest bucket; returns memory and FLOPs per device."""
    trainer, state, batch, lowered = lower_train_step(cfg, devices)
    mesh, mc = trainer.mesh, trainer.model.config
    rows, length = batch["inputs"].shape
    compiled = lowered.compile()
    memory = compiled.memory_analysis()
    hlo = compiled.as_text() or ""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    tokens = rows * length
    return {
        "mesh": dict(mesh.shape),
        "devices": mesh.size,
        "device_kind": getattr(mesh.devices.flat[0], "device_kind", "?"),
        "devices_per_chip": _devices_per_chip(list(mesh.devices.flat)),
        "batch": {"rows": rows, "length": length, "micro_batches": cfg.train.micro_batches},
        "per_device_bytes": {
            "params": _bytes_per_device(state.params),
            "optimizer_state": _bytes_per_device(state.opt_state),
            "temporaries": int(getattr(memory, "temp_size_in_bytes", -1)),
            "arguments": int(getattr(memory, "argument_size_in_bytes", -1)),
            "outputs": int(getattr(memory, "output_size_in_bytes", -1)),
            "alias": int(getattr(memory, "alias_size_in_bytes", 0)),
        },
        "xla_flops_per_device": float(cost.get("flops", -1.0)) if cost else None,
        "xla_bytes_accessed_per_device": float(cost.get("bytes accessed", -1.0)) if cost else None,
        "optimal_seconds": float(cost["optimal_seconds"])
        if cost and "optimal_seconds" in cost
        else None,
        # Fused attention kernels in the program (TPU splash, GPU cuDNN), forward and backward
        # (tx.model.splash): 0 means every attention went through XLA's own ops.
        "attention_kernel_calls": sum(hlo.count(f'custom_call_target="{t}') for t in KERNELS),
        "analytic_model_flops": train_flops_per_step(mc, tokens, tokens, length, length),
        "tokens_per_step": 2 * cfg.data.tokens_per_step,  # source + target, as configured
        "num_steps": cfg.train.num_steps,
    }


def estimate(report: dict) -> dict:
    """Memory against the chip's HBM and the step time, throughput and MFU ceiling that follow
    from a compile_report; each figure says where it comes from."""
    known = chip_of(report["device_kind"])
    memory = report["per_device_bytes"]
    # Peak HBM of the step: its inputs (parameters, optimizer state, batch), its temporaries,
    # and its outputs less those that reuse donated inputs.
    hbm = memory["arguments"] + memory["temporaries"] + memory["outputs"] - memory.get("alias", 0)
    out = {"chip": known.name if known else None, "hbm_bytes_per_chip": hbm}
    out |= dict.fromkeys(("step_seconds", "tokens_per_sec", "mfu_ceiling", "run_hours"))
    if known is None:
        return out | {"fits": None, "step_seconds": None, "step_source": "unknown chip"}
    per_chip = report.get("devices_per_chip", 1)  # a device is a chip, or a core of one
    out["hbm_capacity_bytes"] = known.hbm_bytes // per_chip
    out["fits"] = hbm <= out["hbm_capacity_bytes"]
    out["chip_source"] = known.source
    flops, moved = report["xla_flops_per_device"], report["xla_bytes_accessed_per_device"]
    # The cost model answers with a negative number where it has no model (v4 in libtpu
    # 0.0.42): then the roofline.
    if (report.get("optimal_seconds") or 0) > 0:
        seconds, source = report["optimal_seconds"], "XLA cost model (optimal_seconds)"
    elif flops and moved and flops > 0 and moved > 0:
        compute = flops / (known.bf16_tflops * 1e12 / per_chip)  # a device's share of the chip
        memory_time = moved / (known.hbm_tbytes_per_sec * 1e12 / per_chip)
        seconds = max(compute, memory_time)
        source = (
            "roofline of XLA's flops and bytes ("
            + ("compute" if compute >= memory_time else "memory")
            + " bound)"
        )
    else:
        return out | {"step_seconds": None, "step_source": "no cost figures from this backend"}
    peak = report["devices"] / per_chip * known.bf16_tflops * 1e12
    return out | {
        "step_seconds": seconds,
        "step_source": source,
        "tokens_per_sec": report["tokens_per_step"] / seconds,
        "mfu_ceiling": report["analytic_model_flops"] / (seconds * peak),
        "run_hours": report["num_steps"] * seconds / 3600,
    }


def layouts(devices: int, num_heads: int) -> list[dict]:
    """The meshes worth compiling on `devices` chips: all data parallel, all fsdp, and tensor
    parallel over 2 and 4 chips (heads split evenly) with data parallel over the rest."""
    out = [{"data": devices, "fsdp": 1, "tensor": 1}]
    if devices > 1:
        out.append({"data": 1, "fsdp": devices, "tensor": 1})
    for tensor in (2, 4):
        if devices % tensor == 0 and num_heads % tensor == 0 and devices > tensor:
            out.append({"data": devices // tensor, "fsdp": 1, "tensor": tensor})
    return out


def compile_layouts(
    cfg: ml_collections.ConfigDict, devices, micro_batches=(1, 2, 4), progress=None
) -> list[dict]:
    """compile_report + estimate for every layout of `layouts` and micro-batch count (more
    micro-batches only while the fewer do not fit), best first: fitting layouts by step time,
    then those that do not fit by how much they need."""
    results = []
    for mesh in layouts(len(devices), cfg.model.num_heads):
        for micro in micro_batches:
            c = copy.deepcopy(cfg)
            c.mesh.shape = dict(mesh)
            c.train.micro_batches = micro
            try:
                row = compile_report(c, devices)
                row |= estimate(row)
            except Exception as e:  # noqa: BLE001 - a layout XLA refuses is a line, not a crash
                row = {"mesh": mesh, "fits": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
                row |= dict.fromkeys(("hbm_bytes_per_chip", "step_seconds", "mfu_ceiling"))
            row["micro_batches"] = micro
            results.append(row)
            if progress:
                progress(describe(row))
            if row.get("fits"):
                break
    return sorted(results, key=_rank)


def _rank(row: dict):
    if row.get("fits"):
        return (0, row.get("step_seconds") or math.inf)
    return (1, row.get("hbm_bytes_per_chip") or math.inf)


def describe(row: dict) -> str:
    """One line for a compiled layout."""
    mesh = "x".join(f"{k}{v}" for k, v in row["mesh"].items())
    head = f"{mesh} micro{row['micro_batches']}"
    if "error" in row:
        return f"{head}: does not compile ({row['error']})"
    per_chip = row.get("devices_per_chip", 1)  # v4: two TensorCores, each a device
    gb = row["hbm_bytes_per_chip"] * per_chip / 1e9
    if row.get("fits") is False:
        over = (row["hbm_bytes_per_chip"] - row["hbm_capacity_bytes"]) * per_chip / 1e9
        return f"{head}: does not fit: {gb:.1f} GB per chip, {over:.1f} GB over the chip's HBM"
    if row.get("step_seconds") is None:
        return f"{head}: {gb:.1f} GB per chip; no step time ({row.get('step_source')})"
    return (
        f"{head}: {gb:.1f} GB per chip, step {row['step_seconds'] * 1e3:.1f} ms "
        f"({row['step_source']}), {row['tokens_per_sec'] / 1e3:.0f}k tokens/s, "
        f"MFU ceiling {row['mfu_ceiling']:.2f}, {row['run_hours']:.1f} h for "
        f"{row['num_steps']} steps"
    )
