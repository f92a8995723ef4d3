import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.train.losses import (
    CPU_CHUNK_BYTES,
    chunk_tokens,
    chunked_cross_entropy,
    chunks_for,
    cross_entropy,
    smoothed_targets_entropy,
)


def brute_force(logits, targets, weights, eps):
    V = logits.shape[-1]
    total, nll = 0.0, 0.0
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            if weights[b, t] == 0:
                continue
            z = logits[b, t]
            logp = z - np.log(np.exp(z - z.max()).sum()) - z.max()
            q = np.full(V, eps / (V - 1))
            q[targets[b, t]] = 1 - eps
            ent = -(q[q > 0] * np.log(q[q > 0])).sum()
            total += -(q * logp).sum() - ent  # KL(q || p)
            nll += -logp[targets[b, t]]
    return total, nll


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.2])
def test_label_smoothed_loss_equals_brute_force(eps):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 7)) * 3
    targets = rng.integers(0, 7, (2, 5))
    weights = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.float32)
    out = cross_entropy(jnp.array(logits), jnp.array(targets), jnp.array(weights), eps)
    loss, nll = brute_force(logits, targets, weights, eps)
    # Bound (first order, against the float64 brute force): float32 rounding of the logits, then
    # log_softmax (4 ulp per exp/log, 7 u sum|exp| for the sum over V = 7), the smoothed
    # combination and the sum over 10 positions (10 u sum|terms|), propagated through the
    # Jacobian: <= 1.8e-6 relative for the loss and <= 1.2e-6 for the NLL (eps 0, 0.1, 0.2;
    # seeds 0-4). Observed: <= 8.9e-8 and <= 7.7e-8 (seeds 0-4, 1 and 2 threads, 8 devices).
    np.testing.assert_allclose(float(out["loss"]), loss, rtol=3e-6)
    np.testing.assert_allclose(float(out["nll"]), nll, rtol=3e-6)
    assert float(out["weight"]) == 8.0
    correct = ((logits.argmax(-1) == targets) * weights).sum()
    assert float(out["correct"]) == correct


def test_perfect_smoothed_prediction_scores_zero():
    eps, V = 0.1, 6
    q = np.full((1, 1, V), eps / (V - 1))
    q[0, 0, 2] = 1 - eps
    out = cross_entropy(jnp.log(jnp.array(q)), jnp.array([[2]]), jnp.ones((1, 1)), eps)
    # Bounds as above, with logits = float32 log(q): the loss (0 in exact arithmetic) is within
    # 1.2e-6 of 0. The NLL is log(s) = 0.105 with s = sum_v exp(z_v - z_max) = 1.11; the sum of
    # six exps (6 u s), exp(0) and log(0.02) = -3.9 to 4 ulp make up to 1.2e-6 absolute error,
    # 1.1e-5 relative. Observed: 3.0e-8 and 4.9e-7 (1 and 2 threads, 8 devices).
    assert abs(float(out["loss"])) < 2e-6
    assert float(out["nll"]) == pytest.approx(-np.log(1 - eps), rel=2e-5)


def test_smoothed_entropy_value():
    V, eps = 4, 0.3
    expected = -(0.7 * np.log(0.7) + 3 * 0.1 * np.log(0.1))
    # Both float64, no cancellation: a few roundings and two logs, ~2e-15 relative; observed 0
    assert smoothed_targets_entropy(V, eps) == pytest.approx(expected, rel=1e-14)


def _hidden_head_targets(dtype, vocab=50, rows=128, seed=0):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(3, 7, 16)), dtype)
    head = np.zeros((rows, 16))
    head[:vocab] = rng.normal(size=(vocab, 16))
    targets = jnp.asarray(rng.integers(1, vocab, (3, 7))).at[0, 5:].set(0)
    return hidden, jnp.asarray(head, dtype), targets, (targets != 0).astype(dtype)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunks", [1, 3, 7])
def test_chunked_loss_and_gradient_equal_the_plain_loss(eps, chunks):
    """In float64 the fused loss (gradient formed in the forward pass, length axis in pieces,
    vocabulary padded from 50 to 128 rows) equals cross_entropy on the unpadded logits to
    summation-order rounding (observed <= 3e-14), and the padding rows get no gradient."""
    with jax.enable_x64(True):
        hidden, head, targets, weights = _hidden_head_targets(jnp.float64)

        def plain(h, e):
            logits = jnp.einsum("btm,Vm->btV", h, e[:50])
            return cross_entropy(logits, targets, weights, eps)

        def fused(h, e):
            return chunked_cross_entropy(
                h, e, targets, weights, label_smoothing=eps, vocab_size=50, chunks=chunks
            )

        want, got = plain(hidden, head), fused(hidden, head)
        for key in want:
            assert float(got[key]) == pytest.approx(float(want[key]), rel=1e-12, abs=1e-12)
        g_want = jax.grad(lambda h, e: plain(h, e)["loss"], (0, 1))(hidden, head)
        g_got = jax.grad(lambda h, e: fused(h, e)["loss"], (0, 1))(hidden, head)
        for a, b in zip(g_got, g_want, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-11, atol=1e-13)
        assert not np.asarray(g_got[1][50:]).any()


