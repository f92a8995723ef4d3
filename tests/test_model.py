"""Model-level properties: causality, padding, position information, cache, weight tying."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tx.model.family_base import shift_right
from tx.model.transformer import Transformer
from tx.model.transformer_config import ModelConfig
from tx.model.transformer_decoding import incremental_decoder
from tx.tokens import BOS_ID, EOS_ID

SMALL = dict(vocab_size=40, d_model=16, num_heads=2, d_ff=32, num_layers=2, dropout_rate=0.0)

# Two float32 forward passes that compute the same function with reductions of other lengths
# or order (padding, packing, cached decoding, permuted inputs) differ by at most the sum of
# their rounding-error bounds. Bound of one pass, per output and to first order: the sum over
# every float32 operation of |d output / d operation| times its local error (n u sum|terms| for a
# sum or dot of n terms in any order or tree, u |x| for + - * /, 4 ulp for exp, log, rsqrt, sin
# and cos; u = 2^-24), with the Jacobian taken in float64. For SMALL and the inputs of these
# tests (and seeds 0-4 of their PRNG and NumPy seeds) it is <= 1.8e-3 on logits and <= 4.4e-4 on
# encoder outputs. Observed differences: <= 1.4e-6 (seeds 0-4; 2 threads, 1 thread under
# taskset -c 0, 8 host devices), while a mask or position bug moves outputs by >= 0.84.
LOGITS_ATOL = 2e-3
ENCODER_ATOL = 5e-4

# The programs here run for microseconds, each compiled once: most of a compile is LLVM's
# optimisation, which changes results by float rounding at most (fused multiply-adds), inside
# the bounds above; so they compile at XLA's level 0.
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})

_DRAWN = {}  # the parameters' names, shapes and dtypes -> the values drawn


@functools.cache
def make(**overrides):
    """(model, parameters) of SMALL with `overrides`, made once per module. Configurations
    whose parameters have the same names, shapes and dtypes (another dtype, dropout rate or
    attention implementation) draw the same values (Flax derives each parameter's key from its
    path): one init for them all, shared (tests never change the arrays)."""
    model = Transformer(ModelConfig(**{**SMALL, **overrides}))
    tokens = jnp.ones((1, 4), jnp.int32)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), tokens, tokens)["params"]
    key = (jax.tree_util.tree_structure(shapes), tuple(jax.tree_util.tree_leaves(shapes)))
    if key not in _DRAWN:
        _DRAWN[key] = _init(model)
    return model, _DRAWN[key]


@functools.partial(jit, static_argnums=0)
def _init(model):
    tokens = jnp.ones((1, 4), jnp.int32)
    return nn.meta.unbox(model.init(jax.random.PRNGKey(0), tokens, tokens)["params"])


@functools.partial(jit, static_argnums=0, static_argnames="method")
def forward(model, params, *inputs, method=None):
    """model.apply, compiled once per model, shapes and method and shared by the tests (op by
    op, every test would compile each small operation of its own shapes). The same program
    for inputs of the same shapes: where a test compares two calls for exact equality, both
    run the same float32 operations, as before."""
    return model.apply({"params": params}, *inputs, **({"method": method} if method else {}))


def random_tokens(seed, shape, low=4, high=40):
    return jnp.array(np.random.default_rng(seed).integers(low, high, shape), jnp.int32)


def test_shift_right_puts_bos_first():
    t = jnp.array([[5, 6, 7, EOS_ID, 0]])
    np.testing.assert_array_equal(shift_right(t), [[BOS_ID, 5, 6, 7, EOS_ID]])
    pos = jnp.array([[0, 1, 0, 1, 2]])
    np.testing.assert_array_equal(
        shift_right(jnp.array([[5, 6, 8, 9, 10]]), pos), [[BOS_ID, 5, BOS_ID, 8, 9]]
    )


@pytest.mark.parametrize("pre_ln", [False, True])
def test_decoder_is_causal(pre_ln):
    model, params = make(pre_ln=pre_ln)
    src = random_tokens(0, (2, 6))
    tgt = random_tokens(1, (2, 7))
    logits = forward(model, params, src, tgt)
    for t in (0, 3, 5):
        changed = tgt.at[:, t + 1 :].set(random_tokens(2, (2, 7 - t - 1)))
        other = forward(model, params, src, changed)
        # Exact: the changed keys get weight exp(finfo.min - max) = 0 and the shapes are the
        # same, so the same float32 operations run on the same values (observed: 0 difference).
        np.testing.assert_array_equal(logits[:, : t + 1], other[:, : t + 1])
        if t + 2 < tgt.shape[1]:  # later positions do see the change, by far more than rounding
            # rounding bound <= 1.8e-3; observed max differences >= 0.84 (seeds 0-4)
            assert not np.allclose(logits[:, t + 2 :], other[:, t + 2 :], rtol=0, atol=LOGITS_ATOL)


def test_source_padding_does_not_change_outputs():
    model, params = make()
    src = random_tokens(3, (2, 5))
    tgt = random_tokens(4, (2, 6))
    padded = jnp.pad(src, ((0, 0), (0, 4)))
    a = forward(model, params, src, tgt)
    b = forward(model, params, padded, tgt)
    # bound (see LOGITS_ATOL) <= 1.6e-3; observed <= 1.4e-6 (seeds 0-4, 1 and 2 threads, 8 devices)
    np.testing.assert_allclose(a, b, atol=LOGITS_ATOL)
    enc_a = forward(model, params, src, method=Transformer.encode)
    enc_b = forward(model, params, padded, method=Transformer.encode)
    # bound <= 4.4e-4; observed <= 7.2e-7 (same runs)
    np.testing.assert_allclose(enc_a, enc_b[:, :5], atol=ENCODER_ATOL)


def test_target_padding_does_not_change_real_positions():
    model, params = make()
    src, tgt = random_tokens(5, (1, 5)), random_tokens(6, (1, 4))
    a = forward(model, params, src, tgt)
    b = forward(model, params, src, jnp.pad(tgt, ((0, 0), (0, 3))))
    # bound (see LOGITS_ATOL) <= 1.7e-3; observed <= 8.4e-7 (seeds 0-4, 1 and 2 threads, 8 devices)
    np.testing.assert_allclose(a, b[:, :4], atol=LOGITS_ATOL)


@pytest.mark.parametrize("positional", ["none", "sinusoidal"])
def test_encoder_permutation_equivariance_depends_on_positions(positional, monkeypatch):
    if positional == "none":
        import tx.model.transformer as txm

        monkeypatch.setattr(txm.PositionEmbedding, "__call__", lambda self, x, positions: x)
    model, params = make()
    src = random_tokens(7, (1, 6))
    perm = np.array([3, 0, 5, 1, 4, 2])
    enc = model.apply({"params": params}, src, method=Transformer.encode)
    enc_p = model.apply({"params": params}, src[:, perm], method=Transformer.encode)
    # Without positions: rounding bound <= 3.7e-4, observed <= 7.2e-7. With sinusoidal positions
    # the largest difference is >= 0.96 (seeds 0-4, 1 and 2 threads, 8 devices).
    equivariant = np.allclose(
        np.asarray(enc)[:, perm], np.asarray(enc_p), rtol=0, atol=ENCODER_ATOL
    )
    assert equivariant == (positional == "none")


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"pre_ln": True},
        {"positional": "learned"},
        {"d_k": 3, "d_v": 5},
        {"share_embeddings": False},
    ],
)
def test_cached_decoding_matches_full_forward(overrides):
    model, params = make(**overrides)
    src = random_tokens(8, (2, 5)).at[1, 3:].set(0)  # second sentence padded
    tgt = random_tokens(9, (2, 6))
    full, steps = _full_and_cached(model, params, src, tgt)
    for t in range(6):
        # bound (see LOGITS_ATOL) <= 1.4e-3 for all five configurations; observed <= 1.2e-6
        # (seeds 0-4, 1 and 2 threads, 8 devices)
        np.testing.assert_allclose(steps[:, t], full[:, t], atol=LOGITS_ATOL, err_msg=f"step {t}")


@functools.partial(jit, static_argnums=0)
def _full_and_cached(model, params, src, tgt):
    """(teacher-forced logits [b, t, V] of `tgt`, the logits [b, t, V] of the cached decoder fed
    BOS and then `tgt` one token a step): one program for both and the t steps (a scan of the
    decoder's step, as a search runs it)."""
    full = model.apply({"params": params}, src, tgt)
    tokens_to_logits, cache, _ = incremental_decoder(model, params, src, width=1, max_len=6)
    prev = jnp.concatenate([jnp.full((tgt.shape[0], 1), BOS_ID, tgt.dtype), tgt[:, :-1]], 1)

    def step(cache, ids):  # ids [b]
        logits, cache = tokens_to_logits(ids[:, None], cache)
        return cache, logits

    _, steps = jax.lax.scan(step, cache, prev.T)  # [t, b, V]
    return full, steps.swapaxes(0, 1)


def test_weight_tying_is_one_array_with_gradients_from_all_three_uses():
    model, params = make()
    assert set(params) == {"shared_embedding", "encoder", "decoder"}
    emb = params["shared_embedding"]["embedding"]
    assert emb.shape == (40, 16)
    src, tgt = random_tokens(10, (1, 4), 4, 10), random_tokens(11, (1, 4), 10, 20)

    def loss(e, which):
        p = {**params, "shared_embedding": {"embedding": e}}
        logits = model.apply({"params": p}, src, tgt)
        return {"all": logits.sum(), "softmax": logits[..., 30:].sum()}[which]

    @jit  # both gradients in one program (op by op, each operation compiled its own)
    def gradients(e):
        return jax.grad(lambda e: loss(e, "all"))(e), jax.grad(lambda e: loss(e, "softmax"))(e)

    g, g_softmax = map(np.asarray, gradients(emb))
    used_src = np.unique(np.asarray(src))
    used_tgt = np.unique(np.asarray(shift_right(tgt)))
    assert np.abs(g[used_src]).sum(-1).min() > 0  # source embedding
    assert np.abs(g[used_tgt]).sum(-1).min() > 0  # target embedding
    unused = np.setdiff1d(np.arange(30, 40), np.concatenate([used_src, used_tgt]))
    assert np.abs(g_softmax[unused]).sum(-1).min() > 0  # pre-softmax projection only


def test_untied_embeddings_are_three_matrices():
    _, params = make(share_embeddings=False)
    assert {"source_embedding", "target_embedding", "softmax"} <= set(params)


def test_packed_rows_equal_separate_rows():
    model, params = make()
    a_src, a_tgt = random_tokens(12, (1, 3)), random_tokens(13, (1, 4))
    b_src, b_tgt = random_tokens(14, (1, 4)), random_tokens(15, (1, 2))
    src = jnp.concatenate([a_src, b_src, jnp.zeros((1, 1), jnp.int32)], 1)
    tgt = jnp.concatenate([a_tgt, b_tgt, jnp.zeros((1, 2), jnp.int32)], 1)
    src_seg = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]])
    tgt_seg = jnp.array([[1, 1, 1, 1, 2, 2, 0, 0]])
    src_pos = jnp.array([[0, 1, 2, 0, 1, 2, 3, 0]])
    tgt_pos = jnp.array([[0, 1, 2, 3, 0, 1, 0, 0]])
    packed = forward(model, params, src, tgt, src_seg, tgt_seg, src_pos, tgt_pos)
    a = forward(model, params, a_src, a_tgt)
    b = forward(model, params, b_src, b_tgt)
    # bound (see LOGITS_ATOL) <= 1.3e-3; observed <= 1.1e-6 (seeds 0-4, 1 and 2 threads, 8 devices)
    np.testing.assert_allclose(packed[:, :4], a, atol=LOGITS_ATOL)
    np.testing.assert_allclose(packed[:, 4:6], b, atol=LOGITS_ATOL)


