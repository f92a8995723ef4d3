"""`RNNConfig` (model.family = "rnn", run by tx.model.rnn) with its counts, as
tx.model.transformer_config has the Transformer's: gates per cell type decide the sizes."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from tx.model.cells import CELLS
from tx.model.family_base import (
    ConfigShell,
    check_dtypes,
    check_positive,
    check_rates,
    param_groups,
)

ATTENTION = ("none", "additive", "dot", "general")


@dataclasses.dataclass(frozen=True)
class RNNConfig(ConfigShell):
    """Architecture of a recurrent encoder-decoder (model.family = "rnn")."""

    family: ClassVar[str] = "rnn"

    vocab_size: int = 32000
    vocab_multiple: int = 1  # embedding rows rounded up to a multiple of this (layers.Embed)
    d_model: int = 256  # embedding width = hidden width of every layer (as the Transformer)
    num_layers: int = 1  # stacked recurrent layers in the encoder and in the decoder
    cell: str = "lstm"  # "lstm" | "gru" | "tanh" (Elman: h = tanh(W x + U h + b))
    attention: str = "none"  # "none" (fixed-length summary) | "additive" | "dot" | "general"
    reverse_source: bool = False  # Sutskever et al.: the encoder reads the source backwards
    forget_bias: float = 1.0  # LSTM forget-gate bias at init (1: Jozefowicz et al. 2015)
    dropout_rate: float = 0.1  # embeddings, between layers, before the softmax
    share_embeddings: bool = True  # one matrix for source, target and pre-softmax
    dtype: str = "float32"  # compute dtype
    param_dtype: str = "float32"

    def __post_init__(self):
        check_positive(self, ("vocab_size", "vocab_multiple", "d_model", "num_layers"))
        if self.cell not in CELLS:
            raise ValueError(f"model.cell must be one of {sorted(CELLS)}, got {self.cell!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"model.attention must be one of {ATTENTION}, got {self.attention!r}")
        check_rates(self, ("dropout_rate",))
        check_dtypes(self)

    @property
    def gates(self) -> int:
        return CELLS[self.cell]

    def tensor_split_sizes(self) -> dict[str, int]:
        """The sizes the mesh's tensor axis splits (hidden units and vocabulary)."""
        return {
            "model.d_model": self.d_model,
            "model.vocab_size (rounded up to model.vocab_multiple)": self.vocab_rows,
        }


def param_count(c: RNNConfig) -> dict[str, int]:
    """A recurrent encoder-decoder counted from its equations (tx.model.rnn).

    A cell with g gates on input width i and n units: W [i, g, n], U [n, g, n], b [g, n]
    (GRU: a second bias b_h, which the reset gate multiplies). Every layer's input is d_model
    wide. With attention: the first decoder layer's context kernel [m, g, n], the score
    (additive: W, U [m, m], v [m]; general: W_a [m, m]; dot: none) and the output
    tanh(W_s s + W_c c + b): 2 m^2 + m.
    """
    m, g, layers = c.d_model, c.gates, c.num_layers
    cell = g * m * (m + m + (2 if c.cell == "gru" else 1))
    score = {"none": 0, "dot": 0, "general": m * m, "additive": 2 * m * m + m}[c.attention]
    attention = 0 if c.attention == "none" else g * m * m + score + 2 * m * m + m
    encoder, decoder = layers * cell, layers * cell + attention
    return param_groups(c, encoder, decoder)


def train_flops(
    c: RNNConfig, src_tokens: float, tgt_tokens: float, src_len: float, tgt_len: float
) -> float:
    """Model FLOPs of one training step (forward + backward = 3 x forward, 2 per MAC).

    6 x weights x the tokens they multiply (the score's key kernel multiplies source
    tokens, the rest of the decoder and the softmax target tokens), plus, with attention,
    6 x 2m per (target token, source position) pair: the score (m MACs: v . tanh(.) or s . k)
    and the context (m MACs). A step of the recurrence costs the same at every position:
    `tgt_len` does not enter.
    """
    del tgt_len
    counts = param_count(c)
    m = c.d_model
    keys = {"additive": m * m, "general": m * m}.get(c.attention, 0)
    softmax = c.vocab_size * m
    dense = 6 * (
        (counts["encoder"] + keys) * src_tokens + (counts["decoder"] - keys + softmax) * tgt_tokens
    )
    pairs = 0.0 if c.attention == "none" else 6 * 2 * m * tgt_tokens * src_len
    return float(dense + pairs)
