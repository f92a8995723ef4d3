"""The training wing on buckets (gs:// and s3://, real servers: tests/object_store.py):
checkpoints, averages, the run lock, TensorBoard events and pictures, run cards, `prepare`.

Each test runs in an empty working directory, with the local cache and the temporary directory
of its own: nothing may be written locally outside the cache (`local_is_clean`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import fail_orbax_writes

from tx import storage
from tx import workdir as wd
from tx.train import checkpoint, runcard, runlock
from tx.train.averaging import average_last, averaged_steps, restore_averaged
from tx.train.checkpoint import Checkpointer
from tx.train.events import Summaries, read_scalars
from tx.train.runlock import WorkdirBusy
from tx.train.trainer import TrainState
from tx.viz.pictures import curves_picture


@pytest.fixture
def local_is_clean(tmp_path, monkeypatch):
    """The test runs in an empty directory with TX_CACHE_DIR and TMPDIR of its own; after it,
    the directory and TMPDIR are still empty (no `gs:` or `s3:` directory, no stray file)."""
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("TX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    yield
    assert os.listdir(cwd) == [] and os.listdir(tmp) == []


@pytest.fixture
def run(bucket, local_is_clean):
    """A fresh workdir in a bucket (gs:// or s3://)."""
    return bucket


def _state(value: float) -> TrainState:
    return TrainState(
        step=jnp.array(int(value), jnp.int32),
        params={"w": jnp.full((3,), value, jnp.float32)},
        opt_state={"mu": jnp.zeros((3,), jnp.float32)},
        rng=jnp.zeros((2,), jnp.uint32),
    )


def _abstract():
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), _state(0)
    )


def _save(ckpt: Checkpointer, steps) -> None:
    for step in steps:
        ckpt.save(step, _state(step), {"epoch": 0, "batch": step})
        ckpt.wait()


def _objects(path: str) -> dict:
    """Every object under `path` with its bytes."""
    return {rel: storage.read_bytes(storage.join(path, rel)) for rel in storage.walk_files(path)}


def _refuse_writes_under(monkeypatch, fragment: str) -> None:
    """Orbax's writes under `fragment` fail as a bucket refusing them would."""
    fail_orbax_writes(monkeypatch, fragment, errno.EACCES, "Permission denied")


# ---------------------------------------------------------------- checkpoints
def test_checkpoints_save_restore_and_prune_in_a_bucket(run):
    ckpt = Checkpointer(run, keep=2, async_save=True, every_steps=5)
    _save(ckpt, [5, 10, 15])
    assert ckpt.all_steps() == [10, 15]
    assert "commit_success.txt" in storage.listdir(ckpt.path(15))  # written last: complete
    step, state, position = Checkpointer(run).restore_newest(_abstract())
    assert step == 15 and position == {"epoch": 0, "batch": 15}
    np.testing.assert_array_equal(np.asarray(state.params["w"]), np.full(3, 15.0))
    ckpt.close()


def test_an_unfinished_step_is_not_a_step(run):
    """A step without its commit file (a save cut off) is seen by no reader, and a new save
    of that step replaces it."""
    ckpt = Checkpointer(run, keep=None, async_save=False)
    _save(ckpt, [5, 10])
    storage.remove(storage.join(ckpt.path(10), "commit_success.txt"))
    assert Checkpointer(run).all_steps() == [5]
    assert Checkpointer(run).restore_newest(_abstract())[0] == 5
    ckpt.manager.reload()
    _save(ckpt, [10])
    assert Checkpointer(run).all_steps() == [5, 10]
    ckpt.close()


# Orbax's background threads report the injected failure again as they wind down.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_failed_upload_names_the_checkpoint_and_no_reader_sees_it(run):
    ckpt = Checkpointer(run, keep=2, async_save=True, every_steps=5)
    _save(ckpt, [5, 10])
    with pytest.MonkeyPatch.context() as failing:  # the bucket refuses step 15's metadata
        _refuse_writes_under(failing, "/checkpoints/15/")
        with pytest.raises(storage.WriteFailed) as e:
            _save(ckpt, [15])
    assert str(e.value).startswith(f"checkpoint {ckpt.path(15)} was not written (")
    assert "commit_success.txt" not in storage.listdir(ckpt.path(15))
    assert ckpt.all_steps() == [5, 10] and Checkpointer(run).all_steps() == [5, 10]
    assert Checkpointer(run).restore_newest(_abstract())[0] == 10
    _save(ckpt, [15])  # the bucket takes it again: the same step is written, pruning resumes
    assert ckpt.all_steps() == [10, 15]
    ckpt.close()