def test_bfloat16_compute_keeps_float32_params_and_its_logits_are_float32_products():
    """A bf16 model's parameters are float32, and its pre-softmax projection accumulates into
    float32, never rounded to bf16.

    Comparing the bf16 model's log-softmax with the float32 model's is too loose to show this:
    the bf16 layers dominate (max |delta log p| 0.019-0.043 per token over seeds 0-3, both before
    and after the fix, not always smaller after). So the logits are checked against the float64
    product of the hidden state that `attend` received and the bf16-rounded embedding, within
    the float32 accumulation bound K u sum_i |y_i e_i| derived in tests/test_layers.py.
    Observed over seeds 0-4: <= 1.18 u S (bound K = 16); old bf16-rounded logits: 3.6e4-4.3e4 u S.
    """
    model, params = make(dtype="bfloat16")
    tokens = jnp.ones((1, 4), jnp.int32)
    drawn = jax.eval_shape(model.init, jax.random.PRNGKey(0), tokens, tokens)["params"]
    assert all(p.dtype == jnp.float32 for p in jax.tree_util.tree_leaves(drawn))

    @jit
    def logits_and_hidden(params, src, tgt):
        hidden = []

        def record_attend_input(next_fun, args, kwargs, context):
            if context.method_name == "attend":
                hidden.append(args[0])
            return next_fun(*args, **kwargs)

        with nn.intercept_methods(record_attend_input):
            return model.apply({"params": params}, src, tgt), hidden

    logits, hidden = logits_and_hidden(params, random_tokens(0, (2, 5)), random_tokens(1, (2, 6)))
    assert logits.dtype == jnp.float32 and len(hidden) == 1 and hidden[0].dtype == jnp.bfloat16
    y = np.asarray(hidden[0].astype(jnp.float32), np.float64)  # [b, t, m]
    emb = jnp.asarray(params["shared_embedding"]["embedding"], jnp.bfloat16)
    e = np.asarray(emb.astype(jnp.float32), np.float64)  # [V, m]
    exact = y @ e.T
    bound = SMALL["d_model"] * 2.0**-24 * (np.abs(y) @ np.abs(e).T)
    err = np.abs(np.asarray(logits, np.float64) - exact)
    assert np.all(err <= bound), (err / bound).max()
    old = jnp.einsum("blm,Vm->blV", hidden[0], emb).astype(jnp.float32)
    assert np.any(np.abs(np.asarray(old, np.float64) - exact) > bound)  # the check can fail


