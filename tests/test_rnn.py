"""The recurrent family (tx.model.cells, tx.model.rnn): cells and whole models against references
written
from the equations, cached decoding against teacher forcing, parameter counts, axis names, beam
search through tx.infer.translate, and tiny training runs through tx.train.loop.train.

Tolerances come from first-order rounding-error bounds. A reference evaluates the equations in
float64; each float32 operation of the model may differ from its exact result by a local error
delta: a product or a sum of n terms in any order or tree by n u sum|terms|, + - * / by
u |result|, tanh, logistic and exp by TRANS u |result| (u = 2^-24). For one cell step the
errors already in the operands are carried through the derivative (|f'(x)| e, |b| e_a +
|a| e_b + e_a e_b): NumPy `Bounds`. Through a recurrence that absolute bound grows as |U|^t
and says nothing, so for whole models the reference puts every operation on a `Tape` and
the bound is sum_k |d output / d eps_k| delta_k, with the Jacobian (signs included) from
jax.jacrev in float64. Two float32 evaluations of the same function (teacher forcing and
cached steps) differ by at most twice the bound.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import linen as nn

from tx.config import ConfigError, load_config, model_config
from tx.infer.decoders import decoder
from tx.infer.search import length_penalty
from tx.infer.translate import LoadedModel, translate_ids
from tx.model import cells
from tx.model.counting import analytic_param_count, param_counts
from tx.model.families import build_model
from tx.model.rnn import RNNSeq2Seq, reverse_source
from tx.model.rnn_config import RNNConfig
from tx.tokens import BOS_ID, EOS_ID, PAD_ID
from tx.train import sharding

U = 2.0**-24  # float32 unit roundoff
# tanh, logistic and exp on the CPU: measured over 2.2M points of [-20, 20] against float64,
# XLA's rational tanh errs by <= 4.4 u relative, logistic <= 2.5 u, exp <= 1.4 u.
TRANS = 8
SMALL = dict(vocab_size=40, d_model=16, dropout_rate=0.0)
CONFIGS = {
    "seq2seq": {},
    "reversed": {"reverse_source": True},
    "additive": {"attention": "additive"},
    "dot": {"attention": "dot"},
    "general-2-layers-untied": {"attention": "general", "num_layers": 2, "share_embeddings": False},
    "gru-additive-2-layers": {"cell": "gru", "attention": "additive", "num_layers": 2},
    "tanh": {"cell": "tanh"},
}
NEG = -1e30  # a masked score: exp(NEG - max) = 0 in float64, with finite gradients


def contraction(spec: str, a, b) -> int:
    """How many terms each output of einsum(spec, a, b) sums."""
    ins, out = spec.split("->")
    sa, sb = ins.split(",")
    sizes = {**dict(zip(sa, np.shape(a), strict=True)), **dict(zip(sb, np.shape(b), strict=True))}
    return math.prod(sizes[ch] for ch in set(sa + sb) - set(out))


# ---------------------------------------------------------------------------------------------
# Two arithmetics for the same equations.


class B(NamedTuple):
    """A float64 value and a bound on |its float32 evaluation - it| (same shape)."""

    v: np.ndarray
    e: np.ndarray


class Bounds:
    """NumPy float64 values carrying absolute error bounds (for a single step)."""

    def const(self, x) -> B:
        x = np.asarray(x, np.float64)
        return B(x, np.zeros_like(x))

    def einsum(self, spec: str, a: B, b: B) -> B:
        v = np.einsum(spec, a.v, b.v)
        e = np.einsum(spec, a.e, np.abs(b.v)) + np.einsum(spec, np.abs(a.v), b.e)
        e = e + np.einsum(spec, a.e, b.e)
        n = contraction(spec, a.v, b.v)
        return B(v, e + n * U * np.einsum(spec, np.abs(a.v), np.abs(b.v)))

    def add(self, a: B, b: B) -> B:
        v = a.v + b.v
        return B(v, a.e + b.e + U * np.abs(v))

    def mul(self, a: B, b: B) -> B:
        v = a.v * b.v
        return B(v, np.abs(b.v) * a.e + np.abs(a.v) * b.e + a.e * b.e + U * np.abs(v))

    def sigmoid(self, a: B) -> B:
        s = 1.0 / (1.0 + np.exp(-a.v))
        return B(s, s * (1 - s) * a.e + TRANS * U * s)

    def tanh(self, a: B) -> B:
        t = np.tanh(a.v)
        return B(t, (1 - t**2) * a.e + TRANS * U * np.abs(t))

    def one_minus(self, a: B) -> B:
        v = 1.0 - a.v
        return B(v, a.e + U * np.abs(v))

    def gate(self, z: B, k: int) -> B:
        return B(z.v[:, k], z.e[:, k])


class Tape:
    """float64 jnp values; every rounding is recorded with its local bound delta and, under
    jax.jacrev, perturbed by eps_k (zero), so that d output / d eps_k is its propagation."""

    def __init__(self, eps=None):
        self.eps, self.deltas = eps, []

    def round(self, value, delta):
        k = len(self.deltas)
        self.deltas.append(delta)
        return value if self.eps is None else value + self.eps[k]

    def const(self, x):
        return jnp.asarray(x, jnp.float64)

    def einsum(self, spec, a, b):
        n = contraction(spec, a, b)
        return self.round(jnp.einsum(spec, a, b), n * U * jnp.einsum(spec, abs(a), abs(b)))

    def add(self, a, b):
        return self.round(a + b, U * abs(a + b))

    def mul(self, a, b):
        return self.round(a * b, U * abs(a * b))

    def sigmoid(self, a):
        s = 1.0 / (1.0 + jnp.exp(-a))
        return self.round(s, TRANS * U * s)

    def tanh(self, a):
        return self.round(jnp.tanh(a), TRANS * U * abs(jnp.tanh(a)))

    def one_minus(self, a):
        return self.round(1.0 - a, U * abs(1.0 - a))

    def gate(self, z, k: int):
        return z[:, k]

    def softmax(self, x, mask):
        """exp(x - max) / sum over the unmasked entries (masked ones are exactly 0): the
        subtraction errs by u |z| in the exponent, exp by TRANS u and the n-term sum by n u
        of each term, the division by u: together p_j (u |z_j| + sum_k p_k u |z_k| +
        (2 TRANS + n + 1) u) on p_j."""
        z = jnp.where(mask, x, NEG)
        z = jnp.where(mask, z - z.max(-1, keepdims=True), 0.0)
        p = jnp.where(mask, jnp.exp(z), 0.0)
        p = p / p.sum(-1, keepdims=True)
        local = U * abs(z) + (p * U * abs(z)).sum(-1, keepdims=True)
        return self.round(p, p * (local + (2 * TRANS + mask.shape[-1] + 1) * U))


def first_order_bound(fn):
    """fn(tape) -> a float64 array. Returns (value, bound) as NumPy arrays of its shape."""
    with jax.enable_x64(True):
        tape = Tape()
        value = np.asarray(fn(tape))
        deltas = [np.asarray(d) for d in tape.deltas]
        jac = jax.jacrev(lambda eps: fn(Tape(eps)))([jnp.zeros(d.shape) for d in deltas])
        bound = sum(
            np.abs(np.asarray(j)).reshape(value.size, -1) @ d.ravel()
            for j, d in zip(jac, deltas, strict=True)
        )
    # The float64 reference's own error is the same bound with u = 2^-53: 2^-29 of it.
    return value, bound.reshape(value.shape) * (1 + 2.0**-29)


# ---------------------------------------------------------------------------------------------
# The equations (ar: Bounds or Tape).


def lstm_ref(ar, z, c):
    """z [b, 4, n] in gate order i, f, g, o (input, forget, content, output)."""
    i, f, o = (ar.sigmoid(ar.gate(z, k)) for k in (0, 1, 3))
    g = ar.tanh(ar.gate(z, 2))
    c = ar.add(ar.mul(f, c), ar.mul(i, g))  # c_t = f * c_{t-1} + i * g
    return ar.mul(o, ar.tanh(c)), c  # h_t = o * tanh(c_t)


def gru_ref(ar, zx, zh, h):
    """zx = x W + b, zh = h U + b_h in gate order r, z, n (reset, update, new)."""
    r = ar.sigmoid(ar.add(ar.gate(zx, 0), ar.gate(zh, 0)))
    u = ar.sigmoid(ar.add(ar.gate(zx, 1), ar.gate(zh, 1)))
    n = ar.tanh(ar.add(ar.gate(zx, 2), ar.mul(r, ar.gate(zh, 2))))
    return ar.add(ar.mul(ar.one_minus(u), n), ar.mul(u, h))  # (1 - u) * n + u * h


def cell_ref(ar, kind: str, p: dict, x, h, c, context=None):
    """One step of a layer with weights p (kernel, recurrent, bias, ...) from input x [b, i]."""
    xp = ar.add(ar.einsum("bi,ign->bgn", x, ar.const(p["kernel"])), ar.const(p["bias"]))
    if context is not None:
        xp = ar.add(xp, ar.einsum("bm,mgn->bgn", context, ar.const(p["context"])))
    zh = ar.einsum("bn,ngk->bgk", h, ar.const(p["recurrent"]))
    if kind == "lstm":
        return lstm_ref(ar, ar.add(xp, zh), c)
    if kind == "gru":
        return gru_ref(ar, xp, ar.add(zh, ar.const(p["recurrent_bias"])), h), None
    return ar.tanh(ar.add(ar.gate(xp, 0), ar.gate(zh, 0))), None  # tanh(W x + U h + b)


def attention_ref(ar: Tape, kind: str, p: dict, annotations, keys, mask, query):
    """query [b, m] -> context [b, m]; scores additive v . tanh(W s + U h_j), else s . k_j."""
    if kind == "additive":
        q = ar.einsum("bm,mk->bk", query, ar.const(p["query"]))
        hidden = ar.tanh(ar.add(keys, q[:, None]))
        scores = ar.einsum("bsk,k->bs", hidden, ar.const(p["score"]))
    else:
        scores = ar.einsum("bsk,bk->bs", keys, query)
    return ar.einsum("bs,bsm->bm", ar.softmax(scores, mask), annotations)


def encoder_ref(ar: Tape, c: RNNConfig, params, src: np.ndarray):
    """-> (annotations [b, s, m], the final (h, c) of every layer)."""
    emb = params["shared_embedding" if c.share_embeddings else "source_embedding"]["embedding"]
    ids = np.asarray(reverse_source(jnp.asarray(src))) if c.reverse_source else src
    x = ar.mul(ar.const(emb[ids]), ar.const(np.sqrt(c.d_model)))
    real = (src != PAD_ID)[:, :, None]  # the real tokens stay in front when reversed
    zeros = ar.const(np.zeros((src.shape[0], c.d_model)))
    states = []
    for layer in range(c.num_layers):
        h, cell, outs = zeros, zeros if c.cell == "lstm" else None, []
        for t in range(src.shape[1]):
            new_h, new_c = cell_ref(
                ar, c.cell, params["encoder"][f"layer_{layer}"], x[:, t], h, cell
            )
            h = jnp.where(real[:, t], new_h, h)  # padding carries the state through
            cell = jnp.where(real[:, t], new_c, cell) if cell is not None else None
            outs.append(h)
        x = jnp.stack(outs, 1)
        states.append((h, cell))
    return x, states


def model_ref(ar: Tape, c: RNNConfig, params, src: np.ndarray, tgt: np.ndarray):
    """Teacher-forced logits [b, t, V] of the model, from the equations (module docstring of
    tx.model.rnn): Bahdanau's decoder, the previous top state as the query."""
    share = c.share_embeddings
    annotations, states = encoder_ref(ar, c, params, src)
    dec, m = params["decoder"], c.d_model
    keys = annotations
    if c.attention in ("additive", "general"):
        keys = ar.einsum("bsm,mk->bsk", annotations, ar.const(dec["attention"]["key"]))
    emb = params["shared_embedding" if share else "target_embedding"]["embedding"]
    prev = np.concatenate([np.full((tgt.shape[0], 1), BOS_ID), tgt[:, :-1]], 1)
    y = ar.mul(ar.const(emb[prev]), ar.const(np.sqrt(m)))
    out_emb = ar.const(params["shared_embedding" if share else "softmax"]["embedding"])
    logits = []
    for t in range(tgt.shape[1]):
        context = None
        if c.attention != "none":
            p = dec.get("attention")
            context = attention_ref(
                ar, c.attention, p, annotations, keys, src != PAD_ID, states[-1][0]
            )
        below, new_states = y[:, t], []
        for layer in range(c.num_layers):
            p = dec[f"layer_{layer}"]
            h, cell = cell_ref(
                ar, c.cell, p, below, *states[layer], context if layer == 0 else None
            )
            new_states.append((h, cell))
            below = h
        states, out = new_states, below
        if c.attention != "none":  # tanh(W_s s_t + W_c c_t + b)
            o = dec["output"]
            out = ar.add(
                ar.einsum("bn,nm->bm", out, ar.const(o["state"])),
                ar.einsum("bk,km->bm", context, ar.const(o["context"])),
            )
            out = ar.tanh(ar.add(out, ar.const(o["bias"])))
        logits.append(ar.einsum("bm,Vm->bV", out, out_emb))
    return jnp.stack(logits, 1)


