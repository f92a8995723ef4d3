"""Comparing training runs that must agree up to float reordering: meshes, processes,
micro-batches. Shared by test_train.py and multidevice_worker.py.

What is compared, and why. Not the parameters after Adam steps: Adam's first update is
lr * g / (|g| + eps), i.e. lr * sign(g) wherever |g| >> eps = 1e-9, so reordering that flips
the sign of a near-zero gradient entry moves that parameter by 2 lr (the issue that introduced
this file: 3.6e-4 on an AMD CPU against 1e-4 allowed). So the runs train with SGD, whose update
is linear in the gradient, with an optimizer stage that keeps the gradient train_step computed.

And in float64 (FP64): the gradient of a ReLU network jumps where a pre-activation crosses
zero, so two runs whose pre-activations differ by float32 rounding (~1e-7) disagree by a whole
(token, unit) term of the gradient whenever one of the ~10^5 pre-activations lies that close to
zero: measured in float32, 1 step in 120 (seed 4, mesh (1,1,8), step 2: 0.7% on
encoder/layer_1/ffn/wi). In float64 the same event needs a pre-activation within ~1e-15 of
zero (probability ~1e-10), so rounding alone is compared and the bounds below are tight: a
real sharding bug (rows on the wrong device, a missing reduction) moves the loss or a gradient
by far more than 1e-3.

Bounds: float64 unit roundoff u = 2^-53 = 1.1e-16; a sum of n terms computed in another order
differs by at most gamma_n = n u times the sum of |terms| (Higham, Thm 4.2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

FP64 = ("model.dtype=float64", "model.param_dtype=float64")  # config overrides (with x64 on)
LR = 0.05  # SGD step: large enough that later steps see other parameters, small enough to train

# The loss is reported as a float32 sum (the metrics are float32 whatever the compute dtype):
# two float64 losses within 1e-13 of each other round to float32 values at most one float32
# ulp apart (2^-23 = 1.2e-7 relative), whichever side of a rounding boundary they fall.
# Observed: 1.04e-7 (micro-batches), 0 (meshes, processes).
LOSS_RTOL = 2.4e-7
# A gradient leaf is a chain of about 10 reductions (2 layers x attention, FFN, LayerNorm,
# softmax) of width <= 320: normwise <= 10 x gamma_320 = 3.5e-13 times the conditioning of the
# leaf (sum of |terms| / |sum|), which cancelling softmax and LayerNorm gradients make large
# (float32 runs showed 20 u): 1e-10 leaves a factor 300 for it. Observed: 3.2e-15.
GRAD_RTOL = 1e-10
# Parameters after the steps, in units of the largest single update lr max|g| (~1e-3): the
# gradient differences (<= GRAD_RTOL) plus the rounding of p - lr g, half an ulp of |p| <= 1
# (1.1e-16) per step, over 3 steps: <= 3.3e-16 / 1e-3 = 3.3e-13. Observed: 6.0e-14.
PARAM_STEP_TOL = 1e-10
# Observed = the largest over seeds 0-4, 2 threads and 1 (taskset -c 0), meshes (8,1,1) (4,2,1)
# (2,2,2) (1,1,8) and (4,2,1) with 2 micro-batches, two processes, 1 vs 4 micro-batches.


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
