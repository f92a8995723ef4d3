"""A run's own files (besides its checkpoints): damaged, hand-edited, or claimed by two runs.

The rule: a file that can be derived again (a token cache) is rebuilt with a warning naming it;
one that cannot (the vocabulary, config.json) is refused in one line naming it; a bookkeeping
file (the run card) is moved aside; nothing that cannot be rebuilt is deleted; and two runs
never write into one workdir at once.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tx.config import ConfigError, load_config
from tx.data import dataset, token_cache
from tx.data.tokenizer import VocabularyError
from tx.data.vocabulary import run_tokenizer
from tx.train import runcard, runlock
from tx.train.runlock import WorkdirBusy


@pytest.fixture
def run(trained, tmp_path):
    """A private copy of the shared tiny run, to damage."""
    path = tmp_path / "run"
    shutil.copytree(trained, path)
    return str(path)


# --- one run per workdir ---------------------------------------------------------------------


def _write_lock(workdir, **holder):
    with open(runlock.lock_file(workdir), "w") as f:
        json.dump(
            {"host": socket.gethostname(), "since": "earlier", "command": "tx train"} | holder, f
        )


def test_a_live_holder_on_this_host_keeps_the_workdir(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write_lock(tmp_path, pid=sleeper.pid)
        with pytest.raises(WorkdirBusy, match=f"in use by pid {sleeper.pid} on") as e:
            runlock.acquire(str(tmp_path))
        assert "--take-over-lock" in str(e.value)
        assert json.load(open(runlock.lock_file(tmp_path)))["pid"] == sleeper.pid  # untouched
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_dead_holders_lock_is_taken_over_with_a_warning(tmp_path, caplog):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _write_lock(tmp_path, pid=gone.pid)
    with caplog.at_level(logging.WARNING):
        runlock.acquire(str(tmp_path))
    assert f"process {gone.pid} on this host is gone" in caplog.text
    assert json.load(open(runlock.lock_file(tmp_path)))["pid"] == os.getpid()
    runlock.release(str(tmp_path))
    assert not os.path.exists(runlock.lock_file(tmp_path))


def test_another_hosts_lock_holds_until_its_heartbeat_stops(tmp_path, caplog):
    _write_lock(tmp_path, host="another-host", pid=1)
    with pytest.raises(WorkdirBusy, match="pid 1 on another-host"):
        runlock.acquire(str(tmp_path))
    old = time.time() - runlock.STALE_AFTER_SECS - 60
    os.utime(runlock.lock_file(tmp_path), (old, old))
    with caplog.at_level(logging.WARNING):
        runlock.acquire(str(tmp_path))
    assert "heartbeat stopped" in caplog.text
    runlock.release(str(tmp_path))


def test_take_over_takes_a_live_lock(tmp_path):
    _write_lock(tmp_path, host="another-host", pid=1)
    runlock.acquire(str(tmp_path), take_over=True)
    assert json.load(open(runlock.lock_file(tmp_path)))["pid"] == os.getpid()
    runlock.release(str(tmp_path))


def test_hold_releases_on_error_and_only_its_own_lock(tmp_path):
    with pytest.raises(KeyError), runlock.hold(str(tmp_path)):
        assert os.path.exists(runlock.lock_file(tmp_path))
        raise KeyError("the run failed")
    assert not os.path.exists(runlock.lock_file(tmp_path))
    _write_lock(tmp_path, host="another-host", pid=1)
    runlock.release(str(tmp_path))  # not ours: kept
    assert os.path.exists(runlock.lock_file(tmp_path))


def test_two_trainings_on_one_workdir_cannot_both_run(tiny, tmp_path):
    """The second `train` exits at once with the holder named, while the first still runs."""
    workdir = str(tmp_path / "w")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    args = [sys.executable, "-m", "tx", "train", "--config", tiny.path, "--workdir", workdir]
    first = subprocess.Popen(
        [*args, "--config.train.num_steps=100000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.time() + 120
        while not os.path.exists(runlock.lock_file(workdir)) and time.time() < deadline:
            assert first.poll() is None, first.stderr.read()
            time.sleep(0.2)
        second = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
        assert second.returncode == 2, second.stderr
        assert f"in use by pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
        assert first.poll() is None  # the first run was not disturbed
    finally:
        first.kill()
        first.wait()


# --- derived files rebuild themselves --------------------------------------------------------


def _cache_dir(workdir):
    data = os.path.join(workdir, "data")
    return [os.path.join(data, d) for d in os.listdir(data) if not d.startswith(".")]


@pytest.mark.parametrize("damage", ["truncate", "zero", "other_run", "manifest"])
def test_a_damaged_token_cache_is_rebuilt_with_a_warning(run, tiny, tmp_path, damage, caplog):
    cfg = tiny()
    tokenizer = run_tokenizer(run)
    want = dataset.split_ids(cfg.data, run, tokenizer, "train")
    want = [np.array(getattr(want, k)) for k in token_cache.FILES]
    (cache,) = _cache_dir(run)
    target = os.path.join(cache, "tgt_ids.npy")
    if damage == "truncate":
        os.truncate(target, os.path.getsize(target) - 28)
    elif damage == "zero":
        with open(target, "r+b") as f:
            f.write(bytes(os.path.getsize(target)))
    elif damage == "other_run":  # a same-sized file of another split
        shutil.copy(os.path.join(cache, "src_ids.npy"), target)
    else:
        with open(os.path.join(cache, token_cache.MANIFEST), "w") as f:
            f.write('{"src_ids": ')
    with caplog.at_level(logging.WARNING):
        got = dataset.split_ids(cfg.data, run, tokenizer, "train")
    assert "is damaged" in caplog.text and cache in caplog.text
    for a, k in zip(want, token_cache.FILES, strict=True):
        np.testing.assert_array_equal(np.array(getattr(got, k)), a)


def test_a_cache_written_before_manifests_is_adopted(run, tiny):
    (cache,) = _cache_dir(run)
    os.remove(os.path.join(cache, token_cache.MANIFEST))
    dataset.split_ids(tiny().data, run, run_tokenizer(run), "train")
    assert os.path.exists(os.path.join(cache, token_cache.MANIFEST))


def test_a_dead_writers_temporary_directory_is_removed(run, tiny):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    data = os.path.join(run, "data")
    dead = os.path.join(data, f".tmp-{socket.gethostname()}-{gone.pid}-abc_12")
    alive = os.path.join(data, f".tmp-{socket.gethostname()}-{os.getpid()}-abc_12")
    for d in (dead, alive):
        os.makedirs(d)
    for d in _cache_dir(run):
        shutil.rmtree(d)  # a rebuild is what looks for leftovers
    dataset.split_ids(tiny().data, run, run_tokenizer(run), "train")
    assert not os.path.exists(dead) and os.path.exists(alive)


# --- files that cannot be rebuilt say so -----------------------------------------------------


@pytest.mark.parametrize("damage", ["truncate", "zero", "appended"])
def test_a_damaged_vocabulary_is_refused_by_name(run, vocab, damage):
    path = os.path.join(run, "spm.model")
    if damage == "truncate":
        os.truncate(path, 100)
    elif damage == "zero":
        with open(path, "r+b") as f:
            f.write(bytes(os.path.getsize(path)))
    else:  # one byte more: a replaced file
        with open(path, "ab") as f:
            f.write(b"\n")
    with pytest.raises(VocabularyError, match=f"{path} is damaged or replaced"):
        run_tokenizer(run)
    assert os.path.exists(path)  # never deleted


def test_a_vocabulary_that_is_not_sentencepiece_is_named(tmp_path):
    from tx.data.tokenizer import Tokenizer

    path = tmp_path / "spm.model"
    path.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(VocabularyError, match=f"{path} is not a SentencePiece model"):
        Tokenizer(str(path))


def test_config_json_that_is_not_json_names_the_file(run):
    path = os.path.join(run, "config.json")
    with open(path, "r+") as f:
        f.truncate(40)
    with pytest.raises(ConfigError, match=f"{path} is not valid JSON \\(line"):
        load_config(path)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("model.num_heads", "four", "model.num_heads must be int, got 'four'"),
        ("model.dropout_rate", [0.1], "model.dropout_rate must be float"),
        ("train.num_steps", "ten", "train.num_steps must be a number, got 'ten'"),
        ("optim.b2", None, "optim.b2 must be a number"),
        ("data.bucket_lengths", "8,16", "data.bucket_lengths must be a list of ints"),
        ("decode.temperature", "hot", "decode.temperature must be a number"),
    ],
)
def test_a_hand_edited_config_json_names_the_key_and_type(run, key, value, message):
    path = os.path.join(run, "config.json")
    with open(path) as f:
        tree = json.load(f)
    section, leaf = key.split(".")
    tree[section][leaf] = value
    with open(path, "w") as f:
        json.dump(tree, f)
    with pytest.raises(ConfigError, match=message.replace("[", "\\[")):
        load_config(path)


@pytest.mark.parametrize("damage", ["truncate", "zero", "list"])
def test_a_damaged_run_card_is_moved_aside(run, damage, caplog):
    path = os.path.join(run, "run_card.json")
    before = open(path, "rb").read()
    if damage == "truncate":
        os.truncate(path, len(before) // 2)
    elif damage == "zero":
        open(path, "wb").write(bytes(len(before)))
    else:
        open(path, "w").write("[1, 2]")
    damaged = open(path, "rb").read()
    with caplog.at_level(logging.WARNING):
        assert runcard.load(run) is None
    assert f"{path} is damaged" in caplog.text
    assert open(path + ".damaged", "rb").read() == damaged and not os.path.exists(path)
    runcard.record(run, "note", 1)  # the next writer starts a new card
    assert runcard.load(run)["note"] == 1


def test_average_holds_the_workdir_too(run, tiny):
    from tx.train.averaging import average

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write_lock(run, pid=sleeper.pid)
        cfg = tiny("train.num_steps=20", "train.checkpoint_every_steps=5")
        with pytest.raises(WorkdirBusy, match=f"in use by pid {sleeper.pid}"):
            average(cfg, run)
        assert not os.path.exists(os.path.join(run, "averaged"))
    finally:
        sleeper.kill()
        sleeper.wait()
