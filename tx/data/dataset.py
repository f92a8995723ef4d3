"""The data stage end to end: `cfg.data` + workdir + tokenizer -> token ids, batch streams.

Writes the workdir's token-id caches (see tx.workdir for where, tx.data.token_cache for how)
and, for source files in a bucket, their sha256 and line counts (`W/data/sources/`,
tx.data.sources.scan). The tokenizer is the run's vocabulary (tx.data.vocabulary).

`build=False` (split_ids, train_stream) only reads what an earlier run or `python -m tx
prepare` wrote: nothing is tokenized or read whole from a bucket, and what is missing raises
NotPrepared (a DataError) naming it.
"""

from __future__ import annotations

from collections.abc import Iterator

import ml_collections

from tx import storage
from tx import workdir as wd
from tx.data import sources
from tx.data.mixing import Mix
from tx.data.pipeline import Batch, BatchSpec, TrainStream, filter_for_training
from tx.data.sources import NotPrepared
from tx.data.token_cache import JoinedSplit, TokenizedSplit, joined, tokenized
from tx.data.tokenizer import Tokenizer


def source_records(workdir: str) -> str:
    """Where the sha256 and line counts of the run's source objects in a bucket are kept."""
    return storage.join(wd.data_dir(workdir), "sources")


def split_ids(
    data: ml_collections.ConfigDict,
    workdir: str,
    tokenizer: Tokenizer,
    split: str,
    build: bool = True,
) -> TokenizedSplit | JoinedSplit:
    """Token ids of `split`, from the workdir's cache (tokenized once). `build=False`:
    NotPrepared (naming "the <split> split" and the missing cache, or the source object
    without a recorded sha256) instead of tokenizing. Several training corpora
    (data.train_prefix with commas) are each cached on their own and joined in order
    (`corpus_sizes` says where each ends)."""
    records = source_records(workdir)
    if data.source == "text" and split == "train":
        try:
            texts = sources.train_corpora(data, records=records, build=build)
        except NotPrepared as e:  # as load_split names it
            raise NotPrepared(f"the {split} split", e.path, e.problem) from None
    else:
        texts = [sources.load_split(data, split, records=records, build=build)]
    cache, name = wd.data_dir(workdir), f"the {split} split"
    parts = [
        tokenized(t, tokenizer, cache, data.num_workers, build=build, name=name) for t in texts
    ]
    return joined(parts)


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
    return TrainStream(ids, keep, spec, position, mix(data, ids)), counts


def mix(data: ml_collections.ConfigDict, ids: TokenizedSplit | JoinedSplit) -> Mix | None:
    """The weighted mix of the training corpora (data.train_weights), recorded in each
    corpus's entry of `ids.source` (the run card's); None: one corpus, or corpora unweighted
    (read as one, each by its size)."""
    weights = tuple(data.get("train_weights", ()))
    if len(weights) < 2:  # one corpus: its one weight changes nothing
        return None
    names = [c["name"] for c in ids.source["corpora"]]
    found = Mix.of(ids.corpus_sizes, weights, names)
    for corpus, weight, share in zip(ids.source["corpora"], weights, found.shares, strict=True):
        corpus.update(weight=weight, share=share)
    return found


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
