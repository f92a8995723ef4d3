"""tx.storage on a local disk and on real GCS and S3 servers (tests/object_store.py): whole
writes, conditional create and replace, listing, moving, the local cache."""

import os
import threading

import numpy as np
import pytest
from object_store import point_at

from tx import storage


@pytest.fixture(params=["local", "gs", "s3"])
def where(request, tmp_path, monkeypatch):
    """A directory: local, or a fresh prefix of a bucket on the session's server."""
    if request.param == "local":
        return str(tmp_path / "run")
    return point_at(request, monkeypatch, request.param)


def test_whole_writes_read_back_and_replace(where):
    path = storage.join(where, "a", "b.txt")
    assert not storage.exists(path)
    storage.write_text(path, "one")
    storage.write_text(path, "two")
    assert storage.read_text(path) == "two" and storage.size(path) == 3
    assert storage.exists(path) and storage.isfile(path)
    assert storage.isdir(storage.join(where, "a")) and not storage.isfile(storage.join(where, "a"))
    with storage.open_read(path) as f:
        assert f.read() == b"two"


def test_listing_names_files_and_directories_once(where):
    for rel in ("x/1", "x/2", "y/z/3", "top"):
        storage.write_bytes(storage.join(where, *rel.split("/")), b"")
    assert storage.listdir(where) == ["top", "x", "y"]
    assert storage.walk_files(where) == ["top", "x/1", "x/2", "y/z/3"]
    assert storage.listdir(storage.join(where, "nothing")) == []


def test_glob_finds_files_only_in_order(where):
    for rel in ("02/wsj_0201.mrg", "02/wsj_0200.mrg", "03/wsj_0300.mrg", "02/notes.txt"):
        storage.write_bytes(storage.join(where, *rel.split("/")), b"(S)")
    found = storage.glob_files(storage.join(where, "0[23]", "*.mrg"))
    want = ("02/wsj_0200.mrg", "02/wsj_0201.mrg", "03/wsj_0300.mrg")
    assert found == [storage.join(where, *r.split("/")) for r in want]
    assert storage.glob_files(storage.join(where, "*")) == []  # "02", "03": directories
    assert storage.glob_files(storage.join(where, "04", "*.mrg")) == []


def test_create_is_won_by_one_writer(where):
    path = storage.join(where, "lock.json")
    storage.create(path, b"first")
    with pytest.raises(storage.AlreadyExists):
        storage.create(path, b"second")
    assert storage.read_bytes(path) == b"first"


def test_replace_if_holds_only_for_the_version_read(where):
    path = storage.join(where, "lock.json")
    storage.create(path, b"first")
    seen = storage.version(path)
    storage.replace_if(path, b"second", seen)
    assert storage.read_bytes(path) == b"second"
    with pytest.raises(storage.Changed):
        storage.replace_if(path, b"third", seen)  # a stale version loses
    assert storage.read_bytes(path) == b"second"
    storage.remove(path)
    with pytest.raises(storage.Changed):
        storage.replace_if(path, b"fourth", seen)
    assert not storage.exists(path)


def test_of_racing_creators_exactly_one_wins(where):
    path = storage.join(where, "contested")
    storage.makedirs(where)
    won, barrier = [], threading.Barrier(4)

    def contend(i):
        barrier.wait()
        try:
            storage.create(path, str(i).encode())
            won.append(i)
        except storage.AlreadyExists:
            pass

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and storage.read_bytes(path) == str(won[0]).encode()


def test_mtime_is_the_time_of_the_last_write(where):
    import time

    path = storage.join(where, "f")
    before = time.time()
    storage.write_bytes(path, b"x")
    # A server's clock and this one agree to within a few seconds here (the same machine).
    assert abs(storage.mtime(path) - before) < 5


