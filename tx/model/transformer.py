"""The encoder-decoder Transformer of "Attention Is All You Need" (section 3).

`ModelConfig` (tx.model.transformer_config) is the frozen architecture; the mode
(`deterministic`, `incremental`) is a call argument. Token ids: 0 is padding (masked
everywhere), `bos_id` starts the decoder input. What a search needs to decode it step by step
(the KV cache, `incremental_decoder`) is tx.model.transformer_decoding's.

Packed rows are supported: optional `*_segments` (int [b, l], 0 = padding, 1.. = pair
number within the row) keep attention inside one pair, and `*_positions` restart at 0 for
every pair.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from tx.model.attention import Masking, MultiHeadAttention, attention_impl
from tx.model.layers import (
    Dropout,
    Embed,
    FeedForward,
    LayerNorm,
    PositionEmbedding,
    constrain,
    target_platform,
)
from tx.model.shell import shift_right
from tx.model.transformer_config import ModelConfig
from tx.tokens import PAD_ID

Array = jax.Array


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
    # The platform traced for: a TPU slice compiled on a CPU host gets the TPU's kernels.
    impl = attention_impl(c.attention_impl, c.compute_dtype, c.d_k, c.d_v, target_platform())
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
        masking = Masking(attention_mask(segments, segments), lengths, segments=(segments,) * 2)
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
        self_mask = Masking(
            attention_mask(self_segments, self_segments, causal=True),
            causal=True,
            segments=(self_segments,) * 2,
        )
        cross_mask = Masking(
            attention_mask(tgt_segments, src_segments), segments=(tgt_segments, src_segments)
        )
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
