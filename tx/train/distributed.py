"""Multi-process start-up: `jax.distributed.initialize` where the run spans several hosts.

* Cloud TPU pod slices: detected from the TPU VM environment, initialised without arguments.
* SLURM (several tasks): JAX reads the SLURM variables itself.
* Anything else: `--coordinator_address HOST:PORT --num_processes N --process_id I`
  (on CPUs the collectives go through gloo).
A single-process run calls nothing here.

When a process dies, the others must stop, not wait for it for ever. A process killed outright
is noticed by the next collective (its sockets close): `process_lost` turns that error into a
one-line `ProcessLost`, and the CLI leaves at once (`exit_now`). A host that stops answering
(frozen, cut off) is noticed by JAX's heartbeat after `mesh.heartbeat_timeout_secs`: JAX then
ends every other process itself (SIGABRT, "Terminating process because the JAX distributed
service detected fatal errors ... another task died").

A stop asked for by a signal (SIGTERM when a VM is preempted, SIGINT) reaches one process:
`StopSignal` turns it into a flag and `sync_flags` tells every process, so that all of them
save the same step and stop together.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import sys

import jax
import numpy as np

# Words in the errors of a collective whose peer has gone (gloo, NCCL, JAX's coordination
# service); another runtime error (out of memory, say) is not taken for a lost process.
_LOST_SIGNS = (
    "gloo",
    "nccl",
    "connection reset",
    "connection closed",
    "socket closed",
    "unavailable",
    "deadline_exceeded",
    "heartbeat",
    "barrier",
)


class ProcessLost(RuntimeError):
    """Another process of a multi-process run died or cannot be reached."""


class LaunchError(ValueError):
    """Multi-process flags that do not go together."""


def _tpu_pod() -> bool:
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    return "," in hosts


def _slurm_multi() -> bool:
    return int(os.environ.get("SLURM_NTASKS", "1")) > 1


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    heartbeat_timeout_secs: int | None = None,
) -> bool:
    """Initialises jax.distributed when needed; returns True if it did.

    `heartbeat_timeout_secs` (`mesh.heartbeat_timeout_secs`): how long a process may send no
    heartbeat before the others take it for dead and stop; None keeps JAX's default.
    """
    explicit = coordinator_address is not None
    if not (explicit or _tpu_pod() or _slurm_multi()):
        return False
    if explicit and (num_processes is None or process_id is None):
        raise LaunchError("--coordinator_address needs --num_processes and --process_id")
    if os.environ.get("JAX_PLATFORMS", "").startswith("cpu") or explicit:
        # CPU processes exchange data through gloo; harmless where accelerators are used.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    options = _timeouts(heartbeat_timeout_secs)
    if explicit:
        jax.distributed.initialize(coordinator_address, num_processes, process_id, **options)
    else:
        jax.distributed.initialize(**options)
    logging.info(
        "jax.distributed: process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return True


def _timeouts(heartbeat_timeout_secs: int | None) -> dict:
    if heartbeat_timeout_secs is None:
        return {}
    if "heartbeat_timeout_seconds" not in inspect.signature(jax.distributed.initialize).parameters:
        logging.warning(
            "this JAX cannot set the heartbeat timeout: mesh.heartbeat_timeout_secs ignored"
        )
        return {}
    return {"heartbeat_timeout_seconds": int(heartbeat_timeout_secs)}


def process_lost(e: BaseException) -> ProcessLost | None:
    """The ProcessLost that `e` means in a multi-process run (a collective that failed because
    its peer has gone), or None."""
    # JaxRuntimeError from a collective, or ValueError when jit dispatches one (gloo, JAX 0.10).
    if jax.process_count() == 1 or not isinstance(e, (jax.errors.JaxRuntimeError, ValueError)):
        return None
    lines = str(e).strip().splitlines()
    first = lines[0][:300] if lines else type(e).__name__
    if not any(sign in str(e).lower() for sign in _LOST_SIGNS):
        return None
    return ProcessLost(
        f"process {jax.process_index()} of {jax.process_count()}: an operation across processes "
        f"failed ({first}); another process has most likely died or become unreachable. "
        "Restart every process (training resumes from its last checkpoint)"
    )


def exit_now(code: int) -> None:
    """Ends this process at once, without jax.distributed's shutdown at exit: that waits at a
    barrier for every process, the dead one too, until the heartbeat timeout, and then aborts."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


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


def sync_flags(*flags: bool) -> tuple[bool, ...]:
    """Each flag true on every process if it is true on any: one collective for all of them
    (none with one process)."""
    if jax.process_count() == 1:
        return flags
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.array(flags, bool))  # [processes, n]
    return tuple(bool(x) for x in np.asarray(gathered).reshape(-1, len(flags)).any(0))


class StopSignal:
    """Turns SIGTERM / SIGINT into a flag the loop checks after each step."""

    def __init__(self):
        self.received = None
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame):
        self.received = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
