"""The Transformer's frozen architecture, `ModelConfig` (run by tx.model.transformer), and what
follows from it alone: its parameters counted from the paper's equations (`param_count`) and the
FLOPs of a training step (`train_flops`), which tx.model.counting reads through the family's
entry in tx.model.families.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from tx.model.family_base import (
    ConfigShell,
    check_dtypes,
    check_positive,
    check_rates,
    param_groups,
)
from tx.model.layers import ACTIVATIONS, padded_rows

TABLES = ("learned", "fixed")  # model.positional values that read a table of max_len rows


@dataclasses.dataclass(frozen=True)
class ModelConfig(ConfigShell):
    """Architecture hyper-parameters; names follow the paper (Table 3 columns)."""

    family: ClassVar[str] = "transformer"  # model.family (tx.model.families); not a field

    vocab_size: int = 37000  # = data.vocab_size: one shared source-target vocabulary
    vocab_multiple: int = 1  # embedding rows rounded up to a multiple of this (layers.Embed)
    d_model: int = 512  # d_model: every sub-layer's output and the embeddings
    num_heads: int = 8  # h
    d_k: int | None = None  # query/key width per head; None -> d_model // h
    d_v: int | None = None  # value width per head; None -> d_model // h
    d_ff: int = 2048  # inner feed-forward width
    num_layers: int = 6  # N, for both stacks unless overridden below
    num_encoder_layers: int | None = None
    num_decoder_layers: int | None = None
    dropout_rate: float = 0.1  # P_drop: sub-layer outputs and embedding+PE sums
    attention_dropout_rate: float = 0.0  # on attention weights (not in the paper; t2t v1: 0)
    relu_dropout_rate: float = 0.0  # inside the feed-forward (not in the paper)
    share_embeddings: bool = True  # one matrix for source, target and pre-softmax
    # Marian's separate vocabularies (its share_encoder_decoder_embeddings=False, imported from
    # Hugging Face): the encoder embeds source ids over this many rows, the decoder target ids
    # over vocab_size rows, tied to the pre-softmax layer (share_embeddings). 0: one vocabulary.
    source_vocab_size: int = 0
    # "sinusoidal" (the paper's), "learned" (Table 3 row E) or "fixed": a stored table that
    # never trains (an imported Marian model's own sinusoids, kept bit for bit)
    positional: str = "sinusoidal"
    max_len: int = 1024  # table size for learned and fixed positions (unused for sinusoids)
    pre_ln: bool = False  # False = the paper's LayerNorm(x + Dropout(Sublayer(x)))
    layer_norm_epsilon: float = 1e-6
    # Compute dtype; parameters and Adam's moments stay float32 and products accumulate in
    # float32. bf16 on GPUs, TPUs and CPUs with bf16 units (docs/performance.md).
    dtype: str = "float32"
    param_dtype: str = "float32"
    # tx.model.kernels.ATTENTION_IMPLS: "auto" is splash on TPUs (lengths in 128s), cuDNN flash
    # attention on GPUs (bf16/fp16), XLA's elsewhere; "explicit" forms the weights (always so
    # for attention dropout, drawn maps and d_k != d_v).
    attention_impl: str = "auto"
    # What a model made elsewhere needs (Hugging Face's MarianMTModel, OPUS-MT: tx.infer
    # .huggingface); the defaults are the paper's model, unchanged.
    activation: str = "relu"  # the feed-forward's: "relu" (the paper), "swish" (OPUS-MT), "gelu"
    attention_bias: bool = False  # biases in W^Q, W^K, W^V and W^O (the paper has none)
    logits_bias: bool = False  # a fixed bias on the logits (Marian's final_logits_bias)
    # The decoder's first input: the embedding of <s> ("token") or zeros ("zero": Marian,
    # tensor2tensor).
    decoder_start: str = "token"

    def __post_init__(self):
        h = self.num_heads
        if h <= 0:
            raise ValueError(f"model.num_heads must be positive, got {h}")
        for name in ("d_k", "d_v"):
            if getattr(self, name) is None:
                if self.d_model % h:
                    raise ValueError(
                        f"model.d_model={self.d_model} is not divisible by model.num_heads={h}; "
                        f"set model.{name} explicitly"
                    )
                object.__setattr__(self, name, self.d_model // h)
        for name in ("num_encoder_layers", "num_decoder_layers"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.num_layers)
        _check_model(self)

    def tensor_split_sizes(self) -> dict[str, int]:
        """The sizes the mesh's tensor axis splits (heads, feed-forward, vocabulary)."""
        return {
            "model.num_heads": self.num_heads,
            "model.d_ff": self.d_ff,
            "model.vocab_size (rounded up to model.vocab_multiple)": self.vocab_rows,
            **(
                {"model.source_vocab_size (rounded up)": self.source_rows}
                if self.source_vocab_size
                else {}
            ),
        }

    @property
    def source_rows(self) -> int:
        """Rows of the source's own embedding (model.source_vocab_size > 0), padded as
        vocab_rows."""
        return padded_rows(self.source_vocab_size, self.vocab_multiple)

    @property
    def position_table(self) -> bool:
        """Whether positions come from a table of max_len rows (learned or fixed): inputs and
        outputs longer than it are refused."""
        return self.positional in TABLES


