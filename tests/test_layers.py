"""Numeric tests of the building blocks against the paper's formulas and plain NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.layers import (
    FeedForward,
    LayerNorm,
    MultiHeadAttention,
    dot_product_attention,
    sinusoidal_encoding,
)


@pytest.mark.parametrize("pos,i", [(0, 0), (1, 0), (5, 3), (17, 100), (250, 255), (1023, 7)])
def test_sinusoidal_encoding_matches_formula(pos, i):
    d_model = 512
    pe = np.asarray(sinusoidal_encoding(jnp.array([pos]), d_model))[0]
    angle = pos / 10000 ** (2 * i / d_model)
    atol = 1e-6 + 2 * angle * np.finfo(np.float32).eps  # float32 rounding of the angle itself
    np.testing.assert_allclose(pe[2 * i], np.sin(angle), atol=atol)
    np.testing.assert_allclose(pe[2 * i + 1], np.cos(angle), atol=atol)


def test_sinusoidal_encoding_known_values():
    pe = np.asarray(sinusoidal_encoding(jnp.arange(3), 4))
    expected = np.array(
        [
            [0.0, 1.0, 0.0, 1.0],
            [np.sin(1.0), np.cos(1.0), np.sin(0.01), np.cos(0.01)],
            [np.sin(2.0), np.cos(2.0), np.sin(0.02), np.cos(0.02)],
        ]
    )
    np.testing.assert_allclose(pe, expected, atol=1e-6)


def numpy_attention(q, k, v, mask=None):
    """softmax(Q K^T / sqrt(d_k)) V, one head at a time, masked logits at -inf."""
    b, lq, h, d = q.shape
    out = np.zeros((b, lq, h, v.shape[-1]))
    for bi in range(b):
        for hi in range(h):
            logits = q[bi, :, hi] @ k[bi, :, hi].T / np.sqrt(d)
            if mask is not None:
                logits = np.where(mask[bi, 0], logits, -np.inf)
            w = np.exp(logits - logits.max(-1, keepdims=True))
            w = w / w.sum(-1, keepdims=True)
            out[bi, :, hi] = w @ v[bi, :, hi]
    return out


@pytest.mark.parametrize("masked", [False, True])
def test_attention_matches_numpy(masked):
    rng = np.random.default_rng(0)
    b, lq, lk, h, d, dv = 2, 5, 7, 3, 4, 6
    q, k = rng.normal(size=(b, lq, h, d)), rng.normal(size=(b, lk, h, d))
    v = rng.normal(size=(b, lk, h, dv))
    mask = None
    if masked:
        mask = rng.random((b, 1, lq, lk)) > 0.4
        mask[..., 0] = True  # every query keeps one key
    got = dot_product_attention(
        jnp.array(q), jnp.array(k), jnp.array(v), None if mask is None else jnp.array(mask)
    )
    np.testing.assert_allclose(np.asarray(got), numpy_attention(q, k, v, mask), atol=1e-5)


def test_multihead_attention_projections_match_numpy():
    rng = np.random.default_rng(1)
    m, h, dk, dv = 8, 2, 3, 5
    x = rng.normal(size=(2, 4, m)).astype(np.float32)
    mha = MultiHeadAttention(h, dk, dv, m)
    params = jax.tree_util.tree_map(
        lambda p: p.unbox() if hasattr(p, "unbox") else p,
        mha.init(jax.random.PRNGKey(0), x, x, None, deterministic=True)["params"],
        is_leaf=lambda p: hasattr(p, "unbox"),
    )
    assert params["query"].shape == (m, h, dk) and params["value"].shape == (m, h, dv)
    assert params["out"].shape == (h, dv, m)
    got = mha.apply({"params": params}, x, x, None, deterministic=True)
    q = np.einsum("blm,mhd->blhd", x, params["query"])
    k = np.einsum("blm,mhd->blhd", x, params["key"])
    v = np.einsum("blm,mhd->blhd", x, params["value"])
    heads = numpy_attention(q, k, v)  # [b, l, h, dv]
    concat = heads.reshape(2, 4, h * dv)  # Concat(head_1..head_h)
    expected = concat @ np.asarray(params["out"]).reshape(h * dv, m)  # W^O
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5)


def test_feed_forward_is_relu_mlp_with_biases():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1, 3, 4)).astype(np.float32)
    ffn = FeedForward(4, 6)
    params = ffn.init(jax.random.PRNGKey(0), x, deterministic=True)["params"]
    p = {k: np.asarray(v.unbox()) for k, v in params.items()}
    p["bi"], p["bo"] = rng.normal(size=6), rng.normal(size=4)
    got = ffn.apply({"params": p}, x, deterministic=True)
    expected = np.maximum(0, x @ p["wi"] + p["bi"]) @ p["wo"] + p["bo"]
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5)


def test_layer_norm_normalizes():
    x = jnp.array([[1.0, 2.0, 3.0, 6.0]])
    params = LayerNorm().init(jax.random.PRNGKey(0), x)
    y = np.asarray(LayerNorm().apply(params, x))
    xn = np.asarray(x)
    expected = (xn - xn.mean()) / np.sqrt(xn.var() + 1e-6)
    np.testing.assert_allclose(y, expected, atol=1e-5)