def test_chunked_loss_in_float32_is_the_plain_loss_to_rounding():
    """float32: 21 tokens x a 50-way log-softmax, each term rounded to 2^-24 relative: the
    sums agree to a few 1e-6 relative (observed 1e-7), the gradients to a few ulps."""
    hidden, head, targets, weights = _hidden_head_targets(jnp.float32)
    logits = jnp.einsum("btm,Vm->btV", hidden, head[:50])
    want = cross_entropy(logits, targets, weights, 0.1)
    got = chunked_cross_entropy(
        hidden, head, targets, weights, label_smoothing=0.1, vocab_size=50, chunks=3
    )
    for key in want:
        assert float(got[key]) == pytest.approx(float(want[key]), rel=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chunked_loss_in_bfloat16_rounds_only_the_logits(seed):
    """bf16 states: the logits are written in bf16 (half the bytes of the largest array of a
    TPU step) and every sum taken in float32. Against the float32 loss of the same bf16 inputs
    the error is the logits' rounding, |d z_v| <= u |z_v| with u = 2^-9: per token the smoothed
    loss moves by at most 2 u max|z| (1 + eps) (the target logit and the log-sum-exp, and the
    eps-weighted sum of log p), the NLL by 2 u max|z|. d hidden: p_v moves by a factor within
    exp(+-2 u max|z|), and d logits and d hidden are rounded to bf16 (u each): per entry at most
    max|head| (exp(2 u max|z|) - 1 + 2 u) + u |d hidden|. Observed (seeds 0-2, 2 threads and
    taskset -c 0 alike): loss and NLL within 3% of their bounds, d hidden within 10%."""
    hidden, head, targets, weights = _hidden_head_targets(jnp.float32, seed=seed)
    hidden = (3 * hidden).astype(jnp.bfloat16)  # logits of a few tens, as in a trained model
    head = head.astype(jnp.bfloat16)
    h32, e32 = hidden.astype(jnp.float32), head[:50].astype(jnp.float32)

    def plain(h):
        return cross_entropy(jnp.einsum("btm,Vm->btV", h, e32), targets, weights, 0.1)

    def fused(h):
        return chunked_cross_entropy(
            h, head, targets, weights, label_smoothing=0.1, vocab_size=50, chunks=3
        )

    u = 2.0**-9
    top = float(jnp.max(jnp.abs(jnp.einsum("btm,Vm->btV", h32, e32))))
    tokens = float(weights.sum())
    want, got = plain(h32), fused(hidden)
    assert abs(float(got["loss"] - want["loss"])) <= tokens * 2 * u * top * 1.1
    assert abs(float(got["nll"] - want["nll"])) <= tokens * 2 * u * top
    d_want = np.asarray(jax.grad(lambda h: plain(h)["loss"])(h32))
    d_got = np.asarray(jax.grad(lambda h: fused(h)["loss"])(hidden).astype(jnp.float32))
    bound = float(jnp.max(jnp.abs(e32))) * (np.expm1(2 * u * top) + 2 * u) + u * np.abs(d_want)
    assert np.all(np.abs(d_got - d_want) <= bound)


def test_chunks_cover_the_length_axis():
    assert chunks_for(32 * 64, 64, 8192) == 1
    assert chunks_for(64 * 256, 256, 8192) == 2
    assert chunks_for(1000 * 8, 8, 100) == 8  # never more pieces than positions
    assert chunks_for(123, 9, 0) == 1  # 0: one piece


def test_chunk_size_per_platform():
    assert chunk_tokens(512, 32000, "cpu") == 512  # an explicit size is kept
    assert chunk_tokens(0, 32000, "gpu") == 0  # 0: the plain loss everywhere
    cpu = chunk_tokens(-1, 32000, "cpu")
    assert cpu * 32000 * 4 <= CPU_CHUNK_BYTES < (cpu + 1) * 32000 * 4
    assert chunk_tokens(-1, 10**9, "cpu") == 1  # never an empty piece
    assert chunk_tokens(-1, 32000, "gpu") == chunk_tokens(-1, 32000, "tpu") >= 4096


def brute_force_unlikelihood(logits, targets, weights, segments):
    """-sum log(1 - p(c)) over each real position's candidates: the distinct real tokens earlier
    in the same sentence, less the one due there (Welleck et al. 2020, section 5.1)."""
    total = 0.0
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            if weights[b, t] == 0:
                continue
            z = logits[b, t]
            p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
            earlier = {
                int(targets[b, s])
                for s in range(t)
                if segments[b, s] == segments[b, t] and weights[b, s] > 0
            }
            total += -sum(np.log(1 - p[c]) for c in earlier - {int(targets[b, t])})
    return total


def _packed_rows(seed, vocab=6):
    """Two rows of 9: the first packs three sentences, the second one and padding; a small
    vocabulary so that tokens repeat within sentences and across them."""
    rng = np.random.default_rng(seed)
    targets = rng.integers(1, vocab, (2, 9))
    targets[1, 6:] = 0
    segments = np.array([[1, 1, 1, 2, 2, 2, 2, 3, 3], [1, 1, 1, 1, 1, 1, 0, 0, 0]])
    return targets, (targets != 0).astype(np.float32), segments


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unlikelihood_equals_brute_force(seed):
    targets, weights, segments = _packed_rows(seed)
    logits = np.random.default_rng(seed + 10).normal(size=(2, 9, 6)) * 3
    with jax.enable_x64(True):
        args = (jnp.array(logits), jnp.array(targets), jnp.array(weights), 0.1)
        out = cross_entropy(*args, unlikelihood=0.5, segments=jnp.array(segments))
        plain = cross_entropy(*args)
    want = brute_force_unlikelihood(logits, targets, weights, segments)
    # float64 against float64, a few dozen terms: rounding only (observed <= 4e-16 relative).
    assert float(out["unlikelihood"]) == pytest.approx(want, rel=1e-12)
    assert float(out["objective"]) == pytest.approx(float(plain["loss"]) + 0.5 * want, rel=1e-12)
    assert float(out["loss"]) == float(plain["loss"])  # the loss reported stays the paper's
    assert "objective" not in plain and "unlikelihood" not in plain


def test_unlikelihood_keeps_packed_sentences_apart():
    """A token of the sentence before, in the same packed row, is no candidate."""
    targets = np.array([[3, 4, 5, 3, 2]])
    weights = np.ones((1, 5), np.float32)
    segments = np.array([[1, 1, 1, 2, 2]])
    logits = np.zeros((1, 5, 6))
    logits[0, 3, 4] = logits[0, 4, 4] = 8.0  # "4" likely where the second sentence starts
    with jax.enable_x64(True):
        out = cross_entropy(
            jnp.array(logits),
            jnp.array(targets),
            jnp.array(weights),
            0.0,
            unlikelihood=1.0,
            segments=jnp.array(segments),
        )
        one_row = cross_entropy(
            jnp.array(logits), jnp.array(targets), jnp.array(weights), 0.0, unlikelihood=1.0
        )
    assert float(out["unlikelihood"]) == pytest.approx(
        brute_force_unlikelihood(logits, targets, weights, segments), rel=1e-12
    )
    # As one sentence, "4" (p = 0.98 at positions 3 and 4) is a candidate there: a large term.
    assert float(one_row["unlikelihood"]) > float(out["unlikelihood"]) + 7.0


@pytest.mark.parametrize("chunks", [1, 3, 9])
@pytest.mark.parametrize("packed", [False, True])
def test_chunked_unlikelihood_and_gradient_equal_the_plain_one(chunks, packed):
    """The fused loss forms the unlikelihood's gradient in its forward pass (a scatter into
    the candidates' columns and a rescaled softmax): in float64 it equals autodiff of the
    plain one to summation-order rounding, and the vocabulary's padding rows get none."""
    targets, weights, segments = _packed_rows(3, vocab=8)
    segments = jnp.asarray(segments) if packed else None
    rng = np.random.default_rng(4)
    with jax.enable_x64(True):
        head = np.zeros((128, 16))
        head[:50] = rng.normal(size=(50, 16))
        # A model that stutters: each state points at the token before it, so that candidates
        # carry much of the probability (p up to ~1) and their gradient terms count.
        before = np.concatenate([targets[:, :1], targets[:, :-1]], axis=1)
        hidden = jnp.asarray(0.8 * head[before] + 0.3 * rng.normal(size=(2, 9, 16)))
        head = jnp.asarray(head)
        targets, weights = jnp.asarray(targets), jnp.asarray(weights, jnp.float64)
        kw = dict(unlikelihood=0.7, segments=segments)

        def plain(h, e):
            logits = jnp.einsum("btm,Vm->btV", h, e[:50])
            return cross_entropy(logits, targets, weights, 0.1, **kw)

        def fused(h, e):
            return chunked_cross_entropy(
                h, e, targets, weights, label_smoothing=0.1, vocab_size=50, chunks=chunks, **kw
            )

        want, got = plain(hidden, head), fused(hidden, head)
        assert set(got) == set(want)
        for key in want:
            assert float(got[key]) == pytest.approx(float(want[key]), rel=1e-12, abs=1e-12)
        assert float(want["unlikelihood"]) > 1.0  # candidates were there to push down
        g_want = jax.grad(lambda h, e: plain(h, e)["objective"], (0, 1))(hidden, head)
        g_got = jax.grad(lambda h, e: fused(h, e)["objective"], (0, 1))(hidden, head)
        for a, b in zip(g_got, g_want, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-11, atol=1e-13)
        assert not np.asarray(g_got[1][50:]).any()
        # The reported loss sends no gradient when the objective is another sum.
        g_loss = jax.grad(lambda h: fused(h, head)["loss"])(hidden)
        assert not np.asarray(g_loss).any()
