"""Multi-process start-up: `jax.distributed.initialize` where the run spans several hosts.

* Cloud TPU pod slices: detected from the TPU VM environment, initialised without arguments.
* SLURM (several tasks): JAX reads the SLURM variables itself.
* Anything else: `--coordinator_address HOST:PORT --num_processes N --process_id I`
  (on CPUs the collectives go through gloo).
A single-process run calls nothing here.
"""

from __future__ import annotations

import logging
import os

import jax
import numpy as np


def _tpu_pod() -> bool:
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    return "," in hosts


def _slurm_multi() -> bool:
    return int(os.environ.get("SLURM_NTASKS", "1")) > 1


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> bool:
    """Initialises jax.distributed when needed; returns True if it did."""
    explicit = coordinator_address is not None
    if not (explicit or _tpu_pod() or _slurm_multi()):
        return False
    if explicit and (num_processes is None or process_id is None):
        raise ValueError("--coordinator_address needs --num_processes and --process_id")
    if os.environ.get("JAX_PLATFORMS", "").startswith("cpu") or explicit:
        # CPU processes exchange data through gloo; harmless where accelerators are used.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if explicit:
        jax.distributed.initialize(coordinator_address, num_processes, process_id)
    else:
        jax.distributed.initialize()
    logging.info(
        "jax.distributed: process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return True


def barrier(name: str) -> None:
    """Waits for every process (no-op with one)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def all_true(flag: bool) -> bool:
    """True if `flag` is true on every process (one collective; none with one process)."""
    if jax.process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.array(bool(flag)))).all())
