"""Pictures: attention maps (the paper's Figures 3-5), positional encodings, learning curves,
BLEU by source length. Each function takes plain arrays and returns a matplotlib Figure;
`save` writes it as a PNG.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas, never through pyplot: no
display is ever needed and no figure lingers in a global registry. Nothing here runs during
training: curves are drawn afterwards from the event files (tx.train.events).
"""

from __future__ import annotations

import io
import math
import textwrap

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tx import storage

DPI = 100
LABEL_PT = 7  # tick labels of tokens
CELL_IN = 0.16  # inches per token: a 7-point label is 0.1 in tall, so neighbours never touch
MAX_LABELS = 60  # past this many tokens a panel labels every n-th one, so it stays legible
PANEL_IN = (1.6, MAX_LABELS * CELL_IN)  # smallest and largest side of one attention panel


def new_figure(width: float, height: float) -> Figure:
    """A figure of width x height inches on the Agg canvas, laid out without overlaps."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, path: str) -> str:
    """Writes `fig` to `path` (a file or a bucket's object) as a PNG, whole: rendered in
    memory, then written at once (tx.storage.write_bytes)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    storage.write_bytes(path, buf.getvalue())
    return path


def _panel_inches(tokens: int) -> float:
    return float(np.clip(tokens * CELL_IN, *PANEL_IN))


def _token_ticks(ax, axis: str, labels: list[str]) -> None:
    """Every token as a tick label, or every n-th one past MAX_LABELS."""
    every = math.ceil(len(labels) / MAX_LABELS)
    ticks = np.arange(0, len(labels), every)
    shown = [labels[i] for i in ticks]
    if axis == "x":
        ax.set_xticks(ticks, shown, rotation=90, fontsize=LABEL_PT)
    else:
        ax.set_yticks(ticks, shown, fontsize=LABEL_PT)


def attention_grid(
    weights: np.ndarray,
    query_labels: list[str],
    key_labels: list[str],
    title: str,
    query_name: str,
    key_name: str,
) -> Figure:
    """A grid of attention maps: one row per layer, one column per head and a last column
    with the mean over heads. Row i of a map is query position i; its cells sum to 1.

    Args:
      weights: [L, h, q, k] attention weights.
      query_labels / key_labels: q and k token strings (tick labels).
      title: the figure's title; query_name / key_name: what the rows and columns are.
    """
    layers, heads, q, k = weights.shape
    maps = np.concatenate([weights, weights.mean(1, keepdims=True)], axis=1)  # [L, h+1, q, k]
    pw, ph = _panel_inches(k), _panel_inches(q)
    # Room for the tick labels (a sub-word is rarely over 10 characters) and the colour bar.
    fig = new_figure((heads + 1) * pw + 1.8, layers * ph + 1.6)
    axes = fig.subplots(layers, heads + 1, sharex=True, sharey=True, squeeze=False)
    vmax = float(maps.max()) or 1.0
    for i in range(layers):
        for j in range(heads + 1):
            ax = axes[i, j]
            image = ax.imshow(maps[i, j], cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
            if i == 0:
                ax.set_title("mean of heads" if j == heads else f"head {j}", fontsize=9)
            if j == 0:
                ax.set_ylabel(f"layer {i}", fontsize=9)
                _token_ticks(ax, "y", query_labels)
            if i == layers - 1:
                _token_ticks(ax, "x", key_labels)
            ax.tick_params(length=2, labelleft=j == 0, labelbottom=i == layers - 1)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    # A long sentence as the title wraps instead of running off a narrow grid.
    fig.suptitle(textwrap.fill(title, int(fig.get_figwidth() * 11)), fontsize=11)
    fig.supxlabel(key_name, fontsize=9)
    fig.supylabel(query_name, fontsize=9)
    return fig


def positional_figure(encoding: np.ndarray) -> Figure:
    """The sinusoidal encodings [positions, d_model]: a few dimensions against position, the
    whole matrix, and PE(p) . PE(q) (it depends on p - q only, which is the point)."""
    positions, d_model = encoding.shape
    fig = new_figure(16, 5)
    lines, matrix, dots = fig.subplots(1, 3, width_ratios=(1.2, 1.2, 1))
    # Sine dimensions whose wavelengths (2 pi 10000^(dim / d_model)) span the positions drawn.
    for dim in sorted({d_model // 8 * k // 2 * 2 for k in (1, 2, 3, 4)}):
        wavelength = 2 * np.pi * 10000 ** (dim / d_model)
        lines.plot(encoding[:, dim], label=f"dim {dim} (sin, wavelength {wavelength:.0f})")
    lines.set(xlabel="position", ylabel="PE(position, dim)", title="a few dimensions")
    lines.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncols=2)
    image = matrix.imshow(encoding, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    matrix.set(xlabel="dimension (even: sin, odd: cos)", ylabel="position", title="PE matrix")
    fig.colorbar(image, ax=matrix, label="value")
    product = encoding @ encoding.T  # [positions, positions]
    image = dots.imshow(product, cmap="magma", aspect="equal")
    dots.set(xlabel="position q", ylabel="position p", title="dot product PE(p) . PE(q)")
    fig.colorbar(image, ax=dots, label="PE(p) . PE(q)")
    fig.suptitle(f"Sinusoidal positional encoding, d_model = {d_model} (section 3.5)")
    return fig


# The learning-curve panels: (title, y label, [(tag, line style, what)], log scale).
CURVES = (
    ("training loss", "loss (label-smoothed)", [("train/loss", "-", "")], False),
    ("dev loss", "loss", [("dev/loss", "-", "")], False),
    ("dev perplexity", "perplexity per sub-word", [("dev/perplexity", "-", "")], True),
    (
        "dev BLEU",
        "BLEU",
        [("dev/bleu", "-", "sacreBLEU"), ("dev/tok_bleu", "--", "tokenized")],
        False,
    ),
    ("learning rate", "learning rate", [("train/learning_rate", "-", "")], False),
    ("throughput", "tokens/s (source + target)", [("train/tokens_per_sec", "-", "")], False),
)


def curves_figure(runs: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]) -> Figure:
    """Learning curves of several runs on one figure: run name -> tag -> (steps, values)."""
    fig = new_figure(15, 8)
    for ax, (title, ylabel, series, log) in zip(fig.subplots(2, 3).ravel(), CURVES, strict=True):
        ax.set(title=title, xlabel="step", ylabel=ylabel)
        drawn = _curve_panel(ax, runs, series)
        if not drawn:
            tags = ", ".join(t for t, _, _ in series)
            ax.text(
                0.5,
                0.5,
                f"not logged\n({tags})",
                ha="center",
                va="center",
                transform=ax.transAxes,
                color="grey",
            )
            continue
        low, high = min(v.min() for v in drawn), max(v.max() for v in drawn)
        if log and low > 0 and high > 10 * low:  # a log axis over less than a decade: no ticks
            ax.set_yscale("log")
        if len(series) > 1 or len(runs) > 1:
            ax.legend(fontsize=8)
    fig.suptitle("Learning curves: " + ", ".join(runs))
    return fig


def _curve_panel(ax, runs, series) -> list[np.ndarray]:
    """Draws every run's `series` on `ax`, one colour per run; returns the values drawn."""
    drawn = []
    for k, (name, scalars) in enumerate(runs.items()):
        for tag, style, what in series:
            if tag in scalars:
                steps, values = scalars[tag]
                marker = "." if len(steps) < 30 else None  # sparse dev points stay visible
                label = f"{name} {what}".strip()
                ax.plot(steps, values, style, color=f"C{k % 10}", marker=marker, label=label)
                drawn.append(values)
    return drawn


def by_length_figure(buckets: list[dict], title: str) -> Figure:
    """BLEU per source-length bucket (Bahdanau et al.'s Figure 2 view), sentence counts on
    the bars. buckets: dicts with "bucket" (label), "bleu" and "sentences"."""
    width = max(6, 0.9 * len(buckets) + 2)
    fig = new_figure(width, 4.5)
    ax = fig.subplots()
    x = np.arange(len(buckets))
    bars = ax.bar(x, [b["bleu"] for b in buckets], color="C0")
    ax.bar_label(bars, [f"n={b['sentences']}" for b in buckets], fontsize=8, padding=2)
    ax.set_xticks(x, [b["bucket"] for b in buckets])
    ax.set(xlabel="source length (words)", ylabel="sacreBLEU")
    ax.set_title(textwrap.fill(title, int(width * 10)), fontsize=10)
    ax.set_ylim(0, max([b["bleu"] for b in buckets] + [1.0]) * 1.12)
    return fig