def test_every_parameter_has_logical_axis_names():
    cfg = ModelConfig(**SMALL)
    tokens = jnp.ones((1, 4), jnp.int32)
    # Shapes only (jax.eval_shape): the boxes and their names are what init returns.
    boxed = jax.eval_shape(Transformer(cfg).init, jax.random.PRNGKey(0), tokens, tokens)["params"]
    leaves = jax.tree_util.tree_leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert leaves and all(isinstance(x, nn.LogicallyPartitioned) for x in leaves)
    assert all(len(x.names) == x.value.ndim for x in leaves)


def test_dropout_is_active_only_in_training():
    model, params = make(dropout_rate=0.5)
    src, tgt = random_tokens(0, (1, 5)), random_tokens(1, (1, 5))
    det = forward(model, params, src, tgt)
    # Exact: the same computation twice (observed: 0 difference).
    np.testing.assert_array_equal(det, forward(model, params, src, tgt))

    @jit  # one program for both masks
    def training(params, rng):
        return model.apply({"params": params}, src, tgt, deterministic=False, rngs={"dropout": rng})

    a = training(params, jax.random.PRNGKey(1))
    b = training(params, jax.random.PRNGKey(2))
    # Other dropout masks: max differences >= 3.0 (seeds 0-4), far above the rounding bound.
    assert not np.allclose(a, b, rtol=0, atol=LOGITS_ATOL)


