"""The train step: sharded state, gradient accumulation, the NaN guard."""

import equivalence
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.train.trainer import build, create_train_state, jit_train_step

PLAIN, PIECES, DEFAULT = 0, 32, -1  # train.loss_chunk_tokens: plain loss, 4 pieces, CPU's own


def _batch(rows=8, length=16, seed=0):
    rng = np.random.default_rng(seed)
    inputs = rng.integers(4, 300, (rows, length)).astype(np.int32)
    targets = rng.integers(4, 300, (rows, length)).astype(np.int32)
    inputs[:, -3:] = 0  # some padding, unevenly over micro-batches
    targets[::3, -5:] = 0
    return {"inputs": inputs, "targets": targets}


@pytest.fixture(scope="module")
def sgd_run(tiny):
    """`sgd_run(micro_batches, loss_chunk_tokens, unlikelihood)` -> (trainer, jitted step, run):
    3 float64 SGD steps of the tiny model with 1 layer on `_batch` seeds 0-2
    (equivalence.record, plus each step's metrics). Each configuration compiles and trains once
    for the module: the tests below compare the same runs two by two (compiling dominates
    their time, not the 3 steps)."""
    runs = {}

    def run(micro_batches, chunk, unlikelihood):
        key = (micro_batches, chunk, unlikelihood)
        if key not in runs:
            runs[key] = _sgd_run(tiny, *key)
        return runs[key]

    return run


def _sgd_run(tiny, micro_batches, chunk, unlikelihood):
    cfg = tiny(
        f"train.micro_batches={micro_batches}",
        f"train.loss_chunk_tokens={chunk}",
        f"train.unlikelihood={unlikelihood}",
        "model.dropout_rate=0.0",
        "model.num_layers=1",  # micro-batches and loss pieces split rows and positions, not layers
        *equivalence.FP64,
    )
    with jax.enable_x64(True):
        trainer = build(cfg, optimizer=equivalence.sgd_keeping_gradients())
        assert trainer.micro_batches == micro_batches and trainer.unlikelihood == unlikelihood
        assert chunk == DEFAULT or trainer.loss_chunk_tokens == chunk
        step, metrics = jit_train_step(trainer), []

        def keeping_metrics(state, batch):
            state, m = step(state, batch)
            metrics.append(jax.device_get(m))
            return state, m

        state = create_train_state(trainer, seed=0)
        batches = [trainer.layout.global_batch(_batch(seed=s)) for s in range(3)]
        run = equivalence.record(keeping_metrics, state, batches, equivalence.flat)[1]
    return trainer, step, run | {"metrics": metrics}


def _assert_same_steps(ref, got, case):
    errors = equivalence.compare_steps(ref, got)
    assert errors["loss"] <= equivalence.LOSS_RTOL, (case, errors)
    assert errors["grad"] <= equivalence.GRAD_RTOL, (case, errors)
    assert errors["params_per_step"] <= equivalence.PARAM_STEP_TOL, (case, errors)


@pytest.mark.parametrize("unlikelihood", [0.0, 1.0])
def test_gradient_accumulation_equals_one_big_batch(sgd_run, unlikelihood):
    """4 micro-batches with the default loss (on a CPU the fused one, 1 piece per micro-batch)
    against 1 batch with the plain loss: the same loss and gradient at every step (SGD;
    tolerances and observed errors in tests/equivalence.py; the plain reference is the next
    test's, which shows the fused loss equal to it on 1 batch), with the unlikelihood term's
    sums as well. Observed (seeds 0-2, 2 threads and taskset -c 0): loss 1.0e-7 (a float32
    ulp of the reported sum), grad 1.5e-15, params 4.0e-14."""
    one = sgd_run(1, PLAIN, unlikelihood)[2]
    four = sgd_run(4, DEFAULT, unlikelihood)[2]
    assert one["weights"] == four["weights"]
    _assert_same_steps(one, four, f"1 vs 4 micro-batches, unlikelihood {unlikelihood}")


@pytest.mark.parametrize("unlikelihood", [0.0, 1.0])
def test_fused_loss_in_pieces_trains_as_the_plain_loss(sgd_run, unlikelihood):
    """The train step with the fused loss in 4 pieces of the length axis (32 of 8 x 16
    positions) and with the plain loss (0): the same loss and gradient at every step (float64,
    SGD; the bounds of tests/equivalence.py: pieces only reorder the sums over positions).
    Observed (seeds 0-2, 2 threads and taskset -c 0): loss 0, grad 1.4e-15, params 4.0e-14
    (2.4e-15 and 4.6e-14 with 2 layers).
    With the unlikelihood term (its gradient formed in the fused pass, autodiff in the plain)."""
    plain = sgd_run(1, PLAIN, unlikelihood)[2]
    pieces = sgd_run(1, PIECES, unlikelihood)[2]
    _assert_same_steps(plain, pieces, f"plain vs 4 pieces, unlikelihood {unlikelihood}")


def test_unlikelihood_reaches_the_train_step_and_changes_only_its_gradient(sgd_run):
    """train.unlikelihood = 1 (the fused loss, whose pass forms the term's gradient): the first
    step reports the term (> 0: _batch's random targets repeat tokens within a row) and its
    gradient moves away from the plain objective's, while the loss it reports stays the
    cross-entropy (the same float64 forward pass, its sum reordered at most: equal to within
    a float32 ulp of the reported sum, 1.2e-7 relative, well inside 1e-5)."""
    plain, with_ul = sgd_run(1, PIECES, 0.0)[2], sgd_run(1, PIECES, 1.0)[2]
    first, first_ul = plain["metrics"][0], with_ul["metrics"][0]
    assert "unlikelihood" not in first and float(first_ul["unlikelihood"]) > 0
    assert float(first_ul["loss"]) == pytest.approx(float(first["loss"]), rel=1e-5)
    grads, ul_grads = plain["grads"][0], with_ul["grads"][0]
    moved = [k for k, g in grads.items() if not np.allclose(g, ul_grads[k], atol=0)]
    assert moved, "the unlikelihood term left every gradient as it was"


def test_train_step_rejects_non_finite_update(sgd_run):
    """NaN parameters: the step reports `finite = False` and keeps the parameters and the
    optimizer state. The guard (a lax.cond around the optimizer update) is the same for every
    optimizer and dtype, so the compiled float64 SGD step of the tests above serves (the
    loop's NaN test, tests/test_loop.py, runs the configured Adam step with dropout)."""
    trainer, step, _ = sgd_run(1, PLAIN, 0.0)
    with jax.enable_x64(True):
        state = create_train_state(trainer, seed=0)
        bad = state.replace(params=jax.tree_util.tree_map(lambda x: x * jnp.nan, state.params))
        before = jax.device_get((bad.params, bad.opt_state))
        new, metrics = step(bad, trainer.layout.global_batch(_batch()))
    assert not bool(metrics["finite"])
    after = (new.params, new.opt_state)  # the kept gradient too: zeros, NaN had it updated
    for a, b in zip(
        jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after), strict=True
    ):
        np.testing.assert_array_equal(a, np.asarray(b))  # NaN == NaN positions unchanged
