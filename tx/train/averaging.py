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
On a bucket there is no rename: an average is written in place, under a name of its own, and
is complete once `averaged/index.json` ({step: name}), written last, names it:
  averaged/<step>/ or averaged/<step>.1/   the two names an average of <step> takes in turn,
                                           so an earlier one is never written over
  averaged/index.json                      the complete averages; the earlier directory of a
                                           step goes once the index names the new one
A write that fails leaves the index, and so the earlier average, as they were.
Which training checkpoints count for averaging, and reading them, is tx.train.checkpoint's.
"""

from __future__ import annotations

import json
import logging

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
    atomicity,
    averaging_steps,
    check_files,
    read_json,
    reading,
    why_unreadable,
)
from tx.train.distributed import barrier

STAGING = ".staging"  # averaged/.staging/<step>: an average being written (local)
INDEX = "index.json"  # averaged/index.json: the complete averages (bucket)


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
        return averaged_path(workdir, chosen[-1])
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
    it was. On a bucket they are written under a name no complete average has and the index,
    written last, names them (see the module's docstring).
    """
    final = storage.join(wd.averaged_dir(workdir), str(step))
    items = ocp.args.Composite(
        params=ocp.args.StandardSave(params),
        meta=ocp.args.JsonSave({"averaged_steps": sources, **(meta or {})}),
    )
    remote = storage.is_remote(workdir)
    index = _index(workdir) if remote else {}
    name = f"{step}.1" if index.get(step) == str(step) else str(step)
    where = (
        storage.join(wd.averaged_dir(workdir), name)
        if remote
        else storage.join(wd.averaged_dir(workdir), STAGING, str(step))
    )
    if wd.is_main():  # left by an earlier attempt that failed: ours to remove
        storage.rmtree(where)
    barrier("tx-average-staging")
    writer = _checkpointer(where)
    try:
        writer.save(storage.absolute(where), args=items)
    except Exception as e:  # noqa: BLE001 - TensorStore reports a full disk as ValueError
        raise storage.WriteFailed(
            f"averaged checkpoint {final} was not written ({why_unreadable(e)}); "
            "any earlier one there is intact"
        ) from e
    finally:
        writer.close()
    if wd.is_main():
        if remote:
            _publish(workdir, step, name, index)
        else:
            _replace_dir(where, final)
    barrier("tx-average-placed")
    return where if remote else final


def _checkpointer(path: str) -> ocp.Checkpointer:
    """Orbax's reader and writer of one average, `path` (params and meta items), with the
    atomicity of where it is (tx.train.checkpoint.atomicity) for the average and its items."""
    options = atomicity(path)
    handler = ocp.CompositeCheckpointHandler(
        composite_options=ocp.CompositeOptions(atomicity_options=options)
    )
    return ocp.Checkpointer(handler, atomicity_options=options)


def _publish(workdir: str, step: int, name: str, index: dict[int, str]) -> None:
    """Bucket: the index names `name` as the average of `step` (one object, written last),
    then the directory it named before goes."""
    earlier = index.get(step)
    index = {**index, step: name}
    text = json.dumps({str(s): n for s, n in sorted(index.items())}, indent=1) + "\n"
    try:
        storage.write_text(storage.join(wd.averaged_dir(workdir), INDEX), text)
    except storage.WriteFailed as e:
        raise storage.WriteFailed(
            f"averaged checkpoint {storage.join(wd.averaged_dir(workdir), str(step))} was not "
            f"written ({e}); any earlier one there is intact"
        ) from e
    if earlier and earlier != name:
        storage.rmtree(storage.join(wd.averaged_dir(workdir), earlier))


def _index(workdir: str) -> dict[int, str]:
    """Bucket: {step: directory name} of the complete averages. An index that cannot be read
    names none (averages are derived data: `average` writes them again), with a warning."""
    path = storage.join(wd.averaged_dir(workdir), INDEX)
    try:
        index = json.loads(storage.read_text(path))
        return {int(step): str(name) for step, name in index.items()}
    except FileNotFoundError:
        return {}
    except (UnicodeDecodeError, ValueError, AttributeError, TypeError) as e:
        logging.warning("%s is damaged (%s): no average counts until one is written", path, e)
        return {}


def _replace_dir(new: str, final: str) -> None:
    """Moves the directory `new` to `final`, replacing what is there (two renames: there is no
    atomic swap of non-empty directories)."""
    old = final + ".replaced"
    storage.rmtree(old)
    if storage.exists(final):
        storage.move_tree(final, old)
    storage.move_tree(new, final)
    storage.rmtree(old)


def averaged_path(workdir: str, step: int) -> str:
    """The directory of the average of `step` (on a bucket, the one the index names)."""
    name = _index(workdir).get(step, str(step)) if storage.is_remote(workdir) else str(step)
    return storage.join(wd.averaged_dir(workdir), name)


def averaged_steps(workdir: str) -> list[int]:
    if storage.is_remote(workdir):
        return sorted(_index(workdir))
    path = wd.averaged_dir(workdir)
    if not storage.isdir(path):
        return []
    manager = ocp.CheckpointManager(
        storage.absolute(path),
        options=ocp.CheckpointManagerOptions(create=False, read_only=True),
        item_names=("params", "meta"),
    )
    return sorted(manager.all_steps())


def averaged_meta(workdir: str, step: int) -> dict:
    """The meta item of averaged/<step> (which steps, chosen how), read without the arrays."""
    return read_json(averaged_path(workdir, step), "meta/metadata")


def restore_averaged(workdir: str, step: int, abstract_params):
    path = averaged_path(workdir, step)
    check_files(path, {"params": "tree", "meta": "json"})
    reader = _checkpointer(path)
    with reading(path):
        restored = reader.restore(
            storage.absolute(path),
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(abstract_params), meta=ocp.args.JsonRestore()
            ),
        )
        return restored["params"], dict(restored["meta"])
