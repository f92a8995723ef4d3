"""A run's vocabulary, one owner: obtaining, copying, verifying and recording it.

    tokenizer = obtain(data, workdir, model=, source=)   trained on first use, or data.vocab_path
                                                        copied in, or the files of `source`
                                                        (train.init_from) copied in
    record(workdir, tokenizer)                          vocab.sha256, once training begins
    tokenizer = run_tokenizer(workdir)                  a run's vocabulary, checked against it

A run's vocabulary is its files (tx.workdir.VOCABULARY_FILES): spm.model, tx's own, or
source.spm, target.spm and vocab.json (and target_vocab.json) of a model imported from Hugging
Face (tx.infer.huggingface_io) or of a run fine-tuned from one (tx.data.tokenizer reads both).
vocab.sha256 records its fingerprint when training begins (or when a run is imported): the
checkpoints need that exact vocabulary, so from then on a damaged or replaced file is refused by
name, a run started from another never reads the other again, and nothing is retrained.

`source`, where a run takes another's vocabulary, is tx.train.init_from.Source: the other run's
workdir (`run`) and train.init_from as written (`given`, for messages).
"""

from __future__ import annotations

import hashlib
import itertools
import logging

import ml_collections

from tx import storage
from tx import workdir as wd
from tx.data import sources
from tx.data.dataset import source_records
from tx.data.sources import NotPrepared
from tx.data.tokenizer import (
    MAPPED_FILES,
    VOCAB_JSON,
    MappedTokenizer,
    Tokenizer,
    VocabularyError,
    train_tokenizer,
)

VOCAB_PATH_KEY = "vocab_path"


def obtain(
    data: ml_collections.ConfigDict,
    workdir: str,
    *,
    model=None,
    source=None,
    build: bool = True,
) -> Tokenizer | MappedTokenizer:
    """The run's tokenizer (`run_tokenizer`), with `data.vocab_size` pieces and (given the
    `model` section) the source vocabulary model.source_vocab_size says.

    With `source`, and until the run has recorded its own vocabulary (`record`), the source's
    files are copied in (`taken`), so nothing is trained. Else a workdir without a vocabulary
    (and without a record of one) gets `data.vocab_path` (a file or a bucket's object) copied
    in, or one trained on the train split; `build=False` raises NotPrepared ("the vocabulary")
    instead, and copies nothing either: pass no `source` with it.
    """
    theirs, done = None, recorded(workdir)
    present = storage.exists(wd.vocab_file(workdir)) or storage.exists(
        storage.join(workdir, VOCAB_JSON)
    )
    if source is not None and not done:
        theirs = taken(data, source)
        for name in files(source.run):  # each file written whole (tx.storage)
            payload = storage.read_bytes(storage.join(source.run, name))
            storage.write_bytes(storage.join(workdir, name), payload)
    elif not present and not build:
        raise NotPrepared("the vocabulary", wd.vocab_file(workdir))
    elif not present and not done:  # a recorded one is never rebuilt: run_tokenizer says so
        _build(data, workdir)
    tokenizer = run_tokenizer(workdir)
    if theirs is not None and tokenizer.fingerprint != theirs.fingerprint:
        raise VocabularyError(f"the vocabulary copied from {source.run} into {workdir} differs")
    if tokenizer.vocab_size != data.vocab_size:  # a run resumed with another config
        raise VocabularyError(
            f"{workdir}'s vocabulary has {tokenizer.vocab_size} pieces but data.vocab_size="
            f"{data.vocab_size}; use a new workdir or set data.vocab_size to match"
        )
    return tokenizer if model is None else check_source_vocabulary(tokenizer, model, workdir)


def _build(data: ml_collections.ConfigDict, workdir: str) -> None:
    """`workdir/spm.model`: data.vocab_path's copy, or trained on the train split."""
    path, given = wd.vocab_file(workdir), data.get(VOCAB_PATH_KEY)
    if given:
        if not storage.exists(given):
            raise FileNotFoundError(f"data.vocab_path not found: {given}")
        storage.write_bytes(path, storage.read_bytes(given))
        return
    logging.info("training a %d-piece %s vocabulary", data.vocab_size, data.spm_model_type)
    train = sources.load_split(data, "train", records=source_records(workdir))
    train_tokenizer(
        itertools.chain.from_iterable(iter(train)),
        path,
        data.vocab_size,
        model_type=data.spm_model_type,
        sample_size=data.spm_sample_size,
        seed=data.shuffle_seed,
        normalization=data.spm_normalization,
        split_digits=data.spm_split_digits,
    )


