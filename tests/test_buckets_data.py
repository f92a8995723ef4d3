"""The data wing on buckets (tests/object_store.py's GCS and S3 servers): text sources read
from a bucket, the vocabulary and token caches written into a workdir in a bucket, damaged
or unfinished caches rebuilt, `build=False` naming what is not prepared, treebank globs,
TFDS's prepared directory mirrored, and dev/test files checked against sacreBLEU's."""

from __future__ import annotations

import importlib.resources
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
from object_store import point_at

from tx import storage
from tx.data import dataset, demo_corpus, external, sources, token_cache, vocabulary
from tx.data.tokenizer import Tokenizer, VocabularyError

SIZES = {"train": 1000, "dev": 40, "test": 40}


def write_corpus(prefix: str) -> dict[str, str]:
    """Demo pairs as text files `<prefix>/<split>.en|de`; the prefixes by split."""
    prefixes = {}
    for split, n in SIZES.items():
        pairs = list(demo_corpus.generate(split, 0, n))
        prefixes[split] = storage.join(prefix, split)
        for side, lang in enumerate(("en", "de")):
            text = "".join(pair[side] + "\n" for pair in pairs)
            storage.write_text(f"{prefixes[split]}.{lang}", text)
    return prefixes


def text_config(tiny, prefixes: dict[str, str], *overrides: str):
    return tiny(
        "data.source=text",
        *(f"data.{split}_prefix={prefix}" for split, prefix in prefixes.items()),
        *overrides,
    )


def caches(workdir: str) -> list[str]:
    data = storage.join(workdir, "data")
    return [storage.join(data, d) for d in storage.listdir(data) if d not in ("sources",)]


def arrays(split) -> list[np.ndarray]:
    return [np.array(getattr(split, name)) for name in token_cache.FILES]


@pytest.fixture
def bucket_run(bucket, tiny, tmp_path, monkeypatch):
    """(config, workdir, tokenizer, train ids): a text corpus in the bucket, a vocabulary and
    the train split's token cache built into a workdir in the bucket; a local cache of its own."""
    monkeypatch.setenv("TX_CACHE_DIR", str(tmp_path / "cache"))
    cfg = text_config(tiny, write_corpus(storage.join(bucket, "corpus")))
    workdir = storage.join(bucket, "run")
    tokenizer = vocabulary.obtain(cfg.data, workdir)
    ids = dataset.split_ids(cfg.data, workdir, tokenizer, "train")
    return cfg, workdir, tokenizer, ids


def test_a_corpus_in_a_bucket_is_prepared_into_a_workdir_in_the_bucket(
    bucket_run, tmp_path, monkeypatch
):
    cfg, workdir, tokenizer, ids = bucket_run
    assert storage.isfile(storage.join(workdir, "spm.model")) and tokenizer.vocab_size == 300
    (cache,) = caches(workdir)
    names = storage.listdir(cache)
    assert names == sorted([token_cache.MANIFEST, *(f"{n}.npy" for n in token_cache.FILES)])
    assert len(ids) == SIZES["train"]
    src, _ = next(iter(sources.load_split(cfg.data, "train")))
    assert list(ids.src(0)) == tokenizer.encode(src)
    # The sources' sha256 and line counts are recorded beside the caches ...
    records = storage.listdir(storage.join(workdir, "data", "sources"))
    assert len(records) == 2
    provenance = ids.source["files_sha256"]
    assert provenance == {p: storage.sha256(p) for p in provenance}
    # ... so a second load (another process, a fresh local cache) reads no text whole and
    # tokenizes nothing; with build=False as well.
    monkeypatch.setenv("TX_CACHE_DIR", str(tmp_path / "another-cache"))
    monkeypatch.setattr(sources, "_scan", lambda path: pytest.fail(f"read {path} whole"))
    monkeypatch.setattr(Tokenizer, "encode_batch", lambda *a: pytest.fail("re-tokenized"))
    for build in (True, False):
        tok = vocabulary.obtain(cfg.data, workdir, build=build)
        again = dataset.split_ids(cfg.data, workdir, tok, "train", build=build)
        for a, b in zip(arrays(ids), arrays(again), strict=True):
            np.testing.assert_array_equal(a, b)
    assert again.source == ids.source


def test_a_verified_local_copy_is_not_hashed_again(bucket_run, monkeypatch):
    cfg, workdir, tokenizer, _ = bucket_run
    dataset.split_ids(cfg.data, workdir, tokenizer, "train")  # copies hashed once here
    monkeypatch.setattr(token_cache, "file_sha256", lambda path: pytest.fail(f"hashed {path}"))
    dataset.split_ids(cfg.data, workdir, tokenizer, "train")


