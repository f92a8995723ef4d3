"""The encoder-decoder Transformer of "Attention Is All You Need" (section 3).

`ModelConfig` (tx.model.transformer_config) is the frozen architecture; what a pass is for is
one `Mode` (tx.model.layers) that every layer reads: TRAIN and SCORE run whole sequences
(`__call__`, `encode`, `decode`, `features`), PRIME and STEP serve a search (`prime`, `step`;
the KV cache and `incremental_decoder` are tx.model.transformer_decoding's). Token ids: 0 is
padding (masked everywhere), `bos_id` starts the decoder input.

Packed rows are supported: optional `*_segments` (int [b, l], 0 = padding, 1.. = pair
number within the row) keep attention inside one pair, and `*_positions` restart at 0 for
every pair.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn

from tx.model.attention import MultiHeadAttention
from tx.model.family_base import EncoderDecoder, shift_right
from tx.model.kernels import Masking, attention_impl
from tx.model.layers import (
    Dropout,
    FeedForward,
    LayerNorm,
    Mode,
    PositionEmbedding,
    constrain,
    target_platform,
)
from tx.model.transformer_config import ModelConfig
from tx.tokens import BOS_ID, PAD_ID

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
    def __call__(self, x: Array, fn, *, mode: Mode) -> Array:
        c = self.config
        norm = LayerNorm(c.layer_norm_epsilon, c.compute_dtype, c.weight_dtype, name="norm")
        drop = Dropout(c.dropout_rate)
        if c.pre_ln:
            return x + drop(fn(norm(x)), deterministic=mode.deterministic)
        return norm(x + drop(fn(x), deterministic=mode.deterministic))


def _attention(c: ModelConfig, name: str, cross: bool = False) -> MultiHeadAttention:
    # The platform traced for: a TPU slice compiled on a CPU host gets the TPU's kernels.
    impl = attention_impl(c.attention_impl, c.compute_dtype, c.d_k, c.d_v, target_platform())
    return MultiHeadAttention(
        num_heads=c.num_heads,
        d_k=c.d_k,
        d_v=c.d_v,
        d_model=c.d_model,
        dropout_rate=c.attention_dropout_rate,
        dtype=c.compute_dtype,
        param_dtype=c.weight_dtype,
        implementation=impl,
        cross=cross,
        use_bias=c.attention_bias,
        name=name,
    )


def _ffn_block(c: ModelConfig, x: Array, mode: Mode) -> Array:
    """The layer's last sub-layer, the position-wise feed-forward: [b, l, m] -> [b, l, m]."""
    ffn = FeedForward(
        c.d_model,
        c.d_ff,
        c.relu_dropout_rate,
        c.compute_dtype,
        c.weight_dtype,
        activation=c.activation,
        name="ffn",
    )
    x = _SubLayer(c, name="ffn_block")(
        x, lambda y: ffn(y, deterministic=mode.deterministic), mode=mode
    )
    return constrain(x, ("batch", "length", "embed"))


def _final_norm(c: ModelConfig, x: Array) -> Array:
    """Pre-LN stacks end in a LayerNorm of their own; post-LN ones are normalised already."""
    if not c.pre_ln:
        return x
    return LayerNorm(c.layer_norm_epsilon, c.compute_dtype, c.weight_dtype, name="final_norm")(x)


def _embedded(
    c: ModelConfig, embed: nn.Module, tokens: Array, positions: Array, mode: Mode, start=False
):
    """tokens, positions [b, l] -> Dropout(embedding x sqrt(d_model) + PE) [b, l, m]. `start`
    (the decoder's input) with model.decoder_start "zero": <s> is embedded as zeros."""
    x = embed(tokens)
    if start and c.decoder_start == "zero":
        x = jnp.where((tokens == BOS_ID)[..., None], jnp.zeros((), x.dtype), x)
    x = PositionEmbedding(
        c.d_model, c.positional, c.max_len, c.compute_dtype, c.weight_dtype, name="position"
    )(x, positions)
    x = Dropout(c.dropout_rate)(x, deterministic=mode.deterministic)
    return constrain(x, ("batch", "length", "embed"))


class EncoderLayer(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x: Array, mask: Masking, *, mode: Mode) -> Array:
        """x: [b, s, m]; mask: its self-attention [b, 1, s, s] -> [b, s, m]."""
        c = self.config
        attn = _attention(c, "self_attention")
        x = _SubLayer(c, name="attention_block")(
            x, lambda y: attn(y, y, mask, mode=mode), mode=mode
        )
        return _ffn_block(c, x, mode)


class DecoderLayer(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, y, encoded, self_mask, cross_mask, *, mode: Mode):
        """y: [b, t, m]; encoded: [b, s, m]; masks [b, 1, t, t] / [b, 1, t, s] -> [b, t, m].
        PRIME only stores the cross-attention keys and values of `encoded` in the cache."""
        c = self.config
        if mode is Mode.PRIME:
            return _attention(c, "cross_attention", cross=True)(None, encoded, None, mode=mode)
        self_attn = _attention(c, "self_attention")
        y = _SubLayer(c, name="self_attention_block")(
            y, lambda z: self_attn(z, z, self_mask, mode=mode), mode=mode
        )
        cross = _attention(c, "cross_attention", cross=True)
        y = _SubLayer(c, name="cross_attention_block")(
            y, lambda z: cross(z, encoded, cross_mask, mode=mode), mode=mode
        )
        return _ffn_block(c, y, mode)


