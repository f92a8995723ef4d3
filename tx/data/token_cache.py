"""Tokenize once: token ids of a split cached on disk, keyed by data and vocabulary.

A cached split is a directory of four .npy files (memory-mapped on load):
  src_ids / tgt_ids: int32 [total tokens], every sentence's ids (ending in EOS) concatenated;
  src_offsets / tgt_offsets: int64 [n + 1], sentence i is ids[offsets[i]:offsets[i + 1]].
The directory name holds the source's fingerprint and the vocabulary's, so a changed file or
vocabulary never reuses stale ids. Directories are written under a temporary name and renamed.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import multiprocessing
import os
import shutil
import tempfile

import numpy as np

from tx.data.sources import ParallelText
from tx.data.tokenizer import Tokenizer

CHUNK = 20_000  # sentence pairs per worker task


@dataclasses.dataclass
class TokenizedSplit:
    """Token ids of one split; `src(i)` / `tgt(i)` give sentence i's ids."""

    src_ids: np.ndarray
    src_offsets: np.ndarray
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    @property
    def src_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets).astype(np.int32)

    @property
    def tgt_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets).astype(np.int32)

    def src(self, i: int) -> np.ndarray:
        return self.src_ids[self.src_offsets[i] : self.src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_ids[self.tgt_offsets[i] : self.tgt_offsets[i + 1]]


def tokenized(
    text: ParallelText, tokenizer: Tokenizer, cache_dir: str, num_workers: int = 0
) -> TokenizedSplit:
    """The cached ids of `text`, tokenizing (in `num_workers` processes) on first use."""
    path = os.path.join(cache_dir, f"{text.fingerprint}-{tokenizer.fingerprint[:16]}")
    if not os.path.isdir(path):
        os.makedirs(cache_dir, exist_ok=True)
        workers = num_workers or os.cpu_count() or 1
        logging.info("tokenizing %s with %d process(es) into %s", text.name, workers, path)
        _write(path, _encode_all(text, tokenizer, workers))
    return _load(path)


def _encode_all(text: ParallelText, tokenizer: Tokenizer, workers: int):
    chunks = _chunked(iter(text), CHUNK)
    if workers == 1:
        return [_encode_chunk_with(tokenizer, c) for c in chunks]
    # spawn, not fork: the parent may already run JAX or TensorFlow threads.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer.path,)) as pool:
        return list(pool.imap(_encode_chunk, chunks))


def _chunked(it, n):
    while chunk := list(itertools.islice(it, n)):
        yield chunk


_WORKER_TOKENIZER: Tokenizer | None = None


def _init_worker(model_path: str) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = Tokenizer(model_path)


def _encode_chunk(chunk):
    return _encode_chunk_with(_WORKER_TOKENIZER, chunk)


def _encode_chunk_with(tokenizer: Tokenizer, chunk):
    """Ids of a chunk as compact arrays: (src ids, src lengths, tgt ids, tgt lengths)."""
    src = tokenizer.encode_batch([s for s, _ in chunk])
    tgt = tokenizer.encode_batch([t for _, t in chunk])
    return (*_flatten(src), *_flatten(tgt))


def _flatten(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(s) for s in seqs), np.int64, len(seqs))
    flat = np.fromiter(itertools.chain.from_iterable(seqs), np.int32, int(lengths.sum()))
    return flat, lengths


def _write(path: str, results) -> None:
    tmp = tempfile.mkdtemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        for name, k in (("src", 0), ("tgt", 2)):
            ids = np.concatenate([r[k] for r in results] or [np.zeros(0, np.int32)])
            lengths = np.concatenate([r[k + 1] for r in results] or [np.zeros(0, np.int64)])
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            np.save(os.path.join(tmp, f"{name}_ids.npy"), ids)
            np.save(os.path.join(tmp, f"{name}_offsets.npy"), offsets)
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(path):  # another process may have written the same cache
            raise


def _load(path: str) -> TokenizedSplit:
    arrays = {
        name: np.load(os.path.join(path, f"{name}.npy"), mmap_mode="r")
        for name in ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
    }
    return TokenizedSplit(**arrays)
