"""Numeric tests of the building blocks (tx.model.layers, kernels, attention) against the
paper's formulas and plain NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx.model.kernels
import tx.model.layers
import tx.model.splash
import tx.model.transformer
from tx.model.attention import MultiHeadAttention, merge_heads
from tx.model.kernels import attention_logits, dot_product_attention
from tx.model.layers import Embed, FeedForward, LayerNorm, layer_norm, sinusoidal_encoding

U32 = 2.0**-24  # unit roundoff of float32 (round to nearest)


@pytest.mark.parametrize("pos,i", [(0, 0), (1, 0), (5, 3), (17, 100), (250, 255), (1023, 7)])
def test_sinusoidal_encoding_matches_formula(pos, i):
    d_model = 512
    pe = np.asarray(sinusoidal_encoding(jnp.array([pos]), d_model))[0]
    angle = pos / 10000 ** (2 * i / d_model)
    # The float32 angle: 2i / d_model is exact (d_model = 512), NumPy's float32 power to 4 ulp
    # (8 u; its AVX-512 path calls SVML's __svml_powf16), the reciprocal and the product (u
    # each): 10 u relative. sin and cos of it to 4 ulp: 4 u absolute (JAX documents <= 2 ulp on
    # CPU and GPU). Observed, over all positions < 1024 and all i: <= 2.9 u (angle + 1) and
    # <= 10 u angle + 0.5 u (1 and 2 threads, 8 devices). The old 4 u angle + 1e-6 assumed a
    # power within 1 ulp.
    atol = 10 * angle * U32 + 4 * U32
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
    # Bound as above: angles 0, 1, 2 exact, 0.01 and 0.02 within 10 u relative; sin and cos to
    # 4 ulp: 4 u + 0.2 u = 2.5e-7. Observed 2.9e-8 (1 and 2 threads, 8 devices).
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
    # Bound (first order, against float64): float32 rounding of q, k, v, then d = 4 and 7-term
    # sums (n u sum|terms|), the scaling, exp to 4 ulp and the normalisation, propagated through
    # the Jacobian: <= 4.2e-6 (seeds 0-4). Observed <= 4.6e-7 (seeds 0-4, 1 and 2 threads,
    # 8 devices).
    np.testing.assert_allclose(np.asarray(got), numpy_attention(q, k, v, mask), atol=1e-5)


def bf16_normal(seed, shape):
    """Normal samples rounded to bfloat16, and the same values (exact) in float64."""
    x = jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.bfloat16)
    return x, np.asarray(x.astype(jnp.float32), np.float64)


# Error bound for float32 accumulation of bfloat16 products (Higham, "Accuracy and Stability of
# Numerical Algorithms", section 3.1): a product of two bfloat16 numbers (8-bit significands) is
# exact in float32 (24 bits), so summing K of them in float32, in any order or tree, errs by at
# most gamma_{K-1} * S, with S = sum_i |a_i b_i| and gamma_n = n u / (1 - n u) <= (n + 1) u for
# u = 2^-24. attention_logits also divides by float32(sqrt(d)): two more roundings of relative u
# (the constant and the quotient), so its bound is (K + 2) u S / sqrt(d). Rounding the result to
# bfloat16 instead (the old einsum-then-cast) errs by up to 2^-9 |a . b|, ~10^4 u S here.
# Observed (2-core AMD EPYC, seeds 0-4 of the inputs below): attention_logits <= 1.13 u S/sqrt(d)
# (bound 66), attend <= 1.13 u S at K = 64 and <= 1.63 u S at K = 512 (bounds 64, 512); the old
# way's largest errors were 1.9e4-2.4e4 u S/sqrt(d) and 6e3-3.1e4 u S.


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_attention_logits_of_bfloat16_accumulate_in_float32(seed):
    b, lq, lk, h, d = 2, 5, 7, 3, 64
    (q, q64), (k, k64) = bf16_normal(seed, (b, lq, h, d)), bf16_normal(seed + 100, (b, lk, h, d))
    got = attention_logits(q, k)
    assert got.dtype == jnp.float32 and got.shape == (b, h, lq, lk)
    exact = np.einsum("bqhd,bkhd->bhqk", q64, k64) / np.sqrt(d)
    bound = (d + 2) * U32 * np.einsum("bqhd,bkhd->bhqk", np.abs(q64), np.abs(k64)) / np.sqrt(d)
    err = np.abs(np.asarray(got, np.float64) - exact)
    assert np.all(err <= bound), (err / bound).max()
    old = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.float32(np.sqrt(d))
    old_err = np.abs(np.asarray(old, np.float64) - exact)
    assert err.max() < old_err.max() and np.any(old_err > bound)  # the test tells them apart


@pytest.mark.parametrize("valid_keys", [4, 2])
def test_attention_takes_its_logits_from_attention_logits(valid_keys, monkeypatch):
    """Zero logits from `attention_logits` must give equal weights to the unmasked keys."""
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.normal(size=(1, 3, 2, 5)), jnp.float32)  # [b, q, h, d]
    k = jnp.asarray(rng.normal(size=(1, 4, 2, 5)), jnp.float32)  # [b, k, h, d]
    v = jnp.asarray(rng.normal(size=(1, 4, 2, 3)), jnp.float32)  # [b, k, h, v]
    mask = jnp.arange(4)[None, None, None, :] < valid_keys  # [1, 1, 1, k]
    monkeypatch.setattr(
        tx.model.kernels, "attention_logits", lambda q, k, cached=False: jnp.zeros((1, 2, 3, 4))
    )
    got = dot_product_attention(q, k, v, mask)
    expected = np.asarray(v)[:, :valid_keys].mean(1, keepdims=True)  # [b, 1, h, v]
    # Weights 1/4 or 1/2 and the products are exact, so both sides only round a sum of
    # valid_keys terms: 2 (valid_keys - 1) u mean|v| <= 5.4e-7 (seeds 0-5). Observed 0 (seeds
    # 0-5, 1 and 2 threads, 8 devices).
    np.testing.assert_allclose(np.asarray(got), np.broadcast_to(expected, got.shape), atol=1e-6)


@pytest.mark.parametrize("seed,d_model", [(0, 64), (1, 64), (2, 512)])
def test_attend_of_bfloat16_accumulates_in_float32(seed, d_model):
    (x, x64), (e, e64) = bf16_normal(seed, (2, 6, d_model)), bf16_normal(seed + 100, (50, d_model))
    embed = Embed(50, d_model, jnp.bfloat16)
    params = {"params": {"embedding": e.astype(jnp.float32)}}  # exact: cast back to bf16 is too
    got = embed.apply(params, x, method=Embed.attend)
    assert got.dtype == jnp.float32 and got.shape == (2, 6, 50)
    exact = x64 @ e64.T
    bound = d_model * U32 * (np.abs(x64) @ np.abs(e64).T)  # gamma_{K-1} <= K u, K = d_model
    err = np.abs(np.asarray(got, np.float64) - exact)
    assert np.all(err <= bound), (err / bound).max()
    old = jnp.einsum("blm,Vm->blV", x, e).astype(jnp.float32)
    old_err = np.abs(np.asarray(old, np.float64) - exact)
    assert err.max() < old_err.max() and np.any(old_err > bound)


def test_multihead_attention_projections_match_numpy():
    rng = np.random.default_rng(1)
    m, h, dk, dv = 8, 2, 3, 5
    x = rng.normal(size=(2, 4, m)).astype(np.float32)
    mha = MultiHeadAttention(h, dk, dv, m)
    params = jax.tree_util.tree_map(
        lambda p: p.unbox() if hasattr(p, "unbox") else p,
        mha.init(jax.random.PRNGKey(0), x, x, None)["params"],
        is_leaf=lambda p: hasattr(p, "unbox"),
    )
    assert params["query"].shape == (m, h, dk) and params["value"].shape == (m, h, dv)
    assert params["out"].shape == (h, dv, m)
    got = mha.apply({"params": params}, x, x, None)
    q = np.einsum("blm,mhd->blhd", x, params["query"])
    k = np.einsum("blm,mhd->blhd", x, params["key"])
    v = np.einsum("blm,mhd->blhd", x, params["value"])
    heads = numpy_attention(q, k, v)  # [b, l, h, dv]
    concat = heads.reshape(2, 4, h * dv)  # Concat(head_1..head_h)
    expected = concat @ np.asarray(params["out"]).reshape(h * dv, m)  # W^O
    # Bound (first order, as for test_attention_matches_numpy): the float32 model, plus the
    # reference's own float32 rounding of q, k, v (8 terms) and q k^T (3 terms): <= 2.2e-5
    # (seeds 0-4 of the inputs and the initialisation). Observed <= 4.0e-7 (1 and 2 threads,
    # 8 devices).
    np.testing.assert_allclose(np.asarray(got), expected, atol=3e-5)


def test_feed_forward_is_relu_mlp_with_biases():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1, 3, 4)).astype(np.float32)
    ffn = FeedForward(4, 6)
    params = ffn.init(jax.random.PRNGKey(0), x, deterministic=True)["params"]
    p = {k: np.asarray(v.unbox()) for k, v in params.items()}
    p["bi"], p["bo"] = rng.normal(size=6), rng.normal(size=4)
    got = ffn.apply({"params": p}, x, deterministic=True)
    expected = np.maximum(0, x @ p["wi"] + p["bi"]) @ p["wo"] + p["bo"]
    # Bound (first order): biases rounded to float32, 4- and 6-term sums, the bias additions,
    # plus the reference's float32 x @ wi: <= 3.7e-6 (seeds 0-4). Observed <= 2.0e-7 (1 and 2
    # threads, 8 devices).
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5)


def test_layer_norm_normalizes():
    x = jnp.array([[1.0, 2.0, 3.0, 6.0]])
    params = LayerNorm().init(jax.random.PRNGKey(0), x)
    y = np.asarray(LayerNorm().apply(params, x))
    xn = np.asarray(x)
    expected = (xn - xn.mean()) / np.sqrt(xn.var() + 1e-6)
    # Both float32: mean 3, deviations and variance 3.5 are exact, var + 1e-6 rounds alike. The
    # rest: rsqrt to 4 ulp (JAX documents 1-2 ulp on x86-64, AMD vs Intel) and a product against
    # sqrt and a quotient, 11 u |y| <= 1.1e-6. Observed 0 (and <= 2 u on other inputs).
    np.testing.assert_allclose(y, expected, atol=2e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_layer_norm_gradient_is_autodiff_of_the_formula(seed):
    """The written-out gradient of `layer_norm` against autodiff of the plain formula, in
    float64 with an uneven cotangent. Both are the same mathematics in another order: a few
    reductions of width 64 and 6 rows, so rounding stays within about 100 u = 1e-14 relative
    of the largest entry; 1e-12 is the bound. Observed (seeds 0-2, 2 threads and taskset -c
    0; seeds 0-4 in a script): 2.9e-16."""

    def formula(x, scale, bias):
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-6) * scale + bias

    rng = np.random.default_rng(seed)
    with jax.enable_x64(True):
        x, dy = (jnp.asarray(3.0 * rng.normal(size=(2, 3, 64)) + 1.0) for _ in range(2))
        scale, bias = (jnp.asarray(rng.normal(size=64)) for _ in range(2))
        ours = jax.vjp(lambda *a: layer_norm(*a, 1e-6), x, scale, bias)
        ref = jax.vjp(formula, x, scale, bias)
        np.testing.assert_allclose(ours[0], ref[0], rtol=1e-12)
        for got, want in zip(ours[1](dy), ref[1](dy), strict=True):
            error = np.max(np.abs(got - want)) / np.max(np.abs(want))
            assert error <= 1e-12, error


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_merge_heads_gradient_is_autodiff_of_the_product(seed):
    """`merge_heads` writes its gradient out only to order the operands of the kernel's
    gradient: against autodiff of the plain einsum, in float64. The same sums of 3 x 7 = 21
    (kernel) and 6 (inputs) products in another order: within about 21 u = 2.3e-15 of the sum
    of magnitudes; 1e-12 relative to the largest entry is the bound. Observed (seeds 0-4, 2
    threads and taskset -c 0): 0, the same sums in the same order on this CPU."""
    rng = np.random.default_rng(seed)
    with jax.enable_x64(True):
        x = jnp.asarray(rng.normal(size=(3, 7, 2, 5)))  # [b, q, h, v]
        kernel = jnp.asarray(rng.normal(size=(2, 5, 6)))  # [h, v, m]
        g = jnp.asarray(rng.normal(size=(3, 7, 6)))
        ours = jax.vjp(merge_heads, x, kernel)
        ref = jax.vjp(lambda x, k: jnp.einsum("bqhv,hvm->bqm", x, k), x, kernel)
        np.testing.assert_array_equal(ours[0], ref[0])  # the forward is the same einsum
        for got, want in zip(ours[1](g), ref[1](g), strict=True):
            assert got.shape == want.shape and got.dtype == want.dtype
            error = np.max(np.abs(got - want)) / np.max(np.abs(want))
            assert error <= 1e-12, error


def _qkv(dtype, b=3, q=7, k=9, h=2, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.normal(size=(b, n, h, d)), dtype) for n in (q, k, k))


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)])
def test_fused_attention_equals_the_explicit_one(dtype, tol):
    """jax.nn.dot_product_attention (XLA) against the weights formed here, for a padding mask,
    a causal mask and a packed-rows (segment) mask. float32: the same products in another
    order; bfloat16: both round the weights to bfloat16 (2^-8 relative) before the value
    product, maybe at other points: outputs of size ~1 differ by up to a few 2^-8. Observed 0
    in both (on a CPU XLA's path is the same arithmetic; seeds 0-4, 2 threads and taskset -c 0):
    the bounds are for other backends."""
    query, key, value = _qkv(dtype)
    kv_len = jnp.array([9, 4, 6])
    padding = (jnp.arange(9)[None, :] < kv_len[:, None])[:, None, None, :]
    causal = jnp.tril(jnp.ones((7, 9), bool))[None, None]
    segments = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0, 0]] * 3)
    packed = (segments[:, :7, None] == segments[:, None, :]) & (segments[:, None, :] > 0)
    for mask in (padding, causal & padding, packed[:, None]):
        want = tx.model.kernels.dot_product_attention(query, key, value, mask)
        masking = tx.model.kernels.Masking(mask)
        got = tx.model.kernels.fused_attention(query, key, value, masking, "xla")
        real = np.asarray(mask.any(-1)).transpose(0, 2, 1)[..., None]  # queries with a key
        diff = np.abs(np.asarray(got, np.float32) - np.asarray(want, np.float32)) * real
        assert diff.max() <= tol, diff.max()


def test_lengths_say_what_the_mask_says():
    """The lengths-and-causal form (cuDNN's) equals the boolean mask on every real query
    (the same softmax over 9 keys, masked differently: observed <= 2.4e-7, seeds 0-4, 2 threads
    and taskset -c 0)."""
    query, key, value = _qkv(jnp.float32, q=9)
    lengths = jnp.array([9, 4, 6])
    real = jnp.arange(9)[None, :] < lengths[:, None]
    for causal in (False, True):
        mask = (real[:, None, :] & real[:, :, None])[:, None]
        if causal:
            mask = mask & jnp.tril(jnp.ones((9, 9), bool))
        want = tx.model.kernels.dot_product_attention(query, key, value, mask)
        masking = tx.model.kernels.Masking(None, (lengths, lengths), causal)
        got = tx.model.kernels.fused_attention(query, key, value, masking, "xla")
        np.testing.assert_allclose(
            np.asarray(got) * np.asarray(real)[:, :, None, None],
            np.asarray(want) * np.asarray(real)[:, :, None, None],
            atol=1e-5,
        )


def _splash_cases():
    """(query ids, key ids, causal): padding, causal, packed self-attention, and a
    cross-attention whose padding queries see no key (a full source row)."""
    q = np.ones((2, 128), np.int32)
    q[0, 100:] = 0
    q[1, 40:90], q[1, 90:] = 2, 0
    k = np.ones((2, 128), np.int32)
    k[1, 30:70], k[1, 70:] = 2, 0
    return [(q, q, False), (q, q, True), (q, k, False)]


@pytest.mark.parametrize("case", range(3))
def test_splash_attention_equals_the_explicit_one(case):
    """The Pallas splash kernel (TPU; here Pallas' interpreter on a CPU) against the weights
    formed here, values and gradients, on every real query. The same float32 sums blocked
    differently and softmaxed online: each output or gradient is a sum of <= 128 products,
    whose orders differ by <= 128 u sum|terms| (u = 2^-24) ~ 1e-5 of its size; the bound here
    is 1e-4 of the largest. Observed <= 1.6e-6 of the largest (seeds 0-2, one per case, 2
    threads; the bound also held under taskset -c 0), where a mask error moves outputs by a
    tenth of it or more."""
    q_ids, k_ids, causal = _splash_cases()[case]
    query, key, value = _qkv(jnp.float32, b=2, q=128, k=128, h=2, d=64, seed=case)
    mask = tx.model.transformer.attention_mask(jnp.asarray(q_ids), jnp.asarray(k_ids), causal)
    real = jnp.asarray(q_ids > 0)[:, :, None, None]

    def explicit(q, k, v):
        return jnp.where(real, tx.model.kernels.dot_product_attention(q, k, v, mask), 0.0)

    def splash(q, k, v):
        out = tx.model.splash.splash_attention(q, k, v, (q_ids, k_ids), causal, interpret=True)
        return jnp.where(real, out, 0.0)

    want, got = explicit(query, key, value), splash(query, key, value)
    assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want))
    loss = lambda fn: lambda *x: jnp.sum(fn(*x) ** 2)  # noqa: E731
    wants = jax.grad(loss(explicit), (0, 1, 2))(query, key, value)
    gots = jax.grad(loss(splash), (0, 1, 2))(query, key, value)
    for w, g in zip(wants, gots, strict=True):
        assert np.max(np.abs(g - w)) <= 1e-4 * np.max(np.abs(w))


def test_attention_impl_resolution():
    resolve = tx.model.kernels.attention_impl
    assert resolve("auto", jnp.bfloat16, 64, 64, "gpu") == "cudnn"
    assert resolve("auto", jnp.float32, 64, 64, "gpu") == "xla"  # cuDNN's kernel is bf16/fp16
    assert resolve("auto", jnp.bfloat16, 64, 64, "tpu") == "splash"
    assert resolve("auto", jnp.float32, 64, 64, "tpu") == "splash"
    assert resolve("auto", jnp.bfloat16, 64, 64, "cpu") == "xla"
    assert resolve("auto", jnp.bfloat16, 16, 64, "gpu") == "explicit"  # d_k != d_v (row B)
    assert resolve("xla", jnp.float64, 64, 64, "cpu") == "explicit"  # float64 stays float64
    with pytest.raises(ValueError, match="model.attention_impl must be one of"):
        resolve("flash", jnp.float32, 64, 64, "cpu")


def test_dropout_on_a_tpu_gives_each_element_a_word(monkeypatch):
    """Traced for a TPU (tx.model.layers.target_platform), element i is dropped when the high
    16 bits of random word i fall below the threshold: no word is split across two elements
    (a relayout there). The kept ones are scaled as on a CPU."""
    monkeypatch.setattr(tx.model.layers, "target_platform", lambda: "tpu")
    x = jnp.ones((4, 6, 10), jnp.float32)
    drawn = {}
    real_bits = jax.random.bits

    def record(rng, shape, dtype):
        drawn["words"] = real_bits(rng, shape, dtype)
        return drawn["words"]

    monkeypatch.setattr(jax.random, "bits", record)
    out = tx.model.layers.Dropout(0.25).apply(
        {}, x, deterministic=False, rngs={"dropout": jax.random.key(3)}
    )
    assert drawn["words"].shape == x.shape  # a word per element
    keep = (np.asarray(drawn["words"]) >> 16) >= 16384
    assert 0.6 < keep.mean() < 0.9  # 240 elements at a rate of 0.25
    np.testing.assert_array_equal(np.asarray(out) != 0, keep)
    np.testing.assert_allclose(np.asarray(out)[keep], 65536 / (65536 - 16384))


def test_dropout_word_j_decides_elements_2j_and_2j_plus_1():
    """The mapping tx.model.layers.Dropout documents: element 2j is dropped when the low 16 bits of
    random word j fall below the threshold, element 2j + 1 by its high 16 bits."""
    x = jnp.ones((3, 5, 64), jnp.float32)
    key = jax.random.key(7)
    out = tx.model.layers.Dropout(0.25).apply({}, x, deterministic=False, rngs={"dropout": key})
    # The key Dropout draws its bits from: flax folds the module path into the "dropout" key.
    bits_of = {}

    def record(rng, shape, dtype):
        bits_of["words"] = real_bits(rng, shape, dtype)
        return bits_of["words"]

    real_bits = jax.random.bits
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jax.random, "bits", record)
        again = tx.model.layers.Dropout(0.25).apply(
            {}, x, deterministic=False, rngs={"dropout": key}
        )
    words = np.asarray(bits_of["words"])
    expected = np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(x.shape) >= 16384
    np.testing.assert_array_equal(np.asarray(again) != 0, expected)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(again))


def test_dropout_keeps_the_expectation_and_the_rate():
    """16 random bits per element: the rate is round(0.1 * 2^16) / 2^16 = 0.1000061; over 2^20
    elements the dropped fraction is within 5 standard deviations (5 x 2.9e-4) of it, and the
    kept values are scaled so that the mean of the output is the input's (x = 1 here)."""
    x = jnp.ones((256, 4096), jnp.float32)
    out = tx.model.layers.Dropout(0.1).apply(
        {}, x, deterministic=False, rngs={"dropout": jax.random.key(0)}
    )
    dropped = float(jnp.mean(out == 0))
    rate = 6554 / 65536
    assert abs(dropped - rate) < 5 * np.sqrt(rate * (1 - rate) / x.size)
    np.testing.assert_allclose(np.asarray(out[out != 0]), 1 / (1 - rate), rtol=1e-7)
    # The mean of 2^20 values that are 0 or 1 / (1 - rate): standard deviation
    # sqrt(rate / (1 - rate) / n) = 3.2e-4.
    assert float(jnp.mean(out)) == pytest.approx(1.0, abs=5 * np.sqrt(rate / (1 - rate) / x.size))
    same = tx.model.layers.Dropout(0.1).apply({}, x, deterministic=True)
    assert same is x or bool((same == x).all())
