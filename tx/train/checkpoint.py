"""Orbax checkpoints: the train state and the data position, saved together, atomically (the
store of averaged parameters is tx.train.averaging's).

Layout under the workdir (paths named in tx.workdir):
  checkpoints/<step>/state   TrainState (params, optimizer state, step, rng), sharded arrays
  checkpoints/<step>/data    the data position {"epoch": e, "batch": b} as JSON, and the
                             dev score when one was taken at that step ({"score": {metric: v}})
Orbax writes each step under a temporary name and renames it when complete, so a run killed
mid-save leaves the previous checkpoints intact and the partial one is ignored. On a bucket
(gs://, s3://), where there is no rename, a step is written in place and is complete once its
`commit_success.txt`, written last, is there (Orbax's commit-file atomicity, which every
manager here uses on buckets, readers included: a reader without it would list an unfinished
step on S3).

A checkpoint whose files were damaged on disk (emptied, cut short, overwritten) cannot be
restored: every read names it and says why (`UnreadableCheckpoint`). Resuming
(`Checkpointer.restore_newest`) goes back to the newest one that restores and moves the
unreadable newer ones aside to `checkpoints/<step>.damaged`: kept for inspection, never deleted,
out of Orbax's view, so neither pruning nor a new save of that step touches them. Pruning
deletes by age alone and reads nothing: a damaged checkpoint nobody has tried to read goes when
its turn comes, as any other would. A bit flipped inside array data is not detected (the files
carry no checksums of the data).

Two kinds of training checkpoint share `checkpoints/`: those written every
`train.checkpoint_every_steps` steps (and at the last step) are the ones averaged, at the same
step spacing on any hardware (the paper: every 10 minutes at its 0.4 s/step, i.e. 1,500 steps);
the time-based ones (`train.checkpoint_every_secs`, SIGTERM) are only for resuming, and only
the newest of them is kept. With `keep_best` (tx.train.best), the best-scoring checkpoints are
kept too, whatever their kind or age.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import orbax.checkpoint as ocp

from tx import compat, storage
from tx import workdir as wd
from tx.config import ConfigError
from tx.train import best
from tx.train.distributed import all_true, barrier, process_lost

DAMAGED_SUFFIX = ".damaged"
SCORE_KEY = "score"  # in a checkpoint's data item: {metric: value} of a dev evaluation


class UnreadableCheckpoint(RuntimeError):
    """A checkpoint that cannot be restored; the message names it and says why."""


def why_unreadable(e: BaseException) -> str:
    """One line saying why a read or write failed, from the error that caused it (Orbax wraps
    TensorStore's in one that prints the store's spec; TensorStore's run to kilobytes of JSON)."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = str(e).strip().splitlines()
    text = f"{type(e).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 240 else text[:237] + "..."


@contextlib.contextmanager
def reading(path: str):
    """Any failure while restoring `path` becomes an UnreadableCheckpoint naming it, once the
    reads still pending have ended (`_pending_reads_end`)."""
    try:
        with _pending_reads_end():
            yield
    except UnreadableCheckpoint:
        raise
    except Exception as e:  # noqa: BLE001 - Orbax and TensorStore raise many kinds for bad files
        raise UnreadableCheckpoint(f"{path} cannot be restored ({why_unreadable(e)})") from e


class _Loop(asyncio.SelectorEventLoop):
    """An event loop that lets its pending tasks (reads, which end) end before closing. Not
    cancelled, as asyncio.run would: cancelling a TensorStore read waits, holding the GIL, for
    its completion callback, which runs on TensorStore's thread and needs the GIL: a
    deadlock."""

    def close(self) -> None:
        pending = asyncio.all_tasks(self)
        if pending and not self.is_running() and not self.is_closed():
            self.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        super().close()


class _Loops(asyncio.DefaultEventLoopPolicy):
    """Makes `_Loop`s."""

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return _Loop()


@contextlib.contextmanager
def _pending_reads_end():
    """Event loops made in the block end their pending tasks before closing
    (https://docs.python.org/3/library/asyncio-policy.html). Orbax reads a checkpoint's arrays
    as tasks of a loop of its own, which it closes at the first failed read with the others
    still pending; each of those would print its traceback when collected, at exit."""
    before = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_Loops())
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(before)


