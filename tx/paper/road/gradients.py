"""`road gradients`: why a plain RNN forgets. The size of the gradient of sum(h_T) with
respect to the start state h_0, for T = 1 .. 50, of untrained networks with 64 units:
a tanh RNN, an LSTM, and an LSTM whose forget gates start open (+3 on their bias).

The cells are tx.model.cells' (the model's own), started as PyTorch starts them, as the seed's were:
every weight and both biases uniform in +-1/sqrt(64) (the two biases summed into one), inputs
x_t ~ N(0, 1) of width 64, c_0 = 0; float64. Each point is the mean over 20 networks, as the
seed's chart. The tanh RNN's gradient is also built by hand, as the product of the step
Jacobians diag(1 - h_t^2) U^T, and compared with autograd on one network (the seed's section 3).
Time: seconds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tx.model import cells
from tx.paper.road import markdown_table
from tx.paper.road.published import GRADIENTS, TANH_SHRINK_PER_STEP
from tx.viz import plots

UNITS = 64
STEPS = 50
NETWORKS = 20
KINDS = {  # name: (cell, forget-gate bias shift)
    "tanh RNN": ("tanh", 0.0),
    "LSTM": ("lstm", 0.0),
    "LSTM, forget gate open (+3)": ("lstm", 3.0),
}
SHOWN = (1, 2, 5, 10, 20, 30, 40, 50)


def torch_start(key, kind: str, forget_shift: float) -> cells.CellWeights:
    """PyTorch's default start: U(-1/sqrt(n), 1/sqrt(n)) for W, U, b_ih and b_hh."""
    g, n = cells.CELLS[kind], UNITS
    k = n**-0.5
    kw, ku, kb1, kb2 = jax.random.split(key, 4)

    def uniform(key, shape):
        return jax.random.uniform(key, shape, jnp.float64, -k, k)

    bias = uniform(kb1, (g, n)) + uniform(kb2, (g, n))
    if kind == "lstm":  # gate order i, f, g, o: the forget gate is block 1
        bias = bias.at[1].add(forget_shift)
    return cells.CellWeights(uniform(kw, (n, g, n)), uniform(ku, (n, g, n)), bias, None, None)


def run_states(kind: str, w: cells.CellWeights, xs, h0):
    """h_1 .. h_T [T, n] and the forget gates [T, n] (LSTM; else zeros) from h_0 [n]."""
    xp = cells.project(w, xs[:, None])  # [T, 1, g, n]

    def step(carry, xp_t):
        h, c = carry
        new_h, new_c = cells.cell_step(kind, w, xp_t, h, c)
        z = xp_t + jnp.einsum("bn,ngk->bgk", h, w.recurrent)
        forget = jax.nn.sigmoid(z[:, 1]) if kind == "lstm" else jnp.zeros_like(h)
        return (new_h, new_c), (new_h[0], forget[0])

    c0 = jnp.zeros((1, UNITS), jnp.float64) if kind == "lstm" else None
    _, (hs, forget) = jax.lax.scan(step, (h0[None], c0), xp)
    return hs, forget


def gradient_norms(kind: str, w, xs) -> np.ndarray:
    """|d sum(h_T) / d h_0| for T = 1 .. STEPS: one reverse pass per T (jax.jacrev)."""
    h0 = jnp.zeros(UNITS, jnp.float64)
    jac = jax.jacrev(lambda h: run_states(kind, w, xs, h)[0].sum(-1))(h0)  # [T, n]
    return jnp.linalg.norm(jac, axis=-1)


def by_hand(w, xs) -> np.ndarray:
    """The tanh RNN's gradient as the seed's Method 1: J = prod_t diag(1 - h_t^2) U^T."""
    hs, _ = run_states("tanh", w, xs, jnp.zeros(UNITS, jnp.float64))
    u = np.asarray(w.recurrent[:, 0])  # [n_in, n_out]: h_t = tanh(... + h_{t-1} U)
    jac, norms = np.eye(UNITS), []
    for h in np.asarray(hs):
        jac = np.diag(1 - h**2) @ u.T @ jac  # d h_t / d h_0, one more factor per step
        norms.append(np.linalg.norm(np.ones(UNITS) @ jac))
    return np.asarray(norms)


