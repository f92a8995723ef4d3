"""Tokenize once: token ids of a split cached on disk, keyed by data and vocabulary.

A cached split is a directory of four .npy files (memory-mapped on load):
  src_ids / tgt_ids: int32 [total tokens], every sentence's ids (ending in EOS) concatenated;
  src_offsets / tgt_offsets: int64 [n + 1], sentence i is ids[offsets[i]:offsets[i + 1]].
The directory name holds the source's fingerprint and the vocabulary's, so a changed file or
vocabulary never reuses stale ids. Directories are written under a temporary name and renamed,
with a manifest (each file's size and sha256) written last: a cache that is damaged on disk
(cut short, zeroed, replaced) is rebuilt with a warning naming it, and temporary directories
left by a writer that died are removed. A cache written before manifests existed is checked
for consistency (offsets against ids) and adopted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import multiprocessing
import os
import shutil
import socket
import tempfile
import time

import numpy as np

from tx.data.sources import ParallelText, file_sha256
from tx.data.tokenizer import Tokenizer

CHUNK = 20_000  # sentence pairs per worker task
FILES = ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
MANIFEST = "manifest.json"
# A temporary directory this old was left by a writer that died (writing takes minutes at most).
STALE_TMP_SECS = 24 * 3600


@dataclasses.dataclass
class TokenizedSplit:
    """Token ids of one split; `src(i)` / `tgt(i)` give sentence i's ids."""

    src_ids: np.ndarray
    src_offsets: np.ndarray
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray
    # The text it was tokenized from (ParallelText's name, fingerprint and provenance).
    source: dict = dataclasses.field(default_factory=dict)

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
    if os.path.isdir(path):
        split, damage = _load_checked(path)
        if split is not None:
            return _with_source(split, text)
        logging.warning("token cache %s is damaged (%s): rebuilding it", path, damage)
        shutil.rmtree(path, ignore_errors=True)
    os.makedirs(cache_dir, exist_ok=True)
    _remove_stale_tmp(cache_dir)
    workers = num_workers or os.cpu_count() or 1
    logging.info("tokenizing %s with %d process(es) into %s", text.name, workers, path)
    _write(path, _encode_all(text, tokenizer, workers))
    return _with_source(_load(path), text)


def _with_source(split: TokenizedSplit, text: ParallelText) -> TokenizedSplit:
    split.source = {"name": text.name, "fingerprint": text.fingerprint, **text.provenance}
    return split


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
    # The writer's host and pid in the name: its leftovers are known as such once it is gone.
    prefix = f".tmp-{socket.gethostname()}-{os.getpid()}-"
    tmp = tempfile.mkdtemp(dir=os.path.dirname(path), prefix=prefix)
    try:
        for name, k in (("src", 0), ("tgt", 2)):
            ids = np.concatenate([r[k] for r in results] or [np.zeros(0, np.int32)])
            lengths = np.concatenate([r[k + 1] for r in results] or [np.zeros(0, np.int64)])
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            np.save(os.path.join(tmp, f"{name}_ids.npy"), ids)
            np.save(os.path.join(tmp, f"{name}_offsets.npy"), offsets)
        _write_manifest(tmp)  # last: a directory with a manifest was written whole
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(path):  # another process may have written the same cache
            raise


def _load(path: str) -> TokenizedSplit:
    arrays = {name: np.load(os.path.join(path, f"{name}.npy"), mmap_mode="r") for name in FILES}
    return TokenizedSplit(**arrays)


def _write_manifest(path: str) -> None:
    entries = {}
    for name in FILES:
        file = os.path.join(path, f"{name}.npy")
        entries[name] = {"bytes": os.path.getsize(file), "sha256": file_sha256(file)}
    with open(os.path.join(path, MANIFEST), "w") as f:
        json.dump(entries, f, indent=2)
        f.flush()
        os.fsync(f.fileno())


def _load_checked(path: str) -> tuple[TokenizedSplit | None, str]:
    """The split at `path` if its files are whole, else (None, what is wrong)."""
    manifest = os.path.join(path, MANIFEST)
    if os.path.exists(manifest):
        try:
            with open(manifest) as f:
                entries = json.load(f)
            for name in FILES:
                file = os.path.join(path, f"{name}.npy")
                if not os.path.exists(file):
                    return None, f"{name}.npy is missing"
                if os.path.getsize(file) != entries[name]["bytes"] or (
                    file_sha256(file) != entries[name]["sha256"]
                ):
                    return None, f"{name}.npy differs from its manifest"
        except (OSError, ValueError, KeyError, TypeError) as e:
            return None, f"{MANIFEST} is unreadable ({e})"
    try:
        split = _load(path)
        _check_consistent(split)
    except (OSError, ValueError) as e:
        return None, str(e)
    if not os.path.exists(manifest):  # written before manifests: consistent, so adopt it
        with contextlib.suppress(OSError):
            _write_manifest(path)
    return split, ""


def _check_consistent(split: TokenizedSplit) -> None:
    """Offsets that start at 0, never decrease and end at the ids' length, on both sides."""
    if len(split.src_offsets) != len(split.tgt_offsets) or len(split.src_offsets) < 1:
        raise ValueError("source and target offsets differ in length")
    for ids, offsets in ((split.src_ids, split.src_offsets), (split.tgt_ids, split.tgt_offsets)):
        if offsets[0] != 0 or offsets[-1] != len(ids) or np.any(np.diff(offsets) < 0):
            raise ValueError("offsets do not match the ids")


def _abandoned(name: str, path: str) -> bool:
    """A temporary directory whose writer is gone: a dead pid on this host, or a day old."""
    head, pid, _ = (["", "", ""] + name.rsplit("-", 2))[-3:]  # .tmp-HOST, PID, random
    host = head.removeprefix(".tmp-")
    if host == socket.gethostname() and pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    return time.time() - os.stat(path).st_mtime > STALE_TMP_SECS


def _remove_stale_tmp(cache_dir: str) -> None:
    """Temporary directories of writers that died (a node lost mid-write): removed."""
    for name in os.listdir(cache_dir):
        tmp = os.path.join(cache_dir, name)
        with contextlib.suppress(OSError):
            if name.startswith(".tmp-") and _abandoned(name, tmp):
                logging.warning("removing %s, left by a tokenization that did not finish", tmp)
                shutil.rmtree(tmp, ignore_errors=True)
