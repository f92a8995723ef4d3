"""Tokenize once: token ids of a split cached on disk, keyed by data and vocabulary.

A cached split is a directory of four .npy files (memory-mapped on load):
  src_ids / tgt_ids: int32 [total tokens], every sentence's ids (ending in EOS) concatenated;
  src_offsets / tgt_offsets: int64 [n + 1], sentence i is ids[offsets[i]:offsets[i + 1]].
The directory name holds the source's fingerprint and the vocabulary's, so a changed file or
vocabulary never reuses stale ids. A manifest (each file's size and sha256) is written last:
a cache that is damaged (cut short, zeroed, replaced) is rebuilt with a warning naming it.

Locally a cache is written under a temporary name and renamed; temporary directories left by a
writer that died are removed, and a cache written before manifests existed is checked for
consistency (offsets against ids) and adopted. A bucket has no rename: the four files are
written at their final names and the manifest after them, so a prefix without a manifest is
one whose writer did not finish; it is never read, and rebuilt. Its files are memory-mapped
from copies in the local cache (tx.storage.local_copy, one per object version); a copy whose
sha256 matched the manifest is marked so (`<copy>.verified`), and later loads of the same
object version check its size only, not gigabytes of sha256 at every start.

`build=False` never tokenizes: a missing, incomplete or damaged cache raises NotPrepared.
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

from tx import storage
from tx.data.sources import NotPrepared, ParallelText, file_sha256
from tx.data.tokenizer import MappedTokenizer, Tokenizer

CHUNK = 20_000  # sentence pairs per worker task
FILES = ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
MANIFEST = "manifest.json"
INCOMPLETE = f"no {MANIFEST}: its writer did not finish"
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
    corpus_sizes = ()  # one corpus (JoinedSplit: each corpus's pairs)

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
    text: ParallelText,
    tokenizer: Tokenizer,
    cache_dir: str,
    num_workers: int = 0,
    build: bool = True,
    name: str | None = None,
) -> TokenizedSplit:
    """The cached ids of `text` under `cache_dir` (a directory or a bucket's prefix),
    tokenizing (in `num_workers` processes) on first use. `build=False` raises NotPrepared
    (naming `name`, default the text's name, and the cache's path) instead of tokenizing."""
    path = storage.join(cache_dir, f"{text.fingerprint}-{tokenizer.fingerprint[:16]}")
    damage = ""
    if storage.isdir(path):
        split, damage = _load_checked(path)
        if split is not None:
            return _with_source(split, text)
    if not build:
        problem = f"is {'incomplete' if damage == INCOMPLETE else 'damaged'} ({damage})"
        raise NotPrepared(name or text.name, path, problem if damage else "is missing")
    if damage:
        state = "incomplete" if damage == INCOMPLETE else "damaged"
        logging.warning("token cache %s is %s (%s): rebuilding it", path, state, damage)
        storage.rmtree(path)
    storage.makedirs(cache_dir)
    if not storage.is_remote(cache_dir):
        _remove_stale_tmp(cache_dir)
    workers = num_workers or os.cpu_count() or 1
    logging.info("tokenizing %s with %d process(es) into %s", text.name, workers, path)
    results = _encode_all(text, tokenizer, workers)
    (_write_remote if storage.is_remote(path) else _write)(path, results)
    return _with_source(_load(path), text)


@dataclasses.dataclass
class JoinedSplit:
    """Several corpora's token ids read as one split, in order (pair i of the second follows
    the last of the first), as TokenizedSplit is read: nothing is copied (each part stays
    memory-mapped from its own cache). `source` names each corpus with its pairs."""

    parts: tuple[TokenizedSplit, ...]
    source: dict

    def __post_init__(self):
        self._starts = np.cumsum([0] + [len(p) for p in self.parts])

    @property
    def corpus_sizes(self) -> tuple[int, ...]:
        return tuple(len(p) for p in self.parts)

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def src_lengths(self) -> np.ndarray:
        return np.concatenate([p.src_lengths for p in self.parts])

    @property
    def tgt_lengths(self) -> np.ndarray:
        return np.concatenate([p.tgt_lengths for p in self.parts])

    def _where(self, i: int) -> tuple[TokenizedSplit, int]:
        c = int(np.searchsorted(self._starts, i, side="right")) - 1
        return self.parts[c], i - int(self._starts[c])

    def src(self, i: int) -> np.ndarray:
        part, j = self._where(i)
        return part.src(j)

    def tgt(self, i: int) -> np.ndarray:
        part, j = self._where(i)
        return part.tgt(j)


def joined(parts: list[TokenizedSplit]) -> TokenizedSplit | JoinedSplit:
    """Several corpora's cached ids as one split (`JoinedSplit`); one part is itself."""
    if len(parts) == 1:
        return parts[0]
    corpora = [{**p.source, "pairs": len(p)} for p in parts]
    name = " + ".join(str(p.source.get("name", "?")) for p in parts)
    return JoinedSplit(tuple(parts), {"name": name, "corpora": corpora})


def _with_source(split: TokenizedSplit, text: ParallelText) -> TokenizedSplit:
    split.source = {"name": text.name, "fingerprint": text.fingerprint, **text.provenance}
    return split


def _encode_all(text: ParallelText, tokenizer: Tokenizer, workers: int):
    chunks = _chunked(iter(text), CHUNK)
    if workers == 1:
        return [_encode_chunk_with(tokenizer, c) for c in chunks]
    # spawn, not fork: the parent may already run JAX or TensorFlow threads.
    ctx = multiprocessing.get_context("spawn")
    # The tokenizer pickles with its files' bytes: the workers read nothing (a bucket's
    # object included).
    with ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer,)) as pool:
        return list(pool.imap(_encode_chunk, chunks))


