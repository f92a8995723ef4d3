"""Multi-head attention (section 3.2) and the decoding cache it keeps.

`MultiHeadAttention` holds the projections (W^Q, W^K, W^V of all heads at once, W^O) and the
"cache" collection of incremental decoding, and reads the model's `Mode` (tx.model.layers):
whole sequences (TRAIN, SCORE), priming the cross-attention cache (PRIME), or one search step
against the cache (STEP). What computes softmax(Q K^T / sqrt(d_k)) V is tx.model.kernels'
choice. The cache entries' names and layouts are written here, since this module writes them:
`cache_layout`, `CACHE_POSITION_AXIS`, `SENTENCE_CONSTANT_CACHE`.

Logical names as tx.model.layers': embed (d_model), heads (h), kv (d_k or d_v). Shape letters:
  b batch, q query length, k key length, h heads, d d_k (query/key width per head),
  v d_v (value width per head), m d_model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from tx.model.kernels import Masking, attention
from tx.model.layers import Dtype, Mode, constrain

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


# Cache entries of cross-attention: one row per sentence, shared by its search rows (see
# MultiHeadAttention._static_cache); tx.model.family_base.reorder_cache leaves them in place.
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


def _per_row(weights: Array, rows: int, length: int) -> Array:
    """Weights [b, h, w * q, k] of `_per_sentence` queries -> [b * w, h, q, k], one per row."""
    b, h, _, k = weights.shape
    weights = weights.reshape(b, h, rows // b, length, k).swapaxes(1, 2)
    return weights.reshape(rows, h, length, k)


# Logical names of projected queries, keys and values [b, l, h, d].
_HEADS = ("batch", "length", "heads", "kv")


def _project(inputs: Array, kernel: Array, bias: Array | float) -> Array:
    """inputs [b, l, m] x W [m, h, d] (+ bias [h, d]) -> [b, l, h, d]."""
    return constrain(jnp.einsum("blm,mhd->blhd", inputs, kernel) + bias, _HEADS)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (section 3.2.2) with separate d_k and d_v; biases only by `use_bias`.

    Self-attention (`cross` False) reads its queries, keys and values from one input; in a
    STEP it appends this position's key and value to the "cache" collection, so step t attends
    over t cached entries instead of recomputing the prefix. Cross-attention (`cross` True)
    reads keys and values from the encoder output; PRIME projects them into the cache once a
    sentence, and a STEP reads them there.
    """

    num_heads: int
    d_k: int
    d_v: int
    d_model: int
    dropout_rate: float = 0.0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str = "explicit"  # tx.model.kernels.attention_impl's (never "auto" here)
    cross: bool = False  # keys and values from the encoder output (cached once a sentence)
    use_bias: bool = False  # biases in the four projections (model.attention_bias)
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

    def _bias(self, name: str, shape: tuple[int, ...], names: tuple[str, ...]) -> Array | float:
        """A projection's bias (`use_bias`), else 0."""
        if not self.use_bias:
            return 0.0
        init = nn.with_logical_partitioning(nn.initializers.zeros, names)
        return jnp.asarray(self.param(name, init, shape, self.param_dtype), self.dtype)

    def _projections(self) -> tuple[tuple[Array, Array | float], ...]:
        """(W, bias) of the query, the key and the value, made in this order (their init keys)."""
        widths = (("query", self.d_k), ("key", self.d_k), ("value", self.d_v))
        kernels = [self._kernel(n, w) for n, w in widths]
        biases = [self._bias(f"{n}_bias", (self.num_heads, w), ("heads", "kv")) for n, w in widths]
        return tuple(zip(kernels, biases, strict=True))

    @nn.compact
    def __call__(
        self,
        inputs_q: Array | None,
        inputs_kv: Array,
        mask: Masking | Array | None,
        *,
        mode: Mode = Mode.SCORE,
    ) -> Array | None:
        """inputs_q: [b, q, m]; inputs_kv: [b, k, m] (self-attention: inputs_q itself); mask: a
        Masking, or its bool mask [b, 1|h, q, k] alone -> [b, q, m]. PRIME (cross-attention
        only) takes no queries and returns None.

        Cross-attention keys may hold one row per sentence for several query rows per sentence
        (the beams: b = sentences x width, sentence-major): see `_per_sentence`.
        """
        projections = self._projections()
        masking = mask if isinstance(mask, Masking) else Masking(mask)
        if self.cross:
            return self._cross(projections, inputs_q, inputs_kv, masking, mode)
        return self._self(projections, inputs_q, masking, mode)

    def _self(self, projections, inputs: Array, masking: Masking, mode: Mode) -> Array:
        """Self-attention over `inputs` [b, q, m]; a STEP appends to the cache and reads it all."""
        if self.d_k == self.d_v:  # one product for queries, keys and values
            (w_q, b_q), (w_k, b_k), (w_v, b_v) = projections
            w_qkv = jnp.concatenate([w_q, w_k, w_v], axis=-1)  # [m, h, 3d]
            qkv = jnp.einsum("blm,mhd->blhd", inputs, w_qkv)
            if self.use_bias:
                qkv = qkv + jnp.concatenate([b_q, b_k, b_v], axis=-1)
            query, key, value = (constrain(x, _HEADS) for x in jnp.split(qkv, 3, axis=-1))
        else:
            query, key, value = (_project(inputs, *wb) for wb in projections)
        if mode is Mode.STEP:
            key, value, step_mask = self._update_cache(key, value, masking.mask)
            masking = Masking(step_mask)
        return self._attend(query, key, value, masking, mode)

    def _cross(self, projections, inputs_q, inputs_kv: Array, masking: Masking, mode: Mode):
        """Cross-attention of `inputs_q` [b, q, m] over `inputs_kv` [b', k, m], whose keys and
        values PRIME stores in the cache (and returns None) and a STEP reads there."""
        query_projection, key_projection, value_projection = projections

        def project():
            return _project(inputs_kv, *key_projection), _project(inputs_kv, *value_projection)

        if mode is Mode.PRIME:
            key, value = cache_layout(*project())
            self.put_variable("cache", "static_key", key)
            self.put_variable("cache", "static_value", value)
            return None
        query = _project(inputs_q, *query_projection)
        key, value = self._static_cache(project) if mode is Mode.STEP else project()
        return self._attend(query, key, value, masking, mode)

    def _attend(self, query: Array, key: Array, value: Array, masking: Masking, mode: Mode):
        """softmax(Q K^T / sqrt(d_k)) V of the heads [b, q, h, *], then W^O -> [b, q, m]."""
        dropout_rng = None
        if not mode.deterministic and self.dropout_rate > 0.0:
            dropout_rng = self.make_rng("dropout")
        rows, length = query.shape[:2]
        out, weights = attention(
            _per_sentence(query, key.shape[0]),  # [sentences, width * q, h, d]
            key,
            value,
            masking,
            implementation=self.implementation,
            cached=mode is Mode.STEP,  # keys and values in `cache_layout`
            dropout_rng=dropout_rng,
            dropout_rate=self.dropout_rate,
            # The caller makes "intermediates" mutable to draw the weights (attention_maps).
            keep_weights=self.is_mutable_collection("intermediates"),
        )
        if weights is not None:
            self.sow("intermediates", "attention_weights", _per_row(weights, rows, length))
        out = out.reshape(rows, length, *out.shape[2:])  # back to one row per query row
        out_kernel = self.param(
            "out",
            nn.with_logical_partitioning(_glorot_split((0, 1), (2,)), ("heads", "kv", "embed")),
            (self.num_heads, self.d_v, self.d_model),
            self.param_dtype,
        )
        project_out = merge_heads.fun if self.plain_autodiff else merge_heads  # fun: no custom_vjp
        out = project_out(out, jnp.asarray(out_kernel, self.dtype))
        out = out + self._bias("out_bias", (self.d_model,), ("embed",))
        return constrain(out, ("batch", "length", "embed"))

    def _static_cache(self, project):
        """Cross-attention keys/values as PRIME stored them (`cache_layout`): static_key
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
            raise ValueError(f"a search step takes one position per call, got {key.shape[-1]}")
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
    sum_bq x g: with x first XLA:CPU copies x as it is, where autodiff's order (g first) makes
    it recompute the backward of the dropout and LayerNorm after this layer into a transposed
    copy of g ([figures](docs/performance.md#what-made-tx-faster)). The feed-forward's second
    layer keeps autodiff's order: there x has 4 times the elements of g. A custom_vjp has no
    forward mode: MultiHeadAttention(plain_autodiff=True) keeps the einsum."""
    return jnp.einsum("bqhv,hvm->bqm", x, kernel)


def _merge_heads_forward(x, kernel):
    return merge_heads(x, kernel), (x, kernel)


def _merge_heads_backward(saved, g):
    x, kernel = saved
    return jnp.einsum("bqm,hvm->bqhv", g, kernel), jnp.einsum("bqhv,bqm->hvm", x, g)


merge_heads.defvjp(_merge_heads_forward, _merge_heads_backward)
