"""Label-smoothed cross-entropy (section 5.4), returning sums so devices and hosts add up."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

Array = jax.Array


def smoothed_targets_entropy(vocab_size: int, label_smoothing: float) -> float:
    """Entropy of the smoothed target distribution: the loss of a perfect prediction."""
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab_size - 1)
    ent = -confidence * math.log(confidence)
    if label_smoothing > 0:
        ent -= (vocab_size - 1) * low * math.log(low)
    return ent


def cross_entropy(logits: Array, targets: Array, weights: Array, label_smoothing: float = 0.1):
    """Label-smoothed cross-entropy and plain NLL, summed over non-padding tokens.

    The smoothed target puts 1 - eps on the true token and eps / (V - 1) on each other token.
    `loss` has the smoothed distribution's entropy subtracted, so a perfect smoothed prediction
    scores 0; `nll` is the unsmoothed negative log-likelihood (its mean gives perplexity).

    Args:
      logits: [b, t, V] float.
      targets: [b, t] int.
      weights: [b, t] float, 1 for real tokens and 0 for padding.
      label_smoothing: epsilon_ls in [0, 1).

    Returns:
      dict of scalar sums: loss, nll, correct (argmax == target), weight (number of tokens).
    """
    vocab_size = logits.shape[-1]
    # float32 at least (float64 stays: the equivalence tests run in float64).
    log_probs = jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), -1)
    true_lp = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # [b, t]
    nll = -true_lp
    if label_smoothing > 0:
        confidence = 1.0 - label_smoothing
        low = label_smoothing / (vocab_size - 1)
        # sum_v q_v * -log p_v with q = low everywhere except `confidence` on the target.
        sum_lp = log_probs.sum(-1)
        smoothed = -(confidence - low) * true_lp - low * sum_lp
    else:
        smoothed = nll
    smoothed = smoothed - smoothed_targets_entropy(vocab_size, label_smoothing)
    correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
    return {
        "loss": jnp.sum(smoothed * weights),
        "nll": jnp.sum(nll * weights),
        "correct": jnp.sum(correct * weights),
        "weight": jnp.sum(weights),
    }
