"""Comparing training runs that must agree up to float reordering: meshes, processes,
micro-batches. Shared by test_train.py and multidevice_worker.py.

What is compared, and why not the parameters after Adam steps: Adam's first update is
lr * g / (|g| + eps), i.e. lr * sign(g) wherever |g| >> eps = 1e-9, so float reordering that
flips the sign of a near-zero gradient entry moves that parameter by 2 lr, and no fixed
tolerance on Adam-trained parameters is both safe and meaningful (issue: 3.6e-4 on an AMD CPU
vs 1e-4 allowed). So the runs train with SGD, whose update is linear in the gradient, and an
optimizer stage that keeps the gradient train_step computed in the optimizer state. Each step
then compares the loss and every gradient leaf tightly, and parameters relative to the step.

Tolerances (float32, unit roundoff u = 2^-24 = 6.0e-8). Two runs that only reorder sums differ
by at most gamma_n = n u relative to the sum of |terms| (Higham, Thm 4.2); observed errors are
the largest over seeds 0-4, 1 and 2 threads, meshes (8,1,1) (4,2,1) (2,2,2) (1,1,8), two
processes, and 1 vs 4 micro-batches (see the closing note of the issue that introduced them).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

LR = 0.05  # SGD step: large enough that later steps see other parameters, small enough to train

# The loss is a sum of n = rows x length (<= 256) positive per-token terms, each itself the
# result of reductions of width <= 320 (vocabulary): gamma_(256+320) = 3.5e-5. Observed: 1.2e-6.
LOSS_RTOL = 3.5e-5
# A gradient leaf is a chain of about 10 reductions (2 layers x attention, FFN, LayerNorm,
# softmax) of width <= 320 between loss and parameter; the normwise relative error of each is
# <= gamma_320 = 1.9e-5, hence <= 2e-4 for the chain. Observed: 4e-6.
GRAD_RTOL = 2e-4
# Parameters after the steps, in units of the largest single update: first order, gradient
# differences of GRAD_RTOL summed over 3 steps, plus the rounding of p - lr g (half an ulp of
# |p| < 1, i.e. 3e-8 / (lr max|g|)). Observed: TBD.
PARAM_STEP_TOL = 1e-3


def keep_gradient() -> optax.GradientTransformation:
    """An optimizer stage that passes the gradient on unchanged and keeps it in its state."""

    def init(params):
        return jax.tree_util.tree_map(jnp.zeros_like, params)

    def update(grads, state, params=None):
        del state, params
        return grads, grads

    return optax.GradientTransformation(init, update)


def sgd_keeping_gradients(lr: float = LR) -> optax.GradientTransformation:
    """SGD whose optimizer state holds the last gradient: `state.opt_state[0]`."""
    return optax.chain(keep_gradient(), optax.sgd(lr))


def gradient_of(state):
    """The gradient of the last step of a state trained with `sgd_keeping_gradients`."""
    return state.opt_state[0]


def relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    """Normwise ||got - ref|| / ||ref|| in float64 (a leaf with zero gradient: absolute)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def compare_steps(ref: dict, got: dict) -> dict:
    """Largest errors between two runs recorded by `record`: loss, gradients, parameters.

    `params_per_step` is max |p - p_ref| divided by the largest single update lr * |g|: the
    first-order effect of gradient differences, <= steps * GRAD_RTOL * sqrt(leaf size), plus
    the rounding of p - lr g (half an ulp of |p| <= 1).
    """
    loss = max(abs(a - b) / abs(b) for a, b in zip(got["losses"], ref["losses"], strict=True))
    grad = max(
        relative_error(g[k], r[k])
        for g, r in zip(got["grads"], ref["grads"], strict=True)
        for k in r
    )
    step = LR * max(float(np.abs(v).max()) for r in ref["grads"] for v in r.values())
    params = max(float(np.abs(got["params"][k] - ref["params"][k]).max()) for k in ref["params"])
    return {"loss": loss, "grad": grad, "params_per_step": params / step}


def record(step_fn, state, batches, to_host) -> tuple[object, dict]:
    """Runs `step_fn` over `batches`, keeping per-step losses and gradients on the host.

    `to_host(tree) -> {name: np.ndarray}` gathers a (possibly multi-process) tree.
    """
    out = {"losses": [], "weights": [], "grads": []}
    for batch in batches:
        state, m = step_fn(state, batch)
        out["losses"].append(float(m["loss"]) / float(m["weight"]))
        out["weights"].append(float(m["weight"]))
        out["grads"].append(to_host(gradient_of(state)))
    out["params"] = to_host(state.params)
    return state, out


def flat(tree) -> dict:
    """{path: np.ndarray} of a single-process tree."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}
