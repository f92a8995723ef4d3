"""A run's directory: every path in it is named here, with the checks that keep it whole.

    W/config.json           the resolved config of the run (written by train)
    W/spm.model             the shared SentencePiece vocabulary
    W/vocab.sha256          its fingerprint when training began: the checkpoints' vocabulary
    W/data/<key>/           token-id caches, keyed by data and vocabulary (tx.data.token_cache)
    W/checkpoints/<step>/   training checkpoints: state + data position (tx.train.checkpoint)
    W/averaged/<step>/      parameters averaged over the last N checkpoints
    W/tensorboard/          scalars (tx.train.monitor)
    W/<split>.hyp.<lang>    hypotheses written by evaluate
    W/run_card.json, .md    what the run was and scored (tx.train.runcard)
    W/plots/                pictures (tx.viz.plots): curves, attention maps, BLEU by length

A workdir belongs to one model and one vocabulary: resuming it with another is refused.
"""

from __future__ import annotations

import contextlib
import json
import os

import jax
import ml_collections

from tx.config import ConfigError

# Keys that must not change when a workdir is resumed (they change the model or its data).
FIXED_KEYS = (
    "model",
    "data.source",
    "data.vocab_size",
    "data.tfds_name",
    "data.src_lang",
    "data.tgt_lang",
    "data.train_prefix",
    "data.spm_model_type",
    "data.spm_normalization",
    "data.spm_split_digits",
)


def is_main() -> bool:
    """Whether this is the process that writes a run's shared files: process 0."""
    return jax.process_index() == 0


class NotARun(FileNotFoundError):
    """A directory given as --workdir that no training has written."""


class WriteFailed(OSError):
    """A file or checkpoint that could not be written whole; the message names it."""


def config_file(workdir: str) -> str:
    return os.path.join(workdir, "config.json")


def vocab_file(workdir: str) -> str:
    return os.path.join(workdir, "spm.model")


def vocab_hash_file(workdir: str) -> str:
    return os.path.join(workdir, "vocab.sha256")


def data_dir(workdir: str) -> str:
    return os.path.join(workdir, "data")


def checkpoints_dir(workdir: str) -> str:
    return os.path.join(workdir, "checkpoints")


def averaged_dir(workdir: str) -> str:
    return os.path.join(workdir, "averaged")


def tensorboard_dir(workdir: str) -> str:
    return os.path.join(workdir, "tensorboard")


def hypotheses_file(workdir: str, split: str, lang: str) -> str:
    return os.path.join(workdir, f"{split}.hyp.{lang}")


def run_card_file(workdir: str) -> str:
    return os.path.join(workdir, "run_card.json")


def run_card_markdown(workdir: str) -> str:
    return os.path.join(workdir, "run_card.md")


def plots_dir(workdir: str) -> str:
    return os.path.join(workdir, "plots")


def require_run(workdir: str) -> str:
    """The run's config.json; NotARun (naming the directory) if training never wrote one."""
    path = config_file(workdir)
    if not os.path.isdir(workdir):
        raise NotARun(f"--workdir {workdir} does not exist")
    if not os.path.exists(path):
        raise NotARun(
            f"{workdir} is not a tx run (it has no config.json): train into it with "
            "`python -m tx train --config FILE --workdir DIR`, or pass --config FILE"
        )
    return path


def check_config(cfg: ml_collections.ConfigDict, workdir: str) -> None:
    """Refuses a workdir whose saved config differs in a FIXED_KEYS entry; else saves cfg."""
    os.makedirs(workdir, exist_ok=True)
    path = config_file(workdir)
    current = json.loads(cfg.to_json_best_effort())
    if os.path.exists(path):
        saved = _read_saved(path)
        # A key the saved config lacks came after that run started: nothing to compare.
        diffs = [
            k
            for k in FIXED_KEYS
            if _lookup(saved, k) is not _MISSING and _lookup(saved, k) != _lookup(current, k)
        ]
        if diffs:
            details = "; ".join(
                f"{k}: {_lookup(saved, k)!r} -> {_lookup(current, k)!r}" for k in diffs
            )
            raise ConfigError(
                f"{workdir} was trained with another configuration ({details}); use a new --workdir"
            )
    if is_main():
        write_atomic(path, json.dumps(current, indent=2, sort_keys=True))


def _read_saved(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(
            f"{path} is damaged ({e}); restore it, or move it away and pass --config FILE "
            "(the config the run started with) to write it again"
        ) from e
    if not isinstance(saved, dict):
        raise ConfigError(f"{path} holds a JSON {type(saved).__name__}, not a tx config object")
    return saved


_MISSING = object()


def _lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree


def write_atomic(path: str, text: str | bytes) -> None:
    """Writes the whole file (text, or bytes such as a PNG) under a temporary name, then
    renames it: never half-written.

    A write that fails (a full disk, a missing directory) raises WriteFailed naming `path`,
    leaves no temporary file, and leaves an earlier file at `path` as it was.
    """
    tmp = path + ".tmp"
    try:
        binary = isinstance(text, bytes)
        with open(tmp, "wb") if binary else open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # a full disk may only show here (delayed allocation, NFS)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise WriteFailed(f"{path} was not written ({e.strerror or e}); nothing was changed") from e