def _chunked(it, n):
    while chunk := list(itertools.islice(it, n)):
        yield chunk


_WORKER_TOKENIZER: Tokenizer | MappedTokenizer | None = None


def _init_worker(tokenizer: Tokenizer | MappedTokenizer) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer


def _encode_chunk(chunk):
    return _encode_chunk_with(_WORKER_TOKENIZER, chunk)


def _encode_chunk_with(tokenizer: Tokenizer, chunk):
    """Ids of a chunk as compact arrays: (src ids, src lengths, tgt ids, tgt lengths)."""
    src = tokenizer.encode_batch([s for s, _ in chunk])
    tgt = tokenizer.encode_batch([t for _, t in chunk], target=True)
    return (*_flatten(src), *_flatten(tgt))


def _flatten(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(s) for s in seqs), np.int64, len(seqs))
    flat = np.fromiter(itertools.chain.from_iterable(seqs), np.int32, int(lengths.sum()))
    return flat, lengths


def _save_arrays(directory: str, results) -> None:
    for name, k in (("src", 0), ("tgt", 2)):
        ids = np.concatenate([r[k] for r in results] or [np.zeros(0, np.int32)])
        lengths = np.concatenate([r[k + 1] for r in results] or [np.zeros(0, np.int64)])
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        np.save(os.path.join(directory, f"{name}_ids.npy"), ids)
        np.save(os.path.join(directory, f"{name}_offsets.npy"), offsets)


def _write(path: str, results) -> None:
    """Locally: a temporary directory beside `path`, renamed into place once whole."""
    # The writer's host and pid in the name: its leftovers are known as such once it is gone.
    prefix = f".tmp-{socket.gethostname()}-{os.getpid()}-"
    tmp = tempfile.mkdtemp(dir=os.path.dirname(path), prefix=prefix)
    try:
        _save_arrays(tmp, results)
        _write_manifest(tmp)  # last: a directory with a manifest was written whole
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(path):  # another process may have written the same cache
            raise


def _write_remote(path: str, results) -> None:
    """On a bucket, which has no rename: each file written whole at its final name (from a
    local temporary directory), then the manifest, last."""
    os.makedirs(storage.cache_dir(), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=storage.cache_dir(), prefix=".token-cache-") as tmp:
        _save_arrays(tmp, results)
        entries = _manifest_entries(tmp)
        for name in FILES:
            with open(os.path.join(tmp, f"{name}.npy"), "rb") as f:
                storage.write_bytes(storage.join(path, f"{name}.npy"), f.read())
        storage.write_text(storage.join(path, MANIFEST), json.dumps(entries, indent=2))


def _load(path: str) -> TokenizedSplit:
    return _load_files({n: storage.local_copy(storage.join(path, f"{n}.npy")) for n in FILES})


def _load_files(files: dict[str, str]) -> TokenizedSplit:
    return TokenizedSplit(**{name: np.load(files[name], mmap_mode="r") for name in FILES})


def _manifest_entries(directory: str) -> dict:
    entries = {}
    for name in FILES:
        file = os.path.join(directory, f"{name}.npy")
        entries[name] = {"bytes": os.path.getsize(file), "sha256": file_sha256(file)}
    return entries


def _write_manifest(path: str) -> None:
    storage.write_text(os.path.join(path, MANIFEST), json.dumps(_manifest_entries(path), indent=2))


def _load_checked(path: str) -> tuple[TokenizedSplit | None, str]:
    """The split at `path` if its files are whole, else (None, what is wrong). A bucket's
    read failing (other than a missing object) is raised, not taken for damage."""
    remote = storage.is_remote(path)
    manifest = storage.join(path, MANIFEST)
    files = {name: storage.join(path, f"{name}.npy") for name in FILES}
    has_manifest = storage.exists(manifest)
    if has_manifest:
        try:
            entries = json.loads(storage.read_text(manifest))
            for name in FILES:
                try:
                    files[name] = storage.local_copy(files[name])
                    whole = _matches(files[name], entries[name], remote)
                except FileNotFoundError:
                    return None, f"{name}.npy is missing"
                if not whole:
                    return None, f"{name}.npy differs from its manifest"
        except (ValueError, KeyError, TypeError) as e:
            return None, f"{MANIFEST} is unreadable ({e})"
        except OSError as e:
            if remote:
                raise
            return None, f"{MANIFEST} is unreadable ({e})"
    elif remote:
        return None, INCOMPLETE
    try:
        split = _load_files(files)
        _check_consistent(split)
    except (OSError, ValueError) as e:
        return None, str(e)
    if not has_manifest:  # written before manifests (locally): consistent, so adopt it
        with contextlib.suppress(OSError):
            _write_manifest(path)
    return split, ""


def _matches(file: str, entry: dict, remote: bool) -> bool:
    """Whether a local file has the manifest entry's size and sha256. A bucket's object's
    copy (named by the object's version) is hashed once: `<copy>.verified` then holds the
    sha256 it matched, and only the size is compared again."""
    if os.path.getsize(file) != entry["bytes"]:
        return False
    marker = file + ".verified"
    if remote and os.path.exists(marker) and storage.read_text(marker) == entry["sha256"]:
        return True
    if file_sha256(file) != entry["sha256"]:
        return False
    if remote:
        with contextlib.suppress(OSError):  # only saves hashing it again
            storage.write_text(marker, entry["sha256"])
    return True


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
