"""What a warm command reuses besides XLA's executables: programs kept traced, and the
parameters' abstract tree, as entries in JAX's compilation cache directory (`tx-exported/`).

JAX's persistent compilation cache (tx.cli.compile_cache) keeps the machine code of each
program, but finding it takes the program's StableHLO, so every command would still trace its
programs through the model (Python, seconds on a CPU) and lower them. Here a program is
exported once (jax.export: traced, lowered, serialized) and later commands call the
deserialized program: tracing that is one call, and XLA's executable for it comes from the
compilation cache as before. Kept so: translate's search (tx.infer.translate) and the train
step (tx.train.trainer.kept_train_step).

    run = kept.program("name", jitted, key, args)   # a callable of args like jitted
    outputs = run(*args)
    params = kept.abstract_params(model_config)     # counting.abstract_params, kept

The parameters' abstract tree (shapes, dtypes and logical axis names, which a command needs
before it reads a checkpoint) is traced through the model's initialisation; it is kept as a
JSON entry.

Entries are kept only where a compilation cache is on (JAX's jax_compilation_cache_dir is set,
by a command or by the user), TX_KEPT_PROGRAMS is not off, and the command runs on one device
in one process (`keeping`); elsewhere `jitted` runs as it is. Cold and warm commands both run
the exported program, so both compile the same one and give the same results. An entry's key
covers tx's own source (as this process imported it), the jax, jaxlib, flax, optax and numpy
versions, the device kind, JAX's settings (x64, matmul precision, ...), the caller's `key` (the
model's config, the search, the run's config) and the arguments' tree, shapes and dtypes; a
different key is a new entry, and an entry that cannot be read is a warning and made anew,
never an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
from importlib import metadata

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax import export

from tx import storage
from tx.model import counting

DIRECTORY = "tx-exported"
ENV = "TX_KEPT_PROGRAMS"  # off (0, false, no): jitted programs only, XLA's cache still on


def _source_fingerprint() -> str:
    """sha256 of tx's Python source: a changed tx makes its entries anew."""
    digest = hashlib.sha256()
    root = pathlib.Path(__file__).resolve().parents[1]
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


# Read when the process imports this module (with the rest of tx), not at its first use: a
# long-lived process whose files are edited meanwhile must not key its old code by the new.
SOURCE = _source_fingerprint()
VERSIONS = tuple(metadata.version(p) for p in ("jax", "jaxlib", "flax", "optax", "numpy"))

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
    """The entry's name: `name` and a sha256 of all it depends on (module docstring)."""
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


def keeping() -> bool:
    """Whether entries are kept: a compilation cache is on, TX_KEPT_PROGRAMS is not off, one
    device, one process."""
    if os.environ.get(ENV, "").strip().lower() in ("0", "off", "false", "no", "none"):
        return False
    return bool(_cache_dir()) and jax.process_count() == 1 and jax.device_count() == 1


def entry(name: str, key: dict, args: tuple) -> str | None:
    """The path of the entry for `name` with this `key` and these arguments' shapes, or None
    where nothing is kept (module docstring)."""
    if not keeping():
        return None
    return storage.join(_cache_dir(), DIRECTORY, _key(name, key, args))


# This process's programs by entry path: each read or exported once, its call traced once.
_programs: dict[str, object] = {}


def program(name: str, jitted, key: dict, args: tuple, donate_argnums: tuple[int, ...] = ()):
    """A callable of `args` computing jitted(*args): the exported program, read from its entry
    or exported and kept now; or `jitted` itself where nothing is kept or JAX cannot export
    it. `jitted` is a jax.jit of the function (its static arguments bound, donating
    `donate_argnums`), returning builtin containers of arrays; `key` holds the reprs of all
    it depends on besides the arguments' shapes (module docstring)."""
    path = entry(name, key, args)
    if path is None:
        return jitted
    if path not in _programs:
        exported = read(path, _deserialize) or _export(name, jitted, args, path)
        call = None if exported is None else jax.jit(exported.call, donate_argnums=donate_argnums)
        _programs[path] = call or jitted
    return _programs[path]