def reference(c, params, src, tgt):
    """(logits, bound) of the teacher-forced model: float64 values and first-order bounds."""
    params = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), params)
    return first_order_bound(lambda tape: model_ref(tape, c, params, src, tgt))


@functools.cache
def reference_of(name: str):
    """The reference of CONFIGS[name] on sources() and the targets below, computed once (a
    Jacobian over every rounding takes seconds)."""
    c, _, params = make(**CONFIGS[name])
    return reference(c, params, sources(), random_tokens(9, (2, 5)))


# ---------------------------------------------------------------------------------------------
# Fixtures.


@functools.cache
def make(**overrides):
    """(config, model, parameters) of SMALL with `overrides`, initialised once per module."""
    c = RNNConfig(**{**SMALL, **overrides})
    model = RNNSeq2Seq(c)
    return c, model, _init(model)


# The programs here run for milliseconds, each compiled once, without LLVM's optimisations:
# they took a third to a half of every compile (a forward pass: 1.2-1.6 s of CPU, 0.7-1.2 s at
# level 0), and change results by float rounding at most (fused multiply-adds), within the
# bounds (each operation rounded once or more; XLA's tanh, logistic and exp err as much at
# level 0 as TRANS says: 4.6, 2.5 and 1.4 u). The parameters' init: one program, 0.4-0.9 s a
# configuration, where op by op took 0.8-3.3 s (values within 6e-8 of the optimised program's;
# every bound here is computed from the parameters drawn).
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


