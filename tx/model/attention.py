"""Multi-head attention (section 3.2), the way it is computed, and the decoding cache's layout.

`MultiHeadAttention` holds the projections (W^Q, W^K, W^V of all heads at once, W^O) and the
"cache" collection of incremental decoding; what computes softmax(Q K^T / sqrt(d_k)) V is
chosen apart from it (`attention_impl`): the weights formed here (`attention_weights`,
`attend`) or jax.nn.dot_product_attention's fused kernels (`fused_attention`), each given the
`Masking` forms it can use. The cache entries' names and layouts are written here too, since
this module writes them: `cache_layout`, `CACHE_POSITION_AXIS`, `SENTENCE_CONSTANT_CACHE`.

Logical names as tx.model.layers': embed (d_model), heads (h), kv (d_k or d_v). Shape letters:
  b batch, q query length, k key length, h heads, d d_k (query/key width per head),
  v d_v (value width per head), m d_model.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from tx.model import splash
from tx.model.layers import Dtype, at_least_float32, constrain, target_platform

Array = jax.Array


def _glorot_split(in_axes: tuple[int, ...], out_axes: tuple[int, ...]):
    """Glorot-uniform over the (fan_in, fan_out) split of a multi-axis kernel."""
    return nn.initializers.variance_scaling(
        1.0, "fan_avg", "uniform", in_axis=in_axes, out_axis=out_axes
    )


def cache_layout(key: Array, value: Array) -> tuple[Array, Array]:
    """Keys [b, k, h, d] -> [b, h, d, k] and values [b, k, h, v] -> [b, h, k, v]: the layouts
    the products of one query step read without a copy. Search caches are kept in them, or
    XLA transposes every layer's whole cache at every step."""
    return key.transpose(0, 2, 3, 1), value.transpose(0, 2, 1, 3)


# The position axis of each self-attention cache entry in `cache_layout`
# (tx.model.transformer_decoding.resize_cache).
CACHE_POSITION_AXIS = {"cached_key": 3, "cached_value": 2}


def attention_logits(query: Array, key: Array, cached: bool = False) -> Array:
    """Q K^T / sqrt(d_k), accumulated in and returned as float32 (not rounded to `dtype`).

    Args:
      query: [b, q, h, d]; key: [b, k, h, d], or [b, h, d, k] if `cached` (`cache_layout`).

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
        # Product first, transpose after: XLA:CPU writing [b, q, h, v] from inside the
        # product took 4x as long for the cross-attention of a search step (0.73 vs 0.17 ms).
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
    """softmax(Q K^T / sqrt(d_k)) V with an optional boolean mask.

    Args:
      query: [b, q, h, d]; key: [b, k, h, d]; value: [b, k, h, v].
      mask: bool, broadcastable to [b, h, q, k]; False positions are excluded.
      dropout_rng: when given and dropout_rate > 0, dropout on the attention weights.

    Returns:
      [b, q, h, v] in the dtype of `value`.
    """
    return attend(attention_weights(query, key, mask), value, dropout_rng, dropout_rate)


# How attention is computed (model.attention_impl):
#   explicit  the weights formed here (attention_weights, attend): dropout on the weights,
#             drawn maps (tx.infer.attention_maps), d_k != d_v, float64 tests
#   xla       jax.nn.dot_product_attention's XLA path (any platform)
#   cudnn     jax.nn.dot_product_attention's cuDNN flash attention (GPU, bf16/fp16)
#   splash    the Pallas splash kernel (tx.model.splash; TPU, lengths in 128s, else xla); on
#             other platforms Pallas' interpreter runs it (slow: for tests)
#   auto      cudnn or splash where they apply, else xla; explicit wherever only it can do the job
ATTENTION_IMPLS = ("auto", "explicit", "xla", "cudnn", "splash")


def attention_impl(requested: str, dtype, d_k: int, d_v: int, platform: str) -> str:
    """The implementation `requested` resolves to for these shapes on `platform`."""
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
    """Which keys each query may attend to, in the forms the implementations take.

    mask: bool [b, 1, q, k] (every implementation can use it: packed rows need it);
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


# Cache entries of cross-attention: one row per sentence, shared by its search rows (see
# MultiHeadAttention._static_cache); tx.model.shell.reorder_cache leaves them in place.
SENTENCE_CONSTANT_CACHE = ("static_key", "static_value")


def is_sentence_constant(name: str) -> bool:
    """Whether the cache entry `name` is the same for every search row of a sentence."""
    return name in SENTENCE_CONSTANT_CACHE


