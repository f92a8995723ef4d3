import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tx.train.optim import make_optimizer, paper_schedule


def formula(step, d_model=512, warmup=4000):
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@pytest.mark.parametrize("step", [1, 2000, 4000, 10000, 100000])
def test_schedule_matches_formula(step):
    sched = paper_schedule(512, 4000)
    # optax counts updates from 0: the step-th update sees count = step - 1.
    # float32: step^-0.5 to 4 ulp (8 u), then the rounded constant d_model^-0.5 and the product
    # (2 u); the other branch 4 u: 10 u = 6.0e-7 relative. Observed <= 1.9 u = 1.1e-7 over steps
    # 1-20000 (1 and 2 threads, 8 devices).
    assert float(sched(step - 1)) == pytest.approx(formula(step), rel=1e-6)


def test_schedule_peaks_at_warmup():
    sched = paper_schedule(512, 4000)
    lrs = np.array([float(sched(s - 1)) for s in range(1, 20001, 1)])
    # The neighbours are 1.2e-4 and 2.5e-4 lower, far above the 10 u = 6.0e-7 rounding bound.
    assert int(lrs.argmax()) + 1 == 4000
    assert lrs.max() == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-6)  # as above; observed 4.5e-8
    # Exact: scale = 2 doubles the rounded constant and the product exactly (observed: equal).
    assert float(paper_schedule(512, 4000, scale=2.0)(3999)) == 2 * lrs.max()


def test_optimizer_is_adam_with_paper_betas():
    cfg = ml_collections.ConfigDict(
        dict(
            learning_rate_scale=1.0,
            warmup_steps=4000,
            b1=0.9,
            b2=0.98,
            eps=1e-9,
            grad_clip_norm=0.0,
        )
    )
    tx, _ = make_optimizer(cfg, 512)
    params = {"w": jnp.array([1.0, -2.0])}
    state = tx.init(params)
    g = {"w": jnp.array([0.5, 0.25])}
    updates, state = tx.update(g, state, params)
    # First Adam step: m_hat = g, v_hat = g^2, update = -lr * g / (|g| + eps).
    lr = formula(1)
    expected = -lr * np.array([0.5, 0.25]) / (np.abs([0.5, 0.25]) + 1e-9)
    # Bound, relative: optax's bias corrections 1 - b^t use float32 b1, b2 and pow, and the
    # cancellation magnifies both: b1 = 0.9f (4 u) and pow to 4 ulp (40 u) over 1 - b1 = 0.1;
    # b2 = 0.98f (16 u) and pow (200 u) over 0.02, halved by the square root (108 u); the
    # schedule (4 u) and ~10 other roundings: ~170 u = 1.0e-5 at step 1, ~105 u = 6.3e-6 at
    # step 2. Observed: <= 12.4 u and 16.6 u (this gradient and 4 random ones, 1 and 2 threads,
    # 8 devices), mostly the rounding of 0.9 and 0.98 (12 u and 15.5 u).
    np.testing.assert_allclose(np.asarray(updates["w"]), expected, rtol=2e-5)
    updates, state = tx.update(g, state, params)
    m = 0.9 * 0.1 * np.array([0.5, 0.25]) + 0.1 * np.array([0.5, 0.25])
    v = 0.98 * 0.02 * np.array([0.25, 0.0625]) + 0.02 * np.array([0.25, 0.0625])
    m_hat, v_hat = m / (1 - 0.9**2), v / (1 - 0.98**2)
    expected = -formula(2) * m_hat / (np.sqrt(v_hat) + 1e-9)
    np.testing.assert_allclose(np.asarray(updates["w"]), expected, rtol=2e-5)  # bound as above
    jax.block_until_ready(updates)


def test_the_constant_schedule_warms_up_linearly_then_holds_its_rate():
    """optim.schedule="constant" (fine-tuning): rate * step / warmup up to the warm-up, then the
    rate. float32: the rate's own rounding, the quotient's and the product's, 3 u = 1.8e-7
    relative; observed <= 1.56 u = 9.3e-8 over steps 1-20,000 (elementwise scalars: no thread
    count enters)."""
    cfg = ml_collections.ConfigDict(
        dict(schedule="constant", learning_rate=3e-5, learning_rate_scale=1.0, warmup_steps=100,
             b1=0.9, b2=0.98, eps=1e-9, grad_clip_norm=0.0)
    )  # fmt: skip
    _, sched = make_optimizer(cfg, 512)
    for step in (1, 50, 100, 101, 5000, 100_000):
        want = 3e-5 * min(1.0, step / 100)
        assert float(sched(step - 1)) == pytest.approx(want, rel=1e-6), step


def test_a_schedule_that_is_not_one_is_named(tiny):
    from tx.config import ConfigError

    with pytest.raises(ConfigError, match="optim.schedule must be 'paper' or 'constant', got 'cos"):
        tiny("optim.schedule=cosine")
    with pytest.raises(ConfigError, match="optim.learning_rate must be positive, got 0.0"):
        tiny("optim.schedule=constant", "optim.learning_rate=0")
