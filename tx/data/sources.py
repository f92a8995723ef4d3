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

Any path may be local or in a bucket (gs://, s3://; read through tx.storage). A bucket's source
object is read whole once per version: its sha256 and line count are recorded beside the run's
token caches (`records`, keyed by the object's version and size) and reused by every later load,
so that the processes of a pod do not each read the training text at every start. A
`tfds_data_dir` in a bucket and the sacreBLEU check of dev and test files: tx.data.external.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator

import ml_collections

from tx import storage
from tx.data import external
from tx.data import trees as parsing
from tx.data.settings import ON_BAD_LINE, SOURCES, train_prefixes

SPLITS = ("train", "dev", "test", "dev2")  # dev2: data.source='text' only (data.dev2_prefix)

# TFDS split names: WMT14 dev = newstest2013 and test = newstest2014, as in the paper.
TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test"}
DEMO_EVAL_SIZE = 500  # dev and test sentences of the demo corpus
UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


class DataError(ValueError):
    """Input data that cannot be used as it is; the message names the file and line."""


class NotPrepared(DataError):
    """What a load with `build=False` found missing or damaged instead of building it: `what`
    (e.g. "the train split", "the vocabulary"), `path` (the file, object or cache) and
    `problem` ("is missing", ...). The message is "<what> is not prepared: <path> <problem>"."""

    def __init__(self, what: str, path: str, problem: str = "is missing"):
        self.what, self.path, self.problem = what, path, problem
        super().__init__(f"{what} is not prepared: {path} {problem}")


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


def load_split(
    data: ml_collections.ConfigDict, split: str, records: str | None = None, build: bool = True
) -> ParallelText:
    """The `split` of the source selected by `data.source`.

    `records`: the directory where the sha256 and line counts of a bucket's source objects are
    recorded (tx.data.dataset gives the run's `W/data/sources`); None reads them each time.
    `build=False`: a bucket's object without a record for its version raises NotPrepared
    instead of being read, and sacreBLEU's test sets are not fetched (the preparing run
    checked them; the token cache it wrote is keyed by the sha256 it checked).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    try:
        return _load_split(data, split, records, build)
    except NotPrepared as e:
        raise NotPrepared(f"the {split} split", e.path, e.problem) from None


def _load_split(data, split: str, records: str | None, build: bool) -> ParallelText:
    if data.source == "demo":
        return demo_split(data, split)
    if data.source == "text" and split == "train":
        return joined(train_corpora(data, records, build))
    if data.source == "text":
        prefix = {"dev": data.dev_prefix, "test": data.test_prefix, "dev2": data.get("dev2_prefix")}
        if not prefix[split]:
            raise DataError(f"data.{split}_prefix is not set (needed for data.source='text')")
        # Only training text may skip bad lines (None: no choice): dev and test are scored whole.
        text = text_split(
            prefix[split], data.src_lang, data.tgt_lang, None, records=records, build=build
        )
        key = f"sacrebleu_{split}_set"
        if build and data.get(key):  # dev or test: the files are sacreBLEU's test set
            pair = f"{data.src_lang}-{data.tgt_lang}"
            problem = external.sacrebleu_mismatch(
                text.provenance["files_sha256"], data[key], pair, key
            )
            if problem:
                raise DataError(problem)
        return text
    if split == "dev2":
        raise DataError(f"data.dev2_prefix names text files: data.source is {data.source!r}")
    if data.source == "tfds":
        return tfds_split(data.tfds_name, split, data.src_lang, data.tgt_lang, data.tfds_data_dir)
    if data.source == "trees":
        return tree_split(_tree_pattern(data, split), records=records, build=build)
    *rest, last = map(repr, SOURCES)
    raise DataError(f"data.source must be {', '.join(rest)} or {last}, got {data.source!r}")


def train_corpora(
    data: ml_collections.ConfigDict, records: str | None = None, build: bool = True
) -> list[ParallelText]:
    """The training corpora of data.source='text', one per prefix of data.train_prefix (the
    corpora data.train_weights weighs), in its order."""
    prefixes = train_prefixes(data.train_prefix)
    if not prefixes:
        raise DataError("data.train_prefix is not set (needed for data.source='text')")
    on_bad_line = data.get("on_bad_line", "error")
    return [
        text_split(p, data.src_lang, data.tgt_lang, on_bad_line, records=records, build=build)
        for p in prefixes
    ]


def joined(texts: list[ParallelText]) -> ParallelText:
    """Several corpora read as one, in order (the vocabulary learns from all of them); one
    corpus is itself."""
    if len(texts) == 1:
        return texts[0]

    def pairs():
        for text in texts:
            yield from text

    fingerprint = _sha(":".join(t.fingerprint for t in texts))
    provenance = {"corpora": [{"name": t.name, **t.provenance} for t in texts]}
    return ParallelText(" + ".join(t.name for t in texts), fingerprint, pairs, provenance)


def demo_split(data: ml_collections.ConfigDict, split: str) -> ParallelText:
    # Imported here: its number-word tables (num2words, a slow import) only for the demo corpus.
    from tx.data import demo_corpus

    # Configs written before demo_eval_size existed have no such key.
    size = data.demo_train_size if split == "train" else data.get("demo_eval_size", DEMO_EVAL_SIZE)
    seed = data.demo_seed
    key = f"demo-v{demo_corpus.VERSION}-seed{seed}-{split}-{size}"
    provenance = {"generator": key}
    return ParallelText(key, _sha(key), lambda: demo_corpus.generate(split, seed, size), provenance)


def text_split(
    prefix: str,
    src_lang: str,
    tgt_lang: str,
    on_bad_line: str | None = "error",
    records: str | None = None,
    build: bool = True,
) -> ParallelText:
    """`<prefix>.<src_lang>` and `<prefix>.<tgt_lang>`: one sentence per line, aligned.

    Line counts are checked before anything is read further; see the module docstring for
    line ends, byte order marks and `on_bad_line` ("error", "skip", or None: an error, and
    skipping is not offered), and `scan` for `records` and `build`.
    """
    if on_bad_line not in (*ON_BAD_LINE, None):
        raise DataError(f"data.on_bad_line must be one of {ON_BAD_LINE}, got {on_bad_line!r}")
    src_path, tgt_path = f"{prefix}.{src_lang}", f"{prefix}.{tgt_lang}"
    scans = {}
    for path in (src_path, tgt_path):
        if not storage.isfile(path):
            raise DataError(f"data file not found: {path}")
        scans[path] = scan(path, records, build)
    n_src, n_tgt = scans[src_path]["lines"], scans[tgt_path]["lines"]
    if n_src != n_tgt:
        raise DataError(f"line counts differ: {src_path} has {n_src} lines, {tgt_path} has {n_tgt}")
    if n_src == 0:
        raise DataError(f"{src_path} and {tgt_path} are empty")
    files = {path: scans[path]["sha256"] for path in (src_path, tgt_path)}
    digest = "".join(files.values())
    # Skipping changes which pairs a cache holds: it must not share one with "error".
    fingerprint = _sha(digest + (":skip-bad-lines" if on_bad_line == "skip" else ""))

    def pairs():
        with storage.open_read(src_path) as s, storage.open_read(tgt_path) as t:
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
    """The files a treebank pattern (a glob, or several separated by commas; local or in a
    bucket) names: each glob's matches in sorted order (WSJ's 02/wsj_0200.mrg, ...)."""
    paths = []
    for part in pattern.split(","):
        matches = storage.glob_files(part.strip())
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


def tree_split(pattern: str, records: str | None = None, build: bool = True) -> ParallelText:
    """Parsing as translation (the paper's Table 4): bracketed trees as (words, linearized
    tree) pairs, with tx.data.trees's linearization (`records`, `build`: see `scan`)."""
    paths = tree_paths(pattern)
    files = {path: scan(path, records, build)["sha256"] for path in paths}
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


def scan(path: str, records: str | None = None, build: bool = True) -> dict:
    """{"sha256": hex, "lines": n} of a source file, read once: the UTF-16 check, the lines
    as `decoded_lines` reads them (a last line without LF counts, a leading BOM is no text)
    and the sha256 of its bytes.

    A bucket's object with `records` (a directory) is read once per version: the result is
    recorded there, keyed by the object's path, version (GCS generation, S3 ETag) and size,
    and reused while they hold. `build=False` raises NotPrepared for an object without such a
    record instead of reading it. Local files are read each time, as are objects without
    `records`.
    """
    if records is None or not storage.is_remote(path):
        return _scan(path)
    record = storage.join(records, hashlib.sha256(path.encode()).hexdigest()[:32] + ".json")
    version, size = storage.version(path), storage.size(path)
    key = {"path": path, "version": version, "bytes": size}
    with contextlib.suppress(FileNotFoundError, ValueError, TypeError):
        saved = json.loads(storage.read_text(record))
        if {k: saved.get(k) for k in key} == key:
            return {"sha256": saved["sha256"], "lines": saved["lines"]}
    if not build:
        raise NotPrepared("the data", path, f"(version {version}) has no record in {records}")
    result = _scan(path)
    if storage.version(path) == version:  # not replaced while it was read
        storage.write_text(record, json.dumps(key | result, indent=2))
    return result


def _scan(path: str) -> dict:
    h, n, last = hashlib.sha256(), 0, b"\n"
    with storage.open_read(path) as f:
        first = f.read(1 << 23)
        _check_not_utf16(first, path)  # before counting lines: UTF-16 has other line ends
        h.update(first)
        chunk = first.removeprefix(UTF8_BOM)
        while chunk:
            n += chunk.count(b"\n")
            last = chunk[-1:]
            chunk = f.read(1 << 23)
            h.update(chunk)
    return {"sha256": h.hexdigest(), "lines": n + (last != b"\n")}


def file_sha256(path: str) -> str:
    """The hex sha256 of a file's or object's bytes, read in blocks (the token cache's)."""
    return storage.sha256(path)


def tfds_split(
    name: str, split: str, src_lang: str, tgt_lang: str, data_dir: str | None = None
) -> ParallelText:
    """A TFDS translation dataset, e.g. "wmt14_translate/de-en" (downloaded on first use;
    `data_dir` local or in a bucket: tx.data.external)."""
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
            ds = external.tfds_load(name, tfds_split_name, data_dir)
        except Exception as e:  # noqa: BLE001 - TFDS raises many kinds; say which dataset failed
            raise DataError(
                f"cannot load TFDS dataset {name!r} split {tfds_split_name!r}: {e}"
            ) from e
        for ex in tfds.as_numpy(ds):
            yield ex[src_lang].decode("utf-8").strip(), ex[tgt_lang].decode("utf-8").strip()

    # TFDS data is versioned and immutable: its name, split and version identify the content.
    version = external.tfds_version(name, data_dir)
    provenance = {"tfds": name, "tfds_split": tfds_split_name, "tfds_version": version}
    return ParallelText(key, _sha(f"{key}:{version}"), pairs, provenance)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
