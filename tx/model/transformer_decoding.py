"""Incremental decoding of a Transformer: the KV cache a search steps it with.

`incremental_decoder` gives tx.infer.decoders what a search needs (tokens_to_logits, the
cache, reorder_cache: tx.model.family_base's); `init_cache` allocates the cache and fills its
cross-attention keys and values once per sentence (`Transformer.prime`); `resize_cache` grows or
cuts its self-attention keys and values, so a search may grow them window by window. Each step
is `Transformer.step`. The cache's entries are
tx.model.attention.MultiHeadAttention's (layouts in `cache_layout`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tx.model.attention import CACHE_POSITION_AXIS
from tx.model.family_base import reorder_cache
from tx.model.transformer import Transformer

Array = jax.Array


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
            method=Transformer.step,
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
    tx.model.family_base.reorder_cache.
    """
    encoded = model.apply({"params": params}, inputs, method=Transformer.encode)  # [b, s, m]
    cache = init_cache(model, params, encoded, inputs, max_len, width)

    def tokens_to_logits(ids: Array, cache):
        logits, variables = model.apply(
            {"params": params, "cache": cache},
            encoded,
            inputs,
            ids,
            method=Transformer.step,
            mutable=["cache"],
        )
        return logits[:, 0], variables["cache"]

    return tokens_to_logits, cache, reorder_cache


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
