"""One run per workdir: `train` and `average` hold a lock on the workdir while they write to it.

    with hold(workdir):          # raises WorkdirBusy naming the holder if another run has it
        ...

The lock is `<workdir>/lock.json` (tx.workdir.lock_file), created only if absent
(tx.storage.create: a hard link of a whole file on a local disk, O_EXCL's guarantee;
ifGenerationMatch=0 on GCS; If-None-Match: * on S3), holding the holder's host, pid, process
start time, command and since when. While the run lives, a thread rewrites it every
HEARTBEAT_SECS, only if it is still the version this run wrote (tx.storage.replace_if): the
file's age tells whether its holder is alive on hosts that cannot see each other's processes,
and a holder whose lock was taken over notices, says so and stops beating. Why a file and not
flock/fcntl: advisory locks are not reliable on every network filesystem (GCS FUSE has none)
and buckets have none, and a lock that only a live process holds says nothing about who holds
it; the file names the holder in the error.

A lock is taken over, with a warning, when its holder is gone:
  - same host, and the pid is not alive (or is alive but started at another time: a reused pid);
  - another host, and the file has not been touched for `stale_after` seconds (a preempted VM);
  - or with `take_over=True` (`--take-over-lock`), for a holder you know is gone.
A take-over replaces the version it judged (tx.storage.replace_if), so of two runs taking over
one lock at once, one wins and the other finds the winner alive.
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

from tx import storage
from tx import workdir as wd
from tx.train.distributed import all_true
from tx.workdir import is_main

HEARTBEAT_SECS = 30.0
STALE_AFTER_SECS = 600.0  # 20 missed heartbeats: a holder on another host is presumed gone


class WorkdirBusy(RuntimeError):
    """Another live run holds the workdir."""


def lock_file(workdir) -> str:
    return wd.lock_file(str(workdir))


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


def _now(timespec: str = "seconds") -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec=timespec)


def _me() -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": _start_time(os.getpid()),
        "since": _now(),
        "command": " ".join(sys.argv)[:500],
        "beat": _now("microseconds"),  # rewritten by each heartbeat
    }


def _read(path: str) -> dict | None:
    """The holder recorded in `path`; {} for a file cut short or not JSON; None if absent."""
    try:
        holder = json.loads(storage.read_bytes(path))
        return holder if isinstance(holder, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def _why_stale(path: str, holder: dict, stale_after: float) -> str | None:
    """Why the holder in `path` is gone (a sentence), or None if it may be alive."""
    try:
        written = storage.mtime(path)  # on a bucket, the server's clock
    except FileNotFoundError:
        return "it was released"
    age = time.time() - written  # read after the mtime: never less than the true age
    if not holder:
        # Locks are written whole: an unreadable one was damaged, or its writer died; it is
        # taken once no heartbeat could have touched it.
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


def acquire(
    workdir: str, *, take_over: bool = False, stale_after: float = STALE_AFTER_SECS
) -> str | None:
    """Creates the lock file for this process; raises WorkdirBusy if a live run holds it.
    Returns the version of the lock written (tx.storage.version: what the heartbeat replaces),
    or None if it was replaced at once."""
    storage.makedirs(workdir)
    path = lock_file(workdir)
    mine = json.dumps(_me(), indent=2).encode("utf-8")
    for _ in range(3):  # a lock released or taken over between our attempts: try again
        try:
            storage.create(path, mine)
            return _version_if_mine(path, mine)
        except storage.AlreadyExists:
            pass
        seen = _version(path)  # first: a lock changed after it is read is not replaced below
        holder = _read(path)
        if seen is None or holder is None:  # released meanwhile
            continue
        why = "--take-over-lock was given" if take_over else None
        why = why or _why_stale(path, holder, stale_after)
        if why is None:
            if _version(path) != seen:  # it changed while we judged it: judge it again
                continue
            raise WorkdirBusy(
                f"{workdir} is in use by {_describe(holder)}: one run per workdir. Wait for "
                f"it, stop it, or use another --workdir; if that run is gone (a machine "
                f"that died), pass --take-over-lock (the lock is {path})"
            ) from None
        logging.warning("taking over the lock of %s: %s (%s)", workdir, why, _describe(holder))
        try:
            storage.replace_if(path, mine, seen)
            return _version_if_mine(path, mine)
        except storage.Changed:  # another run took it over first, or it was released
            continue
    raise WorkdirBusy(f"{workdir}: could not take {path}: other runs keep taking it")


def _version(path: str) -> str | None:
    """tx.storage.version of `path`; None if it is not there."""
    try:
        return storage.version(path)
    except FileNotFoundError:
        return None


def _version_if_mine(path: str, mine: bytes) -> str | None:
    """The version of `path` if it holds `mine` (read after the version: a replace between
    the two reads shows in the bytes), else None."""
    try:
        version = storage.version(path)
        return version if storage.read_bytes(path) == mine else None
    except FileNotFoundError:
        return None


def release(workdir: str) -> None:
    """Removes the lock file if this process holds it."""
    path = lock_file(workdir)
    holder = _read(path)
    if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        storage.remove(path)


def _heartbeat(path: str, version: str | None, stop: threading.Event) -> None:
    """Rewrites the lock every HEARTBEAT_SECS (with the time of the beat: every version's bytes
    differ, as an S3 ETag is their MD5) while it is the version this run wrote; stops, with a
    warning, once another run has taken it over."""
    while not stop.wait(HEARTBEAT_SECS):
        try:
            if version is None:
                raise storage.Changed(path)
            holder = _read(path) or {}
            beat = json.dumps(holder | {"beat": _now("microseconds")}, indent=2).encode("utf-8")
            storage.replace_if(path, beat, version)
            version = _version_if_mine(path, beat)
            if version is None:
                raise storage.Changed(path)
        except (storage.Changed, FileNotFoundError):
            logging.warning(
                "the lock %s was taken over or removed (now held by %s): this run no longer "
                "holds its workdir",
                path,
                _describe(_read(path) or {}),
            )
            return
        except OSError as e:  # unreachable for a while: the next beat tries again
            logging.warning("could not refresh the lock %s (%s)", path, e)


@contextlib.contextmanager
def hold(workdir: str, *, take_over: bool = False, stale_after: float = STALE_AFTER_SECS):
    """Holds the workdir's lock for the body (process 0 of a multi-process run holds it)."""
    error, version = None, None
    if is_main():
        try:
            version = acquire(workdir, take_over=take_over, stale_after=stale_after)
        except WorkdirBusy as e:
            error = e
    if not all_true(error is None):
        raise error or WorkdirBusy(f"{workdir} is in use by another run (see process 0)")
    stop = threading.Event()
    beat = None
    if is_main():
        beat = threading.Thread(
            target=_heartbeat, args=(lock_file(workdir), version, stop), daemon=True
        )
        beat.start()
    try:
        yield
    finally:
        stop.set()
        if beat is not None:
            beat.join()
            release(workdir)