@functools.partial(jit, static_argnums=0)
def _init(model):
    tokens = jnp.ones((1, 4), jnp.int32)
    return nn.meta.unbox(model.init(jax.random.PRNGKey(0), tokens, tokens)["params"])


@functools.partial(jit, static_argnums=0)
def forward(model, params, src, tgt):
    """Teacher-forced logits [b, t, V], compiled once per model and shapes (eager, every call
    would trace and compile the model's scans anew)."""
    return model.apply({"params": params}, src, tgt)


def random_tokens(seed, shape, low=4, high=40):
    return np.random.default_rng(seed).integers(low, high, shape).astype(np.int32)


def sources():
    """Two rows, the second padded, both ending in EOS."""
    src = random_tokens(8, (2, 6))
    src[0, 5] = EOS_ID
    src[1, 3], src[1, 4:] = EOS_ID, PAD_ID
    return src


# ---------------------------------------------------------------------------------------------
# Cells.


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lstm_cell_equals_the_equations_in_gate_order_i_f_g_o(seed):
    rng = np.random.default_rng(seed)
    z, c = rng.normal(0, 2, (3, 4, 8)).astype(np.float32), rng.normal(0, 1, (3, 8))
    c = c.astype(np.float32)
    h, c_new = cells.lstm_cell(jnp.asarray(z), jnp.asarray(c))
    ar = Bounds()
    ref_h, ref_c = lstm_ref(ar, ar.const(z), ar.const(c))
    # bound <= 2.3e-6 (seeds 0-2); observed <= 3.0e-7
    assert np.all(np.abs(np.asarray(h) - ref_h.v) <= ref_h.e)
    assert np.all(np.abs(np.asarray(c_new) - ref_c.v) <= ref_c.e)
    # The order matters: reading the blocks as f, i, g, o misses by >= 0.31 (seeds 0-2).
    swapped, _ = lstm_ref(ar, ar.const(z[:, [1, 0, 2, 3]]), ar.const(c))
    assert np.abs(np.asarray(h) - swapped.v).max() > 1000 * ref_h.e.max()