@pytest.mark.parametrize("damage", ["cut_short", "replaced"])
def test_a_damaged_cache_object_is_rebuilt_with_a_warning(bucket_run, damage, caplog):
    cfg, workdir, tokenizer, ids = bucket_run
    want = arrays(ids)
    (cache,) = caches(workdir)
    target = storage.join(cache, "tgt_ids.npy")
    data = storage.read_bytes(target)
    storage.write_bytes(target, data[:-28] if damage == "cut_short" else bytes(len(data)))
    with pytest.raises(sources.NotPrepared, match="the train split is not prepared: .* damaged"):
        dataset.split_ids(cfg.data, workdir, tokenizer, "train", build=False)
    with caplog.at_level(logging.WARNING):
        got = dataset.split_ids(cfg.data, workdir, tokenizer, "train")
    assert f"token cache {cache} is damaged (tgt_ids.npy differs from its manifest)" in caplog.text
    for a, b in zip(want, arrays(got), strict=True):
        np.testing.assert_array_equal(a, b)
    assert storage.read_bytes(target) == data


def test_a_prefix_without_a_manifest_is_never_read_and_is_rebuilt(bucket_run, caplog):
    cfg, workdir, tokenizer, ids = bucket_run
    (cache,) = caches(workdir)
    manifest = storage.join(cache, token_cache.MANIFEST)
    storage.remove(manifest)  # as a writer that died before its last write leaves it
    with pytest.raises(sources.NotPrepared, match=f"{cache} is incomplete"):
        dataset.split_ids(cfg.data, workdir, tokenizer, "train", build=False)
    with caplog.at_level(logging.WARNING):
        got = dataset.split_ids(cfg.data, workdir, tokenizer, "train")
    assert f"token cache {cache} is incomplete (no manifest.json" in caplog.text
    assert storage.exists(manifest)
    np.testing.assert_array_equal(np.array(got.tgt_ids), np.array(ids.tgt_ids))


def test_a_damaged_vocabulary_in_a_bucket_is_refused_by_name(bucket_run):
    _, workdir, tokenizer, _ = bucket_run
    vocabulary.record(workdir, tokenizer)  # records vocab.sha256, as train does
    path = storage.join(workdir, "spm.model")
    storage.write_bytes(path, storage.read_bytes(path)[:100])
    with pytest.raises(VocabularyError, match=f"{path} is damaged or replaced"):
        vocabulary.run_tokenizer(workdir)
    assert storage.exists(path)  # never deleted


def test_vocab_path_in_a_bucket(bucket, vocab, tiny, tmp_path):
    given = storage.join(bucket, "shared", "spm.model")
    with open(vocab, "rb") as f:
        storage.write_bytes(given, f.read())
    for workdir in (str(tmp_path / "run"), storage.join(bucket, "run")):
        tok = vocabulary.obtain(tiny(f"data.vocab_path={given}").data, workdir)
        assert tok.fingerprint == Tokenizer(vocab).fingerprint
        assert storage.read_bytes(storage.join(workdir, "spm.model")) == tok.model_bytes


# s3 under -m slow here: the data's reads and writes reach both schemes through tx.storage,
# whose primitives tests/test_storage.py runs on both servers by default.
@pytest.fixture(params=["gs", pytest.param("s3", marks=pytest.mark.slow)])
def bucket(request, monkeypatch):
    """conftest's bucket, with s3 under -m slow."""
    return point_at(request, monkeypatch, request.param)


@pytest.fixture(params=["local", "gs", pytest.param("s3", marks=pytest.mark.slow)])
def where(request, tmp_path, monkeypatch):
    """A directory: local, or a fresh prefix of a bucket on the session's server."""
    monkeypatch.setenv("TX_CACHE_DIR", str(tmp_path / "cache"))
    if request.param == "local":
        return str(tmp_path / "here")
    return point_at(request, monkeypatch, request.param)


def test_build_false_names_what_is_not_prepared(where, vocab, tiny):
    workdir = storage.join(where, "run")
    cfg = tiny(f"data.vocab_path={vocab}")  # the demo source: no files to record
    with pytest.raises(sources.NotPrepared) as e:
        vocabulary.obtain(cfg.data, workdir, build=False)
    path = storage.join(workdir, "spm.model")
    assert str(e.value) == f"the vocabulary is not prepared: {path} is missing"
    assert (e.value.what, e.value.path) == ("the vocabulary", path)
    assert not storage.exists(path)  # build=False wrote nothing
    tok = vocabulary.obtain(cfg.data, workdir)
    with pytest.raises(sources.NotPrepared, match="the dev split is not prepared: .* is missing"):
        dataset.split_ids(cfg.data, workdir, tok, "dev", build=False)
    assert storage.listdir(storage.join(workdir, "data")) == []
    dataset.split_ids(cfg.data, workdir, tok, "dev")
    assert len(dataset.split_ids(cfg.data, workdir, tok, "dev", build=False)) == 50


