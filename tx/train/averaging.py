"""Checkpoint averaging (the paper: "averaging the last 5 checkpoints", 20 for big models).

    average(cfg, workdir)  `tx average`: the last `decode.average_last` averaging checkpoints
                           -> workdir/averaged/<step>, recorded in the run card
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
from tx.config import model_config
from tx.model.counting import abstract_params
from tx.train import runcard, runlock, sharding
from tx.train.checkpoint import (
    Checkpointer,
    UnreadableCheckpoint,
    averaged_steps,
    averaging_steps,
    restore_averaged,
    save_params,
)


def average(
    cfg: ml_collections.ConfigDict,
    workdir: str,
    last: int | None = None,
    take_over_lock: bool = False,
):
    """`tx average`: the last `last` (default `decode.average_last`) averaging checkpoints of
    `workdir` -> workdir/averaged/<step>; returns (path, averaged steps). It writes into the
    run, so it holds the run's lock (tx.train.runlock) as `train` does."""
    target = sharding.layout(cfg.mesh).placed(abstract_params(model_config(cfg)))
    t = cfg.train
    last = cfg.decode.average_last if last is None else last
    with runlock.hold(workdir, take_over=take_over_lock):
        path, steps = average_last(workdir, last, target, t.checkpoint_every_steps, t.num_steps)
        runcard.record_average(workdir, path, steps)
    return path, steps


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
    if not steps:
        raise FileNotFoundError(f"no checkpoints to average in {ckpt.directory}")
    if last < 1:
        raise ValueError(f"--last must be >= 1, got {last}")
    chosen = steps[-last:]
    if _already_averaged(workdir, chosen, abstract_params):  # e.g. `make demo` run twice
        ckpt.close()
        return os.path.join(wd.averaged_dir(workdir), str(chosen[-1])), chosen
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
    return save_params(workdir, chosen[-1], mean, chosen), chosen


def _already_averaged(workdir: str, chosen: list[int], abstract_params) -> bool:
    """Whether averaged/<last chosen step> holds the average of exactly `chosen`; one that
    cannot be read is not (it is replaced, with a warning: it is derived data)."""
    if chosen[-1] not in averaged_steps(workdir):
        return False
    try:
        _, meta = restore_averaged(workdir, chosen[-1], abstract_params)
    except UnreadableCheckpoint as e:
        logging.warning("%s; averaging again", e)
        return False
    return meta["averaged_steps"] == chosen
