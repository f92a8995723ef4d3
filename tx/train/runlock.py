"""One run per workdir: `train` and `average` hold a lock on the workdir while they write to it.

    with hold(workdir):          # raises WorkdirBusy naming the holder if another run has it
        ...

The lock is a file, `<workdir>/lock.json`, created with O_CREAT | O_EXCL (atomic on local
disks and on NFS v3 and later, the shared filesystems the README recommends for pods), holding
the holder's host, pid, process start time, command and since when. While the run lives, a
thread touches the file every HEARTBEAT_SECS: the file's age tells whether its holder is alive
on hosts that cannot see each other's processes. Why a file and not flock/fcntl: advisory locks
are not reliable on every network filesystem (GCS FUSE has none), and a lock that only a live
process holds says nothing about who holds it; the file names the holder in the error.

A lock is taken over, with a warning, when its holder is gone:
  - same host, and the pid is not alive (or is alive but started at another time: a reused pid);
  - another host, and the file has not been touched for `stale_after` seconds (a preempted VM);
  - or with `take_over=True` (`--take-over-lock`), for a holder you know is gone.
A multi-process run takes it once, on process 0; every process learns the outcome from one
collective, so that all of them stop, or all go on.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import socket
import sys
import threading
import time

from tx.train.distributed import all_true
from tx.workdir import is_main

HEARTBEAT_SECS = 30.0
STALE_AFTER_SECS = 600.0  # 20 missed heartbeats: a holder on another host is presumed gone


class WorkdirBusy(RuntimeError):
    """Another live run holds the workdir."""


def lock_file(workdir: str) -> str:
    return os.path.join(workdir, "lock.json")


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    now = _start_time(pid)
    return started is None or now is None or now == started


def _me() -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": _start_time(os.getpid()),
        "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv)[:500],
    }


def _read(path: str) -> dict | None:
    """The holder recorded in `path`; {} for a file cut short or not JSON; None if absent."""
    try:
        with open(path, encoding="utf-8") as f:
            holder = json.load(f)
        return holder if isinstance(holder, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def _why_stale(path: str, holder: dict, stale_after: float) -> str | None:
    """Why the holder in `path` is gone (a sentence), or None if it may be alive."""
    try:
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return "it was released"
    if not holder:
        # Written by O_EXCL then filled in: empty only while its writer writes, or if it died.
        return "it is unreadable and untouched" if age > HEARTBEAT_SECS else None
    if holder.get("host") == socket.gethostname():
        if not _alive(int(holder.get("pid", -1)), holder.get("started")):
            return f"process {holder.get('pid')} on this host is gone"
        return None
    if age > stale_after:
        return f"its heartbeat stopped {age / 60:.0f} minutes ago"
    return None


def _describe(holder: dict) -> str:
    if not holder:
        return "a run whose lock file is unreadable"
    return (
        f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')} "
        f"({holder.get('command', '?')})"
    )


def acquire(workdir: str, *, take_over: bool = False, stale_after: float = STALE_AFTER_SECS):
    """Creates the lock file for this process; raises WorkdirBusy if a live run holds it."""
    os.makedirs(workdir, exist_ok=True)
    path = lock_file(workdir)
    for _ in range(3):  # a lock released or taken over between our attempts: try again
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(path)
            if holder is None:
                continue
            why = "--take-over-lock was given" if take_over else None
            why = why or _why_stale(path, holder, stale_after)
            if why is None:
                raise WorkdirBusy(
                    f"{workdir} is in use by {_describe(holder)}: one run per workdir. Wait for "
                    f"it, stop it, or use another --workdir; if that run is gone (a machine "
                    f"that died), pass --take-over-lock (the lock is {path})"
                ) from None
            logging.warning("taking over the lock of %s: %s (%s)", workdir, why, _describe(holder))
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(_me(), f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        return
    raise WorkdirBusy(f"{workdir}: could not take {path}: other runs keep taking it")


def release(workdir: str) -> None:
    """Removes the lock file if this process holds it."""
    path = lock_file(workdir)
    holder = _read(path)
    if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _heartbeat(path: str, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_SECS):
        with contextlib.suppress(OSError):
            os.utime(path)


@contextlib.contextmanager
def hold(workdir: str, *, take_over: bool = False, stale_after: float = STALE_AFTER_SECS):
    """Holds the workdir's lock for the body (process 0 of a multi-process run holds it)."""
    error = None
    if is_main():
        try:
            acquire(workdir, take_over=take_over, stale_after=stale_after)
        except WorkdirBusy as e:
            error = e
    if not all_true(error is None):
        raise error or WorkdirBusy(f"{workdir} is in use by another run (see process 0)")
    stop = threading.Event()
    beat = None
    if is_main():
        beat = threading.Thread(target=_heartbeat, args=(lock_file(workdir), stop), daemon=True)
        beat.start()
    try:
        yield
    finally:
        stop.set()
        if beat is not None:
            beat.join()
            release(workdir)
