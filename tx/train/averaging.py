"""Checkpoint averaging (the paper: "averaging the last 5 checkpoints", 20 for big models).

    average(cfg, workdir)  `tx average`: the last `decode.average_last` averaging checkpoints
                           (or, with decode.average_which="best", the best by the dev score
                           of train.best_metric: tx.train.best) -> workdir/averaged/<step>,
                           recorded in the run card
    average_last(...)      the same from explicit arguments, for tests and other callers

The arithmetic is here; reading and writing checkpoints (which ones count for averaging, the
averaged store and its atomic replacement) is tx.train.checkpoint's, and nothing here touches
Orbax.
"""

from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp
import ml_collections

from tx import workdir as wd
from tx.config import ConfigError, model_config
from tx.model.counting import abstract_params
from tx.train import best, runcard, runlock, sharding
from tx.train.averaged import averaged_steps, restore_averaged, save_params
from tx.train.checkpoint import Checkpointer, UnreadableCheckpoint, averaging_steps


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
