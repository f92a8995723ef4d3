"""How attention is computed: softmax(Q K^T / sqrt(d_k)) V, by the kernel the inputs allow.

`attention` is the one place that chooses (MaxText's `AttentionOp`); the projections, the modes
and the decoding cache around it are tx.model.attention's `MultiHeadAttention`. A new kernel is
an entry in `ATTENTION_IMPLS`, a branch in `attention_impl` and one in `attention`, and a test
against `dot_product_attention` (tests/test_layers.py).

    explicit  the weights formed here (`attention_weights`, `attend`): dropout on the weights,
              drawn maps (tx.infer.attention_maps), search steps, d_k != d_v, float64 tests
    xla       jax.nn.dot_product_attention's XLA path (any platform)
    cudnn     jax.nn.dot_product_attention's cuDNN flash attention (GPU, bf16/fp16)
    splash    the Pallas splash kernel (tx.model.splash; TPU, lengths in 128s, else xla); on
              other platforms Pallas' interpreter runs it (slow: for tests)
    auto      cudnn or splash where they apply, else xla; explicit wherever only it can do the job

Shape letters: b batch, q query length, k key length, h heads, d d_k, v d_v.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tx.model import splash
from tx.model.layers import at_least_float32, target_platform

Array = jax.Array

ATTENTION_IMPLS = ("auto", "explicit", "xla", "cudnn", "splash")


def attention_impl(requested: str, dtype, d_k: int, d_v: int, platform: str) -> str:
    """The implementation `requested` (model.attention_impl) resolves to for these shapes on
    `platform`."""
    if requested not in ATTENTION_IMPLS:
        raise ValueError(
            f"model.attention_impl must be one of {ATTENTION_IMPLS}, got {requested!r}"
        )
    # jax.nn.dot_product_attention needs one head width, and computes its softmax in float32.
    if requested == "explicit" or d_k != d_v or jnp.dtype(dtype) == jnp.float64:
        return "explicit"
    if requested != "auto":
        return requested
    if platform == "tpu":
        return "splash"
    fused_ok = jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and d_k % 8 == 0 and d_k <= 128
    return "cudnn" if platform == "gpu" and fused_ok else "xla"


class Masking(NamedTuple):
    """Which keys each query may attend to, in the forms the kernels take.

    mask: bool [b, 1, q, k] (every kernel can use it: packed rows need it);
    lengths: (query lengths [b], key lengths [b]) int32 when every row is one sequence padded
    at its end, else None; causal: queries see no later key; segments: (query ids [b, q], key
    ids [b, k]) int, a query seeing the keys of its id, 0 = padding (splash's form). `lengths`
    or `segments` with `causal` say what `mask` says for the real queries (padding queries are
    never read).
    """

    mask: Array | None
    lengths: tuple[Array, Array] | None = None
    causal: bool = False
    segments: tuple[Array, Array] | None = None


def attention(
    query: Array,
    key: Array,
    value: Array,
    masking: Masking,
    *,
    implementation: str,
    cached: bool = False,
    dropout_rng: Array | None = None,
    dropout_rate: float = 0.0,
    keep_weights: bool = False,
) -> tuple[Array, Array | None]:
    """softmax(Q K^T / sqrt(d_k)) V by `implementation` (resolved: never "auto"), or by the
    explicit weights where only they can do the job: dropout on the weights (`dropout_rng`),
    the weights wanted (`keep_weights`), or keys and values in `cache_layout` (`cached`: a search
    step's one query per row needs no fused kernel).

    Args:
      query: [b, q, h, d]; key: [b, k, h, d] and value [b, k, h, v], or if `cached`
        [b, h, d, k] and [b, h, k, v] (tx.model.attention.cache_layout).

    Returns:
      (out [b, q, h, v] in the dtype of `value`, the weights float32 [b, h, q, k] when they
      were formed, else None).
    """
    if implementation == "explicit" or dropout_rng is not None or keep_weights or cached:
        weights = attention_weights(query, key, masking.mask, cached)
        return attend(weights, value, dropout_rng, dropout_rate, cached), weights
    if implementation == "splash" and _splash_fits(query, key, masking):
        interpret = target_platform() != "tpu"
        return splash.splash_attention(
            query, key, value, masking.segments, masking.causal, interpret
        ), None
    # cuDNN's fast masks are lengths; packed rows take the XLA path.
    fast = implementation == "cudnn" and masking.lengths is not None
    return fused_attention(query, key, value, masking, "cudnn" if fast else "xla"), None


def _splash_fits(query: Array, key: Array, masking: Masking) -> bool:
    """Whether splash can compute this attention: its segment ids are given and its blocks
    tile the lengths (shorter buckets take XLA's path)."""
    return masking.segments is not None and splash.applies(query.shape[1], key.shape[1])


def attention_logits(query: Array, key: Array, cached: bool = False) -> Array:
    """Q K^T / sqrt(d_k), accumulated in and returned as float32 (not rounded to `dtype`).

    Args:
      query: [b, q, h, d]; key: [b, k, h, d], or [b, h, d, k] if `cached`.

    Returns:
      float32 [b, h, q, k].
    """
    out = at_least_float32(query.dtype)
    spec = "bqhd,bhdk->bhqk" if cached else "bqhd,bkhd->bhqk"
    logits = jnp.einsum(spec, query, key, preferred_element_type=out)
    return logits / np.sqrt(query.shape[-1]).astype(out)


def attention_weights(query: Array, key: Array, mask: Array | None, cached: bool = False) -> Array:
    """softmax(Q K^T / sqrt(d_k)) with an optional boolean mask: every row sums to 1.

    Args:
      query: [b, q, h, d]; key: [b, k, h, d], or [b, h, d, k] if `cached`.
      mask: bool, broadcastable to [b, h, q, k]; False positions are excluded.

    Returns:
      float32 [b, h, q, k].
    """
    logits = attention_logits(query, key, cached)
    if mask is not None:
        # The paper sets masked logits to -inf; the most negative finite float gives the same
        # softmax whenever a row has one valid key, and no NaN for an all-padding row.
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    return jax.nn.softmax(logits, axis=-1)


def attend(
    weights: Array,
    value: Array,
    dropout_rng: Array | None = None,
    dropout_rate: float = 0.0,
    cached: bool = False,
) -> Array:
    """weights [b, h, q, k] x value [b, k, h, v] (or [b, h, k, v] if `cached`) -> [b, q, h, v]
    in the dtype of `value`, with dropout on the weights when `dropout_rng` is given and
    dropout_rate > 0."""
    if dropout_rng is not None and dropout_rate > 0.0:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
        weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
    weights = weights.astype(value.dtype)
    if cached:
        # Product first, transpose after: XLA:CPU writes [b, q, h, v] from inside the product
        # slower than it transposes (docs/performance.md#what-made-tx-faster).
        return jnp.einsum("bhqk,bhkv->bhqv", weights, value).transpose(0, 2, 1, 3)
    return jnp.einsum("bhqk,bkhv->bqhv", weights, value)


def dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None,
    dropout_rng: Array | None = None,
    dropout_rate: float = 0.0,
) -> Array:
    """softmax(Q K^T / sqrt(d_k)) V with an optional boolean mask, the weights formed: the
    reference every kernel is tested against.

    Args:
      query: [b, q, h, d]; key: [b, k, h, d]; value: [b, k, h, v].
      mask: bool, broadcastable to [b, h, q, k]; False positions are excluded.
      dropout_rng: when given and dropout_rate > 0, dropout on the attention weights.

    Returns:
      [b, q, h, v] in the dtype of `value`.
    """
    return attend(attention_weights(query, key, mask), value, dropout_rng, dropout_rate)


def fused_attention(query, key, value, masking: Masking, implementation: str) -> Array:
    """softmax(Q K^T / sqrt(d_k)) V by jax.nn.dot_product_attention: [b, q, h, d] x
    [b, k, h, d] x [b, k, h, d] -> [b, q, h, d]. cuDNN gets lengths and the causal flag (its
    fast masks); the XLA path takes the mask, or the lengths where there is no mask."""
    if masking.lengths is not None and (implementation == "cudnn" or masking.mask is None):
        q_len, k_len = masking.lengths
        return jax.nn.dot_product_attention(
            query,
            key,
            value,
            is_causal=masking.causal,
            query_seq_lengths=q_len,
            key_value_seq_lengths=k_len,
            implementation=implementation,
        )
    return jax.nn.dot_product_attention(
        query, key, value, mask=masking.mask, implementation=implementation
    )