def test_build_false_does_not_read_a_source_object_without_its_record(where, vocab, tiny):
    prefixes = write_corpus(storage.join(where, "corpus"))
    cfg = text_config(tiny, prefixes, f"data.vocab_path={vocab}")
    workdir = storage.join(where, "run")
    tok = vocabulary.obtain(cfg.data, workdir)
    if not storage.is_remote(where):  # local files are read each time: only the cache misses
        with pytest.raises(sources.NotPrepared, match="the dev split is not prepared: .*missing"):
            dataset.split_ids(cfg.data, workdir, tok, "dev", build=False)
        return
    with pytest.raises(sources.NotPrepared) as e:
        dataset.split_ids(cfg.data, workdir, tok, "dev", build=False)
    assert e.value.path == f"{prefixes['dev']}.en" and e.value.what == "the dev split"
    assert "has no record in" in str(e.value)
    # Several training corpora (data.train_prefix with commas): named as the train split too.
    both = f"data.train_prefix={prefixes['train']},{prefixes['test']}"
    cfg = text_config(tiny, prefixes, f"data.vocab_path={vocab}", both)
    with pytest.raises(sources.NotPrepared) as e:
        dataset.split_ids(cfg.data, workdir, tok, "train", build=False)
    assert e.value.path == f"{prefixes['train']}.en" and e.value.what == "the train split"
    dataset.split_ids(cfg.data, workdir, tok, "dev")
    # A source object rewritten since (a new version) is not prepared either.
    de = f"{prefixes['dev']}.de"
    storage.write_text(de, storage.read_text(de).replace("e", "E", 1))
    with pytest.raises(sources.NotPrepared, match=f"{de} \\(version"):
        dataset.split_ids(cfg.data, workdir, tok, "dev", build=False)


def test_text_checks_are_the_same_on_a_bucket(bucket):
    prefix = storage.join(bucket, "t")
    storage.write_bytes(f"{prefix}.en", b"\xef\xbb\xbfone\r\ntwo\n")
    storage.write_bytes(f"{prefix}.de", b"eins\nzwei")
    assert list(sources.text_split(prefix, "en", "de")) == [("one", "eins"), ("two", "zwei")]
    storage.write_bytes(f"{prefix}.de", b"\xff\xfee\x00")
    with pytest.raises(sources.DataError, match=f"{prefix}.de starts with a UTF-16 byte order"):
        sources.text_split(prefix, "en", "de")
    storage.write_bytes(f"{prefix}.de", b"eins\nzw\xffei\n")
    with pytest.raises(sources.DataError, match=f"{prefix}.de:2: invalid UTF-8 at byte offset 7"):
        list(sources.text_split(prefix, "en", "de"))
    storage.write_bytes(f"{prefix}.de", b"eins\n")
    with pytest.raises(sources.DataError, match=f"{prefix}.en has 2 lines, {prefix}.de has 1"):
        sources.text_split(prefix, "en", "de")
    with pytest.raises(sources.DataError, match=f"data file not found: {prefix}.fr"):
        sources.text_split(prefix, "en", "fr")


def test_treebank_globs_in_a_bucket(bucket):
    trees = {
        "02/wsj_0201.mrg": "(S (NP (DT The) (NN cat)) (VP (VBD sat)))\r\n",
        "02/wsj_0200.mrg": "( (S (NP (PRP He)) (VP (VBD ran)) (. .)) )\n",
        "03/wsj_0300.mrg": "(S (VB Go))\n",
    }
    for rel, text in trees.items():
        storage.write_text(storage.join(bucket, "wsj", *rel.split("/")), text)
    pattern = storage.join(bucket, "wsj", "02", "*.mrg")
    assert sources.tree_paths(pattern) == [
        storage.join(bucket, "wsj", "02", f"wsj_020{i}.mrg") for i in (0, 1)
    ]
    pairs = list(sources.tree_split(pattern))
    assert pairs == [
        ("He ran .", "(S (NP XX )NP (VP XX )VP XX )S"),
        ("The cat sat", "(S (NP XX XX )NP (VP XX )VP )S"),
    ]
    with pytest.raises(sources.DataError, match="no treebank file matches .*/04/"):
        sources.tree_paths(storage.join(bucket, "wsj", "04", "*.mrg"))


