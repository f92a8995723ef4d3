"""Orbax checkpoints: the train state and the data position, saved together, atomically.

Layout under the workdir:
  checkpoints/<step>/state   TrainState (params, optimizer state, step, rng), sharded arrays
  checkpoints/<step>/data    the data position {"epoch": e, "batch": b} as JSON
  averaged/<step>/state      parameters averaged over the last N checkpoints (tx average)
Orbax writes each step under a temporary name and renames it when complete, so a run killed
mid-save leaves the previous checkpoints intact and the partial one is ignored.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

CHECKPOINTS = "checkpoints"
AVERAGED = "averaged"


def _manager(
    directory: str, keep: int | None, async_save: bool = True, read_only: bool = False
) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        create=not read_only,
        enable_async_checkpointing=async_save,
        read_only=read_only,
    )
    return ocp.CheckpointManager(
        os.path.abspath(directory), options=options, item_names=("state", "data")
    )


class Checkpointer:
    """Saves and restores (state, data position) in `workdir/checkpoints`, keeping the last K."""

    def __init__(self, workdir: str, keep: int = 20, async_save: bool = True):
        self.directory = os.path.join(workdir, CHECKPOINTS)
        self.manager = _manager(self.directory, keep, async_save)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state, data_position: dict) -> None:
        """Starts an (asynchronous) save; `wait()` blocks until it is on disk."""
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(dict(data_position))
            ),
            force=True,
        )

    def restore(self, step: int, abstract_state):
        """(state, data position) of `step`, laid out as `abstract_state`'s shardings say.

        `abstract_state` is a tree of jax.ShapeDtypeStruct with shardings, so a checkpoint
        written on one mesh restores onto another.
        """
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()
            ),
        )
        return restored["state"], dict(restored["data"])

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def average_params(trees: list) -> object:
    """Arithmetic mean of parameter trees, in float32, cast back to each leaf's dtype."""
    n = len(trees)

    def mean(*leaves):
        total = sum(leaf.astype(jnp.float32) for leaf in leaves)
        return (total / n).astype(leaves[0].dtype)

    return jax.tree_util.tree_map(mean, *trees)


def save_params(workdir: str, step: int, params, sources: list[int]) -> str:
    """Writes averaged parameters as `workdir/averaged/<step>` (atomically) and returns it."""
    manager = ocp.CheckpointManager(
        os.path.abspath(os.path.join(workdir, AVERAGED)),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=None, create=True, enable_async_checkpointing=False
        ),
        item_names=("params", "meta"),
    )
    if step in manager.all_steps():  # averaged over other steps before: replace it
        manager.delete(step)
    manager.save(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            meta=ocp.args.JsonSave({"averaged_steps": sources}),
        ),
        force=True,
    )
    manager.wait_until_finished()
    manager.close()
    return os.path.join(workdir, AVERAGED, str(step))


def averaged_steps(workdir: str) -> list[int]:
    path = os.path.join(workdir, AVERAGED)
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


def restore_averaged(workdir: str, step: int, abstract_params):
    manager = _manager_read(os.path.join(workdir, AVERAGED), ("params", "meta"))
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract_params), meta=ocp.args.JsonRestore()
        ),
    )
    return restored["params"], dict(restored["meta"])


def average_last(workdir: str, last: int, abstract_state) -> tuple[str, list[int]]:
    """Averages the parameters of the last `last` checkpoints into `workdir/averaged/<step>`.

    `abstract_state` (ShapeDtypeStructs with shardings) says how to lay the arrays out, so
    sharded parameters are averaged shard by shard on their devices.
    """
    ckpt = Checkpointer(workdir, keep=None, async_save=False)
    steps = ckpt.all_steps()
    if not steps:
        raise FileNotFoundError(f"no checkpoints in {ckpt.directory}")
    if last < 1:
        raise ValueError(f"--last must be >= 1, got {last}")
    chosen = steps[-last:]
    if chosen[-1] in averaged_steps(workdir):
        _, meta = restore_averaged(workdir, chosen[-1], abstract_state.params)
        if meta["averaged_steps"] == chosen:  # already done (e.g. `make demo` run twice)
            ckpt.close()
            return os.path.join(workdir, AVERAGED, str(chosen[-1])), chosen
    total, n = None, 0
    for step in chosen:  # a running sum: memory stays at two parameter trees
        params = ckpt.restore(step, abstract_state)[0].params
        params32 = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), params)
        total = params32 if total is None else jax.tree_util.tree_map(jnp.add, total, params32)
        n += 1
    ckpt.close()
    mean = jax.tree_util.tree_map(
        lambda t, a: (t / n).astype(a.dtype), total, abstract_state.params
    )
    return save_params(workdir, chosen[-1], mean, chosen), chosen