def test_gru_and_tanh_cells_equal_the_equations():
    rng = np.random.default_rng(3)
    zx, zh, h = (rng.normal(0, 2, s).astype(np.float32) for s in ((3, 3, 8), (3, 3, 8), (3, 8)))
    out = np.asarray(cells.gru_cell(jnp.asarray(zx), jnp.asarray(zh), jnp.asarray(h)))
    ar = Bounds()
    ref = gru_ref(ar, ar.const(zx), ar.const(zh), ar.const(h))
    # bound <= 2.5e-6; observed <= 2.2e-7
    assert np.all(np.abs(out - ref.v) <= ref.e)
    shapes = ((8, 1, 8), (8, 1, 8), (1, 8))
    w = cells.CellWeights(
        *(jnp.asarray(rng.normal(0, 1, s), jnp.float32) for s in shapes), None, None
    )
    x = rng.normal(0, 1, (3, 8)).astype(np.float32)
    tanh_h, _ = cells.cell_step("tanh", w, cells.project(w, jnp.asarray(x)), jnp.asarray(h), None)
    p = {k: np.asarray(v) for k, v in w._asdict().items() if v is not None}
    ref, _ = cell_ref(ar, "tanh", p, ar.const(x), ar.const(h), None)
    assert np.all(np.abs(np.asarray(tanh_h) - ref.v) <= ref.e)


