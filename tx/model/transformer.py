"""The encoder-decoder Transformer of "Attention Is All You Need" (section 3).

`ModelConfig` is the frozen architecture; the mode (`deterministic`, `incremental`) is a call
argument. Token ids: 0 is padding (masked everywhere), `bos_id` starts the decoder input.

Packed rows are supported: optional `*_segments` (int [b, l], 0 = padding, 1.. = pair
number within the row) keep attention inside one pair, and `*_positions` restart at 0 for
every pair.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn

from tx.model.layers import (
    CACHE_POSITION_AXIS,
    Dropout,
    Embed,
    FeedForward,
    LayerNorm,
    Masking,
    MultiHeadAttention,
    PositionEmbedding,
    attention_impl,
    constrain,
    is_sentence_constant,
    padded_rows,
)
from tx.tokens import BOS_ID, PAD_ID

Array = jax.Array

# float64 is for numerical tests on the CPU (with jax_enable_x64), not for training.
_DTYPES = {
    "float32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "float16": jnp.float16,
    "float64": jnp.float64,
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters; names follow the paper (Table 3 columns)."""

    family: ClassVar[str] = "transformer"  # model.family (tx.model.families); not a field

    vocab_size: int = 37000
    vocab_multiple: int = 1  # embedding rows rounded up to a multiple of this (layers.Embed)
    d_model: int = 512  # d_model
    num_heads: int = 8  # h
    d_k: int | None = None  # query/key width per head; None -> d_model // h
    d_v: int | None = None  # value width per head; None -> d_model // h
    d_ff: int = 2048  # inner feed-forward width
    num_layers: int = 6  # N, for both stacks unless overridden below
    num_encoder_layers: int | None = None
    num_decoder_layers: int | None = None
    dropout_rate: float = 0.1  # P_drop: sub-layer outputs and embedding+PE sums
    attention_dropout_rate: float = 0.0  # on attention weights (not in the paper)
    relu_dropout_rate: float = 0.0  # inside the feed-forward (not in the paper)
    share_embeddings: bool = True  # one matrix for source, target and pre-softmax
    positional: str = "sinusoidal"  # or "learned" (Table 3 row E)
    max_len: int = 1024  # table size for learned positions
    pre_ln: bool = False  # False = the paper's LayerNorm(x + Dropout(Sublayer(x)))
    layer_norm_epsilon: float = 1e-6
    dtype: str = "float32"  # compute dtype
    param_dtype: str = "float32"
    attention_impl: str = "auto"  # tx.model.layers.ATTENTION_IMPLS

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

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        """Builds from a config section, naming any key that is not a field."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ValueError(f"unknown key(s) in config section 'model': {', '.join(unknown)}")
        return cls(**dict(d))

    @property
    def compute_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def weight_dtype(self):
        return _DTYPES[self.param_dtype]

    @property
    def vocab_rows(self) -> int:
        """Rows of the embedding matrices: vocab_size rounded up to vocab_multiple."""
        return padded_rows(self.vocab_size, self.vocab_multiple)

    def tensor_split_sizes(self) -> dict[str, int]:
        """The sizes the mesh's tensor axis splits (heads, feed-forward, vocabulary)."""
        return {
            "model.num_heads": self.num_heads,
            "model.d_ff": self.d_ff,
            "model.vocab_size (rounded up to model.vocab_multiple)": self.vocab_rows,
        }


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
    for name in positive:
        if getattr(c, name) <= 0:
            raise ValueError(f"model.{name} must be positive, got {getattr(c, name)}")
    for name in ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate"):
        if not 0.0 <= getattr(c, name) < 1.0:
            raise ValueError(f"model.{name} must be in [0, 1), got {getattr(c, name)}")
    if c.d_model % 2:
        raise ValueError(f"model.d_model must be even for sinusoidal encodings, got {c.d_model}")
    if c.positional not in ("sinusoidal", "learned"):
        raise ValueError(
            f"model.positional must be 'sinusoidal' or 'learned', got {c.positional!r}"
        )
    for name in ("dtype", "param_dtype"):
        if getattr(c, name) not in _DTYPES:
            raise ValueError(
                f"model.{name} must be one of {sorted(_DTYPES)}, got {getattr(c, name)!r}"
            )