@pytest.mark.parametrize("packed", [False, True])
def test_attention_implementations_compute_the_same_model(packed):
    """attention_impl "xla" (jax.nn.dot_product_attention; lengths for unpacked rows) and
    "explicit" (the weights formed in tx.model.kernels) on the same parameters: the same function
    with reductions in another order, so within LOGITS_ATOL (observed 0 on a CPU: seeds 0-4,
    2 threads and taskset -c 0)."""
    model, params = make(attention_impl="explicit")
    fused = Transformer(ModelConfig(**{**SMALL, "attention_impl": "xla"}))
    src = random_tokens(20, (2, 7)).at[1, 4:].set(0)
    tgt = random_tokens(21, (2, 6)).at[0, 3:].set(0)
    extra = ()
    if packed:
        extra = (
            jnp.array([[1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 0, 0, 0]]),
            jnp.array([[1, 1, 2, 0, 0, 0], [1, 1, 1, 1, 1, 1]]),
            jnp.array([[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 0, 0, 0]]),
            jnp.array([[0, 1, 0, 0, 0, 0], [0, 1, 2, 3, 4, 5]]),
        )
    want = forward(model, params, src, tgt, *extra)
    got = forward(fused, params, src, tgt, *extra)
    real = np.asarray(tgt != 0)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=LOGITS_ATOL)


