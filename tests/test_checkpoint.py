"""Checkpoints: which are kept, which are averaged, and refusing a stale averaged model."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tx import checkpoint
from tx.checkpoint import Checkpointer, average_last, averaging_steps
from tx.trainer import TrainState
from tx.translate import StaleAverage, _check_fresh


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
    params, meta = checkpoint.restore_averaged(str(tmp_path), 15, abstract.params)
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