def test_move_tree_keeps_every_file_and_removes_the_source(where):
    src, dst = storage.join(where, "10"), storage.join(where, "10.damaged")
    for rel in ("state/a", "state/b/c", "data"):
        storage.write_text(storage.join(src, *rel.split("/")), rel)
    storage.move_tree(src, dst)
    assert not storage.exists(src)
    assert storage.walk_files(dst) == ["data", "state/a", "state/b/c"]
    assert storage.read_text(storage.join(dst, "state", "b", "c")) == "state/b/c"


def test_an_appender_shows_every_flush_whole(where):
    path = storage.join(where, "tb", "events")
    log = storage.Appender(path)
    log.write(b"one ")
    assert not storage.exists(path)  # nothing before the first flush
    log.flush()
    log.write(b"two ")
    log.write(b"three")
    assert storage.read_bytes(path) == b"one "
    log.flush()
    log.flush()  # nothing new: nothing written twice
    assert storage.read_bytes(path) == b"one two three" and log.size == 13


def test_rmtree_and_remove_of_what_is_not_there_do_nothing(where):
    storage.rmtree(storage.join(where, "none"))
    storage.remove(storage.join(where, "none"))
    storage.write_bytes(storage.join(where, "d", "f"), b"1")
    storage.rmtree(storage.join(where, "d"))
    assert storage.listdir(where) == []


def test_a_local_copy_maps_the_bytes_and_a_new_object_is_a_new_file(where, tmp_path, monkeypatch):
    monkeypatch.setenv("TX_CACHE_DIR", str(tmp_path / "cache"))
    path = storage.join(where, "ids.npy")
    storage.makedirs(where)
    _saved(path, np.arange(5, dtype=np.int32))
    first = storage.local_copy(path)
    mapped = np.load(first, mmap_mode="r")
    _saved(path, np.arange(7, dtype=np.int32))
    second = storage.local_copy(path)
    assert list(np.load(second, mmap_mode="r")) == list(range(7))
    assert list(mapped) == list(range(5)) or not storage.is_remote(where)
    if storage.is_remote(where):  # a new object is a new local file; the mapped one stays
        assert first != second and os.path.exists(first)


def test_a_local_tree_is_a_new_copy_once_an_object_changes(where, tmp_path, monkeypatch):
    monkeypatch.setenv("TX_CACHE_DIR", str(tmp_path / "cache"))
    for rel in ("model.bin", "sub/vocab"):
        storage.write_bytes(storage.join(where, *rel.split("/")), b"one")
    first = storage.local_tree(where)
    assert storage.local_tree(where) == first
    with open(os.path.join(first, "sub", "vocab"), "rb") as f:
        assert f.read() == b"one"
    storage.write_bytes(storage.join(where, "model.bin"), b"two")  # the same size
    second = storage.local_tree(where)
    with open(os.path.join(second, "model.bin"), "rb") as f:
        assert f.read() == b"two"
    assert sorted(os.listdir(second)) == ["model.bin", "sub"]
    assert (first == second) != storage.is_remote(where)  # a local tree is itself


def _saved(path, array):
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    storage.write_bytes(path, buffer.getvalue())
    return path


def test_a_failed_write_names_the_path_and_changes_nothing(tmp_path):
    path = str(tmp_path / "f.txt")
    storage.write_text(path, "kept")
    os.chmod(tmp_path, 0o500)
    try:
        if os.access(tmp_path, os.W_OK):  # root ignores the mode
            pytest.skip("the directory stays writable for this user")
        with pytest.raises(storage.WriteFailed, match="f.txt was not written"):
            storage.write_text(path, "new")
    finally:
        os.chmod(tmp_path, 0o700)
    assert storage.read_text(path) == "kept" and os.listdir(tmp_path) == ["f.txt"]


def test_an_unreachable_bucket_fails_with_the_objects_name(bucket, monkeypatch):
    path = bucket.replace("tx-tests", "no-such-bucket-here") + "/f"
    with pytest.raises((storage.WriteFailed, OSError)) as e:
        storage.write_bytes(path, b"x")
    assert "no-such-bucket-here" in str(e.value)
