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
    np.testing.assert_allclose(float(out["loss"]), loss, rtol=1e-5)
    np.testing.assert_allclose(float(out["nll"]), nll, rtol=1e-5)
    assert float(out["weight"]) == 8.0
    correct = ((logits.argmax(-1) == targets) * weights).sum()
    assert float(out["correct"]) == correct


def test_perfect_smoothed_prediction_scores_zero():
    eps, V = 0.1, 6
    q = np.full((1, 1, V), eps / (V - 1))
    q[0, 0, 2] = 1 - eps
    out = cross_entropy(jnp.log(jnp.array(q)), jnp.array([[2]]), jnp.ones((1, 1)), eps)
    assert abs(float(out["loss"])) < 1e-6
    assert float(out["nll"]) == pytest.approx(-np.log(1 - eps), rel=1e-6)


def test_smoothed_entropy_value():
    V, eps = 4, 0.3
    expected = -(0.7 * np.log(0.7) + 3 * 0.1 * np.log(0.1))
    assert smoothed_targets_entropy(V, eps) == pytest.approx(expected)