def _deserialize(payload: bytes) -> export.Exported:
    return export.deserialize(bytearray(payload))


def _export(name: str, jitted, args: tuple, path: str) -> export.Exported | None:
    """jitted's program exported and kept at `path`; None (a warning: `jitted` runs as
    without a cache) where JAX cannot export it, and not kept where it cannot be serialized."""
    try:
        exported = export.export(jitted)(*args)
    except Exception as e:  # noqa: BLE001 - what jit runs but export refuses: jit it
        logging.warning("%s cannot be exported (%s): traced afresh each time", name, e)
        return None
    try:
        payload = bytes(exported.serialize())
    except Exception as e:  # noqa: BLE001 - e.g. a pytree node jax.export cannot serialize
        logging.warning("%s cannot be kept (%s): traced afresh each time", name, e)
        return exported
    write(path, payload)
    return exported


# An entry: MAGIC, the sha256 of the payload (hex), a newline, the payload. The checksum finds
# an entry cut short or overwritten before it is parsed.
MAGIC = b"tx-exported 1\n"


def write(path: str, payload: bytes) -> None:
    entry = MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
    try:
        storage.write_bytes(path, entry)  # whole or not at all: readers never see half
    except Exception as e:  # noqa: BLE001 - a cache that cannot be written costs time only
        logging.warning("%s; it will be traced again next time", e)


def read(path: str, parse):
    """parse(the payload) of the entry at `path`, or None when there is none or it cannot be
    read (a warning: the caller makes it again, and the entry is replaced)."""
    try:
        if not storage.isfile(path):
            return None
        entry = storage.read_bytes(path)
        head, payload = entry[: len(MAGIC) + 65], entry[len(MAGIC) + 65 :]
        digest = hashlib.sha256(payload).hexdigest().encode() + b"\n"
        if head != MAGIC + digest:
            raise ValueError("its checksum does not match: damaged or cut short")
        return parse(payload)
    except Exception as e:  # noqa: BLE001 - an unreadable entry costs time, never the command
        logging.warning("kept entry %s cannot be read (%s): making it again", path, e)
        return None


def abstract_params(config):
    """tx.model.counting.abstract_params(config), read from its entry where one is kept, else
    traced (and kept). A tree other than dicts of ShapeDtypeStructs, bare or in logical
    partitioning boxes, is returned as traced and not kept."""
    path = entry("abstract_params", {"config": config}, ())
    tree = None if path is None else read(path, _tree_from_json)
    if tree is None:
        tree = counting.abstract_params(config)
        leaves = _tree_to_json(tree)
        if path is not None and leaves is not None:
            write(path, leaves)
    return tree


def _tree_to_json(tree) -> bytes | None:
    """[[keys, shape, dtype, logical names or null], ...] of `tree`'s leaves; None where a node
    is neither a dict nor a leaf this format writes down whole."""
    leaves = []
    for keys, leaf in _leaves(tree, ()):
        names = None
        if isinstance(leaf, nn.LogicallyPartitioned):
            if leaf.mesh is not None or leaf.rules is not None:
                return None
            leaf, names = leaf.value, list(leaf.names)
        if type(leaf) is not jax.ShapeDtypeStruct or leaf.sharding is not None:
            return None
        leaves.append([list(keys), list(leaf.shape), leaf.dtype.name, names])
    return json.dumps(leaves).encode()


def _leaves(tree, keys: tuple):
    if isinstance(tree, dict) and tree:
        for k, v in tree.items():
            yield from _leaves(v, (*keys, k))
    else:
        yield keys, tree


def _tree_from_json(payload: bytes) -> dict:
    leaves = json.loads(payload)
    if not leaves:
        raise ValueError("it holds no parameters")
    tree: dict = {}
    for keys, shape, dtype, names in leaves:
        leaf = jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))
        if names is not None:
            leaf = nn.LogicallyPartitioned(leaf, tuple(names))
        node = tree
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = leaf
    return tree
