"""Where sentence pairs come from: TFDS WMT, aligned text files, the built-in demo corpus, or
a treebank (parsing as translation, tx.data.trees).

Each source gives, per split ("train", "dev", "test"), a `ParallelText`: an iterable of
(source, target) strings in file order plus a fingerprint identifying its content, which keys
the token-id cache. Bad input raises `DataError` naming the file and line.

Text files are UTF-8, one sentence per line. A line ends at LF; a CR before it (Windows line
ends) and a UTF-8 byte order mark at the start of the file are not text and are dropped; a BOM
anywhere else, or a lone CR, is kept as a character. Invalid UTF-8 is an error naming the file,
the line and the byte offset, unless training text is read with `data.on_bad_line="skip"`: then
the pair is left out, and the pairs left out are counted in the log. Dev and test text has no
such option: scores on a test set with sentences missing are not comparable.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator

import ml_collections

from tx.data import demo_corpus
from tx.data import trees as parsing
from tx.data.settings import ON_BAD_LINE, SOURCES

SPLITS = ("train", "dev", "test")

# TFDS split names: WMT14 dev = newstest2013 and test = newstest2014, as in the paper.
TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test"}
DEMO_EVAL_SIZE = 500  # dev and test sentences of the demo corpus
UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


class DataError(ValueError):
    """Input data that cannot be used as it is; the message names the file and line."""


@dataclasses.dataclass
class ParallelText:
    """Aligned sentence pairs of one split; iterating yields (source, target) in order."""

    name: str
    fingerprint: str
    pairs: Callable[[], Iterator[tuple[str, str]]]
    # Where the text comes from, for run cards: files and their sha256, or the TFDS dataset
    # and version, or the generator's key.
    provenance: dict = dataclasses.field(default_factory=dict)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return self.pairs()


def load_split(data: ml_collections.ConfigDict, split: str) -> ParallelText:
    """The `split` of the source selected by `data.source`."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    if data.source == "demo":
        return demo_split(data, split)
    if data.source == "text":
        prefix = {"train": data.train_prefix, "dev": data.dev_prefix, "test": data.test_prefix}
        if not prefix[split]:
            raise DataError(f"data.{split}_prefix is not set (needed for data.source='text')")
        # Only training text may skip bad lines (None: no choice): dev and test are scored whole.
        on_bad_line = data.get("on_bad_line", "error") if split == "train" else None
        return text_split(prefix[split], data.src_lang, data.tgt_lang, on_bad_line)
    if data.source == "tfds":
        return tfds_split(data.tfds_name, split, data.src_lang, data.tgt_lang, data.tfds_data_dir)
    if data.source == "trees":
        return tree_split(_tree_pattern(data, split))
    *rest, last = map(repr, SOURCES)
    raise DataError(f"data.source must be {', '.join(rest)} or {last}, got {data.source!r}")


def demo_split(data: ml_collections.ConfigDict, split: str) -> ParallelText:
    # Configs written before demo_eval_size existed have no such key.
    size = data.demo_train_size if split == "train" else data.get("demo_eval_size", DEMO_EVAL_SIZE)
    seed = data.demo_seed
    key = f"demo-v{demo_corpus.VERSION}-seed{seed}-{split}-{size}"
    provenance = {"generator": key}
    return ParallelText(key, _sha(key), lambda: demo_corpus.generate(split, seed, size), provenance)


