"""Data that other tools fetch and keep, as tx uses it: TFDS's prepared datasets (a data_dir
in a bucket) and sacreBLEU's test sets (dev and test files checked against them).

TFDS reads its records through TensorFlow's own file layer, which has no S3 and cannot be
pointed at another GCS endpoint: for a `data_dir` in a bucket TFDS is given a directory of the
local cache instead, holding a copy of the dataset's prepared directory `<data_dir>/<name>/`;
a dataset the bucket lacks is downloaded and prepared there by TFDS and uploaded (its
dataset_info.json files last: a bucket has no rename to publish a directory at once, and a
directory without them is not taken for prepared), so that other machines reuse it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os

from tx import storage

TFDS_INFO = "dataset_info.json"  # in each prepared version's directory; uploaded last


def tfds_local_dir(data_dir: str | None) -> str | None:
    """The data_dir to give TFDS: `data_dir` itself when local (None: TFDS's default); for a
    bucket, a directory of the local cache (tx.storage.cache_dir)."""
    if data_dir is None or not storage.is_remote(data_dir):
        return data_dir
    return storage.cache_dir("tfds", hashlib.sha256(data_dir.encode()).hexdigest()[:16])


def tfds_load(name: str, split: str, data_dir: str | None):
    """`tfds.load` of one split (in file order) from `data_dir`, local or in a bucket (the
    bucket's prepared copy mirrored; else prepared locally, then shared)."""
    import tensorflow_datasets as tfds

    shared = data_dir is not None and storage.is_remote(data_dir) and mirror_tfds(name, data_dir)
    local = tfds_local_dir(data_dir)
    ds = tfds.load(name, split=split, data_dir=local, shuffle_files=False)
    if local != data_dir and not shared:
        share_tfds(name, data_dir)
    return ds


def tfds_version(name: str, data_dir: str | None) -> str:
    """The dataset's version (its builder's: reads no data); "unknown" if TFDS cannot say."""
    import tensorflow_datasets as tfds

    try:
        return str(tfds.builder(name, data_dir=tfds_local_dir(data_dir)).version)
    except Exception:  # noqa: BLE001 - an unknown version only weakens the cache key
        return "unknown"


def _parts(name: str) -> list[str]:
    """A dataset's directories under a data_dir: "wmt14_translate/de-en:1.0.0" ->
    ["wmt14_translate", "de-en"] (each version is a directory below)."""
    return name.split(":")[0].split("/")


def _has_info(files: list[str]) -> bool:
    return any(f.rsplit("/", 1)[-1] == TFDS_INFO for f in files)


def mirror_tfds(name: str, data_dir: str) -> bool:
    """Whether the bucket `data_dir` holds the dataset prepared; if so, `tfds_local_dir` is
    given it (a link to its copy in the local cache, refreshed), unless it was prepared here."""
    remote = storage.join(data_dir, *_parts(name))
    if not _has_info(storage.walk_files(remote)):
        return False
    local = os.path.join(tfds_local_dir(data_dir), *_parts(name))
    if os.path.islink(local) or not os.path.exists(local):
        tree = storage.local_tree(remote)  # a new copy when any object was rewritten
        if not os.path.islink(local) or os.readlink(local) != tree:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            link = f"{local}.tmp-{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):
                os.remove(link)
            os.symlink(tree, link)
            os.replace(link, local)  # a reader sees the old link or the new one
    return True


def share_tfds(name: str, data_dir: str) -> None:
    """Uploads the dataset TFDS prepared in `tfds_local_dir(data_dir)` to the bucket, the
    dataset_info.json files last; nothing if none was prepared here."""
    local = os.path.join(tfds_local_dir(data_dir), *_parts(name))
    remote = storage.join(data_dir, *_parts(name))
    files = storage.walk_files(local)
    if not _has_info(files):
        return
    logging.info("uploading the prepared TFDS dataset %s to %s", name, remote)
    for rel in sorted(files, key=lambda f: f.rsplit("/", 1)[-1] == TFDS_INFO):
        with open(os.path.join(local, rel), "rb") as f:
            storage.write_bytes(storage.join(remote, *rel.split(os.sep)), f.read())


def sacrebleu_mismatch(files: dict[str, str], test_set: str, pair: str, key: str) -> str | None:
    """Why dev or test text is not sacreBLEU's `test_set` (e.g. "wmt14/full") for `pair`
    ("en-de"), or None if it is: `files` maps our source file, then our reference file, to
    their sha256, which must be those of sacreBLEU's source and (first) reference files.
    sacreBLEU fetches them once into $SACREBLEU (default ~/.sacrebleu), checking its tarball's
    md5. `key` names the config key in messages."""
    from sacrebleu.dataset import DATASETS

    if test_set not in DATASETS:
        return f"data.{key}={test_set!r} is not a sacreBLEU test set (`sacrebleu --list`)"
    if pair not in DATASETS[test_set].langpairs:
        return f"data.{key}: sacreBLEU's {test_set} has no {pair} pair"
    try:
        theirs = [
            DATASETS[test_set].get_source_file(pair),
            DATASETS[test_set].get_reference_files(pair)[0],
        ]
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a failed download exits (md5)
        return (
            f"data.{key}={test_set!r}: sacreBLEU could not provide its {pair} files ({e!r}); it "
            "fetches them once into $SACREBLEU (~/.sacrebleu): copy that directory from a "
            f"machine that has them, or unset data.{key}"
        )
    for (ours, have), their_file, field in zip(files.items(), theirs, ("src", "ref"), strict=True):
        want = storage.sha256(their_file)
        if have != want:
            return (
                f"{ours} is not sacreBLEU's {test_set} {pair} {field} ({their_file}): sha256 "
                f"{have[:12]}, not {want[:12]}. Write it with `sacrebleu -t {test_set} -l {pair} "
                f"--echo {field} > {ours}`, or unset data.{key}"
            )
    return None