def measure(seed: int = 0) -> dict:
    """{kind: {"norms": [networks, T], "forget": mean forget gate}} and the hand check."""
    out = {}
    with jax.enable_x64(True):
        keys = jax.random.split(jax.random.PRNGKey(seed), NETWORKS)
        xs = jax.random.normal(jax.random.PRNGKey(seed + 1), (NETWORKS, STEPS, UNITS), jnp.float64)
        for name, (kind, shift) in KINDS.items():
            ws = jax.vmap(lambda k, kind=kind, shift=shift: torch_start(k, kind, shift))(keys)
            norms = jax.vmap(lambda w, x, kind=kind: gradient_norms(kind, w, x))(ws, xs)
            forget = jax.vmap(lambda w, x, kind=kind: run_states(kind, w, x, x[0] * 0)[1])(ws, xs)
            out[name] = {"norms": np.asarray(norms), "forget": float(forget.mean())}
        w0 = jax.tree_util.tree_map(
            lambda a: a[0], jax.vmap(lambda k: torch_start(k, "tanh", 0))(keys)
        )
        out["check"] = {
            "hand": by_hand(w0, xs[0]),
            "autograd": np.asarray(gradient_norms("tanh", w0, xs[0])),
            "top_singular": float(
                np.linalg.svd(np.asarray(w0.recurrent[:, 0]), compute_uv=False)[0]
            ),
        }
    return out


def run(results: str, root: str, overrides=(), say=print):
    m = measure()
    header = ["T", *[f"{name} (ours)" for name in KINDS]]
    rows = [[t, *[f"{m[k]['norms'][:, t - 1].mean():.2e}" for k in KINDS]] for t in SHOWN]
    seed = [
        f"{name}: about {a:g} -> {b:g}" if a else f"{name}: to about {b:g}"
        for name, (a, b) in GRADIENTS.items()
    ]
    check = m["check"]
    shrink = (check["autograd"][-1] / check["autograd"][0]) ** (1 / (STEPS - 1))
    check_rows = [
        [t, f"{check['hand'][t - 1]:.3e}", f"{check['autograd'][t - 1]:.3e}"]
        for t in (1, 5, 10, 20, 50)
    ]
    forget = ", ".join(f"{k} {m[k]['forget']:.3f}" for k in KINDS if "LSTM" in k)
    body = (
        f"|d sum(h_T) / d h_0|, mean over {NETWORKS} untrained networks with {UNITS} units "
        "(PyTorch's default start, float64).\n\n"
        + markdown_table(header, rows)
        + "\nThe seed (its chart, 20 networks): "
        + "; ".join(seed)
        + ".\n\n"
        + f"Mean forget gate over the run: {forget} (the seed: 0.541, and 0.949 with +3).\n\n"
        + "One tanh RNN, the gradient built by hand (product of the step Jacobians "
        "diag(1 - h_t^2) U^T) and by autograd:\n\n"
        + markdown_table(["T", "by hand", "autograd"], check_rows)
        + f"\nAverage shrink per step {shrink:.3f} (the seed's network: "
        f"{TANH_SHRINK_PER_STEP}); largest singular value of U {check['top_singular']:.3f}.\n"
    )
    return body, figure(m), "python -m tx road gradients"


def figure(m: dict):
    fig = plots.new_figure(7.5, 4.5)
    ax = fig.subplots()
    steps = np.arange(1, STEPS + 1)
    for i, name in enumerate(KINDS):
        norms = m[name]["norms"]
        ax.plot(steps, norms.mean(0), color=f"C{i}", label=f"{name} (mean of {NETWORKS})")
        ax.fill_between(steps, norms.min(0), norms.max(0), color=f"C{i}", alpha=0.15)
    for i, (a, b) in enumerate(GRADIENTS.values()):
        ax.plot([1, STEPS] if a else [STEPS], [a, b] if a else [b], "x", color=f"C{i}", ms=9)
    ax.plot([], [], "kx", label="the seed's chart (read off its text)")
    ax.set_yscale("log")
    ax.set(xlabel="T (steps back to step 0)", ylabel="|d sum(h_T) / d h_0|")
    ax.set_title("The gradient from step T back to step 0 (bands: min-max over networks)")
    ax.legend(fontsize=8)
    return fig
