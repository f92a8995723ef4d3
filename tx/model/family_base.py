"""What every model family (tx.model.families) is built on: what the Transformer and the
recurrent encoder-decoders share, so that neither family reaches into the other.

    ConfigShell     the fields every family's frozen config has, and what follows from them:
                    from_dict, the compute and parameter dtypes, the embedding rows
    EncoderDecoder  every family's module: its embedding tables and two stacks
    check_*         the checks of those fields (and of any positive size or rate), one message
    param_groups    a family's analytic parameter count in the groups `info` prints
    shift_right     the decoder input every family is trained on
    reorder_cache   a search's choice of rows applied to any family's cache

A family adds its own fields, a `family` name (`model.family`) and `tensor_split_sizes`, and
registers its config, module, decoder and counts in tx.model.families.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, TypeVar

import jax
import jax.numpy as jnp
from flax import linen as nn

from tx.model.attention import is_sentence_constant
from tx.model.layers import embedding_tables, padded_rows
from tx.tokens import BOS_ID, PAD_ID

Array = jax.Array

# float64 is for numerical tests on the CPU (with jax_enable_x64), not for training.
DTYPES = {
    "float32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "float16": jnp.float16,
    "float64": jnp.float64,
}

_Config = TypeVar("_Config", bound="ConfigShell")


class ConfigShell:
    """Base of every family's config: a frozen dataclass that declares the fields below.

    The family declares them itself, among its own fields, in the order that reads best for
    it (the paper's, for the Transformer: `python -m tx info` prints them in that order) and
    with its own defaults; this class gives what is computed from them. tests/test_config.py
    checks that every registered family's config declares them all.
    """

    family: ClassVar[str]  # model.family (tx.model.families); not a field

    # one vocabulary for source and target (tx.data's SentencePiece model); the target's where
    # an imported Transformer has two (model.source_vocab_size)
    vocab_size: int
    vocab_multiple: int  # embedding rows rounded up to a multiple of this (layers.Embed)
    d_model: int  # the embedding width
    dropout_rate: float
    share_embeddings: bool  # one matrix for source, target and pre-softmax
    dtype: str  # compute dtype, a key of DTYPES
    param_dtype: str

    @classmethod
    def from_dict(cls: type[_Config], d: Mapping[str, Any]) -> _Config:
        """Builds from a config section, naming any key that is not a field."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ValueError(f"unknown key(s) in config section 'model': {', '.join(unknown)}")
        return cls(**dict(d))

    @property
    def compute_dtype(self):
        return DTYPES[self.dtype]

    @property
    def weight_dtype(self):
        return DTYPES[self.param_dtype]

    @property
    def vocab_rows(self) -> int:
        """Rows of the embedding matrices: vocab_size rounded up to vocab_multiple."""
        return padded_rows(self.vocab_size, self.vocab_multiple)


class EncoderDecoder(nn.Module):
    """A family's module: the embedding tables its config describes (layers.embedding_tables)
    and its two stacks, ENCODER(config, source table) and DECODER(config, target table,
    pre-softmax table or None), named "encoder" and "decoder" in the parameter tree."""

    ENCODER: ClassVar[type]
    DECODER: ClassVar[type]

    def setup(self):
        src, tgt, out = embedding_tables(self.config)
        self.encoder = self.ENCODER(self.config, src, name="encoder")
        self.decoder = self.DECODER(self.config, tgt, out, name="decoder")


def check_positive(config: ConfigShell, names: Iterable[str]) -> None:
    for name in names:
        if getattr(config, name) <= 0:
            raise ValueError(f"model.{name} must be positive, got {getattr(config, name)}")


def check_rates(config: ConfigShell, names: Iterable[str]) -> None:
    """Dropout rates: in [0, 1)."""
    for name in names:
        if not 0.0 <= getattr(config, name) < 1.0:
            raise ValueError(f"model.{name} must be in [0, 1), got {getattr(config, name)}")


def check_dtypes(config: ConfigShell) -> None:
    for name in ("dtype", "param_dtype"):
        if getattr(config, name) not in DTYPES:
            raise ValueError(
                f"model.{name} must be one of {sorted(DTYPES)}, got {getattr(config, name)!r}"
            )


def param_groups(config: ConfigShell, encoder: int, decoder: int) -> dict[str, int]:
    """{"params", "encoder", "decoder", "embeddings"}: a family's stacks counted from its
    equations, and its embeddings (one shared matrix, or source, target and pre-softmax)."""
    embeddings = config.vocab_size * config.d_model * (1 if config.share_embeddings else 3)
    embeddings += getattr(config, "source_vocab_size", 0) * config.d_model  # Marian's own
    return {
        "params": encoder + decoder + embeddings,
        "encoder": encoder,
        "decoder": decoder,
        "embeddings": embeddings,
    }


def shift_right(targets: Array, positions: Array | None = None) -> Array:
    """Decoder input: targets shifted right by one, `bos_id` at every pair's first position.

    targets: [b, t] int; positions: optional [b, t] per-pair positions (packed rows).
    """
    shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=BOS_ID)[:, :-1]
    if positions is not None:
        shifted = jnp.where(positions == 0, BOS_ID, shifted)
    return jnp.where(targets == PAD_ID, PAD_ID, shifted) if positions is not None else shifted


def reorder_cache(cache, rows: Array):
    """The cache of rows `rows` [n] int, for rows chosen within each sentence's block (as
    beam search chooses them): per-row entries (self-attention keys/values, a recurrent state)
    follow their rows; the cross-attention keys/values are held once per sentence and stay
    (tx.model.attention.SENTENCE_CONSTANT_CACHE); step counters are shared."""

    def gather(path, x):
        if x.ndim == 0 or is_sentence_constant(path[-1].key):
            return x
        return x[rows]

    return jax.tree_util.tree_map_with_path(gather, cache)
