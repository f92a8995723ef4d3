import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tx.optim import make_optimizer, paper_schedule


def formula(step, d_model=512, warmup=4000):
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@pytest.mark.parametrize("step", [1, 2000, 4000, 10000, 100000])
def test_schedule_matches_formula(step):
    sched = paper_schedule(512, 4000)
    # optax counts updates from 0: the step-th update sees count = step - 1.
    assert float(sched(step - 1)) == pytest.approx(formula(step), rel=1e-6)


def test_schedule_peaks_at_warmup():
    sched = paper_schedule(512, 4000)
    lrs = np.array([float(sched(s - 1)) for s in range(1, 20001, 1)])
    assert int(lrs.argmax()) + 1 == 4000
    assert lrs.max() == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-6)
    assert float(paper_schedule(512, 4000, scale=2.0)(3999)) == pytest.approx(2 * lrs.max())


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
    np.testing.assert_allclose(np.asarray(updates["w"]), expected, rtol=1e-5)
    updates, state = tx.update(g, state, params)
    m = 0.9 * 0.1 * np.array([0.5, 0.25]) + 0.1 * np.array([0.5, 0.25])
    v = 0.98 * 0.02 * np.array([0.25, 0.0625]) + 0.02 * np.array([0.25, 0.0625])
    m_hat, v_hat = m / (1 - 0.9**2), v / (1 - 0.98**2)
    expected = -formula(2) * m_hat / (np.sqrt(v_hat) + 1e-9)
    np.testing.assert_allclose(np.asarray(updates["w"]), expected, rtol=1e-5)
    jax.block_until_ready(updates)