def shift_right(targets: Array, positions: Array | None = None) -> Array:
    """Decoder input: targets shifted right by one, `bos_id` at every pair's first position.

    targets: [b, t] int; positions: optional [b, t] per-pair positions (packed rows).
    """
    shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=BOS_ID)[:, :-1]
    if positions is not None:
        shifted = jnp.where(positions == 0, BOS_ID, shifted)
    return jnp.where(targets == PAD_ID, PAD_ID, shifted) if positions is not None else shifted


def _default_positions(tokens: Array) -> Array:
    return jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)


def _segments_or_mask(tokens: Array, segments: Array | None) -> Array:
    """[b, l] int: the pair number of each position; 0 marks padding."""
    return segments if segments is not None else (tokens != PAD_ID).astype(jnp.int32)


def _lengths(segments: Array) -> Array:
    """[b] int32: the real positions of each row (its padding is at the end)."""
    return jnp.sum(segments > 0, axis=-1, dtype=jnp.int32)


def attention_mask(q_segments: Array, k_segments: Array, causal: bool = False) -> Array:
    """bool [b, 1, q, k]: key is real and in the query's pair (and not in the future)."""
    mask = (q_segments[:, :, None] == k_segments[:, None, :]) & (k_segments[:, None, :] > 0)
    if causal:
        q, k = q_segments.shape[1], k_segments.shape[1]
        mask = mask & (jnp.arange(q)[:, None] >= jnp.arange(k)[None, :])
    return mask[:, None]


