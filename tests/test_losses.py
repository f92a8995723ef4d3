import jax.numpy as jnp
import numpy as np
import pytest

from tx.losses import cross_entropy, smoothed_targets_entropy


def brute_force(logits, targets, weights, eps):
    V = logits.shape[-1]
    total, nll = 0.0, 0.0
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            if weights[b, t] == 0:
                continue
            z = logits[b, t]
            logp = z - np.log(np.exp(z - z.max()).sum()) - z.max()
            q = np.full(V, eps / (V - 1))
            q[targets[b, t]] = 1 - eps
            ent = -(q[q > 0] * np.log(q[q > 0])).sum()
            total += -(q * logp).sum() - ent  # KL(q || p)
            nll += -logp[targets[b, t]]
    return total, nll


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.2])
def test_label_smoothed_loss_equals_brute_force(eps):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 7)) * 3
    targets = rng.integers(0, 7, (2, 5))
    weights = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.float32)
    out = cross_entropy(jnp.array(logits), jnp.array(targets), jnp.array(weights), eps)
    loss, nll = brute_force(logits, targets, weights, eps)
    # Bound (first order, against the float64 brute force): float32 rounding of the logits, then
    # log_softmax (4 ulp per exp/log, 7 u sum|exp| for the sum over V = 7), the smoothed
    # combination and the sum over 10 positions (10 u sum|terms|), propagated through the
    # Jacobian: <= 1.8e-6 relative for the loss and <= 1.2e-6 for the NLL (eps 0, 0.1, 0.2;
    # seeds 0-4). Observed: <= 8.9e-8 and <= 7.7e-8 (seeds 0-4, 1 and 2 threads, 8 devices).
    np.testing.assert_allclose(float(out["loss"]), loss, rtol=3e-6)
    np.testing.assert_allclose(float(out["nll"]), nll, rtol=3e-6)
    assert float(out["weight"]) == 8.0
    correct = ((logits.argmax(-1) == targets) * weights).sum()
    assert float(out["correct"]) == correct


def test_perfect_smoothed_prediction_scores_zero():
    eps, V = 0.1, 6
    q = np.full((1, 1, V), eps / (V - 1))
    q[0, 0, 2] = 1 - eps
    out = cross_entropy(jnp.log(jnp.array(q)), jnp.array([[2]]), jnp.ones((1, 1)), eps)
    # Bounds as above, with logits = float32 log(q): the loss (0 in exact arithmetic) is within
    # 1.2e-6 of 0. The NLL is log(s) = 0.105 with s = sum_v exp(z_v - z_max) = 1.11; the sum of
    # six exps (6 u s), exp(0) and log(0.02) = -3.9 to 4 ulp make up to 1.2e-6 absolute error,
    # 1.1e-5 relative. Observed: 3.0e-8 and 4.9e-7 (1 and 2 threads, 8 devices).
    assert abs(float(out["loss"])) < 2e-6
    assert float(out["nll"]) == pytest.approx(-np.log(1 - eps), rel=2e-5)


def test_smoothed_entropy_value():
    V, eps = 4, 0.3
    expected = -(0.7 * np.log(0.7) + 3 * 0.1 * np.log(0.1))
    # Both float64, no cancellation: a few roundings and two logs, ~2e-15 relative; observed 0
    assert smoothed_targets_entropy(V, eps) == pytest.approx(expected, rel=1e-14)