def _check_model(c: ModelConfig) -> None:
    positive = (
        "vocab_size",
        "vocab_multiple",
        "d_model",
        "d_k",
        "d_v",
        "d_ff",
        "num_encoder_layers",
        "num_decoder_layers",
        "max_len",
    )
    check_positive(c, positive)
    check_rates(c, ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate"))
    if c.d_model % 2:
        raise ValueError(f"model.d_model must be even for sinusoidal encodings, got {c.d_model}")
    if c.positional not in ("sinusoidal", *TABLES):
        raise ValueError(
            f"model.positional must be 'sinusoidal', 'learned' or 'fixed', got {c.positional!r}"
        )
    if c.activation not in ACTIVATIONS:
        raise ValueError(
            f"model.activation must be one of {sorted(ACTIVATIONS)}, got {c.activation!r}"
        )
    if c.source_vocab_size < 0:
        raise ValueError(f"model.source_vocab_size must be >= 0, got {c.source_vocab_size}")
    if c.source_vocab_size and not c.share_embeddings:
        raise ValueError(
            "model.source_vocab_size > 0 (separate vocabularies, Marian's) ties the target's "
            "embedding to the pre-softmax layer: it needs model.share_embeddings=True"
        )
    if c.decoder_start not in ("token", "zero"):
        raise ValueError(f"model.decoder_start must be 'token' or 'zero', got {c.decoder_start!r}")
    check_dtypes(c)


def param_count(c: ModelConfig) -> dict[str, int]:
    """The paper's architecture counted from its equations (bias-free attention projections,
    feed-forward with biases, two LayerNorms per encoder layer and three per decoder layer)."""
    m, h = c.d_model, c.num_heads
    attention = m * h * c.d_k * 2 + m * h * c.d_v + h * c.d_v * m
    if c.attention_bias:
        attention += h * c.d_k * 2 + h * c.d_v + m
    ffn = 2 * m * c.d_ff + c.d_ff + m
    norm = 2 * m
    final_norm = norm if c.pre_ln else 0
    positions = c.max_len * m if c.positional in TABLES else 0
    encoder = c.num_encoder_layers * (attention + ffn + 2 * norm) + final_norm + positions
    decoder = c.num_decoder_layers * (2 * attention + ffn + 3 * norm) + final_norm + positions
    groups = param_groups(c, encoder, decoder)
    if c.logits_bias:  # beside the embeddings: the pre-softmax layer's bias (fixed)
        groups["embeddings"] += c.vocab_size
        groups["params"] += c.vocab_size
    return groups


def train_flops(
    c: ModelConfig, src_tokens: float, tgt_tokens: float, src_len: float, tgt_len: float
) -> float:
    """Model FLOPs of one training step (forward + backward = 3 x forward, 2 per MAC).

    6 x (encoder weights x source tokens + (decoder weights + softmax) x target tokens), plus
    attention scores: 6 x 2 x (h * d_k + h * d_v)/2-style terms over the attended lengths.
    """
    counts = param_count(c)
    softmax = c.vocab_size * c.d_model
    dense = 6 * (counts["encoder"] * src_tokens + (counts["decoder"] + softmax) * tgt_tokens)
    hd = c.num_heads * (c.d_k + c.d_v)
    attn = (
        6
        * hd
        * (
            c.num_encoder_layers * src_tokens * src_len
            + c.num_decoder_layers * tgt_tokens * (tgt_len / 2 + src_len)
        )
    )
    return float(dense + attn)