def taken(data: ml_collections.ConfigDict, source):
    """The tokenizer of `source` (checked against the sha256 it recorded), once data.vocab_size
    is its size and data.vocab_path (if set) is its file; else VocabularyError in one line
    naming both."""
    theirs = run_tokenizer(source.run)
    if data.vocab_size != theirs.vocab_size:
        raise VocabularyError(
            f"data.vocab_size={data.vocab_size}, but the vocabulary of train.init_from="
            f"{source.given} has {theirs.vocab_size} pieces: set data.vocab_size="
            f"{theirs.vocab_size}"
        )
    given = data.get(VOCAB_PATH_KEY)
    if given:
        if not storage.exists(given):
            raise FileNotFoundError(f"data.vocab_path not found: {given}")
        spm = wd.vocab_file(source.run)
        if not storage.exists(spm) or storage.sha256(given) != storage.sha256(spm):
            raise VocabularyError(
                f"data.vocab_path={given} is not the vocabulary of train.init_from="
                f"{source.given} ({', '.join(files(source.run))} there): a run "
                "started from another takes its vocabulary; leave data.vocab_path empty"
            )
    return theirs


def files(run: str) -> list[str]:
    """The names (tx.workdir.VOCABULARY_FILES) of the files that make up `run`'s vocabulary."""
    return [name for name in wd.VOCABULARY_FILES if storage.exists(storage.join(run, name))]


def recorded(workdir: str) -> bool:
    """Whether the run has recorded its vocabulary (vocab.sha256): training has begun."""
    return storage.exists(wd.vocab_hash_file(workdir))


def record(workdir: str, tokenizer) -> None:
    """Records the vocabulary the run's checkpoints are trained with, once (one process); a run
    that recorded it already was checked against it when `run_tokenizer` loaded it."""
    if not recorded(workdir) and wd.is_main():
        storage.write_text(wd.vocab_hash_file(workdir), tokenizer.fingerprint + "\n")


def install(workdir: str, tokenizer: MappedTokenizer) -> None:
    """An imported model's vocabulary written into its new run, files and record."""
    for name, payload in tokenizer.files.items():
        storage.write_bytes(storage.join(workdir, name), payload)
    storage.write_text(wd.vocab_hash_file(workdir), tokenizer.fingerprint + "\n")


def described(workdir: str, tokenizer) -> dict:
    """The run card's account of the vocabulary taken: its sha256 and each file's."""
    names = files(workdir)
    return {
        "vocabulary_sha256": tokenizer.fingerprint,
        "vocabulary_files": {n: storage.sha256(storage.join(workdir, n)) for n in names},
    }


def run_tokenizer(workdir: str) -> Tokenizer | MappedTokenizer:
    """The vocabulary of a trained run, checked against the sha256 the run recorded: its
    `spm.model`, or (an imported Marian model, or a run fine-tuned from one) source.spm,
    target.spm and vocab.json when it has vocab.json. The checkpoints only make sense with
    that exact vocabulary, so a damaged or replaced one is refused, naming the file (it cannot
    be rebuilt)."""
    if storage.exists(storage.join(workdir, VOCAB_JSON)):
        tokenizer = MappedTokenizer(workdir)
        _check_recorded(
            workdir,
            tokenizer.fingerprint,
            f"{workdir}'s vocabulary ({', '.join(MAPPED_FILES)})",
            "the files from a copy (the model directory it was imported from, or an export of "
            "this run)",
        )
        return tokenizer
    path = wd.vocab_file(workdir)
    if not storage.exists(path):
        raise VocabularyError(f"{path} is missing: the run's vocabulary cannot be rebuilt")
    model_bytes = storage.read_bytes(path)  # checked before it is parsed: a damaged file named
    _check_recorded(
        workdir,
        hashlib.sha256(model_bytes).hexdigest(),
        path,
        "the file from a copy (an export of this run holds it), or train anew in another --workdir",
    )
    return Tokenizer(path, model_bytes)


def _check_recorded(workdir: str, have: str, what: str, restore: str) -> None:
    """VocabularyError naming `what` if its sha256 `have` is not the one the run recorded."""
    path = wd.vocab_hash_file(workdir)
    want = storage.read_text(path).strip() if storage.exists(path) else have
    if have != want:
        raise VocabularyError(
            f"{what} is damaged or replaced: its sha256 {have[:12]} is not the {want[:12]} this "
            f"run recorded in {path}. The checkpoints need that exact vocabulary: restore {restore}"
        )


def check_source_vocabulary(tokenizer, model, workdir: str):
    """`tokenizer` if the model's source embedding fits it: model.source_vocab_size is the
    source vocabulary's size where the run has two (target_vocab.json), else 0; else
    VocabularyError naming the key."""
    have = getattr(tokenizer, "source_vocab_size", 0)
    want = model.get("source_vocab_size", 0) if hasattr(model, "get") else model.source_vocab_size
    if have != want:
        what = f"a source vocabulary of {have} pieces" if have else "one vocabulary"
        raise VocabularyError(
            f"{workdir} has {what} but model.source_vocab_size={want}; set "
            f"model.source_vocab_size={have}"
        )
    return tokenizer