def check_files(path: str, items: dict[str, str]) -> None:
    """Checks the files Orbax reads first in the checkpoint directory `path`, so that the usual
    damage (a file emptied, cut short or overwritten) is named by its file rather than by a
    TensorStore error. `items` maps each item to its kind: "tree" (arrays) or "json"."""
    for item, kind in items.items():
        name = "_METADATA" if kind == "tree" else "metadata"
        metadata = read_json(path, f"{item}/{name}")
        if kind == "tree" and metadata.get("use_ocdbt", False):
            manifest = storage.join(path, item, "manifest.ocdbt")
            if not storage.isfile(manifest) or storage.size(manifest) == 0:
                raise UnreadableCheckpoint(
                    f"{path} cannot be restored ({item}/manifest.ocdbt is missing or empty)"
                )


def read_json(path: str, name: str) -> dict:
    """The JSON object `name` ("item/file") of the checkpoint directory `path`."""
    try:
        value = json.loads(storage.read_bytes(storage.join(path, *name.split("/"))).decode("utf-8"))
    except FileNotFoundError:
        raise UnreadableCheckpoint(f"{path} cannot be restored ({name} is missing)") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise UnreadableCheckpoint(f"{path} cannot be restored ({name} is not JSON)") from None
    if not isinstance(value, dict):
        raise UnreadableCheckpoint(f"{path} cannot be restored ({name} is not a JSON object)")
    return value


def _saved_score(path: str) -> dict:
    """The score a checkpoint's data item carries ({} if none, or if it cannot be read)."""
    try:
        score = read_json(path, "data/metadata").get(SCORE_KEY, {})
    except UnreadableCheckpoint as e:
        logging.warning("%s: its dev score is not counted", e)
        return {}
    if not isinstance(score, dict):
        return {}
    return {k: v for k, v in score.items() if isinstance(v, (int, float)) and v == v}


def _manager(directory: str, async_save: bool = True) -> ocp.CheckpointManager:
    """Orbax keeps everything; Checkpointer._prune decides what goes."""
    options = manager_options(
        directory, max_to_keep=None, create=True, enable_async_checkpointing=async_save
    )
    return ocp.CheckpointManager(
        storage.absolute(directory), options=options, item_names=("state", "data")
    )


def manager_options(directory: str, **options) -> ocp.CheckpointManagerOptions:
    """CheckpointManagerOptions for a manager of `directory` (writer or reader): on a bucket,
    commit-file atomicity (see `atomicity`)."""
    return ocp.CheckpointManagerOptions(atomicity_options=atomicity(directory), **options)


def atomicity(path: str) -> ocp.options.AtomicityOptions | None:
    """Orbax's atomicity for checkpoints under `path`: locally its default (a temporary name,
    renamed when whole: None); on a bucket, which has no rename, a commit file written last.
    Prepares Orbax for the bucket first (tx.storage.configure; for s3://, `_orbax_s3`)."""
    if not storage.is_remote(path):
        return None
    storage.configure()
    if path.startswith("s3://"):
        _orbax_s3()
    return ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE)


def _orbax_s3() -> None:
    """Lets Orbax write s3:// arrays through TensorStore's s3 driver (tx.compat.orbax_s3, with
    tx.storage.s3_kvstore's spec), only once an s3:// checkpoint is used: gs:// and local
    paths never depend on it. An Orbax without the internals it relies on stops here with
    one line."""
    try:
        compat.orbax_s3(storage.s3_kvstore)
    except (ImportError, AttributeError) as e:
        raise ConfigError(
            f"s3:// checkpoints rely on internals of orbax-checkpoint 0.12.x, which this "
            f"orbax-checkpoint {ocp.__version__} lacks ({e}); install orbax-checkpoint==0.12.8, "
            "or use gs:// or a local directory"
        ) from None


def averaging_steps(steps: list[int], every: int, final_step: int | None = None) -> list[int]:
    """The steps among `steps` that count for averaging: multiples of `every` and the final
    step, not the time-based saves in between. `every` = 0 (time-based only): all of them."""
    if not every:
        return sorted(steps)
    return sorted(s for s in steps if s % every == 0 or s == final_step)