def text_split(
    prefix: str, src_lang: str, tgt_lang: str, on_bad_line: str | None = "error"
) -> ParallelText:
    """`<prefix>.<src_lang>` and `<prefix>.<tgt_lang>`: one sentence per line, aligned.

    Line counts are checked before anything is read further; see the module docstring for
    line ends, byte order marks and `on_bad_line` ("error", "skip", or None: an error, and
    skipping is not offered).
    """
    if on_bad_line not in (*ON_BAD_LINE, None):
        raise DataError(f"data.on_bad_line must be one of {ON_BAD_LINE}, got {on_bad_line!r}")
    src_path, tgt_path = f"{prefix}.{src_lang}", f"{prefix}.{tgt_lang}"
    for path in (src_path, tgt_path):
        if not os.path.isfile(path):
            raise DataError(f"data file not found: {path}")
        with open(path, "rb") as f:  # before counting lines: UTF-16 has other line ends
            _check_not_utf16(f.read(2), path)
    n_src, n_tgt = _count_lines(src_path), _count_lines(tgt_path)
    if n_src != n_tgt:
        raise DataError(f"line counts differ: {src_path} has {n_src} lines, {tgt_path} has {n_tgt}")
    if n_src == 0:
        raise DataError(f"{src_path} and {tgt_path} are empty")
    files = {path: file_sha256(path) for path in (src_path, tgt_path)}
    digest = "".join(files.values())
    # Skipping changes which pairs a cache holds: it must not share one with "error".
    fingerprint = _sha(digest + (":skip-bad-lines" if on_bad_line == "skip" else ""))

    def pairs():
        with open(src_path, "rb") as s, open(tgt_path, "rb") as t:
            yield from _aligned(decoded_lines(s, src_path), decoded_lines(t, tgt_path), on_bad_line)

    provenance = {"files_sha256": files, "on_bad_line": on_bad_line}
    return ParallelText(f"text:{prefix}", fingerprint, pairs, provenance)


def _tree_pattern(data: ml_collections.ConfigDict, split: str) -> str:
    pattern = {"train": data.train_prefix, "dev": data.dev_prefix, "test": data.test_prefix}[split]
    if not pattern:
        raise DataError(
            f"data.{split}_prefix is not set (data.source='trees': a treebank file or glob)"
        )
    return pattern


def tree_paths(pattern: str) -> list[str]:
    """The files a treebank pattern (a glob, or several separated by commas) names: each
    glob's matches in sorted order (WSJ's 02/wsj_0200.mrg, 02/wsj_0201.mrg, ...)."""
    paths = []
    for part in pattern.split(","):
        matches = sorted(p for p in glob.glob(part.strip()) if os.path.isfile(p))
        if not matches:
            raise DataError(f"no treebank file matches {part.strip()}")
        paths += [p for p in matches if p not in paths]
    return paths


def read_treebank(pattern: str) -> list[parsing.Tree]:
    """Every tree of the files `pattern` names, normalized (tx.data.trees); errors name the file."""
    paths = tree_paths(pattern)
    trees = []
    for path in paths:
        try:
            trees += parsing.read_trees(path)
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: invalid UTF-8 ({e.reason} at byte {e.start})") from None
        except ValueError as e:
            raise DataError(f"{path}: {e}") from None
    return trees


def tree_split(pattern: str) -> ParallelText:
    """Parsing as translation (the paper's Table 4): bracketed trees as (words, linearized
    tree) pairs, with tx.data.trees's linearization."""
    paths = tree_paths(pattern)
    files = {path: file_sha256(path) for path in paths}
    fingerprint = _sha(f"linearize-v{parsing.FORMAT}" + "".join(files.values()))

    def pairs():
        yield from parsing.to_pairs(read_treebank(pattern))

    return ParallelText(f"trees:{pattern}", fingerprint, pairs, {"files_sha256": files})


def gold_trees(data: ml_collections.ConfigDict, split: str) -> list[parsing.Tree]:
    """The `split`'s trees (data.source='trees'), for scoring parses against."""
    return read_treebank(_tree_pattern(data, split))


def _aligned(src, tgt, on_bad_line: str | None) -> Iterator[tuple[str, str]]:
    """Pairs of stripped lines; a pair with a bad side raises, or is skipped and counted."""
    skipped = []
    for (lineno, s, s_bad), (_, t, t_bad) in zip(src, tgt, strict=True):
        problem = s_bad or t_bad
        if problem is None:
            yield s.strip(), t.strip()
        elif on_bad_line is None:
            raise DataError(problem)
        elif on_bad_line == "error":
            raise DataError(f"{problem}; fix it, or set data.on_bad_line=skip to leave pairs out")
        else:
            if not skipped:
                logging.warning("data.on_bad_line=skip: leaving out %s", problem)
            skipped.append(lineno)
    if skipped:
        shown = ", ".join(map(str, skipped[:10])) + (", ..." if len(skipped) > 10 else "")
        logging.warning(
            "data.on_bad_line=skip: left out %d pair(s) with invalid UTF-8 (lines %s)",
            len(skipped),
            shown,
        )


