"""Checkpoints: which are kept, which are averaged, refusing a stale averaged model, and
checkpoints damaged on disk."""

import errno
import glob
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import fail_orbax_writes

from tx import compat, storage
from tx.infer.translate import StaleAverage, _check_fresh
from tx.train import checkpoint
from tx.train.averaging import average_last, averaged_steps, restore_averaged
from tx.train.checkpoint import Checkpointer, averaging_steps
from tx.train.trainer import TrainState


def test_averaging_steps_are_the_step_spaced_ones_and_the_last():
    steps = [1500, 2113, 3000, 4500, 4980, 5000]  # 2113 and 4980: time-based safety saves
    assert averaging_steps(steps, 1500, final_step=5000) == [1500, 3000, 4500, 5000]
    assert averaging_steps(steps, 1500) == [1500, 3000, 4500]
    assert averaging_steps(steps, 0) == steps  # time-based only: every checkpoint counts


def _state(value: float) -> TrainState:
    return TrainState(
        step=jnp.array(int(value), jnp.int32),
        params={"w": jnp.full((3,), value, jnp.float32)},
        opt_state={"mu": jnp.zeros((3,), jnp.float32)},
        rng=jnp.zeros((2,), jnp.uint32),
    )


def _save(ckpt: Checkpointer, steps) -> None:
    for step in steps:
        ckpt.save(step, _state(step), {"epoch": 0, "batch": step})
        ckpt.wait()


def test_keeps_the_last_averaging_checkpoints_and_the_newest(tmp_path):
    ckpt = Checkpointer(str(tmp_path), keep=2, async_save=False, every_steps=5, final_step=30)
    _save(ckpt, [5, 7, 10, 13, 15, 17])
    assert ckpt.all_steps() == [10, 15, 17]  # 17 (time-based) stays only while it is newest
    _save(ckpt, [20])
    assert ckpt.all_steps() == [15, 20]
    ckpt.close()


def test_average_uses_only_step_spaced_checkpoints(tmp_path):
    ckpt = Checkpointer(str(tmp_path), keep=None, async_save=False)
    _save(ckpt, [5, 7, 10, 13, 15])
    ckpt.close()
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), _state(0)
    )
    path, steps = average_last(str(tmp_path), 3, abstract.params, every=5)
    assert steps == [5, 10, 15] and path.endswith("averaged/15")
    params, meta = restore_averaged(str(tmp_path), 15, abstract.params)
    np.testing.assert_array_equal(np.asarray(params["w"]), np.full(3, 10.0))  # (5+10+15)/3
    assert meta["averaged_steps"] == [5, 10, 15]


def _cfg(every: int) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        {
            "train": {"checkpoint_every_steps": every, "num_steps": 100},
            "decode": {"average_last": 5},
        }
    )


def test_a_stale_averaged_model_is_refused(tmp_path):
    ckpt = Checkpointer(str(tmp_path), keep=None, async_save=False)
    _save(ckpt, [5, 10, 12])  # 12: a time-based save after the last step-spaced one
    ckpt.close()
    _check_fresh(_cfg(5), str(tmp_path), 10)  # nothing newer to average: fresh
    with pytest.raises(StaleAverage, match=r"averaged/5 is stale: .* up to step 10"):
        _check_fresh(_cfg(5), str(tmp_path), 5)
    with pytest.raises(StaleAverage, match="python -m tx average --workdir"):
        _check_fresh(_cfg(0), str(tmp_path), 10)  # time-based only: 12 counts


# ---------------------------------------------------------------- damaged on disk
def _abstract():
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), _state(0)
    )


def _files(path) -> dict:
    """Every file under `path` with its bytes: to show a directory was left exactly as it was."""
    out = {}
    for dirpath, _, names in os.walk(path):
        for name in names:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