class EncoderStack(nn.Module):
    config: ModelConfig
    embed: nn.Module

    @nn.compact
    def __call__(self, inputs, masking: Masking, positions, *, mode: Mode) -> Array:
        """inputs, positions: [b, s] int; masking: its self-attention -> encoded [b, s, m]."""
        c = self.config
        x = _embedded(c, self.embed, inputs, positions, mode)
        for i in range(c.num_encoder_layers):
            x = EncoderLayer(c, name=f"layer_{i}")(x, masking, mode=mode)
        return _final_norm(c, x)


class DecoderStack(nn.Module):
    config: ModelConfig
    embed: nn.Module
    output_embed: nn.Module | None  # None: tie the softmax to `embed`

    @nn.compact
    def __call__(self, encoded, decoder_inputs, self_mask, cross_mask, positions, *, mode: Mode):
        """decoder_inputs: [b, t] (already shifted) -> the states the softmax layer takes
        [b, t, m] (`logits` turns them into logits). PRIME fills the cache's cross-attention
        keys and values from `encoded` [b, s, m], and nothing else; a STEP counts its positions
        in the cache."""
        c = self.config
        if mode is Mode.PRIME:
            for i in range(c.num_decoder_layers):
                DecoderLayer(c, name=f"layer_{i}")(None, encoded, None, None, mode=mode)
            return None
        if mode is Mode.STEP:
            positions = self._step_positions(decoder_inputs)
        y = _embedded(c, self.embed, decoder_inputs, positions, mode, start=True)
        for i in range(c.num_decoder_layers):
            y = DecoderLayer(c, name=f"layer_{i}")(y, encoded, self_mask, cross_mask, mode=mode)
        return _final_norm(c, y)

    @property
    def head(self) -> nn.Module:
        """The pre-softmax layer: its own matrix, or the tied embedding."""
        return self.output_embed if self.output_embed is not None else self.embed

    def logits(self, states: Array) -> Array:
        """states [b, t, m] -> logits [b, t, V] float32."""
        return constrain(self.head.attend(states), ("batch", "length", "vocab"))

    def _step_positions(self, decoder_inputs: Array) -> Array:
        """[b, l] positions of a search step, counted in the "cache" collection."""
        initialized = self.has_variable("cache", "decode_position")
        index = self.variable("cache", "decode_position", lambda: jnp.array(0, jnp.int32))
        length = decoder_inputs.shape[1]
        positions = index.value + jnp.broadcast_to(jnp.arange(length), decoder_inputs.shape)
        if initialized:
            index.value = index.value + length
        return positions


class Transformer(EncoderDecoder):
    """Encoder-decoder Transformer; see `encode`, `decode`, `step` and `__call__` for shapes."""

    config: ModelConfig
    ENCODER: ClassVar[type] = EncoderStack
    DECODER: ClassVar[type] = DecoderStack

    def setup(self):
        super().setup()
        if self.config.logits_bias:  # Marian's final_logits_bias, a buffer there: never trained
            zeros = nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",))
            self.final_logits_bias = self.param(
                "final_logits_bias", zeros, (self.config.vocab_size,), jnp.float32
            )

    def _logits(self, states: Array) -> Array:
        """states [b, t, m] -> logits [b, t, V] float32, with the fixed bias if there is one."""
        logits = self.decoder.logits(states)
        if self.config.logits_bias:
            logits = logits + jax.lax.stop_gradient(self.final_logits_bias)
        return logits

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
        mode = Mode.teacher_forced(deterministic)
        return self.encoder(inputs, masking, positions, mode=mode)

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
        features: bool = False,
    ) -> Array:
        """Teacher-forced decoder logits: targets [b, t] are shifted right here and the result
        is logits [b, t, V] predicting targets[:, i] at position i (with `features`: the states
        [b, t, m] the softmax layer takes)."""
        src_segments = _segments_or_mask(inputs, inputs_segments)
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
        mode = Mode.teacher_forced(deterministic)
        states = self.decoder(encoded, decoder_inputs, self_mask, cross_mask, positions, mode=mode)
        return states if features else self._logits(states)

    def step(self, encoded, inputs, ids) -> Array:
        """One search step: ids [b, 1] the previous tokens (`bos_id` first) -> logits
        [b, 1, V]. The "cache" collection must come from `init_cache` and be mutable."""
        cross_mask = (_segments_or_mask(inputs, None) > 0)[:, None, None, :]  # [b, 1, 1, s]
        states = self.decoder(encoded, ids, None, cross_mask, None, mode=Mode.STEP)
        return self._logits(states)

    def prime(self, encoded: Array) -> None:
        """Stores every layer's cross-attention keys and values of `encoded` [b, s, m] in the
        "cache" collection (mutable, allocated by `init_cache`): projected once per sentence,
        before the search, instead of at a step inside it."""
        self.decoder(encoded, None, None, None, None, mode=Mode.PRIME)

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
        matrix [V', m]), whose product is the logits, for a loss that never holds them all
        (tx.train.losses). A fixed logits bias joins them as one more feature: states
        [b, t, m + 1] ending in ones, and the matrix's last column the bias."""
        states = self(*args, **kwargs, features=True)
        head = self.decoder.head.matrix()
        if self.config.logits_bias:
            bias = jax.lax.stop_gradient(self.final_logits_bias).astype(head.dtype)
            bias = jnp.pad(bias, (0, head.shape[0] - bias.shape[0]))  # padding rows: masked
            states = jnp.concatenate([states, jnp.ones((*states.shape[:2], 1), states.dtype)], -1)
            head = jnp.concatenate([head, bias[:, None]], -1)
        return states, head