# ---------------------------------------------------------------------------------------------
# Models.


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_model_equals_the_reference(name):
    c, model, params = make(**CONFIGS[name])
    src, tgt = sources(), random_tokens(9, (2, 5))
    logits = np.asarray(forward(model, params, src, tgt))
    value, bound = reference_of(name)
    # bound <= 6.8e-5 over the seven configurations; observed <= 3.1e-7
    err = np.abs(logits - value)
    assert np.all(err <= bound), (err / bound).max()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cached_decoding_matches_teacher_forcing(name):
    c, model, params = make(**CONFIGS[name])
    src, tgt = sources(), random_tokens(9, (2, 5))
    full = np.asarray(forward(model, params, src, tgt))
    bound = 2 * reference_of(name)[1]  # each evaluation within the bound
    own = decoder(model, params, jnp.asarray(src), 1, 5)
    assert not own.rows_independent  # its step closes over the memory repeated per row
    # Compiled once for the five steps, as the search runs it (eager, each step's scan would
    # be traced and compiled anew).
    tokens_to_logits, cache = jit(own.tokens_to_logits), own.cache
    assert set(cache) == ({"hidden", "cell"} if c.cell == "lstm" else {"hidden"})
    prev = jnp.full((2, 1), BOS_ID, jnp.int32)
    for t in range(tgt.shape[1]):
        logits, cache = tokens_to_logits(prev, cache)
        # bound <= 1.4e-4; observed 0 (the same XLA operations on the same values)
        assert np.all(np.abs(np.asarray(logits) - full[:, t]) <= bound[:, t]), f"step {t}"
        prev = jnp.asarray(tgt[:, t : t + 1])


