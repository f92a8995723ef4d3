"""The store of averaged parameters (tx.train.averaging computes them; tx.infer reads them).

Layout under the workdir (paths named in tx.workdir):
  averaged/<step>/params     parameters averaged over N training checkpoints (tx average)
  averaged/<step>/meta       {"averaged_steps": [...], "selection": "last" | "best", ...}
  averaged/.staging/<step>   an average being written; renamed into place when whole
"""

from __future__ import annotations

import os
import shutil

import jax
import orbax.checkpoint as ocp

from tx import workdir as wd
from tx.train.checkpoint import check_files, read_json, reading, why_unreadable
from tx.train.distributed import barrier

STAGING = ".staging"  # averaged/.staging/<step>: an average being written


def save_params(
    workdir: str, step: int, params, sources: list[int], meta: dict | None = None
) -> str:
    """Writes averaged parameters as `workdir/averaged/<step>` and returns that path; its meta
    item holds {"averaged_steps": sources, **meta} (meta: how they were chosen).

    They are written whole under `averaged/.staging/` (not a step) and then renamed into
    place, so a write that fails (tx.workdir.WriteFailed) leaves an earlier `averaged/<step>` as
    it was.
    """
    final = os.path.join(wd.averaged_dir(workdir), str(step))
    staging = os.path.join(wd.averaged_dir(workdir), STAGING)
    if jax.process_index() == 0:  # left by an earlier attempt that failed: ours to remove
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
        raise wd.WriteFailed(
            f"averaged checkpoint {final} was not written ({why_unreadable(e)}); "
            "any earlier one there is intact"
        ) from e
    finally:
        manager.close()
    if jax.process_index() == 0:
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