def test_a_damaged_checkpoint_object_is_set_aside_and_the_one_before_restored(run, caplog):
    ckpt = Checkpointer(run, keep=None, async_save=False)
    _save(ckpt, [5, 10, 15])
    storage.write_bytes(storage.join(ckpt.path(15), "state", "_METADATA"), b"\xff" * 64)
    before = _objects(ckpt.path(15))
    with caplog.at_level("WARNING"):
        step, state, position = ckpt.restore_newest(_abstract())
    assert step == 10 and position == {"epoch": 0, "batch": 10}
    np.testing.assert_array_equal(np.asarray(state.params["w"]), np.full(3, 10.0))
    assert f"{ckpt.path(15)} cannot be restored (state/_METADATA is not JSON)" in caplog.text
    assert f"moved it to {ckpt.path(15)}.damaged (kept, not deleted)" in caplog.text
    assert _objects(ckpt.path(15) + ".damaged") == before  # kept byte for byte
    assert not storage.isdir(ckpt.path(15)) and ckpt.all_steps() == [5, 10]
    _save(ckpt, [15])  # a new step 15 beside the damaged one
    assert ckpt.all_steps() == [5, 10, 15]
    assert _objects(ckpt.path(15) + ".damaged") == before
    ckpt.close()


def test_a_missing_manifest_object_is_named(run):
    ckpt = Checkpointer(run, keep=None, async_save=False)
    _save(ckpt, [5])
    storage.remove(storage.join(ckpt.path(5), "state", "manifest.ocdbt"))
    with pytest.raises(checkpoint.UnreadableCheckpoint) as e:
        ckpt.restore_newest(_abstract())
    assert f"{ckpt.path(5)} cannot be restored (state/manifest.ocdbt is missing" in str(e.value)
    assert storage.listdir(ckpt.directory) == ["5"]  # nothing moved
    ckpt.close()


def test_an_orbax_without_the_internals_s3_relies_on_is_refused_in_one_line(monkeypatch):
    """tx reaches S3 through three private functions of orbax-checkpoint 0.12.x
    (tx.train.checkpoint._orbax_s3); another Orbax stops an s3:// run with one line, and
    local and gs:// checkpoints never depend on them."""
    from orbax.checkpoint._src.serialization import tensorstore_utils as tsu

    from tx.config import ConfigError

    monkeypatch.delattr(tsu, "_tx_s3", raising=False)  # (restored after the test)
    monkeypatch.delattr(tsu, "_use_gcs_driver")
    with pytest.raises(ConfigError, match="s3:// checkpoints rely on internals of orbax") as e:
        checkpoint.atomicity("s3://bucket/run/checkpoints")
    assert "\n" not in str(e.value) and "orbax-checkpoint==0.12.8" in str(e.value)
    assert checkpoint.atomicity("/local/run") is None
    assert (
        checkpoint.atomicity("gs://bucket/run").mode
        == checkpoint.ocp.options.AtomicityMode.COMMIT_FILE
    )


# ---------------------------------------------------------------- averages
def _averaged_run(run) -> dict:
    ckpt = Checkpointer(run, keep=None, async_save=False)
    _save(ckpt, [5, 10, 15])
    ckpt.close()
    return _abstract().params


def _fail_arrays(monkeypatch) -> None:
    """The new average's metadata is refused, once its arrays are written."""
    _refuse_writes_under(monkeypatch, "/averaged/15.1/")


