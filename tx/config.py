"""Loading, overriding and validating the Python configs in `configs/`.

A config file defines `get_config(arg: str | None = None) -> ConfigDict` with one section per
stage: model, data, optim, train, decode, mesh. On the command line:

    --config configs/base.py[:ARG] --config.model.num_layers=4 --config.train.num_steps=10

Each section is owned by the wing that reads it (SECTIONS): tx.model's frozen dataclasses for
`model`, and a settings module in the wing for the others (tx.data.settings, tx.train.settings,
tx.infer.settings), which holds the section's fields, defaults, comments and checks. This module
composes them (`defaults`) and keeps what is common: loading, overrides, the older values of a
run's saved config.json, and the checker the sections' checks are handed (`Checker`). Everything
is validated here, before anything compiles; errors name the offending key.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import types
import typing
from collections.abc import Sequence

import ml_collections
from ml_collections import config_dict

from tx import storage
from tx.data import settings as data_settings
from tx.infer import settings as infer_settings
from tx.model import families
from tx.train import settings as train_settings

# The wings' settings modules: defaults() -> {section: {field: default}}, and check(Checker).
OWNERS = (data_settings, train_settings, infer_settings)
# Section -> its owner; the model section is tx.model's (its families' frozen dataclasses).
SECTIONS = {"model": families, **{s: o for o in OWNERS for s in o.defaults()}}
# A run's config.json written before a key existed gets the value that run had: this where it
# differs from today's default, else the default.
OLDER = {"train.loss_chunk_tokens": 8192}


class ConfigError(ValueError):
    """A config that cannot run: the message names the key."""


def load_config(path: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """Imports `path` (optionally `path:arg`), applies `key=value` overrides and validates."""
    cfg = read_config(path)
    _fill_older_keys(cfg)
    for item in overrides:
        apply_override(cfg, item)
    validate(cfg)
    return cfg


def defaults() -> ml_collections.ConfigDict:
    """Every section at its defaults: what configs/base.py starts from.

    The model section is the Transformer's frozen dataclass at its defaults (a None default is
    a placeholder of the field's type, so that overrides are type-checked); the wings' sections
    are the paper's base recipe. The vocabulary size is one reference in the model and data
    sections: setting either sets both.
    """
    config = families.FAMILIES[families.DEFAULT].config
    model = {f.name: f.default for f in dataclasses.fields(config)}
    for name, hint in typing.get_type_hints(config).items():
        if name in model and model[name] is None:  # `int | None` -> a placeholder of int
            model[name] = config_dict.placeholder(typing.get_args(hint)[0])
    sections = {"model": model, **{s: d for o in OWNERS for s, d in o.defaults().items()}}
    vocab = config_dict.FieldReference(sections["data"]["vocab_size"])
    model["vocab_size"] = sections["data"]["vocab_size"] = vocab
    return ml_collections.ConfigDict(sections)


def _fill_older_keys(cfg: ml_collections.ConfigDict) -> None:
    """Keys a run's config.json lacks, from before they existed: OLDER's value, else the default.
    (A model section is its family's: its dataclass fills what the section lacks.)"""
    fill = defaults()
    for section in SECTIONS:
        if section == "model" or section not in cfg:
            continue
        for key, value in fill[section].items():
            if key not in cfg[section]:
                cfg[section][key] = OLDER.get(f"{section}.{key}", value)


def read_config(path: str) -> ml_collections.ConfigDict:
    """`get_config([arg])` of the file at `path` (`path:arg`), without validation.

    Config files that derive from another call this with a path relative to their own file.
    A run's config.json may be in a bucket (gs://, s3://).
    """
    scheme, remote, rest = path.rpartition("://") if storage.is_remote(path) else ("", "", path)
    path, _, arg = rest.partition(":")
    path = scheme + remote + path
    if not storage.exists(path):
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
        tree = json.loads(storage.read_text(path))
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
    """Raises ConfigError naming the first invalid key: the model section's family checks it,
    each other section's owner (OWNERS) through a Checker."""
    for section in SECTIONS:
        if section not in cfg:
            raise ConfigError(f"config has no section '{section}'")
    model_config(cfg)
    checker = Checker(cfg)
    for owner in OWNERS:
        owner.check(checker)


class Checker:
    """What a section's `check` is handed: the whole config (`cfg`) and checks that raise
    ConfigError naming the key, so that the wings' settings modules need not import tx.config
    (which imports them)."""

    def __init__(self, cfg: ml_collections.ConfigDict):
        self.cfg = cfg

    def fail(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)

    def get(self, dotted: str):
        node = self.cfg
        for part in dotted.split("."):
            if part not in node:
                self.fail(f"config has no key '{dotted}'")
            node = node[part]
        return node

    def number(self, key: str):
        """The number at `key`; a ConfigError naming the key if it is anything else (a
        hand-edited config.json can hold a string or a list where a number belongs)."""
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(f"{key} must be a number, got {value!r} ({type(value).__name__})")
        return value

    def positive(self, *keys: str) -> None:
        for key in keys:
            if not self.number(key) > 0:
                self.fail(f"{key} must be positive, got {self.get(key)}")

    def nonnegative(self, *keys: str) -> None:
        for key in keys:
            if self.number(key) < 0:
                self.fail(f"{key} must be >= 0, got {self.get(key)}")

    def unit(self, *keys: str) -> None:
        for key in keys:
            if not 0.0 <= self.number(key) < 1.0:
                self.fail(f"{key} must be in [0, 1), got {self.get(key)}")

    def one_of(self, key: str, choices: tuple, spelled: bool = False):
        """The value at `key`, one of `choices` (named in the error as a tuple, or spelled out:
        "'a', 'b' or 'c'")."""
        value = self.get(key)
        if value not in choices:
            *rest, last = map(repr, choices)
            shown = f"{', '.join(rest)} or {last}" if spelled else f"one of {choices}"
            self.fail(f"{key} must be {shown}, got {value!r}")
        return value


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


def checkout() -> str | None:
    """The source checkout tx is imported from (the directory above tx/, with configs/ and
    results/), or None for an installed tx: pyproject.toml installs configs/ as tx/configs/."""
    package = os.path.dirname(os.path.abspath(__file__))
    return None if os.path.isdir(os.path.join(package, "configs")) else os.path.dirname(package)


def configs_dir() -> str:
    """tx's own configs (`--config base`): the installed package's tx/configs/, or the
    checkout's configs/ (one copy)."""
    return os.path.join(checkout() or os.path.dirname(os.path.abspath(__file__)), "configs")
