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
import types
import typing
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
    "decode.no_repeat_ngram_size": 0,
    "decode.max_length_ratio": 0.0,
    "train.max_minutes": 0.0,
    "train.keep_best": 0,
    "train.best_metric": "dev_bleu",
    "train.early_stopping_patience": 0,
    "decode.average_which": "last",
    "train.unlikelihood": 0.0,
}
# A dev metric that can choose checkpoints (tx.train.best) -> the key of its evaluation interval.
BEST_METRICS = {"dev_bleu": "train.eval_bleu_every_steps", "dev_loss": "train.eval_every_steps"}


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
        return _read_json(path)
    spec = importlib.util.spec_from_file_location(f"tx_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{path} defines no get_config()")
    return module.get_config(arg) if arg else module.get_config()


def _read_json(path: str) -> ml_collections.ConfigDict:
    """A run's config.json; one clear error naming the file if it is not a config."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = json.load(f)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text (byte {e.start}): not a tx config") from e
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
            "restore it, or move it away and pass --config FILE (the config the run started "
            "with) to write it again"
        ) from e
    if not isinstance(tree, dict):
        raise ConfigError(f"{path} holds a JSON {type(tree).__name__}, not a tx config object")
    return ml_collections.ConfigDict(tree)


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
    """The frozen architecture from `cfg.model` (tx.model.transformer_config.ModelConfig or
    tx.model.rnn_config.RNNConfig, as `model.family` says; absent = "transformer")."""
    section = cfg.model.to_dict()
    family = families.FAMILIES.get(section.get("family", families.DEFAULT))
    if family is not None:
        _check_types(section, family.config)
    try:
        return families.model_config(section)
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from e


def _check_types(section: dict, config_class) -> None:
    """Each `model` key against its field's annotation in the family's frozen config: a
    hand-edited config.json's "num_heads": "four" is named, not met later as a TypeError."""
    hints = typing.get_type_hints(config_class)
    for key, value in section.items():
        want = hints.get(key)
        if want is not None and not _is_a(value, want):
            raise ConfigError(
                f"model.{key} must be {_type_name(want)}, got {value!r} ({type(value).__name__})"
            )


def _is_a(value, want) -> bool:
    """Whether `value` (from Python or JSON) fits the annotation `want`; unknown kinds fit."""
    args = typing.get_args(want)
    if typing.get_origin(want) in (typing.Union, types.UnionType):
        return any(_is_a(value, a) for a in args)
    if want is type(None):
        return value is None
    if want is bool:
        return isinstance(value, bool)
    if want is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if want is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if want is str:
        return isinstance(value, str)
    if typing.get_origin(want) is tuple:
        return isinstance(value, (tuple, list))
    return True


def _type_name(want) -> str:
    if typing.get_origin(want) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(want))
    return "None" if want is type(None) else getattr(want, "__name__", str(want))


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
        "train.max_minutes",
        "train.unlikelihood",
        "optim.grad_clip_norm",
    )
    if _number(cfg, "train.loss_chunk_tokens") < -1:
        raise ConfigError(
            "train.loss_chunk_tokens must be -1 (per platform), 0 (plain loss) or > 0, got "
            f"{cfg.train.loss_chunk_tokens}"
        )
    _check_unit(cfg, "train.label_smoothing")
    _check_unit(cfg, "optim.b1", "optim.b2")
    if cfg.model.vocab_size != cfg.data.vocab_size:
        raise ConfigError(
            f"model.vocab_size={cfg.model.vocab_size} differs from data.vocab_size="
            f"{cfg.data.vocab_size}; the shared vocabulary sizes the embedding"
        )
    _check_decode(cfg)
    _check_best(cfg)
    if cfg.data.on_bad_line not in ON_BAD_LINE:
        raise ConfigError(
            f"data.on_bad_line must be one of {ON_BAD_LINE}, got {cfg.data.on_bad_line!r}"
        )
    if cfg.data.source not in ("demo", "text", "tfds", "trees"):
        raise ConfigError(
            f"data.source must be 'demo', 'text', 'tfds' or 'trees', got {cfg.data.source!r}"
        )
    buckets = cfg.data.bucket_lengths
    if not isinstance(buckets, (tuple, list)) or not all(
        isinstance(b, int) and not isinstance(b, bool) for b in buckets
    ):
        raise ConfigError(f"data.bucket_lengths must be a list of ints, got {buckets!r}")
    buckets = tuple(buckets)
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
        if _number(cfg, f"mesh.shape.{axis}") == 0 or size < -1:
            raise ConfigError(f"mesh.shape.{axis} must be positive or -1, got {size}")