class Checkpointer:
    """Saves and restores (state, data position) in `workdir/checkpoints`.

    Keeps the last `keep` averaging checkpoints (see `averaging_steps`), the newest checkpoint
    whatever its kind, and the `keep_best` best by `best_metric` (tx.train.best); `keep=None`
    deletes nothing.
    """

    def __init__(
        self,
        workdir: str,
        *,
        keep: int | None = 20,
        async_save: bool = True,
        every_steps: int = 0,
        final_step: int | None = None,
        keep_best: int = 0,
        best_metric: str = "dev_bleu",
    ):
        self.directory = wd.checkpoints_dir(workdir)
        self.keep, self.every_steps, self.final_step = keep, every_steps, final_step
        self.keep_best, self.best_metric = keep_best, best_metric
        self.async_save = async_save
        self.manager = _manager(self.directory, async_save)
        self._pending = None  # the step whose save may still be running
        self._scores = {}  # step -> its data item's "score" ({} when none), read once

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state, data_position: dict, score: dict | None = None) -> None:
        """Starts an (asynchronous) save; `wait()` blocks until it is on disk. `score`
        ({metric: value}, the dev evaluation of this very state) is saved with it.

        A save that fails (a full disk, say) raises tx.storage.WriteFailed naming its checkpoint,
        here or from the next `save` / `wait`; Orbax writes under a temporary name, so nothing
        partial is ever a step, and the checkpoints before it are intact.
        """
        self.wait()  # the previous save's failure is reported as its own
        data = dict(data_position) | ({SCORE_KEY: dict(score)} if score else {})
        with self._writing(step):
            self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data)
                ),
                force=True,
            )
        self._pending = step
        self._scores[step] = dict(score or {})

    @contextlib.contextmanager
    def _writing(self, step: int):
        try:
            yield
        except Exception as e:  # noqa: BLE001 - TensorStore reports a full disk as ValueError
            if (lost := process_lost(e)) is not None:  # not a write that failed: a peer died
                raise lost from e
            self._renew_manager()
            raise storage.WriteFailed(
                f"checkpoint {self.path(step)} was not written ({why_unreadable(e)}); "
                "the checkpoints before it are intact"
            ) from e

    def _renew_manager(self) -> None:
        """After a failed save: Orbax's manager listed the step when the save began, and its
        background threads keep the failure, to raise it again from any later call (a restore
        would then blame another checkpoint). A new manager reads the steps from disk."""
        with contextlib.suppress(Exception):
            self.manager.close()
        _join_commit_threads()
        self.manager = _manager(self.directory, self.async_save)

    def wait(self) -> None:
        """Blocks until the pending save is on disk, then prunes: only a checkpoint known to be
        complete may count towards deleting an older one."""
        step, self._pending = self._pending, None
        if step is None:  # nothing saved since: nothing to prune for
            return
        with self._writing(step):
            self.manager.wait_until_finished()
        self._prune()

    def _prune(self) -> None:
        if self.keep is None:
            return
        steps = self.all_steps()
        if not steps:
            return
        kept = set(averaging_steps(steps, self.every_steps, self.final_step)[-self.keep :])
        kept.add(steps[-1])
        if self.keep_best:
            kept.update(best.best_steps(self.scores(), self.best_metric, self.keep_best))
        for step in steps:
            if step not in kept:
                self.manager.delete(step)

    def path(self, step: int) -> str:
        return storage.join(self.directory, str(step))

    def scores(self, metric: str | None = None) -> dict[int, float]:
        """{step: value of `metric` (default best_metric)} of the checkpoints that carry one.

        Only the small data item of each checkpoint is read, once. A checkpoint whose data
        item cannot be read has no score here (its restore will name the damage)."""
        metric = metric or self.best_metric
        for step in self.all_steps():
            if step not in self._scores:
                self._scores[step] = _saved_score(self.path(step))
        return {
            step: float(self._scores[step][metric])
            for step in self.all_steps()
            if metric in self._scores[step]
        }

    def restore(self, step: int, abstract_state):
        """(state, data position) of `step`, laid out as `abstract_state`'s shardings say.

        `abstract_state` is a tree of jax.ShapeDtypeStruct with shardings, so a checkpoint
        written on one mesh restores onto another. UnreadableCheckpoint if it cannot be read.
        """
        check_files(self.path(step), {"state": "tree", "data": "json"})
        with reading(self.path(step)):
            restored = self.manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()
                ),
            )
            data = dict(restored["data"])
            data.pop(SCORE_KEY, None)  # the rest is the data position
            return restored["state"], data

    def restore_newest(self, abstract_state):
        """(step, state, data position) of the newest checkpoint that restores, or None if
        there is none. Newer ones that cannot be restored are moved aside (`_set_aside`) with
        a warning; if none restores, UnreadableCheckpoint lists them all and nothing is moved.
        """
        unreadable = []
        for step in reversed(self.all_steps()):
            try:
                restored, why = self.restore(step, abstract_state), None
            except UnreadableCheckpoint as e:
                restored, why = None, str(e)
            # Every process resumes from the same step, even if only one could not read it.
            if all_true(why is None):
                for bad, reason in unreadable:
                    self._set_aside(bad, reason)
                return (step, *restored)
            unreadable.append((step, why or f"{self.path(step)}: another process cannot read it"))
        if unreadable:
            raise UnreadableCheckpoint(
                f"no checkpoint in {self.directory} can be restored; tried: "
                + "; ".join(why for _, why in unreadable)
                + ". Nothing was changed: move the directory aside to train from scratch"
            )
        return None

    def _set_aside(self, step: int, why: str) -> None:
        """Moves an unreadable checkpoint to `<step>.damaged`: kept, but no longer a step (a
        new save of that step would otherwise collide with it). Locally a rename; on a bucket
        each object is copied and then the originals removed (tx.storage.move_tree)."""
        target = self.path(step) + DAMAGED_SUFFIX
        n = 1
        while storage.isdir(target):  # damaged at this step before: keep both
            target, n = f"{self.path(step)}{DAMAGED_SUFFIX}.{n}", n + 1
        if wd.is_main():
            storage.move_tree(self.path(step), target)
        logging.warning("%s; moved it to %s (kept, not deleted)", why, target)
        barrier(f"tx-set-aside-{step}")
        self.manager.reload()

    def restore_params(self, step: int, abstract_params):
        """Only the parameters of `step`, laid out as `abstract_params` says: the optimizer
        state is not read (inference and averaging need no optimizer)."""
        return restore_part(self.path(step), "state", {"params": abstract_params})["params"]

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.manager.close()


