"""Transformer building blocks (section 3 of the paper), as Flax Linen modules.

Every parameter carries logical axis names (`nn.with_logical_partitioning`), so the
mesh rules in `tx.sharding` decide placement without touching the model. Logical names:
  vocab, embed (d_model), heads (h), kv (d_k or d_v), mlp (d_ff), length (positions).
Activations are constrained with `batch`, `length`, `embed`, `heads`, `kv`, `mlp`, `vocab`.

Shape letters used in einsums and comments:
  b batch, q query length, k key length, h heads, d d_k (query/key width per head),
  v d_v (value width per head), m d_model, f d_ff, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

Array = jax.Array
Dtype = Any

# Glorot-uniform over the (fan_in, fan_out) split of multi-axis kernels.
_glorot = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")


def _glorot_split(in_axes: tuple[int, ...], out_axes: tuple[int, ...]):
    return nn.initializers.variance_scaling(
        1.0, "fan_avg", "uniform", in_axis=in_axes, out_axis=out_axes
    )


def at_least_float32(dtype) -> jnp.dtype:
    """float32 for bf16/f16/f32 compute; float64 stays float64 (numerical tests with x64)."""
    return jnp.promote_types(dtype, jnp.float32)


def constrain(x: Array, names: tuple[str | None, ...]) -> Array:
    """Logical sharding constraint; a no-op outside a mesh/rules context."""
    return nn.with_logical_constraint(x, names)


def sinusoidal_encoding(positions: Array, d_model: int) -> Array:
    """The paper's positional encoding, evaluated at integer `positions`.

    PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same angle):
    sines and cosines interleaved exactly as the formula is written.

    Args:
      positions: int array of any shape [...].
      d_model: even model width.

    Returns:
      float32 array [..., d_model].
    """
    two_i = np.arange(0, d_model, 2, dtype=np.float32)  # [d_model/2]
    inv_freq = jnp.asarray(1.0 / (10000.0 ** (two_i / d_model)))
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [..., d_model/2]
    # Interleave: index 2i gets sin, 2i+1 gets cos.
    pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., d_model/2, 2]
    return pe.reshape(*positions.shape, d_model)


class Embed(nn.Module):
    """Token embedding [V, m]; `attend` reuses the same matrix as the pre-softmax layer."""

    vocab_size: int
    d_model: int
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    def setup(self):
        init = nn.initializers.normal(stddev=self.d_model**-0.5)
        self.embedding = self.param(
            "embedding",
            nn.with_logical_partitioning(init, ("vocab", "embed")),
            (self.vocab_size, self.d_model),
            self.param_dtype,
        )

    def __call__(self, tokens: Array) -> Array:
        """[b, l] int -> [b, l, m], multiplied by sqrt(d_model) as in section 3.4."""
        emb = jnp.take(jnp.asarray(self.embedding, self.dtype), tokens, axis=0)
        return emb * jnp.asarray(np.sqrt(self.d_model), self.dtype)

    def attend(self, x: Array) -> Array:
        """[b, l, m] -> logits [b, l, V] float32.

        The product runs in `dtype` but accumulates into and returns float32: casting a
        bfloat16 result would round every logit to 8 significant bits (up to 2^-9 relative).
        """
        embedding = jnp.asarray(self.embedding, self.dtype)
        out = at_least_float32(self.dtype)
        return jnp.einsum("blm,Vm->blV", x, embedding, preferred_element_type=out)


class PositionEmbedding(nn.Module):
    """Adds sinusoidal (default) or learned (Table 3 row E) position information."""

    d_model: int
    kind: str = "sinusoidal"
    max_len: int = 1024
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: Array, positions: Array) -> Array:
        """x: [b, l, m]; positions: [b, l] int. Returns x + PE(positions)."""
        if self.kind == "sinusoidal":
            pe = sinusoidal_encoding(positions, self.d_model)
        else:
            table = self.param(
                "pos_embedding",
                nn.with_logical_partitioning(nn.initializers.normal(0.02), ("length", "embed")),
                (self.max_len, self.d_model),
                self.param_dtype,
            )
            pe = jnp.take(table, positions, axis=0)
        return x + pe.astype(self.dtype)


def attention_logits(query: Array, key: Array) -> Array:
    """Q K^T / sqrt(d_k), accumulated in and returned as float32 (not rounded to `dtype`).

    Args:
      query: [b, q, h, d]; key: [b, k, h, d].

    Returns:
      float32 [b, h, q, k].
    """
    out = at_least_float32(query.dtype)
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=out)
    return logits / np.sqrt(query.shape[-1]).astype(out)


def attention_weights(query: Array, key: Array, mask: Array | None) -> Array:
    """softmax(Q K^T / sqrt(d_k)) with an optional boolean mask: every row sums to 1.

    Args:
      query: [b, q, h, d]; key: [b, k, h, d].
      mask: bool, broadcastable to [b, h, q, k]; False positions are excluded.

    Returns:
      float32 [b, h, q, k].
    """
    logits = attention_logits(query, key)
    if mask is not None:
        # The paper sets masked logits to -inf; the most negative finite float gives the same
        # softmax whenever a row has one valid key, and no NaN for an all-padding row.
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    return jax.nn.softmax(logits, axis=-1)


def attend(
    weights: Array, value: Array, dropout_rng: Array | None = None, dropout_rate: float = 0.0
) -> Array:
    """weights [b, h, q, k] x value [b, k, h, v] -> [b, q, h, v] in the dtype of `value`,
    with dropout on the weights when `dropout_rng` is given and dropout_rate > 0."""
    if dropout_rng is not None and dropout_rate > 0.0:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
        weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
    return jnp.einsum("bhqk,bkhv->bqhv", weights.astype(value.dtype), value)


def dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None,
    dropout_rng: Array | None = None,
    dropout_rate: float = 0.0,
) -> Array:
    """softmax(Q K^T / sqrt(d_k)) V with an optional boolean mask.

    Args:
      query: [b, q, h, d]; key: [b, k, h, d]; value: [b, k, h, v].
      mask: bool, broadcastable to [b, h, q, k]; False positions are excluded.
      dropout_rng: when given and dropout_rate > 0, dropout on the attention weights.

    Returns:
      [b, q, h, v] in the dtype of `value`.
    """
    return attend(attention_weights(query, key, mask), value, dropout_rng, dropout_rate)


# Cache entries of cross-attention: the same for every search row of a sentence (see
# MultiHeadAttention._static_cache); tx.model.reorder_cache leaves them in place.
SENTENCE_CONSTANT_CACHE = ("static_key", "static_value", "static_ready")


def is_sentence_constant(name: str) -> bool:
    """Whether the cache entry `name` is the same for every search row of a sentence."""
    return name in SENTENCE_CONSTANT_CACHE


class MultiHeadAttention(nn.Module):
    """Multi-head attention (section 3.2.2) with separate d_k and d_v, no biases.

    In `incremental` mode the keys and values of earlier positions are kept in the "cache"
    collection, so step t attends over t cached entries instead of recomputing the whole prefix,
    and cross-attention projects the encoder output once, not at every step.
    """

    num_heads: int
    d_k: int
    d_v: int
    d_model: int
    dropout_rate: float = 0.0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    def _kernel(self, name: str, width: int) -> Array:
        """Projection W [m, h, width] (W^Q, W^K or W^V of all heads at once)."""
        kernel = self.param(
            name,
            nn.with_logical_partitioning(_glorot_split((0,), (1, 2)), ("embed", "heads", "kv")),
            (self.d_model, self.num_heads, width),
            self.param_dtype,
        )
        return jnp.asarray(kernel, self.dtype)

    @nn.compact
    def __call__(
        self,
        inputs_q: Array,
        inputs_kv: Array,
        mask: Array | None,
        *,
        deterministic: bool,
        incremental: bool = False,
        static_kv: bool = False,
    ) -> Array:
        """inputs_q: [b, q, m]; inputs_kv: [b, k, m]; mask: bool [b, 1|h, q, k] -> [b, q, m].

        `incremental`: one new position per call (search). With `static_kv` (cross-attention:
        `inputs_kv` is the same encoder output at every step) keys and values are projected
        once and cached;
        otherwise (self-attention) this step's key and value are appended to the cache.
        """
        names = ("batch", "length", "heads", "kv")
        w_q, w_k, w_v = (
            self._kernel(n, w)
            for n, w in (("query", self.d_k), ("key", self.d_k), ("value", self.d_v))
        )
        query = constrain(jnp.einsum("blm,mhd->blhd", inputs_q, w_q), names)

        def project():
            key = jnp.einsum("blm,mhd->blhd", inputs_kv, w_k)
            value = jnp.einsum("blm,mhd->blhd", inputs_kv, w_v)
            return constrain(key, names), constrain(value, names)

        if incremental and static_kv:
            key, value = self._static_cache(project)
        else:
            key, value = project()
            if incremental:
                key, value, mask = self._update_cache(key, value, mask)
        dropout_rng = None
        if not deterministic and self.dropout_rate > 0.0:
            dropout_rng = self.make_rng("dropout")
        weights = attention_weights(query, key, mask)  # [b, h, q, k] float32
        # Kept only when the caller makes "intermediates" mutable (tx.attention draws them);
        # otherwise sow is a no-op at trace time: training and search compile as before.
        self.sow("intermediates", "attention_weights", weights)
        out = attend(weights, value, dropout_rng, self.dropout_rate)
        out_kernel = self.param(
            "out",
            nn.with_logical_partitioning(_glorot_split((0, 1), (2,)), ("heads", "kv", "embed")),
            (self.num_heads, self.d_v, self.d_model),
            self.param_dtype,
        )
        out = jnp.einsum("bqhv,hvm->bqm", out, jnp.asarray(out_kernel, self.dtype))
        return constrain(out, ("batch", "length", "embed"))

    def _static_cache(self, project):
        """Cross-attention keys/values, projected at the first step and reused after it.

        Cache entries: static_key [b, s, h, d], static_value [b, s, h, v], static_ready [] bool.
        """
        if not self.has_variable("cache", "static_key"):  # allocation pass (init_cache)
            key, value = project()
            self.variable("cache", "static_key", jnp.zeros, key.shape, key.dtype)
            self.variable("cache", "static_value", jnp.zeros, value.shape, value.dtype)
            self.variable("cache", "static_ready", lambda: jnp.array(False))
            return key, value
        static_key = self.variable("cache", "static_key")
        static_value = self.variable("cache", "static_value")
        ready = self.variable("cache", "static_ready")
        key, value = jax.lax.cond(
            ready.value, lambda: (static_key.value, static_value.value), project
        )
        static_key.value, static_value.value, ready.value = key, value, jnp.array(True)
        return key, value

    def _update_cache(self, key: Array, value: Array, mask: Array | None):
        """Writes this step's key/value at the cache index and returns the whole cache.

        The first call (during `init_cache`) sees the full target length and only allocates:
        cached_key [b, L, h, d], cached_value [b, L, h, v], cache_index [] int32.
        """
        initialized = self.has_variable("cache", "cached_key")
        cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
        cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
        if not initialized:
            return key, value, mask
        batch, max_len = cached_key.value.shape[:2]
        if key.shape[1] != 1:
            raise ValueError(f"incremental mode takes one position per call, got {key.shape[1]}")
        i = cache_index.value
        cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key, (0, i, 0, 0))
        cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, value, (0, i, 0, 0))
        cache_index.value = i + 1
        # Causality for one query: attend to cache slots 0..i only.
        step_mask = (jnp.arange(max_len) <= i)[None, None, None, :]  # [1, 1, 1, L]
        return (
            cached_key.value,
            cached_value.value,
            jnp.broadcast_to(step_mask, (batch, 1, 1, max_len)),
        )


class FeedForward(nn.Module):
    """Position-wise feed-forward: max(0, x W1 + b1) W2 + b2 (section 3.3)."""

    d_model: int
    d_ff: int
    relu_dropout_rate: float = 0.0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: Array, *, deterministic: bool) -> Array:
        """[b, l, m] -> [b, l, m]."""

        def param(name, init, shape, names):
            return jnp.asarray(
                self.param(
                    name, nn.with_logical_partitioning(init, names), shape, self.param_dtype
                ),
                self.dtype,
            )

        w1 = param("wi", _glorot, (self.d_model, self.d_ff), ("embed", "mlp"))
        b1 = param("bi", nn.initializers.zeros, (self.d_ff,), ("mlp",))
        w2 = param("wo", _glorot, (self.d_ff, self.d_model), ("mlp", "embed"))
        b2 = param("bo", nn.initializers.zeros, (self.d_model,), ("embed",))
        h = jax.nn.relu(jnp.einsum("blm,mf->blf", x, w1) + b1)
        h = constrain(h, ("batch", "length", "mlp"))
        h = nn.Dropout(self.relu_dropout_rate)(h, deterministic=deterministic)
        return constrain(jnp.einsum("blf,fm->blm", h, w2) + b2, ("batch", "length", "embed"))


class LayerNorm(nn.Module):
    """LayerNorm with scale and bias ('embed' axis), statistics in float32."""

    epsilon: float = 1e-6
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        d = x.shape[-1]
        scale = self.param(
            "scale",
            nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
            (d,),
            self.param_dtype,
        )
        bias = self.param(
            "bias",
            nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
            (d,),
            self.param_dtype,
        )
        x32 = x.astype(at_least_float32(x.dtype))
        mean = x32.mean(-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.epsilon)
        return (y * scale + bias).astype(self.dtype)
