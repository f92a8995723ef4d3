"""Checkpoint averaging (the paper: "averaging the last 5 checkpoints", 20 for big models)
and the store of averaged parameters.

    average(cfg, workdir)  `tx average`: the last `decode.average_last` averaging checkpoints
                           (or, with decode.average_which="best", the best by the dev score
                           of train.best_metric: tx.train.best) -> workdir/averaged/<step>,
                           recorded in the run card
    average_last(...)      the same from explicit arguments, for tests and other callers

The store, under the workdir (paths named in tx.workdir; tx.infer reads it):
  averaged/<step>/params     parameters averaged over N training checkpoints (tx average)
  averaged/<step>/meta       {"averaged_steps": [...], "selection": "last" | "best", ...}
  averaged/.staging/<step>   an average being written; renamed into place when whole
Which training checkpoints count for averaging, and reading them, is tx.train.checkpoint's.
"""

from __future__ import annotations

import logging
import os
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import orbax.checkpoint as ocp

from tx import storage
from tx import workdir as wd
from tx.config import ConfigError, model_config
from tx.model.counting import abstract_params
from tx.train import best, runcard, runlock, sharding
from tx.train.checkpoint import (
    Checkpointer,
    UnreadableCheckpoint,
    averaging_steps,
    check_files,
    read_json,
    reading,
    why_unreadable,
)
from tx.train.distributed import barrier

STAGING = ".staging"  # averaged/.staging/<step>: an average being written


def average(
    cfg: ml_collections.ConfigDict,
    workdir: str,
    last: int | None = None,
    take_over_lock: bool = False,
    which: str | None = None,
):
    """`tx average`: `last` (default `decode.average_last`; for the best, at most
    `train.keep_best`) checkpoints of `workdir`, the last ones or the best (`which`, default
    `decode.average_which`) -> workdir/averaged/<step>;
    returns (path, averaged steps). It writes into the run, so it holds the run's lock
    (tx.train.runlock) as `train` does."""
    target = sharding.layout(cfg.mesh).placed(abstract_params(model_config(cfg)))
    t = cfg.train
    which = which or cfg.decode.get("average_which", "last")
    if last is None:  # the best: no more than the run keeps
        last = cfg.decode.average_last
        last = min(last, t.keep_best) if which == "best" and t.get("keep_best") else last
    with runlock.hold(workdir, take_over=take_over_lock):
        if which == "best":
            path, steps, scores = average_best(workdir, last, target, t.best_metric)
            runcard.record_average(workdir, path, steps, {"best_by": t.best_metric, **scores})
        else:
            path, steps = average_last(workdir, last, target, t.checkpoint_every_steps, t.num_steps)
            runcard.record_average(workdir, path, steps)
    return path, steps


def average_best(workdir: str, n: int, abstract_params, metric: str) -> tuple[str, list[int], dict]:
    """Averages the `n` checkpoints with the best dev `metric` (tx.train.best); returns
    (path, steps, {"scores": {step: value}}). Fewer than `n` scored checkpoints: those there
    are, with a warning; none: a ConfigError saying how to get them."""
    ckpt = Checkpointer(workdir, keep=None, async_save=False)
    scores = ckpt.scores(metric)
    ckpt.close()
    if not scores:
        raise ConfigError(
            f"no checkpoint in {wd.checkpoints_dir(workdir)} carries a {metric} score: train "
            "with train.keep_best > 0 (and train.best_metric evaluated), or average the last "
            "ones (--which last)"
        )
    if n < 1:
        raise ValueError(f"--last must be >= 1, got {n}")
    chosen = best.best_steps(scores, metric, n)
    if len(chosen) < n:
        logging.warning(
            "only %d checkpoints carry a %s score: averaging those", len(chosen), metric
        )
    meta = {"selection": "best", "metric": metric, "scores": {str(s): scores[s] for s in chosen}}
    path = _average(workdir, chosen, abstract_params, meta)
    return path, chosen, {"scores": meta["scores"]}


def average_last(
    workdir: str, last: int, abstract_params, every: int = 0, final_step: int | None = None
) -> tuple[str, list[int]]:
    """Averages the parameters of the last `last` averaging checkpoints (those every `every`
    steps and the final one; see `averaging_steps`) into `workdir/averaged/<step>`.

    `abstract_params` (ShapeDtypeStructs with shardings) says how to lay the arrays out, so
    sharded parameters are averaged shard by shard on their devices; the optimizer state is
    never read.
    """
    ckpt = Checkpointer(workdir, keep=None, async_save=False)
    steps = averaging_steps(ckpt.all_steps(), every, final_step)
    ckpt.close()
    if not steps:
        raise FileNotFoundError(f"no checkpoints to average in {ckpt.directory}")
    if last < 1:
        raise ValueError(f"--last must be >= 1, got {last}")
    chosen = steps[-last:]
    return _average(workdir, chosen, abstract_params, {"selection": "last"}), chosen


