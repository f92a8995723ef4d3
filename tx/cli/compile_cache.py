"""XLA's compiled programs kept across commands and restarts: JAX's persistent compilation
cache, on for every command (as MaxText and T5X keep theirs), so that a second `translate`, an
`evaluate`, or a run resumed after a preemption loads its programs instead of compiling them.

Where: JAX_COMPILATION_CACHE_DIR when it is set (yours, or the test suite's: JAX reads it
itself and it is left alone); else TX_COMPILATION_CACHE, a directory or a bucket's prefix that
the processes of a pod share; else the local cache's `jax/` (tx.storage.cache_dir:
$TX_CACHE_DIR, else $XDG_CACHE_HOME/tx, else ~/.cache/tx). TX_COMPILATION_CACHE=off turns it
off. JAX keys each entry by the program, the compile options, the devices and the jax and
jaxlib versions, so another release or machine never loads a program it did not write; it
writes each entry whole before others can read it, so processes may share one directory; and an
entry it cannot read is a warning and a compile, never an error. A run of several processes
keeps its programs only where TX_COMPILATION_CACHE or JAX_COMPILATION_CACHE_DIR names a place
(`enable`). The Python API (tx.load) leaves
JAX's settings as the program that imports it has them.
"""

from __future__ import annotations

import os

from tx import storage

ENV = "TX_COMPILATION_CACHE"
OFF = ("0", "off", "false", "no", "none")


def directory(environ=os.environ) -> str | None:
    """The cache's directory for a command (module docstring), or None when it is off."""
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return environ["JAX_COMPILATION_CACHE_DIR"]
    chosen = environ.get(ENV, "").strip()
    if chosen.lower() in OFF and chosen:
        return None
    return chosen or storage.cache_dir("jax")


def enable() -> str | None:
    """Points JAX at `directory()` (after jax.distributed starts, before the command compiles
    anything); returns it. Not by default for a run of several processes: with jax 0.12.1 two
    CPU processes training from a warm cache hung before their first step (a cold one did not;
    tests/test_distributed.py's prepared-data test, run twice on one cache), so a pod keeps
    its programs only where TX_COMPILATION_CACHE or JAX_COMPILATION_CACHE_DIR names a place."""
    import jax

    if jax.process_count() > 1 and not os.environ.get(ENV, "").strip():
        return os.environ.get("JAX_COMPILATION_CACHE_DIR") or None
    path = directory()
    if path is not None and not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        jax.config.update("jax_compilation_cache_dir", path)
    return path