def _fail_index(monkeypatch) -> None:
    """The bucket refuses the index object, the marker written last."""
    real = storage.write_bytes

    def write_bytes(path, data):
        if path.endswith("/averaged/index.json"):
            raise storage.WriteFailed(f"{path} was not written (refused); nothing was changed")
        return real(path, data)

    monkeypatch.setattr(storage, "write_bytes", write_bytes)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_average_is_read_back_and_one_whose_write_fails_leaves_the_earlier_one(run):
    params = _averaged_run(run)
    path, steps = average_last(run, 3, params)
    assert steps == [5, 10, 15] and path == f"{run}/averaged/15" and averaged_steps(run) == [15]
    for fail in (_fail_arrays, _fail_index):  # the arrays, then the marker written last
        with pytest.MonkeyPatch.context() as failing:  # (the fixtures' own patches stay)
            fail(failing)
            with pytest.raises(
                storage.WriteFailed, match=rf"averaged checkpoint {run}/averaged/15 was not written"
            ):
                average_last(run, 2, params)
        assert averaged_steps(run) == [15]
        kept, meta = restore_averaged(run, 15, params)
        assert meta["averaged_steps"] == [5, 10, 15]
        np.testing.assert_array_equal(np.asarray(kept["w"]), np.full(3, 10.0))  # (5+10+15)/3
    # It is replaced whole, under the other name; the earlier one goes.
    path, _ = average_last(run, 2, params)
    new, meta = restore_averaged(run, 15, params)
    assert meta["averaged_steps"] == [10, 15] and path == f"{run}/averaged/15.1"
    np.testing.assert_array_equal(np.asarray(new["w"]), np.full(3, 12.5))
    assert averaged_steps(run) == [15]
    assert storage.listdir(f"{run}/averaged") == ["15.1", "index.json"]


# ---------------------------------------------------------------- the lock
def _foreign_lock(run: str) -> None:
    """lock.json of a run on another host."""
    holder = {"host": "another-host", "pid": 1, "since": "earlier", "command": "tx train"}
    storage.write_text(runlock.lock_file(run), json.dumps(holder))


def test_the_lock_is_refused_to_a_second_run_and_taken_over_when_stale(run, caplog):
    runlock.acquire(run)
    with pytest.raises(WorkdirBusy, match=f"in use by pid {os.getpid()} on"):
        runlock.acquire(run)  # a live holder on this host
    runlock.release(run)
    assert not storage.exists(runlock.lock_file(run))
    _foreign_lock(run)
    with pytest.raises(WorkdirBusy, match="in use by pid 1 on another-host") as e:
        runlock.acquire(run)
    assert f"(the lock is {run}/lock.json)" in str(e.value)
    with caplog.at_level(logging.WARNING):  # untouched for longer than stale_after
        runlock.acquire(run, stale_after=0.0)
    assert "heartbeat stopped" in caplog.text
    assert json.loads(storage.read_bytes(runlock.lock_file(run)))["pid"] == os.getpid()
    runlock.release(run)


