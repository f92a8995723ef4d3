"""A run's data, prepared once before training: `python -m tx prepare --config C --workdir W`.

    prepare(cfg, workdir)        config.json, the vocabulary and the token caches of train, dev
                                 and test, recorded in the run card (the sources' checksums)
    check_prepared(cfg, workdir) what a multi-process `train` checks instead of tokenizing

On a pod every host would otherwise wait while one tokenizes millions of pairs; `prepare` runs
on any one machine (a CPU VM will do) and writes into the workdir, a bucket's prefix included.
A `train` of several processes then builds nothing: each process checks that the data is
there (tx.data.dataset with build=False) and, if anything is missing, every process stops at
once with the same line naming it and the command to run.
"""

from __future__ import annotations

import time

import ml_collections

from tx import workdir as wd
from tx.data import dataset, vocabulary
from tx.data.pipeline import filter_for_training
from tx.data.sources import DataError, NotPrepared
from tx.train import init_from, runcard, runlock
from tx.train.distributed import sync_flags

SPLITS = ("train", "dev", "test", "dev2")


class DataNotPrepared(DataError):
    """A multi-process `train` whose vocabulary or token caches `prepare` has not built."""


def splits_of(data: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The splits the data config names: train, dev and test, except a text or treebank split
    whose prefix is not set (training needs no test text, say), and dev2 where
    data.dev2_prefix names it."""
    prefixed = data.source in ("text", "trees")  # the other sources have all three
    return tuple(
        split
        for split in SPLITS
        if data.get(f"{split}_prefix") or not (prefixed or split == "dev2")
    )


def prepare(cfg: ml_collections.ConfigDict, workdir: str, *, take_over_lock: bool = False) -> dict:
    """Writes config.json (refusing a workdir trained with another model or data:
    tx.workdir.check_config), builds the vocabulary and the token caches of every split the
    config names, and records the data in the run card (tx.train.runcard.data_record: each
    split's source and checksums, the pairs read and kept, the vocabulary's sha256). Holds the
    workdir's lock as `train` does. Returns the card's data record."""
    started = time.time()
    with runlock.hold(workdir, take_over=take_over_lock):
        wd.check_config(cfg, workdir)
        source = init_from.vocabulary_source(cfg, workdir)  # train.init_from: the source's
        tokenizer = vocabulary.obtain(cfg.data, workdir, model=cfg.model, source=source)
        splits = {}
        for split in splits_of(cfg.data):
            ids = dataset.split_ids(cfg.data, workdir, tokenizer, split)
            counts = None
            if split == "train":
                counts = filter_for_training(ids, cfg.data.max_len)[1]
                dataset.mix(cfg.data, ids)  # each corpus's weight and share, on the card
            splits[split] = (ids, counts)
        record = runcard.data_record(cfg.data, tokenizer, splits)
        runcard.record_prepared(workdir, cfg, record, time.time() - started)
    return record


def check_prepared(cfg: ml_collections.ConfigDict, workdir: str, splits: tuple[str, ...]):
    """The run's tokenizer, once every process has found the vocabulary and the token caches
    of `splits` ready (tx.data.dataset with build=False: nothing is built). If any process
    misses any of them, DataNotPrepared on every process, naming each missing piece (one
    collective: the same answer everywhere)."""
    found = {}  # piece -> what is missing, as this process sees it (NotPrepared's message)
    tokenizer = None
    try:
        tokenizer = vocabulary.obtain(cfg.data, workdir, build=False)
        for split in splits:
            try:
                dataset.split_ids(cfg.data, workdir, tokenizer, split, build=False)
            except NotPrepared as e:
                found[split] = str(e)
    except NotPrepared as e:  # no vocabulary: the caches, keyed by it, are missing too
        found = {"vocabulary": str(e)} | {split: f"the {split} split" for split in splits}
    pieces = ("vocabulary", *splits)
    missing = sync_flags(*(piece in found for piece in pieces))
    if any(missing):
        names = [
            found.get(piece, f"the {piece} (on another process)")
            for piece, flag in zip(pieces, missing, strict=True)
            if flag
        ]
        raise DataNotPrepared(
            f"the data of {workdir} is not prepared ({'; '.join(names)}): the processes of a "
            "run do not tokenize. Run `python -m tx prepare --config "
            f"{wd.config_file(workdir)} --workdir {workdir}` once, on one machine, then train"
        )
    return tokenizer