@pytest.mark.slow  # 17 s on 2 cores; the reference-equality tests cover the same cells
def test_source_padding_and_reversal():
    np.testing.assert_array_equal(
        reverse_source(jnp.array([[5, 6, 7, EOS_ID, 0], [5, EOS_ID, 0, 0, 0]])),
        [[7, 6, 5, EOS_ID, 0], [5, EOS_ID, 0, 0, 0]],
    )
    c, model, params = make(attention="additive", reverse_source=True)
    src, tgt = sources()[:1], random_tokens(10, (1, 4))
    padded = np.pad(src, ((0, 0), (0, 3)))
    a = model.apply({"params": params}, src, tgt)
    b = model.apply({"params": params}, padded, tgt)
    # Padding carries the state through unchanged and gets softmax weight exp(min - max) = 0;
    # sums of other lengths may round differently: each side within its bound, together
    # <= 7.1e-5; observed 0.
    bound = reference(c, params, src, tgt)[1] + reference(c, params, padded, tgt)[1]
    assert np.all(np.abs(np.asarray(a) - np.asarray(b)) <= bound)


def test_reversal_changes_what_the_encoder_reads():
    _, model, params = make()
    _, reversed_model, _ = make(reverse_source=True)
    # The shapes of the reference tests: both programs are compiled there.
    src, tgt = sources(), random_tokens(9, (2, 5))
    a = forward(model, params, src, tgt)
    b = forward(reversed_model, params, src, tgt)
    # Rounding could move them apart by <= 2 x 1.9e-5 (the references' bounds); they differ
    # by 0.15.
    assert np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-2


def expected_count(V, m, layers, cell, attention, shared=True):
    """The architecture written out term by term."""
    gates = {"lstm": 4, "gru": 3, "tanh": 1}[cell]
    biases = 2 if cell == "gru" else 1  # GRU: b and b_h
    layer = gates * m * m + gates * m * m + biases * gates * m  # W, U, biases
    dec = layers * layer
    if attention != "none":
        dec += gates * m * m  # the context kernel of the first decoder layer
        dec += {"additive": m * m + m * m + m, "general": m * m, "dot": 0}[attention]
        dec += m * m + m * m + m  # W_s, W_c, b of the output
    return V * m * (1 if shared else 3) + layers * layer + dec


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(attention="additive", num_layers=2),
        dict(attention="dot", cell="gru"),
        dict(attention="general", share_embeddings=False),
        dict(cell="tanh", num_layers=3),
    ],
)
def test_parameter_counts_equal_the_formula(kw):
    c = RNNConfig(vocab_size=50, d_model=12, **kw)
    expected = expected_count(50, 12, c.num_layers, c.cell, c.attention, c.share_embeddings)
    assert param_counts(c)["params"] == expected
    assert analytic_param_count(c) == param_counts(c)


def test_every_parameter_has_logical_axis_names_and_shards(tiny):
    c = RNNConfig(**SMALL, attention="additive", num_layers=2, cell="gru")
    tokens = jnp.ones((1, 4), jnp.int32)
    # Shapes only (jax.eval_shape): the boxes and their names are what init returns.
    boxed = jax.eval_shape(RNNSeq2Seq(c).init, jax.random.PRNGKey(0), tokens, tokens)["params"]
    leaves = jax.tree_util.tree_leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert leaves and all(isinstance(x, nn.LogicallyPartitioned) for x in leaves)
    assert all(len(x.names) == x.value.ndim for x in leaves)
    # The mesh rules of the configs map every name (a repeated name would be refused).
    layout = sharding.layout(tiny().mesh)
    assert jax.tree_util.tree_leaves(layout.tree(boxed))


