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
entry it cannot read is a warning and a compile, never an error. The Python API (tx.load) leaves
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
    """Points JAX at `directory()` (before the command compiles anything); returns it."""
    path = directory()
    if path is not None and not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        import jax

        jax.config.update("jax_compilation_cache_dir", path)
    return path
