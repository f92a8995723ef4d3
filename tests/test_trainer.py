"""The train step: sharded state, gradient accumulation, the NaN guard."""

import equivalence
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.train.trainer import build, create_train_state, jit_train_step


def _batch(rows=8, length=16, seed=0):
    rng = np.random.default_rng(seed)
    inputs = rng.integers(4, 300, (rows, length)).astype(np.int32)
    targets = rng.integers(4, 300, (rows, length)).astype(np.int32)
    inputs[:, -3:] = 0  # some padding, unevenly over micro-batches
    targets[::3, -5:] = 0
    return {"inputs": inputs, "targets": targets}


@pytest.mark.parametrize("unlikelihood", [0.0, 1.0])
def test_gradient_accumulation_equals_one_big_batch(tiny, unlikelihood):
    """1 vs 4 micro-batches: the same loss and gradient at every step (SGD; tolerances and
    observed errors in tests/equivalence.py), with the unlikelihood term's sums as well."""
    runs = []
    for k in (1, 4):
        ul = f"train.unlikelihood={unlikelihood}"
        cfg = tiny(f"train.micro_batches={k}", ul, "model.dropout_rate=0.0", *equivalence.FP64)
        with jax.enable_x64(True):
            trainer = build(cfg, optimizer=equivalence.sgd_keeping_gradients())
            state = create_train_state(trainer, seed=0)
            batches = [trainer.layout.global_batch(_batch(seed=s)) for s in range(3)]
            step = jit_train_step(trainer)
            runs.append(equivalence.record(step, state, batches, equivalence.flat)[1])
    assert runs[0]["weights"] == runs[1]["weights"]
    errors = equivalence.compare_steps(*runs)
    assert errors["loss"] <= equivalence.LOSS_RTOL, errors
    assert errors["grad"] <= equivalence.GRAD_RTOL, errors
    assert errors["params_per_step"] <= equivalence.PARAM_STEP_TOL, errors


@pytest.mark.parametrize("unlikelihood", [0.0, 1.0])
def test_fused_loss_in_pieces_trains_as_the_plain_loss(tiny, unlikelihood):
    """The train step with the fused loss in 4 pieces of the length axis (32 of 8 x 16
    positions) and with the plain loss (0): the same loss and gradient at every step (float64,
    SGD; the bounds of tests/equivalence.py: pieces only reorder the sums over positions).
    Observed (seeds 0-2, 2 threads and taskset -c 0): loss 0, grad 2.4e-15, params 4.6e-14.
    With the unlikelihood term (its gradient formed in the fused pass, autodiff in the plain)."""
    runs = []
    for chunk in (0, 32):
        ul = f"train.unlikelihood={unlikelihood}"
        cfg = tiny(
            f"train.loss_chunk_tokens={chunk}", ul, "model.dropout_rate=0.0", *equivalence.FP64
        )
        with jax.enable_x64(True):
            trainer = build(cfg, optimizer=equivalence.sgd_keeping_gradients())
            assert trainer.loss_chunk_tokens == chunk
            state = create_train_state(trainer, seed=0)
            batches = [trainer.layout.global_batch(_batch(seed=s)) for s in range(3)]
            step = jit_train_step(trainer)
            runs.append(equivalence.record(step, state, batches, equivalence.flat)[1])
    errors = equivalence.compare_steps(*runs)
    assert errors["loss"] <= equivalence.LOSS_RTOL, errors
    assert errors["grad"] <= equivalence.GRAD_RTOL, errors
    assert errors["params_per_step"] <= equivalence.PARAM_STEP_TOL, errors


def test_unlikelihood_reaches_the_train_step_and_changes_only_its_gradient(tiny):
    """train.unlikelihood = 1: the step reports the term (> 0: _batch's random targets repeat
    tokens within a row) and its gradient moves away from the plain objective's, while the
    loss it reports stays the cross-entropy (the same forward pass in float32: a sum of ~100
    token losses reordered at most, bound ~100 x 6e-8 < 1e-5; observed 0 for batch seeds 0-2,
    2 threads and taskset -c 0)."""
    out = {}
    for ul in (0.0, 1.0):
        cfg = tiny(f"train.unlikelihood={ul}", "model.dropout_rate=0.0")
        trainer = build(cfg, optimizer=equivalence.sgd_keeping_gradients())
        assert trainer.unlikelihood == ul
        state = create_train_state(trainer, seed=0)
        state, metrics = jit_train_step(trainer)(state, trainer.layout.global_batch(_batch()))
        out[ul] = (metrics, equivalence.flat(equivalence.gradient_of(state)))
    (plain, plain_grads), (with_ul, ul_grads) = out[0.0], out[1.0]
    assert "unlikelihood" not in plain and float(with_ul["unlikelihood"]) > 0
    assert float(with_ul["loss"]) == pytest.approx(float(plain["loss"]), rel=1e-5)
    moved = [k for k, g in plain_grads.items() if not np.allclose(g, ul_grads[k], atol=0)]
    assert moved, "the unlikelihood term left every gradient as it was"


def test_train_step_rejects_non_finite_update(tiny):
    trainer = build(tiny())
    state = create_train_state(trainer, seed=0)
    bad = state.replace(params=jax.tree_util.tree_map(lambda x: x * jnp.nan, state.params))
    before = jax.device_get(bad.params)
    new, metrics = jit_train_step(trainer)(bad, trainer.layout.global_batch(_batch()))
    assert not bool(metrics["finite"])
    for a, b in zip(
        jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(new.params), strict=True
    ):
        np.testing.assert_array_equal(a, np.asarray(b))  # NaN == NaN positions unchanged