def _average(workdir: str, chosen: list[int], abstract_params, meta: dict) -> str:
    """The mean of the parameters of the checkpoints `chosen` -> averaged/<last of them>, with
    `meta` beside the steps; its path."""
    if _already_averaged(workdir, chosen, abstract_params, meta):  # `make demo` run twice
        return os.path.join(wd.averaged_dir(workdir), str(chosen[-1]))
    ckpt = Checkpointer(workdir, keep=None, async_save=False)
    total, unreadable = None, []
    for step in chosen:  # a running sum: memory stays at two parameter trees
        try:
            params = ckpt.restore_params(step, abstract_params)
        except UnreadableCheckpoint as e:  # go on: name every unreadable input at once
            unreadable.append(str(e))
            continue
        params32 = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), params)
        total = params32 if total is None else jax.tree_util.tree_map(jnp.add, total, params32)
    ckpt.close()
    if unreadable:
        raise UnreadableCheckpoint("not averaging: " + "; ".join(unreadable))
    n = len(chosen)
    mean = jax.tree_util.tree_map(lambda t, a: (t / n).astype(a.dtype), total, abstract_params)
    return save_params(workdir, chosen[-1], mean, chosen, meta)


def _already_averaged(workdir: str, chosen: list[int], abstract_params, meta: dict) -> bool:
    """Whether averaged/<last chosen step> holds the average of exactly `chosen`, chosen the
    same way (`meta`); one that cannot be read is not (it is replaced, with a warning: it is
    derived data)."""
    if chosen[-1] not in averaged_steps(workdir):
        return False
    try:
        _, saved = restore_averaged(workdir, chosen[-1], abstract_params)
    except UnreadableCheckpoint as e:
        logging.warning("%s; averaging again", e)
        return False
    same_way = saved.get("selection", "last") == meta["selection"]
    return saved["averaged_steps"] == chosen and same_way


def save_params(
    workdir: str, step: int, params, sources: list[int], meta: dict | None = None
) -> str:
    """Writes averaged parameters as `workdir/averaged/<step>` and returns that path; its meta
    item holds {"averaged_steps": sources, **meta} (meta: how they were chosen).

    They are written whole under `averaged/.staging/` (not a step) and then renamed into
    place, so a write that fails (tx.storage.WriteFailed) leaves an earlier `averaged/<step>` as
    it was.
    """
    final = os.path.join(wd.averaged_dir(workdir), str(step))
    staging = os.path.join(wd.averaged_dir(workdir), STAGING)
    if wd.is_main():  # left by an earlier attempt that failed: ours to remove
        shutil.rmtree(os.path.join(staging, str(step)), ignore_errors=True)
    barrier("tx-average-staging")
    manager = ocp.CheckpointManager(
        os.path.abspath(staging),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=None, create=True, enable_async_checkpointing=False
        ),
        item_names=("params", "meta"),
    )
    try:
        manager.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                meta=ocp.args.JsonSave({"averaged_steps": sources, **(meta or {})}),
            ),
            force=True,
        )
        manager.wait_until_finished()
    except Exception as e:  # noqa: BLE001 - TensorStore reports a full disk as ValueError
        raise storage.WriteFailed(
            f"averaged checkpoint {final} was not written ({why_unreadable(e)}); "
            "any earlier one there is intact"
        ) from e
    finally:
        manager.close()
    if wd.is_main():
        _replace_dir(os.path.join(staging, str(step)), final)
    barrier("tx-average-placed")
    return final


def _replace_dir(new: str, final: str) -> None:
    """Moves the directory `new` to `final`, replacing what is there (two renames: there is no
    atomic swap of non-empty directories)."""
    old = final + ".replaced"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(final):
        os.rename(final, old)
    os.rename(new, final)
    shutil.rmtree(old, ignore_errors=True)


def averaged_steps(workdir: str) -> list[int]:
    path = wd.averaged_dir(workdir)
    if not os.path.isdir(path):
        return []
    manager = _manager_read(path, ("params", "meta"))
    return sorted(manager.all_steps())


def _manager_read(path: str, items) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(
        os.path.abspath(path),
        options=ocp.CheckpointManagerOptions(create=False, read_only=True),
        item_names=items,
    )


def averaged_meta(workdir: str, step: int) -> dict:
    """The meta item of averaged/<step> (which steps, chosen how), read without the arrays."""
    return read_json(os.path.join(wd.averaged_dir(workdir), str(step)), "meta/metadata")


def restore_averaged(workdir: str, step: int, abstract_params):
    path = os.path.join(wd.averaged_dir(workdir), str(step))
    check_files(path, {"params": "tree", "meta": "json"})
    manager = _manager_read(wd.averaged_dir(workdir), ("params", "meta"))
    with reading(path):
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(abstract_params), meta=ocp.args.JsonRestore()
            ),
        )
        return restored["params"], dict(restored["meta"])
