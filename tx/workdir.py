"""A run's directory: every path in it is named here, with the checks that keep it whole.

    W/config.json           the resolved config of the run (written by train)
    W/spm.model             the shared SentencePiece vocabulary (an imported Marian model:
                            source.spm, target.spm and vocab.json instead)
    W/vocab.sha256          its fingerprint when training began: the checkpoints' vocabulary
    W/data/<key>/           token-id caches, keyed by data and vocabulary (tx.data.token_cache)
    W/data/sources/         a bucket's source files' sha256 and lines, by object version
    W/checkpoints/<step>/   training checkpoints: state + data position (tx.train.checkpoint)
    W/averaged/<step>/      parameters averaged over the last N checkpoints
    W/tensorboard/          scalars (tx.train.monitor)
    W/<split>.hyp.<lang>    hypotheses written by evaluate
    W/run_card.json, .md    what the run was and scored (tx.train.runcard)
    W/plots/                pictures (tx.viz.plots): curves, attention maps, BLEU by length
    W/lock.json             the run that writes to W now (tx.train.runlock)

W is a local directory or a bucket's prefix (gs://, s3://): tx.storage reads and writes it.
A workdir belongs to one model and one vocabulary: resuming it with another is refused.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import ml_collections

from tx import storage
from tx.config import ConfigError
from tx.model import families

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
    "train.init_from",  # the parameters and vocabulary a run starts from (tx.train.init_from)
)


def is_main() -> bool:
    """Whether this is the process that writes a run's shared files: process 0."""
    return jax.process_index() == 0


class NotARun(FileNotFoundError):
    """A directory given as --workdir that no training has written."""


def _in_run(name: str):
    """The path of `name` in a workdir, as a function of the workdir."""
    return lambda workdir: storage.join(workdir, name)


# A run's vocabulary: one SentencePiece model for source and target (spm.model, tx's own), or
# two mapped through one list of pieces, or through two (an imported Marian model's:
# tx.data.tokenizer).
VOCABULARY_FILES = ("spm.model", "source.spm", "target.spm", "vocab.json", "target_vocab.json")

config_file = _in_run("config.json")
vocab_file = _in_run("spm.model")
vocab_hash_file = _in_run("vocab.sha256")
data_dir = _in_run("data")
checkpoints_dir = _in_run("checkpoints")
averaged_dir = _in_run("averaged")
tensorboard_dir = _in_run("tensorboard")
run_card_file = _in_run("run_card.json")
run_card_markdown = _in_run("run_card.md")
plots_dir = _in_run("plots")
lock_file = _in_run("lock.json")


def hypotheses_file(workdir: str, split: str, lang: str) -> str:
    return storage.join(workdir, f"{split}.hyp.{lang}")


def require_run(workdir: str) -> str:
    """The run's config.json; NotARun (naming the directory) if training never wrote one."""
    path = config_file(workdir)
    if not storage.isdir(workdir):  # a bucket's prefix is one once something is under it
        raise NotARun(f"--workdir {workdir} does not exist")
    if not storage.exists(path):
        raise NotARun(
            f"{workdir} is not a tx run (it has no config.json): train into it with "
            "`python -m tx train --config FILE --workdir DIR`, or pass --config FILE"
        )
    return path


def check_config(cfg: ml_collections.ConfigDict, workdir: str) -> None:
    """Refuses a workdir whose saved config differs in a FIXED_KEYS entry; else saves cfg."""
    storage.makedirs(workdir)
    path = config_file(workdir)
    current = json.loads(cfg.to_json_best_effort())
    if storage.exists(path):
        saved = _read_saved(path)
        old, new = _fixed(saved), _fixed(current)
        # A key the saved config lacks came after that run started: nothing to compare.
        diffs = [k for k in old if old[k] is not _MISSING and old[k] != new[k]]
        if diffs:
            details = "; ".join(f"{k}: {old[k]!r} -> {new[k]!r}" for k in diffs)
            raise ConfigError(
                f"{workdir} was trained with another configuration ({details}); use a new --workdir"
            )
    if is_main():
        storage.write_text(path, json.dumps(current, indent=2, sort_keys=True))


def _read_saved(path: str) -> dict:
    try:
        saved = json.loads(storage.read_text(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(
            f"{path} is damaged ({e}); restore it, or move it away and pass --config FILE "
            "(the config the run started with) to write it again"
        ) from e
    if not isinstance(saved, dict):
        raise ConfigError(f"{path} holds a JSON {type(saved).__name__}, not a tx config object")
    return saved


_MISSING = object()


def _fixed(tree: dict) -> dict:
    """FIXED_KEYS' values in a config tree; the model section field by field, with its
    family's defaults for the fields a config written before them lacks (a model is the same
    model if only such a field was added since)."""
    values = {k: _lookup(tree, k) for k in FIXED_KEYS if k != "model"}
    section = tree.get("model")
    if isinstance(section, dict):
        try:
            fields = dataclasses.asdict(families.model_config(section))
        except (ValueError, TypeError):  # a config that does not build: compare it as written
            fields = section
        values |= {f"model.{k}": v for k, v in fields.items()}
    return values


def _lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree
