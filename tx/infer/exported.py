"""Search programs kept traced: a warm command neither traces nor lowers its search again.

JAX's persistent compilation cache (tx.cli.compile_cache) keeps the machine code of each
program, but finding it takes the program's StableHLO, so every command still traces its beam
search through the model (Python, seconds on a CPU) and lowers it. Here the search is exported
once (jax.export: the traced, lowered program, serialized) into `tx-exported/` inside the
compilation cache's directory, and later commands call the deserialized program: tracing that
is one call, and XLA's executable for it comes from the compilation cache as before.

    program = exported.search(fn, static, args)   # fn(*args, **static) -> outputs
    outputs = program(*args)

Only where a compilation cache is on (JAX's jax_compilation_cache_dir is set, by a command or
by the user) and the program runs on one device in one process; elsewhere `fn` is jitted as
before. Cold and warm commands both run the exported program, so both compile the same one and
give the same results. An entry is keyed by everything the program depends on: tx's own source
(as this process imported it), the jax, jaxlib, flax and numpy versions, the device kind, JAX's
settings (x64, matmul precision, ...), the static arguments' repr (the model's config, the
search) and the arguments' tree, shapes and dtypes; a different key is a new entry, and an
entry that cannot be read is a warning and an export anew, never an error.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import pathlib
from importlib import metadata

import jax
from jax import export

from tx import storage

DIRECTORY = "tx-exported"


def _source_fingerprint() -> str:
    """sha256 of tx's Python source: a changed tx exports its programs anew."""
    digest = hashlib.sha256()
    root = pathlib.Path(__file__).resolve().parents[1]
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


# Read when the process imports this module (with the rest of tx), not at its first search: a
# long-lived process whose files are edited meanwhile must not key its old code by the new.
SOURCE = _source_fingerprint()
VERSIONS = tuple(metadata.version(p) for p in ("jax", "jaxlib", "flax", "numpy"))

# JAX's settings that cannot change a traced program: where programs are kept, and logging.
UNTRACED = {
    "jax_enable_compilation_cache", "jax_raise_persistent_cache_errors",
    "jax_explain_cache_misses", "jax_log_compiles", "jax_logging_level",
    "jax_debug_log_modules", "jax_log_checkpoint_residuals",
}  # fmt: skip


def _tracing_settings() -> str:
    """JAX's settings, which can change a traced program (jax_enable_x64, the default matmul
    precision, ...), less UNTRACED and the caches' places and sizes."""
    kept = (
        (k, repr(v))
        for k, v in jax.config.values.items()
        if k not in UNTRACED and not k.startswith(("jax_compilation_cache", "jax_persistent_cache"))
    )
    return repr(sorted(kept))


def _key(name: str, static: dict, args: tuple) -> str:
    """The entry's name: `name` and a sha256 of all the program depends on (module docstring)."""
    leaves, tree = jax.tree.flatten(args)
    shapes = [(tuple(x.shape), str(x.dtype)) for x in leaves]
    parts = [
        SOURCE,
        *VERSIONS,
        jax.devices()[0].device_kind,
        _tracing_settings(),
        repr(sorted(static.items())),
        str(tree),
        repr(shapes),
    ]
    return f"{name}-{hashlib.sha256(repr(parts).encode()).hexdigest()[:32]}"


def _cache_dir() -> str | None:
    """JAX's compilation cache's directory, as a command or the user set it."""
    return jax.config.jax_compilation_cache_dir


def _place() -> str | None:
    """Where exported programs live, or None where they are not kept (module docstring)."""
    cache = _cache_dir()
    if not cache or jax.process_count() > 1 or jax.device_count() > 1:
        return None
    return storage.join(cache, DIRECTORY)


@functools.cache
def _jitted(fn, static_argnames: tuple[str, ...]):
    return jax.jit(fn, static_argnames=static_argnames)


# This process's programs by entry path: each read or exported once, its jit traced once.
_programs: dict[str, object] = {}


def search(fn, static: dict, args: tuple):
    """A callable of `args` computing fn(*args, **static): the exported program, read from the
    cache or exported and kept now; or `fn` jitted (module docstring)."""
    place = _place()
    if place is None:
        return functools.partial(_jitted(fn, tuple(sorted(static))), **static)
    path = storage.join(place, _key(fn.__name__, static, args))
    if path not in _programs:
        program = _read(path) or _export(fn, static, args, path)
        jitted = functools.partial(_jitted(fn, tuple(sorted(static))), **static)
        _programs[path] = jitted if program is None else jax.jit(program.call)
    return _programs[path]


def _export(fn, static: dict, args: tuple, path: str) -> export.Exported | None:
    """fn's program exported and kept at `path`; None (a warning: `fn` is jitted as without a
    cache) where JAX cannot export it, and not kept where it cannot be serialized."""
    try:
        program = export.export(jax.jit(functools.partial(fn, **static)))(*args)
    except Exception as e:  # noqa: BLE001 - what jit runs but export refuses: jit it
        logging.warning("%s cannot be exported (%s): traced afresh each time", fn.__name__, e)
        return None
    try:
        payload = bytes(program.serialize())
    except Exception as e:  # noqa: BLE001 - e.g. a pytree node jax.export cannot serialize
        logging.warning("%s cannot be kept (%s): traced afresh each time", fn.__name__, e)
        return program
    _write(path, payload)
    return program


# An entry: MAGIC, the sha256 of the payload (hex), a newline, the serialized program. The
# checksum finds an entry cut short or overwritten before jax.export parses it.
MAGIC = b"tx-exported 1\n"


def _write(path: str, payload: bytes) -> None:
    entry = MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
    try:
        storage.write_bytes(path, entry)  # whole or not at all: readers never see half
    except Exception as e:  # noqa: BLE001 - a cache that cannot be written costs time only
        logging.warning("%s; the search will be traced again next time", e)


def _read(path: str) -> export.Exported | None:
    """The exported program at `path`, or None when there is none or it cannot be read (a
    warning: it is exported again, and the entry replaced)."""
    if not storage.isfile(path):
        return None
    try:
        entry = storage.read_bytes(path)
        head, payload = entry[: len(MAGIC) + 65], entry[len(MAGIC) + 65 :]
        digest = hashlib.sha256(payload).hexdigest().encode() + b"\n"
        if head != MAGIC + digest:
            raise ValueError("its checksum does not match: damaged or cut short")
        return export.deserialize(bytearray(payload))
    except Exception as e:  # noqa: BLE001 - an unreadable entry costs time, never the command
        logging.warning("exported program %s cannot be read (%s): exporting it again", path, e)
        return None