def restore_part(path: str, item: str, tree):
    """The arrays `tree` names (ShapeDtypeStructs with shardings: all or part of the tree the
    item `item` of the checkpoint directory `path` holds), read into their shardings."""
    check_files(path, {item: "tree"})
    restore_args = ocp.checkpoint_utils.construct_restore_args(tree)
    with reading(path):
        reader = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(), atomicity_options=atomicity(path))
        args = ocp.args.PyTreeRestore(tree, restore_args, partial_restore=True)
        return reader.restore(storage.join(storage.absolute(path), item), args=args)


# Bounds the wait for a failed save's other writes; each is one file of one checkpoint.
COMMIT_JOIN_TIMEOUT_SECS = 300.0


def _join_commit_threads() -> None:
    """Waits for the writes of a failed save that are still running.

    Orbax reports a save's first failed write (ChainedFuture.result stops at it) while the others
    go on in their own threads. A retry of that step would remove and recreate the temporary
    directory those threads still write to (CI saw the retry's rmtree lose a TensorStore lock
    file to them), so nothing touches the step again until they end.
    """
    for thread in compat.commit_threads():
        with contextlib.suppress(Exception):  # its failure is the one already reported
            thread.join(COMMIT_JOIN_TIMEOUT_SECS)
        if thread.is_alive():
            raise storage.WriteFailed(
                f"a failed checkpoint write ({thread.name}) was still running after "
                f"{COMMIT_JOIN_TIMEOUT_SECS:.0f} s"
            )
