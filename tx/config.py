"""Loading, overriding and validating the Python configs in `configs/`.

A config file defines `get_config(arg: str | None = None) -> ConfigDict` with one section per
stage: model, data, optim, train, decode, mesh. On the command line:

    --config configs/base.py[:ARG] --config.model.num_layers=4 --config.train.num_steps=10

Everything is validated here, before anything compiles; errors name the offending key.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
from collections.abc import Sequence

import ml_collections

from tx.model import families

SECTIONS = ("model", "data", "optim", "train", "decode", "mesh")
# The device mesh's axes, in mesh order (tx.train.sharding builds the mesh from them).
AXES = ("data", "fsdp", "tensor")
# tx.infer.search.STRATEGIES and tx.data.sources.ON_BAD_LINE (a test keeps them equal: config may
# not import downstream modules).
SEARCH_STRATEGIES = ("beam", "greedy", "sample")
ON_BAD_LINE = ("error", "skip")
# Keys added after runs were written: a run's config.json without them gets these values.
LATER_KEYS = {
    "data.on_bad_line": "error",
    "mesh.heartbeat_timeout_secs": 100,
    "train.loss_chunk_tokens": 8192,
}


class ConfigError(ValueError):
    """A config that cannot run: the message names the key."""


def load_config(path: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """Imports `path` (optionally `path:arg`), applies `key=value` overrides and validates."""
    cfg = read_config(path)
    _add_later_keys(cfg)
    for item in overrides:
        apply_override(cfg, item)
    validate(cfg)
    return cfg


def _add_later_keys(cfg: ml_collections.ConfigDict) -> None:
    for dotted, default in LATER_KEYS.items():
        section, key = dotted.split(".")
        if section in cfg and key not in cfg[section]:
            cfg[section][key] = default


def read_config(path: str) -> ml_collections.ConfigDict:
    """`get_config([arg])` of the file at `path` (`path:arg`), without validation.

    Config files that derive from another call this with a path relative to their own file.
    """
    path, _, arg = path.partition(":")
    if not os.path.exists(path):
        raise ConfigError(f"config file not found: {path}")
    if path.endswith(".json"):  # a run's resolved config, as written to its workdir
        with open(path) as f:
            return ml_collections.ConfigDict(json.load(f))
    spec = importlib.util.spec_from_file_location(f"tx_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{path} defines no get_config()")
    return module.get_config(arg) if arg else module.get_config()


def apply_override(cfg: ml_collections.ConfigDict, item: str) -> None:
    """Applies one `a.b.c=value` override; the value is parsed as a Python literal if it can be."""
    key, sep, raw = item.partition("=")
    if not sep:
        raise ConfigError(f"config override {item!r} is not of the form key=value")
    parts = key.split(".")
    node = cfg
    for i, part in enumerate(parts[:-1]):
        if part not in node:
            raise ConfigError(
                f"unknown config key '{'.'.join(parts[: i + 1])}' in override {item!r}"
            )
        node = node[part]
    leaf = parts[-1]
    if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
        raise ConfigError(f"unknown config key '{key}' in override {item!r}")
    if isinstance(node[leaf], ml_collections.ConfigDict):  # a whole section: keys would go
        raise ConfigError(f"config key '{key}' is a section: override its keys ({key}.KEY=VALUE)")
    value = _parse_value(raw, node[leaf])
    if value is None and node[leaf] is not None:  # ml_collections would let None in
        raise ConfigError(f"config key '{key}' cannot be None (override {item!r})")
    try:
        node[leaf] = value
    except TypeError as e:  # ml_collections' message holds the value's repr, lines and all
        shown = raw if len(raw) <= 60 else raw[:57] + "..."
        kind = type(node[leaf]).__name__ if node[leaf] is not None else "typed field"
        raise ConfigError(f"config key '{key}' is a {kind}: cannot set it to {shown!r}") from e


def _parse_value(raw: str, current):
    if isinstance(current, bool) or raw.lower() in ("true", "false"):
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
    if isinstance(current, str):
        return raw
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw
    if isinstance(current, float) and isinstance(value, int):
        return float(value)
    if isinstance(current, tuple) and isinstance(value, list):
        return tuple(value)
    return value


def model_config(cfg: ml_collections.ConfigDict):
    """The frozen architecture from `cfg.model` (tx.model.transformer.ModelConfig or
    tx.model.rnn.RNNConfig, as `model.family` says; absent = "transformer")."""
    try:
        return families.model_config(cfg.model.to_dict())
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from e


def validate(cfg: ml_collections.ConfigDict) -> None:
    """Raises ConfigError naming the first invalid key."""
    for section in SECTIONS:
        if section not in cfg:
            raise ConfigError(f"config has no section '{section}'")
    mc = model_config(cfg)
    if mc.family == "rnn" and cfg.data.pack:
        raise ConfigError(
            "data.pack=True: model.family='rnn' reads one pair per row (its state would run "
            "across packed pairs); set data.pack=False"
        )
    _check_positive(
        cfg,
        "data.vocab_size",
        "data.max_len",
        "data.tokens_per_step",
        "optim.warmup_steps",
        "train.num_steps",
        "train.micro_batches",
        "train.keep_checkpoints",
        "train.log_every_steps",
        "decode.beam_size",
        "decode.batch_tokens",
        "mesh.heartbeat_timeout_secs",
    )
    _check_nonnegative(
        cfg,
        "optim.learning_rate_scale",
        "decode.alpha",
        "decode.max_extra_len",
        "train.checkpoint_every_secs",
        "train.checkpoint_every_steps",
        "train.eval_every_steps",
        "optim.grad_clip_norm",
    )
    if cfg.train.loss_chunk_tokens < -1:
        raise ConfigError(
            "train.loss_chunk_tokens must be -1 (per platform), 0 (plain loss) or > 0, got "
            f"{cfg.train.loss_chunk_tokens}"
        )
    _check_unit(cfg, "train.label_smoothing")
    for key in ("optim.b1", "optim.b2"):
        if not 0.0 <= _get(cfg, key) < 1.0:
            raise ConfigError(f"{key} must be in [0, 1), got {_get(cfg, key)}")
    if cfg.model.vocab_size != cfg.data.vocab_size:
        raise ConfigError(
            f"model.vocab_size={cfg.model.vocab_size} differs from data.vocab_size="
            f"{cfg.data.vocab_size}; the shared vocabulary sizes the embedding"
        )
    _check_decode(cfg.decode)
    if cfg.data.on_bad_line not in ON_BAD_LINE:
        raise ConfigError(
            f"data.on_bad_line must be one of {ON_BAD_LINE}, got {cfg.data.on_bad_line!r}"
        )
    if cfg.data.source not in ("demo", "text", "tfds", "trees"):
        raise ConfigError(
            f"data.source must be 'demo', 'text', 'tfds' or 'trees', got {cfg.data.source!r}"
        )
    buckets = tuple(cfg.data.bucket_lengths)
    if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] <= 0:
        raise ConfigError(f"data.bucket_lengths must be increasing positive ints, got {buckets}")
    if buckets[-1] < cfg.data.max_len:
        raise ConfigError(
            f"data.bucket_lengths ends at {buckets[-1]} < data.max_len={cfg.data.max_len}"
        )
    if cfg.data.tokens_per_step < buckets[-1]:
        raise ConfigError(
            f"data.tokens_per_step={cfg.data.tokens_per_step} cannot hold one row of the "
            f"longest bucket ({buckets[-1]})"
        )
    for axis, size in cfg.mesh.shape.items():
        if axis not in AXES:
            raise ConfigError(f"unknown mesh axis 'mesh.shape.{axis}'")
        if size == 0 or size < -1:
            raise ConfigError(f"mesh.shape.{axis} must be positive or -1, got {size}")


def _check_decode(decode: ml_collections.ConfigDict) -> None:
    if decode.strategy not in SEARCH_STRATEGIES:
        raise ConfigError(
            f"decode.strategy must be one of {SEARCH_STRATEGIES}, got {decode.strategy!r}"
        )
    if not decode.temperature > 0:
        raise ConfigError(f"decode.temperature must be positive, got {decode.temperature}")
    if decode.top_k < 0:
        raise ConfigError(f"decode.top_k must be >= 0, got {decode.top_k}")


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        if part not in node:
            raise ConfigError(f"config has no key '{dotted}'")
        node = node[part]
    return node


def _check_positive(cfg, *keys):
    for key in keys:
        if not _get(cfg, key) > 0:
            raise ConfigError(f"{key} must be positive, got {_get(cfg, key)}")


def _check_nonnegative(cfg, *keys):
    for key in keys:
        if _get(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0, got {_get(cfg, key)}")


def _check_unit(cfg, *keys):
    for key in keys:
        if not 0.0 <= _get(cfg, key) < 1.0:
            raise ConfigError(f"{key} must be in [0, 1), got {_get(cfg, key)}")


def split_config_args(argv: Sequence[str]) -> tuple[list[str], str | None, list[str]]:
    """Separates `--config PATH` and `--config.key=value` from the other arguments."""
    rest, path, overrides = [], None, []
    it = iter(argv)
    for a in it:
        if a == "--config":
            path = next(it, None)
        elif a.startswith("--config="):
            path = a.split("=", 1)[1]
        elif a.startswith("--config."):
            body = a[len("--config.") :]
            if "=" not in body:
                body = f"{body}={next(it, '')}"
            overrides.append(body)
        else:
            rest.append(a)
    return rest, path, overrides