def _per_sentence(query: Array, key_rows: int) -> Array:
    """Queries [b * w, q, h, d] of rows that share their keys [b, ...] w by w (the beams of a
    sentence share its encoder output) -> [b, w * q, h, d]: each sentence's w rows become
    more query positions against one copy of its keys, so the keys are neither copied w
    times nor gathered when the beams are reordered. w = 1 leaves the queries as they are."""
    rows = query.shape[0]
    if rows == key_rows:
        return query
    return query.reshape(key_rows, (rows // key_rows) * query.shape[1], *query.shape[2:])


def _splash_fits(query: Array, key: Array, masking: Masking) -> bool:
    """Whether splash can compute this attention: its segment ids are given and its blocks
    tile the lengths (shorter buckets take XLA's path)."""
    return masking.segments is not None and splash.applies(query.shape[1], key.shape[1])


def _per_row(weights: Array, rows: int, length: int) -> Array:
    """Weights [b, h, w * q, k] of `_per_sentence` queries -> [b * w, h, q, k], one per row."""
    b, h, _, k = weights.shape
    weights = weights.reshape(b, h, rows // b, length, k).swapaxes(1, 2)
    return weights.reshape(rows, h, length, k)


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
    implementation: str = "explicit"  # resolved by `attention_impl` (never "auto" here)
    # The output projection's gradient through `merge_heads` (a custom_vjp, faster on a CPU);
    # True: plain autodiff, which forward mode (jax.jvp: tx.paper.road.table1's path lengths) needs.
    plain_autodiff: bool = False

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
        mask: Masking | Array | None,
        *,
        deterministic: bool,
        incremental: bool = False,
        static_kv: bool = False,
        prime: bool = False,
    ) -> Array | None:
        """inputs_q: [b, q, m]; inputs_kv: [b, k, m]; mask: a Masking, or its bool mask
        [b, 1|h, q, k] alone -> [b, q, m].

        `incremental`: one new position per call (search). With `static_kv` (cross-attention:
        `inputs_kv` is the same encoder output at every step) keys and values come from the
        cache, where `prime` (a call of its own, before the first step) projected them once;
        otherwise (self-attention) this step's key and value are appended to the cache.
        Cross-attention keys may hold one row per sentence for several query rows per sentence
        (the beams: b = sentences x width, sentence-major): see `_per_sentence`.
        """
        names = ("batch", "length", "heads", "kv")
        w_q, w_k, w_v = (
            self._kernel(n, w)
            for n, w in (("query", self.d_k), ("key", self.d_k), ("value", self.d_v))
        )

        def project():
            key = jnp.einsum("blm,mhd->blhd", inputs_kv, w_k)
            value = jnp.einsum("blm,mhd->blhd", inputs_kv, w_v)
            return constrain(key, names), constrain(value, names)

        if prime:
            key, value = cache_layout(*project())
            self.put_variable("cache", "static_key", key)
            self.put_variable("cache", "static_value", value)
            return None
        masking = mask if isinstance(mask, Masking) else Masking(mask)
        if incremental and static_kv:
            query = constrain(jnp.einsum("blm,mhd->blhd", inputs_q, w_q), names)
            key, value = self._static_cache(project)
        else:
            if inputs_kv is inputs_q and self.d_k == self.d_v:  # self-attention: one product
                w_qkv = jnp.concatenate([w_q, w_k, w_v], axis=-1)  # [m, h, 3d]
                qkv = jnp.einsum("blm,mhd->blhd", inputs_q, w_qkv)
                query, key, value = (constrain(x, names) for x in jnp.split(qkv, 3, axis=-1))
            else:
                query = constrain(jnp.einsum("blm,mhd->blhd", inputs_q, w_q), names)
                key, value = project()
            if incremental:
                key, value, step_mask = self._update_cache(key, value, masking.mask)
                masking = Masking(step_mask)
        dropout_rng = None
        if not deterministic and self.dropout_rate > 0.0:
            dropout_rng = self.make_rng("dropout")
        # The weights themselves are needed for dropout on them and for drawing them (the
        # caller makes "intermediates" mutable: tx.infer.attention_maps); otherwise a fused kernel.
        drawn = self.is_mutable_collection("intermediates")
        rows, length = query.shape[:2]
        query = _per_sentence(query, key.shape[0])  # [sentences, width * q, h, d]
        # Search steps (one query per row, keys in `cache_layout`) need no fused kernel.
        if self.implementation == "explicit" or dropout_rng is not None or drawn or incremental:
            weights = attention_weights(query, key, masking.mask, incremental)  # [b, h, q, k]
            self.sow("intermediates", "attention_weights", _per_row(weights, rows, length))
            out = attend(weights, value, dropout_rng, self.dropout_rate, incremental)
        elif self.implementation == "splash" and _splash_fits(query, key, masking):
            interpret = target_platform() != "tpu"
            out = splash.splash_attention(
                query, key, value, masking.segments, masking.causal, interpret
            )
        else:
            # cuDNN's fast masks are lengths; packed rows and search steps take the XLA path.
            fast = self.implementation == "cudnn" and masking.lengths is not None
            out = fused_attention(query, key, value, masking, "cudnn" if fast else "xla")
        out = out.reshape(rows, length, *out.shape[2:])  # back to one row per query row
        out_kernel = self.param(
            "out",
            nn.with_logical_partitioning(_glorot_split((0, 1), (2,)), ("heads", "kv", "embed")),
            (self.num_heads, self.d_v, self.d_model),
            self.param_dtype,
        )
        project_out = merge_heads.fun if self.plain_autodiff else merge_heads  # fun: no custom_vjp
        out = project_out(out, jnp.asarray(out_kernel, self.dtype))
        return constrain(out, ("batch", "length", "embed"))

    def _static_cache(self, project):
        """Cross-attention keys/values as `prime` stored them (`cache_layout`): static_key
        [b, h, d, s], static_value [b, h, s, v]; the first call (`init_cache`) allocates."""
        if not self.has_variable("cache", "static_key"):  # allocation pass (init_cache)
            key, value = cache_layout(*project())
            self.variable("cache", "static_key", jnp.zeros, key.shape, key.dtype)
            self.variable("cache", "static_value", jnp.zeros, value.shape, value.dtype)
            return key, value
        return self.get_variable("cache", "static_key"), self.get_variable("cache", "static_value")

    def _update_cache(self, key: Array, value: Array, mask: Array | None):
        """Writes this step's key/value at the cache index and returns the whole cache, in
        `cache_layout`.

        The first call (during `init_cache`) sees the full target length and only allocates:
        cached_key [b, h, d, L], cached_value [b, h, L, v], cache_index [] int32.
        """
        key, value = cache_layout(key, value)
        initialized = self.has_variable("cache", "cached_key")
        cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
        cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
        if not initialized:
            return key, value, mask
        batch, max_len = cached_value.value.shape[0], cached_value.value.shape[2]
        if key.shape[-1] != 1:
            raise ValueError(f"incremental mode takes one position per call, got {key.shape[-1]}")
        i = cache_index.value
        cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key, (0, 0, 0, i))
        cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, value, (0, 0, i, 0))
        cache_index.value = i + 1
        # Causality for one query: attend to cache slots 0..i only.
        step_mask = (jnp.arange(max_len) <= i)[None, None, None, :]  # [1, 1, 1, L]
        return (
            cached_key.value,
            cached_value.value,
            jnp.broadcast_to(step_mask, (batch, 1, 1, max_len)),
        )


