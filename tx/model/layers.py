"""Transformer building blocks (section 3 of the paper), as Flax Linen modules: token embeddings
(tied to the pre-softmax layer), positional encodings, the position-wise feed-forward, LayerNorm
and dropout. Attention, the block the rest are built around, is tx.model.attention's.

Every parameter carries logical axis names (`nn.with_logical_partitioning`), so the
mesh rules in `tx.train.sharding` decide placement without touching the model. Logical names:
  vocab, embed (d_model), heads (h), kv (d_k or d_v), mlp (d_ff), length (positions).
Activations are constrained with `batch`, `length`, `embed`, `heads`, `kv`, `mlp`, `vocab`.

Shape letters used in einsums and comments:
  b batch, q query length, k key length, h heads, d d_k (query/key width per head),
  v d_v (value width per head), m d_model, f d_ff, V vocabulary.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

Array = jax.Array
Dtype = Any

# Glorot-uniform over a [fan_in, fan_out] kernel.
_glorot = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")


class Mode(enum.Enum):
    """What a pass of the Transformer is for: its layers read this one value, not flags.

    TRAIN  whole sequences, teacher-forced, dropout on (the train step)
    SCORE  whole sequences, teacher-forced, no dropout (dev loss, scoring, attention maps)
    PRIME  the encoder output projected into the cross-attention cache, once a sentence
    STEP   one new position per row against the cache (a search step)
    """

    TRAIN = "train"
    SCORE = "score"
    PRIME = "prime"
    STEP = "step"

    @classmethod
    def teacher_forced(cls, deterministic: bool) -> Mode:
        return cls.SCORE if deterministic else cls.TRAIN

    @property
    def deterministic(self) -> bool:
        """No dropout: every mode but TRAIN."""
        return self is not Mode.TRAIN


def at_least_float32(dtype) -> jnp.dtype:
    """float32 for bf16/f16/f32 compute; float64 stays float64 (numerical tests with x64)."""
    return jnp.promote_types(dtype, jnp.float32)


def constrain(x: Array, names: tuple[str | None, ...]) -> Array:
    """Logical sharding constraint; a no-op outside a mesh/rules context."""
    return nn.with_logical_constraint(x, names)


_TRACED_MESH = contextvars.ContextVar("tx_traced_mesh", default=None)


@contextlib.contextmanager
def traced_on(mesh: jax.sharding.Mesh):
    """`with mesh:` for tracing the model on `mesh` (as tx.train.trainer traces its steps),
    which `traced_mesh` then returns: JAX has no public getter for the mesh of `with mesh:`
    (jax.set_mesh, which has one, also turns on Flax's activation constraints: another
    program; https://docs.jax.dev/en/latest/sharded-computation.html)."""
    token = _TRACED_MESH.set(mesh)
    try:
        with mesh:
            yield
    finally:
        _TRACED_MESH.reset(token)


def traced_mesh():
    """The mesh of the innermost `traced_on`, or None."""
    return _TRACED_MESH.get()


def target_platform() -> str:
    """The platform being traced for: that of the devices of `traced_mesh` (a TPU slice
    compiled deviceless on a CPU host is "tpu"), else JAX's default backend."""
    mesh = traced_mesh()
    return jax.default_backend() if mesh is None else mesh.devices.flat[0].platform


class Dropout(nn.Module):
    """Inverted dropout: an element is dropped when 16 random bits fall below
    round(rate * 2^16); the rate is kept to within 2^-17 (0.1 -> 6554 / 65536 = 0.1000061),
    and kept values are scaled by 1 / (1 - that rate), so the expected output is the input
    exactly.

    How the bits are drawn depends on the platform traced for (`target_platform`). On a CPU,
    random bits are the cost of dropout, so one 32-bit word serves two elements: word j of a
    row gives elements 2j (low half) and 2j + 1 (high half). On a TPU drawing is cheap but
    that split is not (reading a word as two halves is a relayout across the vector lanes), so
    there each element takes the high 16 bits of a word of its own, drawn inside the
    consumer's fusion ([figures](docs/performance.md#what-made-tx-faster)). Either way JAX's
    partitionable threefry makes the words a function of their global position, so the masks
    are the same on any mesh of one platform.
    """

    rate: float

    @nn.compact
    def __call__(self, x: Array, *, deterministic: bool) -> Array:
        if deterministic or self.rate == 0.0:
            return x
        threshold = round(self.rate * 65536)
        rng = self.make_rng("dropout")
        *lead, width = x.shape
        if target_platform() == "tpu":
            keep = jax.random.bits(rng, x.shape, jnp.uint32) >= np.uint32(threshold << 16)
        elif width % 2:
            keep = jax.random.bernoulli(rng, 1.0 - threshold / 65536, x.shape)
        else:
            words = jax.random.bits(rng, (*lead, width // 2), jnp.uint32)
            # [..., width/2, 2]: the low and the high half of each word, as a reinterpretation
            # (XLA's bitcast is little-endian), cheaper than splitting with & and >>.
            halves = jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(x.shape)
            keep = halves >= threshold
        scale = jnp.asarray(65536 / (65536 - threshold), x.dtype)
        return jnp.where(keep, x * scale, jnp.zeros((), x.dtype))


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


def padded_rows(vocab_size: int, multiple: int) -> int:
    """vocab_size rounded up to a multiple of `multiple`: the rows of an `Embed`."""
    return -(-vocab_size // multiple) * multiple


class Embed(nn.Module):
    """Token embedding [V', m]; `attend` reuses the same matrix as the pre-softmax layer.

    V' is `vocab_size` rounded up to a multiple of `vocab_multiple` (128 lays the softmax
    product out in whole tiles on GPUs and TPUs and lets a tensor axis split it). The extra
    rows start at zero and stay there: no token looks them up, and their logits are cut off
    (`attend`) or masked (tx.train.losses.chunked_cross_entropy), so they get no gradient.
    """

    vocab_size: int
    d_model: int
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    vocab_multiple: int = 1

    @classmethod
    def of(cls, config, name: str, vocab_size: int = 0) -> Embed:
        """The embedding a model config describes (its vocab_size, or `vocab_size` rows,
        d_model, vocab_multiple, compute_dtype and weight_dtype: ModelConfig and RNNConfig
        have them all)."""
        return cls(
            vocab_size or config.vocab_size,
            config.d_model,
            config.compute_dtype,
            config.weight_dtype,
            config.vocab_multiple,
            name=name,
        )

    @property
    def rows(self) -> int:
        return padded_rows(self.vocab_size, self.vocab_multiple)

    def setup(self):
        normal = nn.initializers.normal(stddev=self.d_model**-0.5)

        def init(key, shape, dtype):  # the real rows as without padding, for any multiple
            real = normal(key, (self.vocab_size, self.d_model), dtype)
            return jnp.pad(real, ((0, shape[0] - self.vocab_size), (0, 0)))

        self.embedding = self.param(
            "embedding",
            nn.with_logical_partitioning(init, ("vocab", "embed")),
            (self.rows, self.d_model),
            self.param_dtype,
        )

    def __call__(self, tokens: Array) -> Array:
        """[b, l] int -> [b, l, m], multiplied by sqrt(d_model) as in section 3.4."""
        emb = jnp.take(jnp.asarray(self.embedding, self.dtype), tokens, axis=0)
        return emb * jnp.asarray(np.sqrt(self.d_model), self.dtype)

    def matrix(self) -> Array:
        """The whole matrix [V', m] in the compute dtype (for a loss that forms the logits)."""
        return jnp.asarray(self.embedding, self.dtype)

    def attend(self, x: Array) -> Array:
        """[b, l, m] -> logits [b, l, V] float32 (the padding columns cut off).

        The product runs in `dtype` but accumulates into and returns float32: casting a
        bfloat16 result would round every logit to 8 significant bits (up to 2^-9 relative).
        """
        out = at_least_float32(self.dtype)
        logits = jnp.einsum("blm,Vm->blV", x, self.matrix(), preferred_element_type=out)
        return logits[..., : self.vocab_size]


def embedding_tables(config) -> tuple[Embed, Embed, Embed | None]:
    """The (source, target, pre-softmax) tables a model config describes, made in a model's
    `setup`: one "shared_embedding" for the source and target and no pre-softmax table of its
    own (None: tied to the target's) when `share_embeddings`, else "source_embedding",
    "target_embedding" and "softmax"; with a `source_vocab_size` (Marian's separate
    vocabularies) "source_embedding" over the source's and "target_embedding" tied to the
    softmax."""
    source_rows = getattr(config, "source_vocab_size", 0)
    if source_rows:
        source = Embed.of(config, "source_embedding", source_rows)
        return source, Embed.of(config, "target_embedding"), None
    if config.share_embeddings:
        shared = Embed.of(config, "shared_embedding")
        return shared, shared, None
    names = ("source_embedding", "target_embedding", "softmax")
    return tuple(Embed.of(config, name) for name in names)


class PositionEmbedding(nn.Module):
    """Adds sinusoidal (default), learned (Table 3 row E) or fixed position information: "fixed"
    is a table like a learned one that never trains (its gradient stopped), for a model whose
    positions are constants made elsewhere (an imported Marian model's own sinusoids)."""

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
            if self.kind == "fixed":
                table = jax.lax.stop_gradient(table)
            pe = jnp.take(table, positions, axis=0)
        return x + pe.astype(self.dtype)


# The feed-forward's nonlinearity (model.activation): the paper's ReLU, or what a model
# imported from elsewhere uses (OPUS-MT's Marian models: swish; transformers' "gelu" is erf's).
ACTIVATIONS = {
    "relu": jax.nn.relu,
    "swish": jax.nn.silu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
}


class FeedForward(nn.Module):
    """Position-wise feed-forward: max(0, x W1 + b1) W2 + b2 (section 3.3), or another
    `activation` (ACTIVATIONS) in place of max(0, .)."""

    d_model: int
    d_ff: int
    relu_dropout_rate: float = 0.0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    activation: str = "relu"

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
        h = ACTIVATIONS[self.activation](jnp.einsum("blm,mf->blf", x, w1) + b1)
        h = constrain(h, ("batch", "length", "mlp"))
        h = Dropout(self.relu_dropout_rate)(h, deterministic=deterministic)
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
        y = layer_norm(x32, scale.astype(x32.dtype), bias.astype(x32.dtype), self.epsilon)
        return y.astype(self.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def layer_norm(x: Array, scale: Array, bias: Array, epsilon: float) -> Array:
    """(x - mean) / sqrt(var + epsilon) * scale + bias over the last axis of x [..., d];
    scale and bias [d], all of one dtype.

    Its gradient is written out, dx = (g - mean(g) - x^ mean(g x^)) / sigma with g = dy scale
    and x^ the normalised x: two reductions and one pass, where autodiff differentiates the
    forward's steps one by one: faster ([figures](docs/performance.md#what-made-tx-faster)), the
    same gradient to rounding (tests/test_layers.py)."""
    return _layer_norm_forward(x, scale, bias, epsilon)[0]


def _layer_norm_forward(x, scale, bias, epsilon):
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    inv_sigma = jax.lax.rsqrt(var + epsilon)
    normed = (x - mean) * inv_sigma
    return normed * scale + bias, (normed, inv_sigma, scale)


def _layer_norm_backward(epsilon, saved, dy):
    del epsilon  # in the saved inv_sigma
    normed, inv_sigma, scale = saved
    g = dy * scale
    mean_g = g.mean(-1, keepdims=True)
    mean_gx = (g * normed).mean(-1, keepdims=True)
    rows = tuple(range(dy.ndim - 1))
    return inv_sigma * (g - mean_g - normed * mean_gx), (dy * normed).sum(rows), dy.sum(rows)


layer_norm.defvjp(_layer_norm_forward, _layer_norm_backward)