def test_of_two_take_overs_one_wins(run):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    holder = {"host": socket.gethostname(), "pid": gone.pid, "since": "earlier", "command": "x"}
    storage.write_text(runlock.lock_file(run), json.dumps(holder))  # its holder is gone
    start, won, refused = threading.Barrier(2), [], []

    def take_over():
        start.wait()
        try:
            won.append(runlock.acquire(run))
        except WorkdirBusy as e:
            refused.append(str(e))

    threads = [threading.Thread(target=take_over) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 1, (won, refused)
    assert f"in use by pid {os.getpid()}" in refused[0]  # the winner, found alive
    assert storage.version(runlock.lock_file(run)) == won[0]
    runlock.release(run)


def test_a_holder_whose_lock_is_taken_over_stops_beating(run, monkeypatch, caplog):
    monkeypatch.setattr(runlock, "HEARTBEAT_SECS", 0.2)
    path = runlock.lock_file(run)
    with caplog.at_level(logging.WARNING), runlock.hold(run):
        first = storage.version(path)
        _wait_for(lambda: storage.version(path) != first)  # the heartbeat rewrites it
        runlock.acquire(run, take_over=True)  # another run (here: this process again)
        taken = storage.version(path)
        _wait_for(lambda: "was taken over" in caplog.text)
        time.sleep(0.5)
        assert storage.version(path) == taken  # no beat since
    assert "this run no longer holds its workdir" in caplog.text


def _wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# ---------------------------------------------------------------- TensorBoard, pictures, cards
def test_tensorboard_events_are_read_back_and_plotted(run, monkeypatch):
    monkeypatch.setattr(Summaries, "ROLL_BYTES", 300)  # a new object every few records
    for start in (0, 20):  # a run, then its resume from step 20 (the later write wins)
        summaries = Summaries(wd.tensorboard_dir(run), enabled=True)
        for step in range(start + 10, start + 50, 10):
            summaries.scalars(step, {"train/loss": 100.0 / step + start, "train/lr": 1e-3})
        summaries.close()
    names = storage.listdir(wd.tensorboard_dir(run))
    assert len(names) > 2 and all(n.startswith("events.out.tfevents.") for n in names)
    steps, values = read_scalars(run)["train/loss"]
    np.testing.assert_array_equal(steps, [10, 20, 30, 40, 50, 60])
    np.testing.assert_allclose(values, [10, 5, 100 / 30 + 20, 100 / 40 + 20, 22, 100 / 60 + 20])
    storage.write_text(wd.config_file(run), "{}")  # a run, for the picture
    out = curves_picture([run], storage.join(wd.plots_dir(run), "curves.png"))
    assert out == f"{run}/plots/curves.png"
    assert storage.read_bytes(out)[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_card_is_written_and_a_damaged_one_set_aside(run, caplog):
    runcard.record(run, "note", 1)
    assert runcard.load(run)["note"] == 1
    assert storage.read_text(wd.run_card_markdown(run)).startswith("# Run card")
    path = wd.run_card_file(run)
    storage.write_bytes(path, b'{"format": 1, "segm')
    with caplog.at_level(logging.WARNING):
        assert runcard.load(run) is None
    assert f"{path} is damaged" in caplog.text
    assert storage.read_bytes(path + ".damaged") == b'{"format": 1, "segm'
    assert not storage.exists(path)
    runcard.record(run, "note", 2)  # the next writer starts a new card
    assert runcard.load(run)["note"] == 2


# ---------------------------------------------------------------- prepare, train, resume
SETTINGS = ("train.checkpoint_every_steps=2", "train.log_every_steps=2")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny, vocab):
    """The tiny config trained 4 steps without a stop, on a local disk."""
    from tx.train.loop import train

    path = str(tmp_path_factory.mktemp("reference"))
    train(tiny(f"data.vocab_path={vocab}", *SETTINGS, "train.num_steps=4"), path)
    return path


# s3 under -m slow (29 s): the checkpoint tests above run its atomicity on both servers by
# default, and the slow suite trains, kills and resumes on s3 (test_buckets_pod, _flaky).
@pytest.mark.parametrize(
    "bucket", ["gs", pytest.param("s3", marks=pytest.mark.slow)], indirect=True
)
def test_prepare_then_train_and_resume_in_a_bucket_as_uninterrupted(
    run, tiny, vocab, reference, caplog
):
    """`prepare`, a `train` stopped after its first step, then resumed: the same state as a
    run of the same steps that was never stopped (on a local disk), every file in the bucket,
    nothing tokenized by train; then an average of the run, read back."""
    from tx.train.averaging import average
    from tx.train.loop import train
    from tx.train.prepare import prepare
    from tx.train.trainer import abstract_train_state, build

    settings = (f"data.vocab_path={vocab}", *SETTINGS)
    cfg = tiny(*settings, "train.num_steps=4")
    record = prepare(cfg, run)
    assert sorted(record["splits"]) == ["dev", "test", "train"]
    with caplog.at_level(logging.INFO):
        # 0.0001 minutes run out before the first step ends: it stops there, with a checkpoint.
        assert (
            train(tiny(*settings, "train.num_steps=4", "train.max_minutes=0.0001"), run)["step"]
            == 1
        )
        assert train(cfg, run)["step"] == 4
    assert f"resuming from {run}/checkpoints step 1" in caplog.text
    assert "tokenizing" not in caplog.text and "training a" not in caplog.text
    abstract = abstract_train_state(build(cfg))
    got, got_position = Checkpointer(run).restore(4, abstract)
    want, want_position = Checkpointer(reference).restore(4, abstract)
    assert got_position == want_position
    for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bitwise
    card = runcard.load(run)
    assert [(s["start_step"], s["end_step"]) for s in card["segments"]] == [(0, 1), (1, 4)]
    assert sorted(card["data"]["splits"]) == ["dev", "test", "train"]  # prepare's test kept
    assert set(read_scalars(run)) >= {"train/loss", "train/learning_rate"}
    path, steps = average(cfg, run, last=2)
    assert steps == [2, 4] and runcard.load(run)["average"]["steps"] == [2, 4]
    params, meta = restore_averaged(run, 4, abstract.params)
    assert meta["averaged_steps"] == [2, 4] and path == f"{run}/averaged/4"
    assert not storage.exists(runlock.lock_file(run))  # released