@jax.custom_vjp
def merge_heads(x: Array, kernel: Array) -> Array:
    """The output projection W^O: x [b, q, h, v] (the heads' outputs) x kernel [h, v, m]
    -> [b, q, m].

    Only its gradient is written out, to choose the operand order of the kernel's gradient
    sum_bq x g. A CPU's matrix product wants one of the two transposed; autodiff puts g
    first, and XLA then fuses the whole backward of the dropout and LayerNorm after this
    layer into the transposed copy of g, recomputed there at strided reads (5-11 ms for
    2048 x 512 on this CPU; it also computes g in place for dx). With x first it copies x,
    the attention's product output, as it is. The base train step on a CPU: the transposing
    copies took 341 against 466 ms, and the step was 3.0%, 2.7% and 2.7% faster in three
    interleaved A/B runs. The feed-forward's second layer keeps autodiff's order: its x,
    relu(x W_1 + b_1), has 4 times the elements of g, and copying it recomputed the relu at
    16 ms. A custom_vjp has no forward mode: MultiHeadAttention(plain_autodiff=True) keeps
    the einsum."""
    return jnp.einsum("bqhv,hvm->bqm", x, kernel)


def _merge_heads_forward(x, kernel):
    return merge_heads(x, kernel), (x, kernel)


def _merge_heads_backward(saved, g):
    x, kernel = saved
    return jnp.einsum("bqm,hvm->bqhv", g, kernel), jnp.einsum("bqhv,bqm->hvm", x, g)


merge_heads.defvjp(_merge_heads_forward, _merge_heads_backward)