def decoded_lines(f: Iterable[bytes], name: str) -> Iterator[tuple[int, str, str | None]]:
    """(line number, text, problem) for each line of the binary file `f` (named `name` in
    messages). `text` has no line end and no leading BOM; `problem` is None, or (text "") a
    one-line description of the invalid UTF-8 naming the line and its byte offset in the file.
    """
    offset = 0
    for lineno, raw in enumerate(f, 1):
        start = offset
        offset += len(raw)
        if lineno == 1:
            _check_not_utf16(raw, name)
            if raw.startswith(UTF8_BOM):
                raw, start = raw[len(UTF8_BOM) :], start + len(UTF8_BOM)
                if not raw:  # the file is a BOM and nothing else: no lines
                    return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            bad = raw[e.start : e.end]
            where = f"{name}:{lineno}: invalid UTF-8 at byte offset {start + e.start}"
            yield lineno, "", f"{where} ({e.reason}: {bad!r})"
            continue
        yield lineno, _strip_line_end(text), None


def _check_not_utf16(first: bytes, name: str) -> None:
    """A UTF-16 file is invalid UTF-8 from its first byte: say what it is instead."""
    if first.startswith(UTF16_BOMS):
        raise DataError(
            f"{name} starts with a UTF-16 byte order mark: tx reads UTF-8 "
            "(convert it, e.g. `iconv -f UTF-16 -t UTF-8`)"
        )


def _strip_line_end(text: str) -> str:
    if text.endswith("\n"):
        text = text[:-1]
    return text[:-1] if text.endswith("\r") else text


def read_lines(f: Iterable[bytes], name: str) -> list[str]:
    """Every line of `f` as text (see `decoded_lines`); DataError on the first invalid one."""
    lines = []
    for _, text, problem in decoded_lines(f, name):
        if problem is not None:
            raise DataError(problem)
        lines.append(text)
    return lines


def _count_lines(path: str) -> int:
    """Lines as `decoded_lines` reads them: a last line without LF counts, a BOM is no text."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        if f.read(len(UTF8_BOM)) != UTF8_BOM:
            f.seek(0)
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")  # a last line without a newline still counts


def file_sha256(path: str) -> str:
    """The hex sha256 of a file's bytes, read in blocks (source files, the token cache's)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 23):
            h.update(block)
    return h.hexdigest()


def tfds_split(
    name: str, split: str, src_lang: str, tgt_lang: str, data_dir: str | None = None
) -> ParallelText:
    """A TFDS translation dataset, e.g. "wmt14_translate/de-en" (downloaded on first use)."""
    import tensorflow_datasets as tfds

    pair = name.split("/")[-1].split("-")
    if {src_lang, tgt_lang} != set(pair):
        raise DataError(
            f"data.src_lang={src_lang!r} / data.tgt_lang={tgt_lang!r} do not match the language "
            f"pair of data.tfds_name={name!r}"
        )
    tfds_split_name = TFDS_SPLITS[split]
    key = f"tfds:{name}:{tfds_split_name}:{src_lang}-{tgt_lang}"

    def pairs():
        try:
            ds = tfds.load(name, split=tfds_split_name, data_dir=data_dir, shuffle_files=False)
        except Exception as e:  # noqa: BLE001 - TFDS raises many kinds; say which dataset failed
            raise DataError(
                f"cannot load TFDS dataset {name!r} split {tfds_split_name!r}: {e}"
            ) from e
        for ex in tfds.as_numpy(ds):
            yield ex[src_lang].decode("utf-8").strip(), ex[tgt_lang].decode("utf-8").strip()

    # TFDS data is versioned and immutable: its name, split and version identify the content.
    version = _tfds_version(name, data_dir)
    provenance = {"tfds": name, "tfds_split": tfds_split_name, "tfds_version": version}
    return ParallelText(key, _sha(f"{key}:{version}"), pairs, provenance)


def _tfds_version(name: str, data_dir: str | None) -> str:
    import tensorflow_datasets as tfds

    try:
        return str(tfds.builder(name, data_dir=data_dir).version)
    except Exception:  # noqa: BLE001 - an unknown version only weakens the cache key
        return "unknown"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