@pytest.mark.parametrize("packed", [False, True])
def test_splash_attention_computes_the_same_model(packed, monkeypatch):
    """attention_impl "splash" (the Pallas kernel, here in its interpreter) on rows of 128, the
    lengths its blocks tile, against "explicit": every attention of the model (encoder,
    causal decoder, cross) goes through the kernel, and the logits agree within LOGITS_ATOL
    (the same sums in another order; passed with 2 threads and under taskset -c 0, one seed)."""
    import tx.model.splash

    calls = []
    run = tx.model.splash.splash_attention
    monkeypatch.setattr(
        tx.model.splash, "splash_attention", lambda *a, **k: calls.append(1) or run(*a, **k)
    )
    model, params = make(attention_impl="explicit")
    kernel = Transformer(ModelConfig(**{**SMALL, "attention_impl": "splash"}))
    src = random_tokens(30, (2, 128)).at[1, 100:].set(0)
    tgt = random_tokens(31, (2, 128)).at[0, 90:].set(0)
    extra = ()
    if packed:
        src_seg = np.ones((2, 128), np.int32)
        src_seg[:, 60:], src_seg[1, 100:] = 2, 0
        tgt_seg = np.ones((2, 128), np.int32)
        tgt_seg[:, 50:], tgt_seg[0, 90:] = 2, 0

        def positions(seg):  # each pair's positions count from 0
            start = np.argmax(seg == 2, axis=1)[:, None]
            return np.where(seg == 2, np.arange(128) - start, np.arange(128)) * (seg > 0)

        extra = tuple(
            jnp.asarray(x) for x in (src_seg, tgt_seg, positions(src_seg), positions(tgt_seg))
        )
    want = model.apply({"params": params}, src, tgt, *extra)
    got = kernel.apply({"params": params}, src, tgt, *extra)
    assert len(calls) == 3 * SMALL["num_layers"]  # encoder self, decoder self and cross
    real = np.asarray(tgt != 0)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=LOGITS_ATOL)


def test_padded_vocabulary_is_the_same_model():
    """vocab_multiple=128 adds zero rows to the embedding (the real rows are drawn as without
    them): the logits are the unpadded model's (to the order of summation), the padding rows
    get no gradient from the fused loss, and the counted parameters do not include them."""
    from tx.model.counting import param_counts
    from tx.train.losses import chunked_cross_entropy

    model, params = make()
    padded, padded_params = make(vocab_multiple=128)
    emb, padded_emb = (
        params["shared_embedding"]["embedding"],
        padded_params["shared_embedding"]["embedding"],
    )
    assert padded_emb.shape == (128, 16)
    np.testing.assert_array_equal(padded_emb[:40], emb)
    assert not np.asarray(padded_emb[40:]).any()
    src, tgt = random_tokens(22, (2, 5)), random_tokens(23, (2, 6))
    # The same dot products, but a wider matrix product may block (and so sum) them in another
    # order: within LOGITS_ATOL (observed 3.6e-7; the rest of the model is the same arithmetic).
    np.testing.assert_allclose(
        forward(padded, padded_params, src, tgt),
        forward(model, params, src, tgt),
        atol=LOGITS_ATOL,
    )

    def loss(p):
        states, head = padded.apply({"params": p}, src, tgt, method="features")
        weights = jnp.ones(tgt.shape)
        return chunked_cross_entropy(
            states, head, tgt, weights, label_smoothing=0.1, vocab_size=40
        )["loss"]

    grad = jit(jax.grad(loss))(padded_params)["shared_embedding"]["embedding"]
    assert np.asarray(grad[:40]).any() and not np.asarray(grad[40:]).any()
    assert param_counts(padded.config) == param_counts(model.config)
