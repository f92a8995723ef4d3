"""Recurrent cells (Elman tanh, LSTM, GRU): pure functions of their pre-activations, the
module that holds their weights, and one layer run over a sequence.

The steps are pure functions so that a layer runs in `jax.lax.scan` (a Flax module cannot be
called inside it) and so that tests and `python -m tx road gradients` use exactly them.
Gate order: LSTM i, f, g, o (input, forget, content, output; PyTorch's order); GRU r, z, n
(reset, update, new; PyTorch's). Shape letters: b rows, s length, i input width, g gates,
n hidden units. Logical axis names as tx.model.layers: the input side "embed", the units "mlp"; the
gate axis is replicated (None): a unit's gates must sit on one device to be combined.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn

Array = jax.Array

CELLS = {"tanh": 1, "lstm": 4, "gru": 3}  # gates per cell


def lstm_cell(z: Array, c: Array) -> tuple[Array, Array]:
    """One LSTM step. z: [b, 4, n] = x W + h U + b in gate order i, f, g, o; c: [b, n].

    c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g);  h_t = sigmoid(o) * tanh(c_t).
    Returns (h_t, c_t), each [b, n].
    """
    i, f, g, o = (z[:, k] for k in range(4))
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def gru_cell(zx: Array, zh: Array, h: Array) -> Array:
    """One GRU step. zx = x W + b, zh = h U + b_h: [b, 3, n] in gate order r, z, n; h: [b, n].

    r = sigmoid(zx_r + zh_r), u = sigmoid(zx_z + zh_z), n = tanh(zx_n + r * zh_n),
    h_t = (1 - u) * n + u * h_{t-1}. The reset gate multiplies U h + b_h, hence two biases.
    """
    r = jax.nn.sigmoid(zx[:, 0] + zh[:, 0])
    u = jax.nn.sigmoid(zx[:, 1] + zh[:, 1])
    n = jnp.tanh(zx[:, 2] + r * zh[:, 2])
    return (1.0 - u) * n + u * h


class CellWeights(NamedTuple):
    kernel: Array  # [i, g, n] input -> gates
    recurrent: Array  # [n, g, n] previous hidden state -> gates
    bias: Array  # [g, n]
    recurrent_bias: Array | None  # [g, n], GRU only
    context: Array | None  # [m, g, n], the decoder's first layer with attention only


def cell_step(kind: str, w: CellWeights, xp: Array, h: Array, c: Array | None):
    """xp: [b, g, n] = x W + b (the input side, projected beforehand); h, c: [b, n] (c: LSTM
    only) -> the new (h, c)."""
    zh = jnp.einsum("bn,ngk->bgk", h, w.recurrent)  # [b, g, n]
    if kind == "lstm":
        return lstm_cell(xp + zh, c)
    if kind == "gru":
        return gru_cell(xp, zh + w.recurrent_bias, h), None
    return jnp.tanh(xp[:, 0] + zh[:, 0]), None  # Elman: h_t = tanh(W x_t + U h_{t-1} + b)


def project(w: CellWeights, x: Array) -> Array:
    """x: [..., i] -> [..., g, n] = x W + b."""
    return jnp.einsum("...i,ign->...gn", x, w.kernel) + w.bias


class Cell(nn.Module):
    """The weights of one recurrent layer (its steps run in a scan, as pure functions)."""

    kind: str
    d_in: int
    d_model: int
    d_context: int = 0  # > 0: a kernel for the attention context (decoder layer 0)
    forget_bias: float = 0.0
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self) -> CellWeights:
        g, n = CELLS[self.kind], self.d_model
        # Glorot-uniform per gate: fan_in = input width, fan_out = n; the gate axis is a batch.
        init = nn.initializers.variance_scaling(
            1.0, "fan_avg", "uniform", in_axis=0, out_axis=2, batch_axis=(1,)
        )

        def param(name, shape, names, initializer=init):
            p = self.param(
                name, nn.with_logical_partitioning(initializer, names), shape, self.param_dtype
            )
            return jnp.asarray(p, self.dtype)

        def bias_init(key, shape, dtype):
            bias = jnp.zeros(shape, dtype)
            return bias.at[1].set(self.forget_bias) if self.kind == "lstm" else bias

        return CellWeights(
            param("kernel", (self.d_in, g, n), ("embed", None, "mlp")),
            param("recurrent", (n, g, n), ("embed", None, "mlp")),
            param("bias", (g, n), (None, "mlp"), bias_init),
            param("recurrent_bias", (g, n), (None, "mlp"), nn.initializers.zeros)
            if self.kind == "gru"
            else None,
            param("context", (self.d_context, g, n), ("embed", None, "mlp"))
            if self.d_context
            else None,
        )


def run_layer(kind: str, w: CellWeights, xp: Array, mask: Array):
    """xp: [b, s, g, n] projected inputs, mask [b, s] -> (outputs [b, s, n], final h, c)."""
    b, n = xp.shape[0], xp.shape[-1]
    h0 = jnp.zeros((b, n), xp.dtype)
    c0 = h0 if kind == "lstm" else None

    def step(carry, inputs):
        h, c = carry
        xp_t, real = inputs  # [b, g, n], [b]
        new_h, new_c = cell_step(kind, w, xp_t, h, c)
        h = jnp.where(real[:, None], new_h, h)
        c = jnp.where(real[:, None], new_c, c) if c is not None else None
        return (h, c), h

    (h, c), out = jax.lax.scan(step, (h0, c0), (xp.swapaxes(0, 1), mask.swapaxes(0, 1)))
    return out.swapaxes(0, 1), h, c