class _SubLayer(nn.Module):
    """Wraps one sub-layer: post-LN `LN(x + Drop(f(x)))` or pre-LN `x + Drop(f(LN(x)))`."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x: Array, fn, *, deterministic: bool) -> Array:
        c = self.config
        norm = LayerNorm(c.layer_norm_epsilon, c.compute_dtype, c.weight_dtype, name="norm")
        drop = Dropout(c.dropout_rate)
        if c.pre_ln:
            return x + drop(fn(norm(x)), deterministic=deterministic)
        return norm(x + drop(fn(x), deterministic=deterministic))


def _attention(c: ModelConfig, name: str) -> MultiHeadAttention:
    impl = attention_impl(c.attention_impl, c.compute_dtype, c.d_k, c.d_v, jax.default_backend())
    return MultiHeadAttention(
        c.num_heads,
        c.d_k,
        c.d_v,
        c.d_model,
        c.attention_dropout_rate,
        c.compute_dtype,
        c.weight_dtype,
        impl,
        name=name,
    )


def _ffn(c: ModelConfig) -> FeedForward:
    return FeedForward(
        c.d_model, c.d_ff, c.relu_dropout_rate, c.compute_dtype, c.weight_dtype, name="ffn"
    )


class EncoderLayer(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x: Array, mask: Array, *, deterministic: bool) -> Array:
        """x: [b, s, m]; mask: [b, 1, s, s] -> [b, s, m]."""
        c = self.config
        attn = _attention(c, "self_attention")
        x = _SubLayer(c, name="attention_block")(
            x, lambda y: attn(y, y, mask, deterministic=deterministic), deterministic=deterministic
        )
        ffn = _ffn(c)
        x = _SubLayer(c, name="ffn_block")(
            x, lambda y: ffn(y, deterministic=deterministic), deterministic=deterministic
        )
        return constrain(x, ("batch", "length", "embed"))


class DecoderLayer(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(
        self,
        y,
        encoded,
        self_mask,
        cross_mask,
        *,
        deterministic: bool,
        incremental: bool,
        prime: bool = False,
    ):
        """y: [b, t, m]; encoded: [b, s, m]; masks [b, 1, t, t] / [b, 1, t, s] -> [b, t, m].

        `prime`: only store the cross-attention keys and values of `encoded` in the cache."""
        c = self.config
        if prime:
            return _attention(c, "cross_attention")(
                None, encoded, None, deterministic=True, prime=True
            )
        self_attn = _attention(c, "self_attention")
        y = _SubLayer(c, name="self_attention_block")(
            y,
            lambda z: self_attn(
                z, z, self_mask, deterministic=deterministic, incremental=incremental
            ),
            deterministic=deterministic,
        )
        cross = _attention(c, "cross_attention")
        y = _SubLayer(c, name="cross_attention_block")(
            y,
            lambda z: cross(
                z,
                encoded,
                cross_mask,
                deterministic=deterministic,
                incremental=incremental,
                static_kv=True,
            ),
            deterministic=deterministic,
        )
        ffn = _ffn(c)
        y = _SubLayer(c, name="ffn_block")(
            y, lambda z: ffn(z, deterministic=deterministic), deterministic=deterministic
        )
        return constrain(y, ("batch", "length", "embed"))


class Encoder(nn.Module):
    config: ModelConfig
    embed: nn.Module

    @nn.compact
    def __call__(self, inputs, masking: Masking, positions, *, deterministic: bool) -> Array:
        """inputs, positions: [b, s] int; masking: its self-attention -> encoded [b, s, m]."""
        c = self.config
        x = self.embed(inputs)
        x = PositionEmbedding(
            c.d_model, c.positional, c.max_len, c.compute_dtype, c.weight_dtype, name="position"
        )(x, positions)
        x = Dropout(c.dropout_rate)(x, deterministic=deterministic)
        x = constrain(x, ("batch", "length", "embed"))
        for i in range(c.num_encoder_layers):
            x = EncoderLayer(c, name=f"layer_{i}")(x, masking, deterministic=deterministic)
        if c.pre_ln:
            x = LayerNorm(c.layer_norm_epsilon, c.compute_dtype, c.weight_dtype, name="final_norm")(
                x
            )
        return x


class Decoder(nn.Module):
    config: ModelConfig
    embed: nn.Module
    output_embed: nn.Module | None  # None: tie the softmax to `embed`

    @nn.compact
    def __call__(
        self,
        encoded,
        decoder_inputs,
        self_mask,
        cross_mask,
        positions,
        *,
        deterministic: bool,
        incremental: bool,
        features: bool = False,
        prime: bool = False,
    ) -> Array:
        """decoder_inputs: [b, t] (already shifted) -> logits [b, t, V] float32, or with
        `features` the states the softmax layer takes [b, t, m]. `prime`: fill the cache's
        cross-attention keys and values from `encoded` [b, s, m], and nothing else."""
        c = self.config
        if prime:
            for i in range(c.num_decoder_layers):
                DecoderLayer(c, name=f"layer_{i}")(
                    None, encoded, None, None, deterministic=True, incremental=True, prime=True
                )
            return None
        if incremental:
            positions = self._step_positions(decoder_inputs)
        y = self.embed(decoder_inputs)
        y = PositionEmbedding(
            c.d_model, c.positional, c.max_len, c.compute_dtype, c.weight_dtype, name="position"
        )(y, positions)
        y = Dropout(c.dropout_rate)(y, deterministic=deterministic)
        y = constrain(y, ("batch", "length", "embed"))
        for i in range(c.num_decoder_layers):
            y = DecoderLayer(c, name=f"layer_{i}")(
                y,
                encoded,
                self_mask,
                cross_mask,
                deterministic=deterministic,
                incremental=incremental,
            )
        if c.pre_ln:
            y = LayerNorm(c.layer_norm_epsilon, c.compute_dtype, c.weight_dtype, name="final_norm")(
                y
            )
        if features:
            return y
        return constrain(self.head.attend(y), ("batch", "length", "vocab"))

    @property
    def head(self) -> nn.Module:
        """The pre-softmax layer: its own matrix, or the tied embedding."""
        return self.output_embed if self.output_embed is not None else self.embed

    def _step_positions(self, decoder_inputs: Array) -> Array:
        """[b, l] positions of an incremental step, counted in the "cache" collection."""
        initialized = self.has_variable("cache", "decode_position")
        index = self.variable("cache", "decode_position", lambda: jnp.array(0, jnp.int32))
        length = decoder_inputs.shape[1]
        positions = index.value + jnp.broadcast_to(jnp.arange(length), decoder_inputs.shape)
        if initialized:
            index.value = index.value + length
        return positions


class Transformer(nn.Module):
    """Encoder-decoder Transformer; see `encode`, `decode` and `__call__` for shapes."""

    config: ModelConfig

    def setup(self):
        c = self.config

        if c.share_embeddings:
            self.shared_embedding = Embed.of(c, "shared_embedding")
            src, tgt, out = self.shared_embedding, self.shared_embedding, None
        else:
            names = ("source_embedding", "target_embedding", "softmax")
            src, tgt, out = (Embed.of(c, name) for name in names)
        self.encoder = Encoder(c, src, name="encoder")
        self.decoder = Decoder(c, tgt, out, name="decoder")

    def encode(
        self, inputs, inputs_segments=None, inputs_positions=None, *, deterministic: bool = True
    ) -> Array:
        """inputs: [b, s] int -> encoded [b, s, m]."""
        segments = _segments_or_mask(inputs, inputs_segments)
        positions = inputs_positions if inputs_positions is not None else _default_positions(inputs)
        lengths = None
        if inputs_segments is None:  # one sentence per row, padded at its end
            n = _lengths(segments)
            lengths = (n, n)
        masking = Masking(attention_mask(segments, segments), lengths)
        return self.encoder(inputs, masking, positions, deterministic=deterministic)

    def decode(
        self,
        encoded,
        inputs,
        targets,
        inputs_segments=None,
        targets_segments=None,
        targets_positions=None,
        *,
        deterministic: bool = True,
        incremental: bool = False,
        features: bool = False,
    ) -> Array:
        """Decoder logits (with `features`: the states [b, t, m] the softmax layer takes).

        Training / scoring (`incremental=False`): targets [b, t] are shifted right here and the
        result is logits [b, t, V] predicting targets[:, i] at position i.
        Incremental (`incremental=True`): targets [b, 1] is the previous token (`bos_id` first);
        the "cache" collection must come from `init_cache` and be mutable.
        """
        src_segments = _segments_or_mask(inputs, inputs_segments)
        if incremental:
            cross_mask = (src_segments > 0)[:, None, None, :]  # [b, 1, 1, s]
            return self.decoder(
                encoded,
                targets,
                None,
                cross_mask,
                None,
                deterministic=deterministic,
                incremental=True,
            )
        tgt_segments = _segments_or_mask(targets, targets_segments)
        if targets_positions is None:
            positions = _default_positions(targets)
            decoder_inputs = shift_right(targets)
            # Causal only: a padding query still sees real keys, so no row is empty.
            self_segments = jnp.ones_like(tgt_segments)
        else:
            positions = targets_positions
            decoder_inputs = shift_right(targets, targets_positions)
            self_segments = tgt_segments
        self_mask = Masking(attention_mask(self_segments, self_segments, causal=True), causal=True)
        cross_mask = Masking(attention_mask(tgt_segments, src_segments))
        if inputs_segments is None and targets_segments is None and targets_positions is None:
            # One pair per row, padded at its end: the same masks as lengths (cuDNN's form).
            self_mask = self_mask._replace(lengths=(_lengths(self_segments),) * 2)
            cross_mask = cross_mask._replace(
                lengths=(_lengths(tgt_segments), _lengths(src_segments))
            )
        return self.decoder(
            encoded,
            decoder_inputs,
            self_mask,
            cross_mask,
            positions,
            deterministic=deterministic,
            incremental=False,
            features=features,
        )

    def __call__(
        self,
        inputs,
        targets,
        inputs_segments=None,
        targets_segments=None,
        inputs_positions=None,
        targets_positions=None,
        *,
        deterministic: bool = True,
        features: bool = False,
    ) -> Array:
        """inputs [b, s], targets [b, t] int -> logits [b, t, V] float32 (teacher forcing),
        or with `features` the states the softmax layer takes [b, t, m]."""
        encoded = self.encode(
            inputs, inputs_segments, inputs_positions, deterministic=deterministic
        )
        return self.decode(
            encoded,
            inputs,
            targets,
            inputs_segments,
            targets_segments,
            targets_positions,
            deterministic=deterministic,
            features=features,
        )

    def features(self, *args, **kwargs) -> tuple[Array, Array]:
        """`__call__`'s arguments -> (states [b, t, m] before the softmax layer, that layer's
        matrix [V', m]), for a loss that never holds all the logits (tx.train.losses)."""
        states = self(*args, **kwargs, features=True)
        return states, self.decoder.head.matrix()

    def prime(self, encoded: Array) -> None:
        """Stores every layer's cross-attention keys and values of `encoded` [b, s, m] in the
        "cache" collection (mutable, allocated by `init_cache`): projected once per sentence,
        before the search, instead of at a step inside it."""
        self.decoder(
            encoded, None, None, None, None, deterministic=True, incremental=True, prime=True
        )


def init_cache(
    model: Transformer, params, encoded: Array, inputs: Array, max_len: int, width: int = 1
):
    """The decoder's cache for `width` search rows per sentence and `max_len` output positions.

    encoded: [b, s, m], inputs: [b, s] (one row per sentence). Self-attention keys and values
    get b * width rows of zeros (index 0); cross-attention keys and values are projected from
    `encoded` once, one row per sentence (its search rows share them).
    """
    targets = jnp.zeros((inputs.shape[0] * width, max_len), jnp.int32)

    def allocate():
        return model.apply(
            {"params": params},
            encoded,
            inputs,
            targets,
            incremental=True,
            method=Transformer.decode,
            mutable=["cache"],
        )[1]["cache"]

    # Only the shapes are needed: no forward pass over max_len positions is run.
    shapes = jax.eval_shape(allocate)
    cache = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    _, primed = model.apply(
        {"params": params, "cache": cache},
        encoded,
        method=Transformer.prime,
        mutable=["cache"],
    )
    return primed["cache"]


def incremental_decoder(model: Transformer, params, inputs: Array, width: int, max_len: int):
    """What a search needs to decode `inputs` [b, s] with `width` rows per sentence.

    Returns (tokens_to_logits, cache, reorder_cache), the fields of tx.infer.search.Decoder:
    the cache has room for b*width rows (sentence-major) and `max_len` output positions, and
    the cross-attention state once per sentence; tokens_to_logits maps the previous tokens
    [b*width, 1] and the cache to (logits [b*width, V] float32, new cache); reorder_cache is
    `reorder_cache`.
    """
    encoded = model.apply({"params": params}, inputs, method=Transformer.encode)  # [b, s, m]
    cache = init_cache(model, params, encoded, inputs, max_len, width)

    def tokens_to_logits(ids: Array, cache):
        logits, variables = model.apply(
            {"params": params, "cache": cache},
            encoded,
            inputs,
            ids,
            incremental=True,
            method=Transformer.decode,
            mutable=["cache"],
        )
        return logits[:, 0], variables["cache"]

    return tokens_to_logits, cache, reorder_cache


def reorder_cache(cache, rows: Array):
    """The cache of rows `rows` [n] int, for rows chosen within each sentence's block (as
    beam search chooses them): self-attention keys/values follow their rows; the
    cross-attention keys/values are held once per sentence and stay; step counters are
    shared."""

    def gather(path, x):
        if x.ndim == 0 or is_sentence_constant(path[-1].key):
            return x
        return x[rows]

    return jax.tree_util.tree_map_with_path(gather, cache)


def resize_cache(cache, length: int):
    """The cache with room for `length` output positions: the self-attention keys and values
    cut to their first `length` positions or padded with zeros after them; the rest as it is.
    Positions at or after the cache index are never attended to (the step's mask), so the
    search may grow the cache window by window (tx.infer.search.windows) as long as `length` is at
    least the number of positions written."""

    def resize(path, x):
        axis = CACHE_POSITION_AXIS.get(path[-1].key)
        if axis is None or x.shape[axis] == length:
            return x
        if x.shape[axis] > length:
            return jax.lax.slice_in_dim(x, 0, length, axis=axis)
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, length - x.shape[axis])
        return jnp.pad(x, widths)

    return jax.tree_util.tree_map_with_path(resize, cache)
