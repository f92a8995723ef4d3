"""The data stage end to end: `cfg.data` + workdir -> tokenizer, token ids, batch streams.

Writes the workdir's vocabulary (trained once, never silently retrained) and token-id caches
(see tx.workdir for where, tx.data.token_cache for how), and, for source files in a bucket,
their sha256 and line counts (`W/data/sources/`, tx.data.sources.scan).

`build=False` (vocabulary, split_ids, train_stream) only reads what an earlier run or
`python -m tx prepare` wrote: nothing is trained, tokenized or read whole from a bucket, and
what is missing raises NotPrepared (a DataError) naming it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

import ml_collections

from tx import storage
from tx import workdir as wd
from tx.data import sources
from tx.data.pipeline import Batch, BatchSpec, TrainStream, filter_for_training
from tx.data.sources import NotPrepared
from tx.data.token_cache import TokenizedSplit, tokenized
from tx.data.tokenizer import Tokenizer, VocabularyError, run_tokenizer, train_tokenizer

VOCAB_PATH_KEY = "vocab_path"


def source_records(workdir: str) -> str:
    """Where the sha256 and line counts of the run's source objects in a bucket are kept."""
    return storage.join(wd.data_dir(workdir), "sources")


def vocabulary(data: ml_collections.ConfigDict, workdir: str, build: bool = True) -> Tokenizer:
    """The run's SentencePiece model: `workdir/spm.model`, trained on first use.

    `data.vocab_path` (a file or a bucket's object), when set, is copied in instead of
    training. An existing workdir model is reused and must have `data.vocab_size` pieces.
    `build=False`: a missing model raises NotPrepared ("the vocabulary") instead.
    """
    path = wd.vocab_file(workdir)
    if not storage.exists(path):
        if not build:
            raise NotPrepared("the vocabulary", path)
        given = data.get(VOCAB_PATH_KEY)
        if given:
            _copy_atomic(given, path)
        else:
            logging.info("training a %d-piece %s vocabulary", data.vocab_size, data.spm_model_type)
            train = sources.load_split(data, "train", records=source_records(workdir))
            sentences = itertools.chain.from_iterable(iter(train))
            train_tokenizer(
                sentences,
                path,
                data.vocab_size,
                data.spm_model_type,
                data.spm_sample_size,
                seed=data.shuffle_seed,
                normalization=data.spm_normalization,
                split_digits=data.spm_split_digits,
            )
    tokenizer = run_tokenizer(workdir)
    if tokenizer.vocab_size != data.vocab_size:
        raise VocabularyError(
            f"{path} has {tokenizer.vocab_size} pieces but data.vocab_size={data.vocab_size}; "
            "use a new workdir or set data.vocab_size to match"
        )
    return tokenizer


def _copy_atomic(src: str, dst: str) -> None:
    if not storage.exists(src):
        raise FileNotFoundError(f"data.vocab_path not found: {src}")
    storage.write_bytes(dst, storage.read_bytes(src))


def split_ids(
    data: ml_collections.ConfigDict,
    workdir: str,
    tokenizer: Tokenizer,
    split: str,
    build: bool = True,
) -> TokenizedSplit:
    """Token ids of `split`, from the workdir's cache (tokenized once). `build=False`:
    NotPrepared (naming "the <split> split" and the missing cache, or the source object
    without a recorded sha256) instead of tokenizing."""
    text = sources.load_split(data, split, records=source_records(workdir), build=build)
    return tokenized(
        text,
        tokenizer,
        wd.data_dir(workdir),
        data.num_workers,
        build=build,
        name=f"the {split} split",
    )


def split_text(data: ml_collections.ConfigDict, split: str) -> list[tuple[str, str]]:
    """All (source, reference) pairs of a split, in order (evaluation: nothing is dropped)."""
    return list(sources.load_split(data, split))


def batch_spec(
    data: ml_collections.ConfigDict,
    row_multiple: int,
    local_rows=None,
) -> BatchSpec:
    """`local_rows`: tx.train.sharding.Layout.process_rows of the run (None: one process)."""
    return BatchSpec(
        bucket_lengths=tuple(data.bucket_lengths),
        tokens_per_step=data.tokens_per_step,
        max_len=data.max_len,
        row_multiple=row_multiple,
        local_rows=local_rows,
        seed=data.shuffle_seed,
        pack=data.pack,
    )


def train_stream(
    data: ml_collections.ConfigDict,
    workdir: str,
    tokenizer: Tokenizer,
    spec: BatchSpec,
    position: dict | None = None,
    build: bool = True,
) -> tuple[TrainStream, dict]:
    """The resumable training stream and the filter counts (dropped pairs are logged)."""
    ids = split_ids(data, workdir, tokenizer, "train", build=build)
    keep, counts = filter_for_training(ids, data.max_len)
    return TrainStream(ids, keep, spec, position), counts


def prefetch(stream: Iterator[Batch], buffer: int = 2) -> Iterator[Batch]:
    """Batches assembled ahead of the training step by tf.data's background threads."""
    import tensorflow as tf

    first = next(stream)
    signature = {k: tf.TensorSpec((None, None), tf.int32) for k in first}

    def gen():
        yield first
        yield from stream

    ds = tf.data.Dataset.from_generator(gen, output_signature=signature).prefetch(buffer)
    return ds.as_numpy_iterator()
