"""Adam with the paper's warm-up then inverse-square-root schedule (section 5.3), or, for a run
that starts from trained weights (fine-tuning), a linear warm-up to a constant rate."""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections
import optax


def paper_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1.

    optax passes the number of updates already applied (0 for the first), hence the `+ 1`.
    `scale` is for users who change the batch size (1.0 = the paper).
    """

    def schedule(count):
        step = jnp.asarray(count, jnp.float32) + 1.0
        return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

    return schedule


def constant_schedule(rate: float, warmup_steps: int) -> optax.Schedule:
    """lrate = rate * min(1, step / warmup), step counted from 1: a fine-tuning run's, which
    has no large early gradients to ride out and no long decay to follow (a start from trained
    weights at the paper's peak rate undoes much of what they learned)."""

    def schedule(count):
        step = jnp.asarray(count, jnp.float32) + 1.0
        return rate * jnp.minimum(1.0, step / warmup_steps)

    return schedule


def make_optimizer(optim: ml_collections.ConfigDict, d_model: int):
    """Adam(b1, b2, eps) on the schedule (optim.schedule), with optional global-norm clipping.

    Returns (optax.GradientTransformation, schedule).
    """
    if optim.get("schedule", "paper") == "constant":
        schedule = constant_schedule(optim.learning_rate, optim.warmup_steps)
    else:
        schedule = paper_schedule(d_model, optim.warmup_steps, optim.learning_rate_scale)
    adam = optax.adam(learning_rate=schedule, b1=optim.b1, b2=optim.b2, eps=optim.eps)
    if optim.grad_clip_norm > 0:
        adam = optax.chain(optax.clip_by_global_norm(optim.grad_clip_norm), adam)
    return adam, schedule