@pytest.mark.slow  # 37 s: eight devices in five layouts; the Transformer's runs by default
def test_meshes_give_the_same_rnn_training_as_one_device(tmp_path):
    """configs/rnn_attention.py (two LSTM layers) on 8 devices in five layouts, SGD in float64,
    against one device: the tolerances of tests/equivalence.py. Observed: losses equal,
    gradients <= 2.0e-14 relative, parameters <= 3.1e-14 of a step."""
    import json

    from equivalence import GRAD_RTOL, LOSS_RTOL, PARAM_STEP_TOL
    from test_sharding import worker

    out = tmp_path / "eq.json"
    worker("equivalence_rnn", out)
    report = json.loads(out.read_text())
    assert len(report) == 5
    for shape, r in report.items():
        assert r["loss"] <= LOSS_RTOL, (shape, r)
        assert r["grad"] <= GRAD_RTOL, (shape, r)
        assert r["params_per_step"] <= PARAM_STEP_TOL, (shape, r)
    assert "tensor" in report["(1, 1, 8) x1"]["spec_example"]  # the units are split


# ---------------------------------------------------------------------------------------------
# Config, search, training.


def test_config_names_the_family_and_its_keys(root):
    path = str(root / "configs" / "rnn_attention.py")
    assert model_config(load_config(path)).attention == "additive"
    with pytest.raises(ConfigError, match="model.family"):
        load_config(path, ["model.family=lstm"])
    with pytest.raises(ConfigError, match="model.attention"):
        load_config(path, ["model.attention=multiplicative"])
    with pytest.raises(ConfigError, match="data.pack"):
        load_config(path, ["data.pack=True"])
    with pytest.raises(ConfigError, match="model.num_heads"):
        load_config(path, ["model.num_heads=4"])
    assert model_config(load_config(str(root / "configs" / "demo.py"))).family == "transformer"


def search_score_ref(ar: Tape, c, params, src_row, hyp):
    """The beam's score of `hyp` from the equations: teacher-forced logits, the search's
    log_softmax over all tokens but PAD and BOS (tx.infer.search.log_probs), the running sum of the
    chosen tokens' log-probabilities, divided by the GNMT penalty of len(hyp) + 1 (EOS)."""
    tgt = np.asarray([*hyp, EOS_ID], np.int32)[None]
    logits = model_ref(ar, c, params, src_row[None], tgt)[0]  # [t, V]
    allowed = ~np.isin(np.arange(c.vocab_size), [PAD_ID, BOS_ID])
    z = jnp.where(allowed, logits, NEG)
    z = ar.round(z - z.max(-1, keepdims=True), U * abs(z - z.max(-1, keepdims=True)))
    e = ar.round(jnp.where(allowed, jnp.exp(z), 0.0), TRANS * U * jnp.where(allowed, jnp.exp(z), 0))
    total = ar.round(e.sum(-1), c.vocab_size * U * e.sum(-1))
    log_s = ar.round(jnp.log(total), TRANS * U * abs(jnp.log(total)))
    lp = ar.round(z - log_s[:, None], U * abs(z - log_s[:, None]))
    score = ar.const(0.0)
    for t, token in enumerate(tgt[0]):
        score = ar.add(score, lp[t, token])
    penalty = float(length_penalty(tgt.shape[1], 0.6))  # its own rounding: TRANS u relative
    return ar.round(score / penalty, (TRANS + 1) * U * abs(score / penalty))


def decode_cfg(**kw):
    base = dict(
        strategy="beam",
        beam_size=4,
        alpha=0.6,
        max_extra_len=4,
        batch_tokens=64,
        temperature=1.0,
        top_k=0,
        seed=0,
    )
    return ml_collections.ConfigDict({**base, **kw})


class Unreordered(RNNSeq2Seq):
    """The same model under a class of its own, so that the search (jitted with the model
    static) is traced anew with tx.model.rnn.reorder_cache patched, not taken from the cache
    (jax.clear_caches() would do it too, and make every later test in the process recompile)."""


