"""`road table1`: the paper's Table 1 measured rather than asserted.

Four layers of width d = 512 read a batch of sequences of n = 16 .. 1024 positions (forward
pass, float32): self-attention (tx.model.attention.MultiHeadAttention, 8 heads), recurrent (an LSTM
layer, tx.model.cells), convolutional (kernel k = 3, d -> d) and restricted self-attention (each
position attends to the r = 32 positions around it, computed in blocks of r); the
convolution is causal, as in ConvS2S's decoder and WaveNet. For each:
  - FLOPs per sequence, counted from the equations and by XLA's cost analysis of the compiled
    layer (XLA counts a loop body once, so the recurrent layer's figure is one step);
  - wall time (median of 5 runs after compilation) on the machine that runs it;
  - sequential operations: the loop steps that must run one after another, read from the
    layer's jaxpr (the lengths of its scans; 1 for a layer without a loop);
  - maximum path length: how many layers (or, inside a recurrent layer, steps) a signal from
    the first input crosses before the last output depends on it, found by pushing a tangent
    at position 0 through stacked layers (jax.jvp) until position n - 1 is reached. This uses
    d = 8: connectivity does not depend on the width. Convolutions are measured contiguous
    (the paper's O(n/k)) and dilated (dilation k^l in layer l: O(log_k n)).
Time: about 2 minutes on 2 CPU cores.
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from tx.model import cells
from tx.model.attention import MultiHeadAttention
from tx.paper.road import markdown_table
from tx.paper.road.published import SEED_TIMING_MS, TABLE1
from tx.viz import plots

D = 512
HEADS = 8
K = 3  # convolution kernel
R = 32  # restricted self-attention neighbourhood
BATCH = 4
LENGTHS = (16, 32, 64, 128, 256, 512, 1024)
LAYERS = ("self-attention", "recurrent", "convolutional", "restricted self-attention")
PATH_LENGTHS = (16, 64, 256, 1024)


# ---------------------------------------------------------------------------------------------
# The layers, as functions of (params, x [b, n, d]) -> [b, n, d].


def attention_layer(d: int):
    d_k = max(d // HEADS, 1)
    mha = MultiHeadAttention(d // d_k, d_k, d_k, d, plain_autodiff=True)  # path_length: jax.jvp

    def init(key, n):
        x = jnp.zeros((1, n, d))
        return nn.meta.unbox(mha.init(key, x, x, None)["params"])

    def apply(params, x):
        return mha.apply({"params": params}, x, x, None)

    return init, apply


def restricted_layer(d: int, r: int = R):
    """Self-attention within |i - j| <= r / 2, in blocks of r queries that read their own and
    the two neighbouring blocks (3r keys, masked to the r + 1 in reach)."""
    init, _ = attention_layer(d)
    d_k = max(d // HEADS, 1)
    h = d // d_k

    def apply(params, x):
        b, n, _ = x.shape
        blocks = -(-n // r)
        pad = blocks * r - n
        widths = ((0, 0), (r, r + pad), (0, 0), (0, 0))  # a block of zeros at each end

        def project(name):  # [b, r + n + pad + r, h, d]: projected, then padded
            return jnp.pad(jnp.einsum("bnm,mhd->bnhd", x, params[name]), widths)

        q, k, v = project("query"), project("key"), project("value")
        qb = q[:, r : r + blocks * r].reshape(b, blocks, r, h, d_k)  # [b, B, r, h, d]
        window = jnp.arange(3 * r)[None] + r * jnp.arange(blocks)[:, None]  # [B, 3r]
        kb, vb = k[:, window], v[:, window]  # [b, B, 3r, h, d]
        logits = jnp.einsum("bBqhd,bBkhd->bBhqk", qb, kb) / math.sqrt(d_k)
        pos_q = jnp.arange(r)[:, None] + r
        reach = jnp.abs(pos_q - jnp.arange(3 * r)[None]) <= r // 2  # [r, 3r]
        real = (window >= r) & (window < r + n)  # [B, 3r]: not padding
        mask = reach[None, None, None] & real[None, :, None, None, :]  # [1, B, 1, r, 3r]
        weights = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(logits.dtype).min), -1)
        out = jnp.einsum("bBhqk,bBkhd->bBqhd", weights, vb).reshape(b, blocks * r, h, d_k)
        return jnp.einsum("bnhd,hdm->bnm", out[:, :n], params["out"])

    return init, apply


def recurrent_layer(d: int):
    cell = cells.Cell("lstm", d, d)

    def init(key, n):
        return nn.meta.unbox(cell.init(key)["params"])

    def apply(params, x):
        w = cell.apply({"params": params})
        mask = jnp.ones(x.shape[:2], bool)
        return cells.run_layer("lstm", w, cells.project(w, x), mask)[0]

    return init, apply


def conv_layer(d: int, dilation: int = 1):
    def init(key, n):
        return {"kernel": jax.random.normal(key, (K, d, d)) * (K * d) ** -0.5}

    def apply(params, x):  # causal: output i reads i, i - dilation, i - 2 dilation
        return jax.lax.conv_general_dilated(
            x,
            params["kernel"],
            (1,),
            [((K - 1) * dilation, 0)],
            rhs_dilation=(dilation,),
            dimension_numbers=("NWC", "WIO", "NWC"),
        )

    return init, apply


BUILD = {
    "self-attention": attention_layer,
    "recurrent": recurrent_layer,
    "convolutional": conv_layer,
    "restricted self-attention": restricted_layer,
}


def analytic_flops(layer: str, n: int, d: int = D) -> float:
    """FLOPs of one sequence (2 per multiply-add), from the equations."""
    if layer == "self-attention":  # Q, K, V, O projections; Q K^T; weights x V
        return 8 * n * d * d + 4 * n * n * d
    if layer == "recurrent":  # x W and h U for 4 gates
        return 16 * n * d * d
    if layer == "convolutional":
        return 2 * K * n * d * d
    blocks = -(-n // R)  # restricted: projections, then 3r keys per query in blocks of r
    return 8 * n * d * d + 4 * blocks * R * 3 * R * d


# ---------------------------------------------------------------------------------------------
# Measurements.


def sequential_steps(jaxpr) -> int:
    """Loop steps that must run in order: scans in sequence add, nested scans multiply; a
    program without a loop is one step."""
    total = 0
    for eqn in jaxpr.eqns:
        inner = [getattr(v, "jaxpr", v) for v in eqn.params.values()]
        inner = [j for j in inner if hasattr(j, "eqns")]
        steps = sum(sequential_steps(j) for j in inner) if inner else 0
        if eqn.primitive.name == "scan":
            total += eqn.params["length"] * max(steps, 1)
        elif steps > len(inner):  # a call whose body loops
            total += steps
    return max(total, 1)


def measure_cost(layer: str, n: int, repeats: int = 5, batch: int = BATCH) -> dict:
    """FLOPs (analytic and XLA's) per sequence, median wall time of the batch and sequential
    steps at length n."""
    init, apply = BUILD[layer](D)
    params = init(jax.random.PRNGKey(0), n)
    x = jax.random.normal(jax.random.PRNGKey(1), (batch, n, D))
    compiled = jax.jit(apply).lower(params, x).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    jax.block_until_ready(compiled(params, x))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, x))
        times.append(time.perf_counter() - start)
    return {
        "flops": analytic_flops(layer, n),
        "xla_flops": float(cost.get("flops", float("nan"))) / batch,
        "ms": 1e3 * float(np.median(times)),
        "sequential": sequential_steps(jax.make_jaxpr(apply)(params, x).jaxpr),
    }


def path_length(layer: str, n: int, d: int = 8, dilated: bool = False) -> int:
    """Layers (recurrent: cell steps) from input 0 to output n - 1, by gradient connectivity:
    a tangent at position 0 is pushed through stacked layers with jax.jvp, and after each
    layer replaced by its support (1 where non-zero): the zero pattern of d out / d x_0,
    without the underflow that its size would suffer over hundreds of layers."""
    x = jax.random.normal(jax.random.PRNGKey(2), (1, n, d))
    tangent = jnp.zeros_like(x).at[:, 0].set(1.0)
    if layer == "recurrent":
        return _recurrent_path(n, d, x, tangent)
    for depth in range(1, n + 1):
        if layer == "convolutional":
            dilation = K ** (depth - 1) if dilated else 1
            if dilation >= n:
                return -1
            init, apply = conv_layer(d, dilation)
        else:
            init, apply = BUILD[layer](d)
        params = init(jax.random.PRNGKey(depth), n)
        x, tangent = jax.jvp(lambda v, p=params, f=apply: f(p, v), (x,), (tangent,))
        tangent = (tangent != 0).astype(x.dtype)
        if np.asarray(tangent[0, n - 1]).any():
            return depth
    return -1


def _recurrent_path(n: int, d: int, x, tangent) -> int:
    """One LSTM layer, one cell step at a time: the steps until output n - 1 depends on x_0."""
    cell = cells.Cell("lstm", d, d)
    w = cell.apply({"params": nn.meta.unbox(cell.init(jax.random.PRNGKey(0))["params"])})

    def step(state, x_t):
        return cells.cell_step("lstm", w, cells.project(w, x_t), *state)

    state = (jnp.zeros((1, d)), jnp.zeros((1, d)))
    tangents = (jnp.zeros((1, d)), jnp.zeros((1, d)))
    for t in range(n):
        state, tangents = jax.jvp(
            lambda s, v, t=t: step(s, v), (state, x[:, t]), (tangents, tangent[:, t])
        )
        tangents = tuple((v != 0).astype(v.dtype) for v in tangents)
        if t == n - 1 and np.asarray(tangents[0]).any():
            return t + 1
    return -1


# ---------------------------------------------------------------------------------------------
# The report.


def measure() -> dict:
    costs = {layer: {n: measure_cost(layer, n) for n in LENGTHS} for layer in LAYERS}
    paths = {layer: [path_length(layer, n) for n in PATH_LENGTHS] for layer in LAYERS}
    paths["convolutional, dilated"] = [
        path_length("convolutional", n, dilated=True) for n in PATH_LENGTHS
    ]
    seed_n = SEED_TIMING_MS["n"]
    seed = {layer: measure_cost(layer, seed_n, batch=32)["ms"] for layer in LAYERS[:2]}
    return {"costs": costs, "paths": paths, "seed_setting": seed}


def growth(values: dict, a: int, b: int) -> float:
    """Measured exponent p of value ~ n^p between lengths a and b."""
    return math.log(values[b] / values[a]) / math.log(b / a)


def run(results: str, root: str, overrides=(), say=print):
    m = measure()
    costs, paths = m["costs"], m["paths"]
    rows = []
    for layer in (*LAYERS[:3], "convolutional, dilated", LAYERS[3]):
        base = layer.split(",")[0]
        complexity, sequential, path = TABLE1[base]
        if layer.endswith("dilated"):
            complexity = sequential = "(as above)"
            flops_growth = time_growth = seq = ""
        else:
            c = costs[layer]
            flops = {n: c[n]["flops"] for n in LENGTHS}
            ms = {n: c[n]["ms"] for n in LENGTHS}
            (a, b), (y, z) = LENGTHS[:2], LENGTHS[-2:]
            flops_growth = f"{growth(flops, a, b):.2f} / {growth(flops, y, z):.2f}"
            time_growth = f"{growth(ms, a, b):.2f} / {growth(ms, y, z):.2f}"
            seq = " / ".join(str(c[n]["sequential"]) for n in (a, z))
        if layer == "convolutional":
            path = "O(n / k) (contiguous)"
        rows.append(
            [
                layer,
                complexity,
                flops_growth,
                time_growth,
                sequential,
                seq,
                path,
                " / ".join(str(p) for p in paths[layer]),
            ]
        )
    (a, b), (y, z) = LENGTHS[:2], LENGTHS[-2:]
    header = [
        "layer",
        "paper: complexity",
        f"FLOPs ~ n^p: p at {a}->{b} / {y}->{z}",
        f"time ~ n^p: p at {a}->{b} / {y}->{z}",
        "paper: sequential",
        f"measured at n={a} / {z}",
        "paper: max path",
        f"measured at n={' / '.join(map(str, PATH_LENGTHS))}",
    ]
    per_n = [[n, *[_cost_cell(costs[layer][n]) for layer in LAYERS]] for n in LENGTHS]
    body = (
        f"Forward pass of one layer, d = {D}, batch {BATCH}, float32, on the CPUs of the "
        "machine that ran it; "
        f"kernel k = {K}, neighbourhood r = {R}. Growth exponents from the analytic FLOPs "
        "and the measured times; sequential steps from the layers' jaxprs; path lengths from "
        "gradient connectivity (layers stacked until the last output depends on the first "
        "input; for the recurrent layer, its cell steps).\n\n"
        + markdown_table(header, rows)
        + "\nPer n: MFLOPs per sequence from the equations (XLA's count; for the recurrent layer "
        "XLA counts its loop body once) / ms per batch:\n\n"
        + markdown_table(["n", *LAYERS], per_n)
        + "\n"
        + notes(costs, m["seed_setting"])
    )
    return body, figure(costs, paths), "python -m tx road table1"


def _cost_cell(c: dict) -> str:
    return f"{c['flops'] / 1e6:,.0f} ({c['xla_flops'] / 1e6:,.0f}) / {c['ms']:.2f}"


def notes(costs: dict, seed: dict) -> str:
    """Where the O(.) column shows, and where constants win, read off the measurements."""
    sa, rnn = costs["self-attention"], costs["recurrent"]
    a, y, z = LENGTHS[0], LENGTHS[-2], LENGTHS[-1]
    share = {n: 4 * n * n * D / sa[n]["flops"] for n in (a, y, z)}
    slower = [n for n in LENGTHS if sa[n]["ms"] > rnn[n]["ms"]]

    def per_flop(n):
        return (rnn[n]["ms"] / rnn[n]["flops"]) / (sa[n]["ms"] / sa[n]["flops"])

    return (
        f"- Self-attention's n^2 d term (scores and weighted sum) is {share[a]:.0%} of its "
        f"FLOPs at n = {a}, {share[y]:.0%} at n = {y} and {share[z]:.0%} at n = {z}: below "
        f"n = d the projections (n d^2) dominate and the cost grows about linearly; it "
        f"equals the LSTM's 16 n d^2 at n = 2d = {2 * D}.\n"
        f"- Time per FLOP, recurrent / self-attention: {per_flop(a):.1f} at n = {a}, "
        f"{per_flop(z):.1f} at n = {z}. The recurrent layer runs {rnn[z]['sequential']} steps "
        "in order, each a [batch, d] x [d, 4d] product; self-attention runs none. "
        "Self-attention took longer than the recurrent layer at "
        + (f"n = {', '.join(map(str, slower))}" if slower else "no measured length")
        + ".\n"
        f"- The seed's setting (batch 32, n = {SEED_TIMING_MS['n']}, forward): recurrent "
        f"{seed['recurrent']:.1f} ms, self-attention {seed['self-attention']:.1f} ms here; the "
        f"seed's laptop: LSTM step loop {SEED_TIMING_MS['lstm_loop']} ms, nn.LSTM "
        f"{SEED_TIMING_MS['nn.LSTM']} ms, self-attention {SEED_TIMING_MS['self-attention']} ms.\n"
    )


def figure(costs: dict, paths: dict):
    fig = plots.new_figure(15, 4.5)
    ax_f, ax_t, ax_p = fig.subplots(1, 3)
    n = np.asarray(LENGTHS)
    for i, layer in enumerate(LAYERS):
        c = costs[layer]
        ax_f.plot(n, [c[k]["flops"] for k in LENGTHS], "-o", color=f"C{i}", label=layer)
        ax_t.plot(n, [c[k]["ms"] for k in LENGTHS], "-o", color=f"C{i}", label=layer)
    ax_f.set(title="FLOPs per sequence (equations)", ylabel="FLOPs")
    ax_t.set(title=f"Time per batch of {BATCH} (the machine that ran it)", ylabel="ms")
    for i, (layer, values) in enumerate(paths.items()):
        ax_p.plot(PATH_LENGTHS, values, "-o", color=f"C{i}", label=layer)
    ax_p.set(title="Maximum path length (gradient connectivity)", ylabel="layers or steps")
    for ax in (ax_f, ax_t, ax_p):
        ax.set(xscale="log", yscale="log", xlabel="n (sequence length)")
        ax.set_xticks(LENGTHS, [str(k) for k in LENGTHS])
        ax.minorticks_off()
        ax.legend(fontsize=7)
    fig.suptitle(f"Table 1 measured: one layer, d = {D}")
    return fig