def test_a_tfds_data_dir_in_a_bucket_is_mirrored_and_shared(bucket, tmp_path, monkeypatch):
    """TFDS prepares into the local cache and the prepared directory goes up to the bucket
    (dataset_info.json last); another machine (another cache) mirrors it and reads it."""
    tfds = pytest.importorskip("tensorflow_datasets")
    # tensorflow-datasets 4.9.10 imports importlib_resources to prepare any dataset but
    # requires it only on Python < 3.9: the standard library's module stands in.
    monkeypatch.setitem(sys.modules, "importlib_resources", importlib.resources)
    name = "dummy_dataset"
    monkeypatch.setenv("TX_CACHE_DIR", str(tmp_path / "first"))
    assert not external.mirror_tfds(name, bucket)
    local = external.tfds_local_dir(bucket)
    assert local.startswith(str(tmp_path / "first"))
    tfds.testing.DummyDataset(data_dir=local).download_and_prepare()
    want = _tfds_ids(tfds, name, local)
    external.share_tfds(name, bucket)
    uploaded = storage.walk_files(storage.join(bucket, name))
    assert any(f.endswith("/dataset_info.json") for f in uploaded) and len(uploaded) > 2
    monkeypatch.setenv("TX_CACHE_DIR", str(tmp_path / "second"))
    assert external.mirror_tfds(name, bucket)
    mirror = external.tfds_local_dir(bucket)
    assert mirror.startswith(str(tmp_path / "second"))
    assert _tfds_ids(tfds, name, mirror) == want and len(want) > 1


def test_tfds_split_with_a_data_dir_in_a_bucket(bucket, tmp_path, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    monkeypatch.setenv("TX_CACHE_DIR", str(tmp_path / "cache"))
    with tfds.testing.mock_data(num_examples=5):
        text = sources.tfds_split("wmt14_translate/de-en", "dev", "en", "de", data_dir=bucket)
        assert len(list(text)) == 5
    assert text.provenance["tfds_version"] != "unknown"
    assert storage.walk_files(bucket) == []  # nothing was prepared, so nothing uploaded


def _tfds_ids(tfds, name: str, data_dir: str) -> list[int]:
    ds = tfds.load(name, split="train", data_dir=data_dir, download=False)
    return sorted(int(ex["id"]) for ex in tfds.as_numpy(ds))


SACREBLEU_CHECK = """
import sys
from tx.config import load_config
from tx.data import sources
cfg = load_config(sys.argv[1], sys.argv[2:])
for split in ("dev", "test"):
    try:
        sources.load_split(cfg.data, split)
        print(split, "ok")
    except sources.DataError as e:
        print(split, "refused:", e)
"""


def test_dev_and_test_files_are_checked_against_sacrebleus(bucket, tiny, tmp_path):
    """sacreBLEU's cache ($SACREBLEU) holds its extracted files, as after its download: the
    check reads them, downloading nothing. A file that differs is refused by name."""
    cache = tmp_path / "sacrebleu"
    prefixes = write_corpus(storage.join(bucket, "corpus"))
    for split, (name, outdir) in {
        "dev": ("wmt13", "wmt13"),
        "test": ("wmt14_full", "wmt14/full"),
    }.items():
        os.makedirs(cache / outdir)
        for field, lang in (
            ("src", "en"),
            ("ref", "de"),
            ("docid", ""),
            ("genre", ""),
            ("origlang", ""),
        ):
            text = storage.read_text(f"{prefixes[split]}.{lang}") if lang else ""
            (cache / outdir / f"{name}.en-de.{field}").write_text(text)
    # The test reference differs by one character: refused.
    ref = cache / "wmt14/full" / "wmt14_full.en-de.ref"
    ref.write_text(ref.read_text().replace("e", "E", 1))
    args = [
        tiny.path,
        "data.source=text",
        "data.sacrebleu_dev_set=wmt13",
        "data.sacrebleu_test_set=wmt14/full",
        *(f"data.{s}_prefix={p}" for s, p in prefixes.items()),
    ]
    env = dict(os.environ, SACREBLEU=str(cache))
    out = subprocess.run(
        [sys.executable, "-c", SACREBLEU_CHECK, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "dev ok"
    assert lines[1].startswith(
        f"test refused: {prefixes['test']}.de is not sacreBLEU's wmt14/full en-de ref ({ref})"
    )
    assert f"sacrebleu -t wmt14/full -l en-de --echo ref > {prefixes['test']}.de" in lines[1]
    assert not (cache / "wmt14" / "raw").exists()  # nothing downloaded