def damage(step_dir: str, how: str) -> None:
    """Damages an Orbax step directory on disk the way a bad disk or a stray command would."""
    state = os.path.join(step_dir, "state")
    data_files = glob.glob(os.path.join(state, "**", "d", "*"), recursive=True)  # OCDBT data
    if how == "metadata overwritten":  # the case: UnicodeDecodeError inside Orbax
        with open(os.path.join(state, "_METADATA"), "r+b") as f:
            f.write(b"\xff" * 64)
    elif how == "array data cut short":  # e.g. a copy that ran out of space
        for path in data_files:
            os.truncate(path, os.path.getsize(path) // 2)
    elif how == "array data zeroed":  # each file's first 40%: chunks, not B-tree nodes
        # (every file: which arrays a file holds, params or Adam's moments, varies by run)
        for path in data_files:
            with open(path, "r+b") as f:
                f.write(bytes(os.path.getsize(path) * 2 // 5))
    elif how == "every file emptied":
        for path in _files(step_dir):
            os.truncate(os.path.join(step_dir, path), 0)
    elif how == "manifest deleted":
        os.remove(os.path.join(state, "manifest.ocdbt"))
    elif how == "data position overwritten":
        with open(os.path.join(step_dir, "data", "metadata"), "wb") as f:
            f.write(b'{"epoch": 0, "bat')
    else:
        raise ValueError(how)


DAMAGES = (
    "metadata overwritten",
    "array data cut short",
    "every file emptied",
    "manifest deleted",
    "data position overwritten",
)


@pytest.mark.parametrize("how", DAMAGES)
def test_resume_sets_a_damaged_checkpoint_aside_and_restores_the_one_before(tmp_path, how, caplog):
    ckpt = Checkpointer(str(tmp_path), keep=None, async_save=False)
    _save(ckpt, [5, 10, 15])
    damage(ckpt.path(15), how)
    before = _files(ckpt.path(15))
    with caplog.at_level("WARNING"):
        step, state, position = ckpt.restore_newest(_abstract())
    assert step == 10 and position == {"epoch": 0, "batch": 10}
    np.testing.assert_array_equal(np.asarray(state.params["w"]), np.full(3, 10.0))
    assert f"{ckpt.path(15)} cannot be restored (" in caplog.text
    assert f"moved it to {ckpt.path(15)}.damaged (kept, not deleted)" in caplog.text
    assert _files(ckpt.path(15) + ".damaged") == before  # kept byte for byte
    assert ckpt.all_steps() == [5, 10]
    ckpt.keep, ckpt.every_steps = 1, 5  # a new step 15 is written; pruning passes it by
    _save(ckpt, [15, 20, 25])
    assert ckpt.all_steps() == [25]
    assert _files(ckpt.path(15) + ".damaged") == before
    ckpt.close()


def test_when_no_checkpoint_restores_the_error_lists_each_and_nothing_moves(tmp_path):
    ckpt = Checkpointer(str(tmp_path), keep=None, async_save=False)
    _save(ckpt, [5, 10])
    damage(ckpt.path(5), "metadata overwritten")
    damage(ckpt.path(10), "manifest deleted")
    with pytest.raises(checkpoint.UnreadableCheckpoint) as e:
        ckpt.restore_newest(_abstract())
    msg = str(e.value)
    assert msg.startswith(f"no checkpoint in {ckpt.directory} can be restored; tried: ")
    assert f"{ckpt.path(10)} cannot be restored (state/manifest.ocdbt is missing" in msg
    assert f"{ckpt.path(5)} cannot be restored (state/_METADATA is not JSON)" in msg
    assert "\n" not in msg and sorted(os.listdir(ckpt.directory)) == ["10", "5"]
    ckpt.close()


def test_average_refuses_damaged_inputs_by_name(tmp_path):
    ckpt = Checkpointer(str(tmp_path), keep=None, async_save=False)
    _save(ckpt, [5, 10, 15])
    damage(ckpt.path(5), "array data cut short")
    damage(ckpt.path(15), "every file emptied")
    ckpt.close()
    with pytest.raises(checkpoint.UnreadableCheckpoint) as e:
        average_last(str(tmp_path), 3, _abstract().params)
    msg = str(e.value)
    assert msg.startswith("not averaging: ") and "\n" not in msg
    assert f"{tmp_path}/checkpoints/5 cannot be restored" in msg
    assert f"{tmp_path}/checkpoints/15 cannot be restored" in msg
    assert "checkpoints/10 " not in msg
    assert not os.path.exists(tmp_path / "averaged" / "15")


def test_a_damaged_checkpoint_is_one_line_on_the_command_line(root, trained, tmp_path):
    """`translate --checkpoint` of a checkpoint whose array data is damaged: one line on
    stderr, its cause worded from TensorStore's message (not Orbax's repr of the store's spec),
    and no read Orbax left pending printing its traceback at exit."""
    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("averaged"))
    damage(str(run / "checkpoints" / "15"), "array data zeroed")
    res = subprocess.run(
        [sys.executable, "-m", "tx", "translate", "--workdir", str(run), "--checkpoint", "15"],
        cwd=root, input="A dog.\n", capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr[-3000:]
    assert res.stderr.startswith(f"error: {run}/checkpoints/15 cannot be restored (ValueError: ")
    assert "Exception ignored" not in res.stderr and "bound method" not in res.stderr


def test_reads_left_pending_by_a_failed_restore_end_with_it(tmp_path):
    """Orbax runs a restore's reads as tasks of an event loop of its own and closes it at the
    first failure (as below, with asyncio's public calls); inside `checkpoint.reading` the
    tasks still pending run to their end first, not cancelled (cancelling a TensorStore read
    can deadlock: tx.train.checkpoint._Loop), so none is left to print a traceback when
    collected."""
    import asyncio

    ended, cancelled = [], []

    async def read(i):
        try:
            await asyncio.sleep(0 if i == 0 else 0.05 * i)
            raise OSError(f"read {i} failed")
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        finally:
            ended.append(i)

    async def reads():
        await asyncio.gather(*(read(i) for i in range(5)))

    def restore():
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(reads())
        finally:
            loop.close()

    failed = pytest.raises(checkpoint.UnreadableCheckpoint, match=r"\(OSError: read 0 failed\)$")
    with failed, checkpoint.reading(str(tmp_path)):
        restore()
    assert sorted(ended) == [0, 1, 2, 3, 4] and cancelled == []


# ---------------------------------------------------------------- failed writes
def fail_writes_under(monkeypatch, fragment: str) -> None:
    """Orbax's file writes under `fragment` fail with a full disk (conftest.fail_orbax_writes)."""
    fail_orbax_writes(monkeypatch, fragment, errno.ENOSPC, "No space left on device")


# Orbax's background threads report the injected failure again as they wind down.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("async_save", [False, True])
def test_a_failed_save_names_it_and_leaves_the_earlier_checkpoints(
    tmp_path, monkeypatch, async_save
):
    ckpt = Checkpointer(str(tmp_path), keep=2, async_save=async_save, every_steps=5)
    _save(ckpt, [5, 10])
    before = {step: _files(ckpt.path(step)) for step in (5, 10)}
    fail_writes_under(monkeypatch, "/15.orbax-checkpoint-tmp")
    with pytest.raises(storage.WriteFailed) as e:
        _save(ckpt, [15])
    assert str(e.value).startswith(f"checkpoint {ckpt.path(15)} was not written (OSError: ")
    assert "No space left on device" in str(e.value)
    # The failed save's other writes have ended: a retry cannot race them for its files (CI saw
    # the retry's removal of the temporary directory lose a TensorStore lock file to one).
    assert not list(compat.commit_threads())
    # Nothing was pruned for a checkpoint that never completed, and no reader sees a step 15.
    assert {step: _files(ckpt.path(step)) for step in (5, 10)} == before
    assert ckpt.all_steps() == [5, 10]
    assert Checkpointer(str(tmp_path)).all_steps() == [5, 10]
    assert ckpt.restore_newest(_abstract())[0] == 10
    monkeypatch.undo()  # space again: the same step saves, and pruning resumes
    _save(ckpt, [15])
    assert ckpt.all_steps() == [10, 15]
    ckpt.close()


def test_a_failed_average_leaves_the_earlier_average(tmp_path, monkeypatch):
    ckpt = Checkpointer(str(tmp_path), keep=None, async_save=False)
    _save(ckpt, [5, 10, 15])
    ckpt.close()
    params = _abstract().params
    average_last(str(tmp_path), 3, params)
    fail_writes_under(monkeypatch, "/.staging/")
    with pytest.raises(
        storage.WriteFailed, match=r"averaged checkpoint .*averaged/15 was not written"
    ):
        average_last(str(tmp_path), 2, params)
    assert averaged_steps(str(tmp_path)) == [15]
    kept, meta = restore_averaged(str(tmp_path), 15, params)
    assert meta["averaged_steps"] == [5, 10, 15]
    np.testing.assert_array_equal(np.asarray(kept["w"]), np.full(3, 10.0))
    monkeypatch.undo()
    average_last(str(tmp_path), 2, params)  # replaces it whole
    new, meta = restore_averaged(str(tmp_path), 15, params)
    assert meta["averaged_steps"] == [10, 15]
    np.testing.assert_array_equal(np.asarray(new["w"]), np.full(3, 12.5))
    assert sorted(os.listdir(tmp_path / "averaged")) == [".staging", "15"]
    assert os.listdir(tmp_path / "averaged" / ".staging") == []


def test_a_write_that_fails_half_way_changes_nothing(tmp_path, monkeypatch):
    path = tmp_path / "test.hyp.de"
    path.write_text("earlier\n")

    def fsync(fd):  # the text is in the temporary file; the disk fills as it is flushed
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(storage.WriteFailed) as e:
        storage.write_text(str(path), "new\n" * 1000)
    assert str(e.value) == f"{path} was not written (No space left on device); nothing was changed"
    assert path.read_text() == "earlier\n" and os.listdir(tmp_path) == ["test.hyp.de"]
    monkeypatch.undo()
    # A missing directory is made (as on a bucket, where there are none); a file in its
    # place is an error naming the path.
    storage.write_text(str(tmp_path / "missing" / "x.txt"), "x")
    with pytest.raises(storage.WriteFailed, match=r"test\.hyp\.de/x\.txt was not written"):
        storage.write_text(str(path / "x.txt"), "x")