@pytest.mark.parametrize(
    "reorder",
    [pytest.param("model", marks=pytest.mark.slow), "identity"],  # 33 s and 16 s
)
def test_beam_search_through_translate_scores_what_the_model_says(tiny, monkeypatch, reorder):
    """Every hypothesis of a 4-wide beam scores its own teacher-forced log-probability: the
    recurrent state followed the beam. With the reordering switched off, it does not."""
    c, _, params = make(attention="additive", num_layers=2)
    params = jax.tree_util.tree_map(lambda x: 3 * x, params)  # peakier: beams diverge
    model = build_model(c)
    if reorder == "identity":
        import tx.model.rnn

        monkeypatch.setattr(tx.model.rnn, "reorder_cache", lambda cache, rows: cache)
        model = Unreordered(c)  # the search is jitted with the model static: traced anew
    loaded = LoadedModel(model, params, None, "init", sharding.layout(tiny().mesh))
    srcs = [np.asarray([*random_tokens(s, (n,)), EOS_ID], np.int32) for s, n in ((1, 4), (2, 6))]
    results = translate_ids(loaded, srcs, decode_cfg(), (8, 16), nbest=4)
    params64 = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), params)
    worst = 0.0
    for src, ids, score in [
        (s, i, x) for s, hyps in zip(srcs, results, strict=True) for i, x in hyps
    ]:
        expected, bound = first_order_bound(
            lambda tape, src=src, ids=ids: search_score_ref(tape, c, params64, src, ids)
        )
        worst = max(worst, abs(score - expected) / bound)
        if worst > 1.0:
            break  # one hypothesis off its own score is enough
    # bound <= 8.6e-4 (it grows with the 3x logits); observed <= 1.5e-6 with the model's
    # reordering; without it the first hypothesis checked misses by 2.4
    assert (worst <= 1.0) == (reorder == "model"), worst


@pytest.mark.parametrize(
    "config", [pytest.param("rnn_seq2seq.py", marks=pytest.mark.slow), "rnn_attention.py"]
)
def test_tiny_rnn_trains_and_translates_through_the_shared_commands(root, tmp_path, vocab, config):
    from tx.infer.translate import load_model, translate
    from tx.train.averaging import average
    from tx.train.checkpoint import Checkpointer
    from tx.train.loop import train

    tiny = load_config(str(root / "configs" / "tiny.py"))
    overrides = [
        f"data.{k}={tiny.data[k]}"
        for k in ("demo_train_size", "vocab_size", "spm_sample_size", "tokens_per_step")
    ]
    # The session's tiny vocabulary (the same data and size: nothing to train). One bucket:
    # the train step compiles once (about 9 s of CPU each; three buckets compiled three), the
    # rows per batch still come from the real tokens per step.
    overrides += [f"data.vocab_path={vocab}", "data.num_workers=1", "data.bucket_lengths=(48,)"]
    overrides += ["model.d_model=32"]
    overrides += ["optim.warmup_steps=20", "train.checkpoint_every_steps=10"]
    overrides += ["train.log_every_steps=5", "train.eval_every_steps=0", "decode.batch_tokens=512"]
    cfg = load_config(str(root / "configs" / config), [*overrides, "train.num_steps=30"])
    last = train(cfg, str(tmp_path / "b"))
    # An untrained model's near-uniform guess has perplexity about the vocabulary's 300; the
    # bound asks 30 steps to take its log down by 1 (observed: to 25.1-25.2, both configs, 2
    # threads and taskset -c 0, i.e. down by 2.5)
    assert last["step"] == 30 and last["perplexity"] < cfg.data.vocab_size / math.e
    assert Checkpointer(str(tmp_path / "b")).latest_step() == 30
    average(cfg, str(tmp_path / "b"))
    loaded = load_model(cfg, str(tmp_path / "b"))
    assert loaded.source.startswith("averaged/") and isinstance(loaded.model, RNNSeq2Seq)
    out = translate(loaded, ["The dog sees a cat.", "", "We count three small birds."], cfg)
    assert len(out) == 3 and out[1] == "" and all(isinstance(o, str) for o in out)