def _check_decode(cfg: ml_collections.ConfigDict) -> None:
    decode = cfg.decode
    if decode.strategy not in SEARCH_STRATEGIES:
        raise ConfigError(
            f"decode.strategy must be one of {SEARCH_STRATEGIES}, got {decode.strategy!r}"
        )
    if not _number(cfg, "decode.temperature") > 0:
        raise ConfigError(f"decode.temperature must be positive, got {decode.temperature}")
    if _number(cfg, "decode.top_k") < 0:
        raise ConfigError(f"decode.top_k must be >= 0, got {decode.top_k}")
    ngram = _number(cfg, "decode.no_repeat_ngram_size")
    if not isinstance(ngram, int) or ngram < 0:
        raise ConfigError(f"decode.no_repeat_ngram_size must be an int >= 0 (0 = off), got {ngram}")
    ratio = _number(cfg, "decode.max_length_ratio")
    if not 0 <= ratio < float("inf"):  # nan and inf as well
        raise ConfigError(f"decode.max_length_ratio must be finite and >= 0 (0 = off), got {ratio}")


def _check_best(cfg: ml_collections.ConfigDict) -> None:
    """Keeping the best checkpoints needs a known metric that is evaluated (tx.train.best)."""
    t = cfg.train
    _check_nonnegative(cfg, "train.keep_best", "train.early_stopping_patience")
    if t.best_metric not in BEST_METRICS:
        raise ConfigError(
            f"train.best_metric must be one of {tuple(BEST_METRICS)}, got {t.best_metric!r}"
        )
    every = BEST_METRICS[t.best_metric]
    if t.early_stopping_patience and not t.keep_best:
        raise ConfigError(
            "train.early_stopping_patience needs train.keep_best >= 1 (the best checkpoint "
            "must be kept to know when training stopped improving)"
        )
    if t.keep_best and not _number(cfg, every):
        raise ConfigError(
            f"train.keep_best={t.keep_best} chooses by {t.best_metric}, which is never "
            f"evaluated: set {every} > 0"
        )
    if cfg.decode.average_which not in ("last", "best"):
        raise ConfigError(
            f"decode.average_which must be 'last' or 'best', got {cfg.decode.average_which!r}"
        )
    if cfg.decode.average_which == "best" and not t.keep_best:
        raise ConfigError("decode.average_which='best' needs train.keep_best >= 1")


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        if part not in node:
            raise ConfigError(f"config has no key '{dotted}'")
        node = node[part]
    return node


def _number(cfg, key: str):
    """The number at `key`; a ConfigError naming the key if it is anything else (a hand-edited
    config.json can hold a string or a list where a number belongs)."""
    value = _get(cfg, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key} must be a number, got {value!r} ({type(value).__name__})")
    return value


def _check_positive(cfg, *keys):
    for key in keys:
        if not _number(cfg, key) > 0:
            raise ConfigError(f"{key} must be positive, got {_get(cfg, key)}")


def _check_nonnegative(cfg, *keys):
    for key in keys:
        if _number(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0, got {_get(cfg, key)}")


def _check_unit(cfg, *keys):
    for key in keys:
        if not 0.0 <= _number(cfg, key) < 1.0:
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
