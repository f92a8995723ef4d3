"""Search: beam against exhaustive search and greedy decoding; sampling against the model's
distribution; the KV cache and its reordering; max length; strategy selection."""

import functools
import itertools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import search_reference  # tests/search_reference.py, beside this file
from flax import linen as nn

from tx.infer.decoders import decoder as family_decoder
from tx.infer.search import (
    NEG,
    STRATEGIES,
    Decoder,
    Strategy,
    beam_search,
    greedy_search,
    length_penalty,
    log_probs,
    sample_search,
    top_log_probs,
    windows,
)
from tx.infer.topk import top_k as search_top_k
from tx.model.transformer import Transformer
from tx.model.transformer_config import ModelConfig
from tx.model.transformer_decoding import incremental_decoder, init_cache
from tx.tokens import BOS_ID, EOS_ID

V = 6  # pad, eos, unk, bos + two word tokens: emittable = {eos, unk, 4, 5}
EMITTABLE = [EOS_ID, 2, 4, 5]


def tiny_model(seed=0, vocab=V):
    cfg = ModelConfig(
        vocab_size=vocab, d_model=16, num_heads=2, d_ff=32, num_layers=1, dropout_rate=0.0
    )
    model = Transformer(cfg)
    tokens = jnp.ones((1, 3), jnp.int32)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(seed), tokens, tokens)["params"])
    # Sharpen the output distribution so that search choices matter.
    params["shared_embedding"]["embedding"] *= 6.0
    return model, params


def decode_fns(model, params, inputs, width):
    """steps -> the model's Decoder for `inputs` with `width` rows per sentence."""
    return lambda steps: family_decoder(model, params, inputs, width, steps)


@functools.partial(jax.jit, static_argnums=0)
def _teacher_forced(model, params, inputs, tgt):
    """[1, T] targets -> [1, T, V] log-probabilities; jitted once per length (eager Flax took
    most of the exhaustive test's 37 s)."""
    return log_probs(model.apply({"params": params}, inputs, tgt))


def full_score(model, params, inputs, seq, alpha):
    """Length-penalised log-probability of `seq` (ending in EOS) by one teacher-forced pass."""
    lp = np.asarray(_teacher_forced(model, params, inputs, jnp.array([seq], jnp.int32)))[0]
    total = float(sum(lp[t, tok] for t, tok in enumerate(seq)))
    return total / float(length_penalty(len(seq), alpha))


@pytest.mark.parametrize("seed,alpha", [(0, 0.6), (1, 0.6), (2, 0.0), (3, 1.0)])
def test_wide_beam_equals_exhaustive_search(seed, alpha):
    model, params = tiny_model(seed)
    inputs = jnp.array([[4, 5, EOS_ID]], jnp.int32)
    max_len = 3  # at most 3 tokens before EOS: 1 + 3 + 9 + 27 = 40 sequences
    words = [t for t in EMITTABLE if t != EOS_ID]
    candidates = [
        list(p) + [EOS_ID] for n in range(max_len + 1) for p in itertools.product(words, repeat=n)
    ]
    scores = [full_score(model, params, inputs, c, alpha) for c in candidates]
    best = candidates[int(np.argmax(scores))]
    beam = 64
    make = decode_fns(model, params, inputs, beam)
    seqs, got = beam_search(
        make(max_len + 1),
        jnp.array([max_len]),
        beam_size=beam,
        alpha=alpha,
        max_steps=max_len + 1,
    )
    top = list(np.asarray(seqs[0, 0]))
    assert top[: len(best)] == best
    assert float(got[0, 0]) == pytest.approx(max(scores), abs=1e-4)
    # The returned n-best list is sorted and its scores are the true scores.
    for j in range(5):
        seq = list(np.asarray(seqs[0, j]))
        seq = seq[: seq.index(EOS_ID) + 1]
        assert float(got[0, j]) == pytest.approx(
            full_score(model, params, inputs, seq, alpha), abs=1e-4
        )
    assert (np.diff(np.asarray(got[0])) <= 1e-6).all()


def test_beam_one_without_length_penalty_is_greedy():
    model, params = tiny_model(4, vocab=12)
    inputs = jnp.array([[4, 7, 9, 5, EOS_ID], [6, 8, EOS_ID, 0, 0]], jnp.int32)
    max_lengths = jnp.array([4 + 5, 2 + 5])
    make = decode_fns(model, params, inputs, 1)
    beam_seqs, _ = beam_search(make(10), max_lengths, beam_size=1, alpha=0.0, max_steps=10)
    greedy, _ = greedy_search(make(10), max_lengths, max_steps=10)
    np.testing.assert_array_equal(np.asarray(beam_seqs[:, 0]), np.asarray(greedy))


def test_cached_scores_equal_full_forward_scores():
    model, params = tiny_model(5, vocab=12)
    inputs = jnp.array([[4, 7, 9, EOS_ID]], jnp.int32)
    make = decode_fns(model, params, inputs, 4)
    seqs, scores = beam_search(make(8), jnp.array([7]), beam_size=4, alpha=0.6, max_steps=8)
    for j in range(4):
        seq = list(np.asarray(seqs[0, j]))
        seq = seq[: seq.index(EOS_ID) + 1]
        assert float(scores[0, j]) == pytest.approx(
            full_score(model, params, inputs, seq, 0.6), abs=1e-4
        )


def test_output_never_exceeds_input_plus_extra():
    model, params = tiny_model(6, vocab=12)
    # Push EOS far down so every hypothesis runs to its maximum length.
    params["shared_embedding"]["embedding"] = (
        params["shared_embedding"]["embedding"].at[EOS_ID].set(-5.0)
    )
    inputs = jnp.array([[4, 5, 6, EOS_ID], [7, EOS_ID, 0, 0]], jnp.int32)
    src_lens = np.array([3, 1])
    extra = 4
    max_lengths = jnp.array(src_lens + extra)
    make = decode_fns(model, params, inputs, 4)
    steps = 3 + extra + 1
    seqs, _ = beam_search(make(steps), max_lengths, beam_size=4, alpha=0.6, max_steps=steps)
    for b in range(2):
        for j in range(4):
            seq = list(np.asarray(seqs[b, j]))
            assert EOS_ID in seq
            assert seq.index(EOS_ID) <= src_lens[b] + extra
    assert list(np.asarray(seqs[1, 0])).index(EOS_ID) == src_lens[1] + extra


def test_length_penalty_formula():
    # float32 2^0.6: 0.6 rounded (0.3 u) and pow to 4 ulp (5.3 u), 3.4e-7; observed 9.1e-9
    assert float(length_penalty(7, 0.6)) == pytest.approx(((5 + 7) / 6) ** 0.6, rel=1e-6)
    assert float(length_penalty(3, 0.0)) == 1.0  # exact: x^0 = 1


def test_never_generates_pad_or_bos():
    lp = log_probs(jnp.zeros((1, 6)))
    assert float(lp[0, 0]) < -1e8 and float(lp[0, BOS_ID]) < -1e8
    # four exp(-log 4): log and exp to 4 ulp each (4.8e-7 + 4.8e-7 relative) and three additions
    # (1.8e-7), 1.2e-6; observed 0
    assert float(jnp.exp(lp).sum()) == pytest.approx(1.0, rel=2e-6)


def test_per_sentence_cross_attention_equals_a_copy_per_row():
    """The model keeps cross-attention keys/values once per sentence (its beams attend to one
    copy, and reorder_cache leaves them in place); a cache with a copy in every row, moved
    with its row by the search's default gather, gives the same hypotheses and scores."""
    model, params = tiny_model(7, vocab=12)
    inputs = jnp.array([[4, 7, 9, 5, EOS_ID], [6, 8, EOS_ID, 0, 0]], jnp.int32)
    t2l, cache, reorder = incremental_decoder(model, params, inputs, 4, 9)
    args = dict(beam_size=4, alpha=0.6, max_steps=9)
    own = beam_search(Decoder(t2l, cache, reorder), jnp.array([8, 6]), **args)

    rows = jnp.repeat(inputs, 4, axis=0)
    encoded = jnp.repeat(model.apply({"params": params}, inputs, method=Transformer.encode), 4, 0)

    def every_row(ids, c):
        logits, v = model.apply(
            {"params": params, "cache": c},
            encoded,
            rows,
            ids,
            method=Transformer.step,
            mutable=["cache"],
        )
        return logits[:, 0], v["cache"]

    copies = init_cache(model, params, encoded, rows, 9)
    assert copies["decoder"]["layer_0"]["cross_attention"]["static_key"].shape[0] == 8
    assert cache["decoder"]["layer_0"]["cross_attention"]["static_key"].shape[0] == 2
    every = beam_search(Decoder(every_row, copies), jnp.array([8, 6]), **args)
    np.testing.assert_array_equal(np.asarray(own[0]), np.asarray(every[0]))
    # The same products batched differently (one key copy per sentence or per row): logits
    # differ by reduction order only (LOGITS_ATOL of test_model.py bounds that at 2e-3 for a
    # larger model); a score sums <= 9 such log-probabilities. Observed <= 3.8e-6 (seeds 0-4,
    # 2 threads and taskset -c 0).
    np.testing.assert_allclose(np.asarray(own[1]), np.asarray(every[1]), atol=1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_first_step_on_one_row_per_sentence_equals_every_row(seed):
    """A Transformer's Decoder is rows_independent: beam search makes step 0 on one row per
    sentence, repeats its logits and copies its cache to the sentence's rows, and finds
    what the search over every row finds."""
    model, params = tiny_model(seed, vocab=300)
    inputs = jnp.array([[4, 7, 9, 5, EOS_ID], [6, 8, EOS_ID, 0, 0], [9, 9, 4, EOS_ID, 0]])
    own = family_decoder(model, params, inputs, 4, 9)
    assert own.rows_independent
    rows_seen = []

    def t2l(ids, c):
        rows_seen.append(ids.shape[0])  # at trace time: step 0, then each window's loop
        return own.tokens_to_logits(ids, c)

    args = dict(beam_size=4, alpha=0.6, max_steps=9)
    first = beam_search(own._replace(tokens_to_logits=t2l), jnp.array([8, 6, 5]), **args)
    assert rows_seen == [3] + [12] * len(windows(9))
    every = beam_search(own._replace(rows_independent=False), jnp.array([8, 6, 5]), **args)
    np.testing.assert_array_equal(np.asarray(first[0]), np.asarray(every[0]))
    # Step 0's products on 3 rows instead of 12: the same sums, possibly blocked differently
    # (as in the test above, atol 1e-4 for a score of <= 9 log-probabilities). Observed
    # <= 3.8e-6, the same hypotheses (seeds 0-4, 2 threads and taskset -c 0).
    np.testing.assert_allclose(np.asarray(first[1]), np.asarray(every[1]), atol=1e-4)


def test_search_module_knows_no_cache_names():
    import inspect

    import tx.infer.search

    source = inspect.getsource(tx.infer.search)
    for name in ("static_", "cached_key", "cached_value", "cache_index", "decode_position"):
        assert name not in source


def test_sampling_with_top_1_is_greedy():
    model, params = tiny_model(4, vocab=12)
    inputs = jnp.array([[4, 7, 9, 5, EOS_ID], [6, 8, EOS_ID, 0, 0]], jnp.int32)
    max_lengths = jnp.array([9, 7])
    make = decode_fns(model, params, inputs, 1)
    greedy, g_scores = greedy_search(make(10), max_lengths, max_steps=10)
    sampled, s_scores = sample_search(
        make(10), max_lengths, jax.random.PRNGKey(3), max_steps=10, temperature=2.0, top_k=1
    )
    np.testing.assert_array_equal(np.asarray(sampled), np.asarray(greedy))
    np.testing.assert_array_equal(np.asarray(s_scores), np.asarray(g_scores))


def first_token_probs(model, params, inputs):
    """The model's distribution of the first output token for inputs[:1]."""
    decoder = decode_fns(model, params, inputs[:1], 1)(1)
    logits, _ = decoder.tokens_to_logits(jnp.full((1, 1), BOS_ID, jnp.int32), decoder.cache)
    return np.exp(np.asarray(log_probs(logits)[0], np.float64))


def test_samples_follow_the_model_distribution():
    """First tokens of n samples: each frequency within 5 binomial standard deviations of the
    model's probability (a fixed seed: deterministic, and the bound is the mathematics')."""
    model, params = tiny_model(8, vocab=V)
    n = 4000
    inputs = jnp.tile(jnp.array([[4, 5, EOS_ID]], jnp.int32), (n, 1))
    make = decode_fns(model, params, inputs, 1)
    seqs, _ = sample_search(make(2), jnp.full((n,), 1), jax.random.PRNGKey(0), max_steps=2)
    first = np.asarray(seqs[:, 0])
    probs = first_token_probs(model, params, inputs)
    for token in range(V):
        p, f = probs[token], float((first == token).mean())
        assert abs(f - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-9, (token, f, p)


def test_top_k_keeps_only_the_k_most_likely_first_tokens():
    model, params = tiny_model(8, vocab=V)
    n = 512
    inputs = jnp.tile(jnp.array([[4, 5, EOS_ID]], jnp.int32), (n, 1))
    make = decode_fns(model, params, inputs, 1)
    seqs, _ = sample_search(
        make(2), jnp.full((n,), 1), jax.random.PRNGKey(1), max_steps=2, temperature=5.0, top_k=2
    )
    top2 = set(np.argsort(first_token_probs(model, params, inputs))[-2:].tolist())
    assert set(np.asarray(seqs[:, 0]).tolist()) == top2  # temperature 5: both appear


def test_strategy_from_config_dispatches_and_keeps_its_width():
    model, params = tiny_model(4, vocab=12)
    inputs = jnp.array([[4, 7, 9, 5, EOS_ID]], jnp.int32)
    max_lengths = jnp.array([9])
    rng = jax.random.PRNGKey(0)
    for name in STRATEGIES:
        cfg = ml_collections.ConfigDict(
            dict(strategy=name, beam_size=3, alpha=0.6, temperature=1.0, top_k=0)
        )
        strategy = Strategy.from_config(cfg)
        assert strategy.width == (3 if name == "beam" else 1)
        seqs, scores = strategy(
            decode_fns(model, params, inputs, strategy.width)(10), max_lengths, 10, rng
        )
        assert seqs.shape == (1, strategy.width, 10) and scores.shape == (1, strategy.width)
    greedy = Strategy("greedy")(decode_fns(model, params, inputs, 1)(10), max_lengths, 10, rng)
    beam1 = Strategy("beam", beam_size=1, alpha=0.0)(
        decode_fns(model, params, inputs, 1)(10), max_lengths, 10, rng
    )
    np.testing.assert_array_equal(np.asarray(greedy[0]), np.asarray(beam1[0]))
    with pytest.raises(ValueError, match="decode.strategy"):
        Strategy("nucleus")(decode_fns(model, params, inputs, 1)(10), max_lengths, 10, rng)


@pytest.mark.parametrize("vocab", [12, 1000, 5003, 32000])
def test_block_top_k_equals_lax_top_k_ties_included(vocab):
    """Values and indices exactly as jax.lax.top_k, with many equal values (few levels) so
    that ties between blocks decide the order."""
    rng = np.random.default_rng(vocab)
    for levels in (3, 50, None):
        x = rng.normal(size=(16, vocab)).astype(np.float32)
        if levels:
            x = np.round(x * levels / 4) / levels
        for n in (1, 8):
            want = jax.lax.top_k(jnp.asarray(x), n)
            got = search_top_k(jnp.asarray(x), n)
            np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
            np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


def test_top_log_probs_are_the_full_log_softmax_at_the_top():
    """The best tokens of each row and their log-probabilities equal the full log-softmax's
    (PAD and BOS excluded; a row at its maximum length gets EOS first)."""
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(6, 5003)).astype(np.float32) * 4)
    at_max = jnp.asarray([[False], [True], [False], [False], [True], [False]])
    lp, tok = top_log_probs(logits, 8, at_max)
    full = log_probs(logits)
    want_lp, want_tok = jax.lax.top_k(jnp.where(at_max, -jnp.inf, full), 8)
    for r in range(6):
        if at_max[r, 0]:
            assert int(tok[r, 0]) == EOS_ID and float(lp[r, 1]) < NEG / 2
            np.testing.assert_allclose(float(lp[r, 0]), float(full[r, EOS_ID]), atol=1e-6)
        else:
            np.testing.assert_array_equal(np.asarray(tok[r]), np.asarray(want_tok[r]))
            # The same operations on the same values (x - max - log sum); 1e-6 allows another
            # summation order of the normaliser. Observed <= 1.2e-7 (seeds 0-4, 2 threads and
            # taskset -c 0).
            np.testing.assert_allclose(np.asarray(lp[r]), np.asarray(want_lp[r]), atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_search_equals_the_full_softmax_search(seed):
    """Today's search (exact top-k per beam, no full log-softmax) against the one before it
    (tests/search_reference.py): the same hypotheses, scores to float32 rounding."""
    model, params = tiny_model(seed, vocab=300)
    rng = np.random.default_rng(seed)
    inputs = jnp.asarray(rng.integers(4, 300, (5, 9)), jnp.int32).at[3, 5:].set(0)
    max_lengths = jnp.array([12, 3, 9, 6, 0])
    make = decode_fns(model, params, inputs, 4)
    for alpha in (0.0, 0.6):
        args = dict(beam_size=4, alpha=alpha, max_steps=13)
        new = beam_search(make(13), max_lengths, **args)
        old = search_reference.beam_search(make(13), max_lengths, **args)
        np.testing.assert_array_equal(np.asarray(new[0]), np.asarray(old[0]))
        # Observed equal (seeds 0-4, 2 threads and taskset -c 0); 1e-5 allows the normaliser
        # to be summed in another order (1.2e-7 per log-probability, <= 13 steps).
        np.testing.assert_allclose(np.asarray(new[1]), np.asarray(old[1]), atol=1e-5)


def test_windows_end_at_a_quarter_a_half_and_all_of_the_steps():
    assert windows(31) == [8, 16, 31]
    assert windows(80) == [24, 40, 80]
    assert windows(55) == [16, 32, 55]
    assert windows(20) == [8, 20]
    assert windows(9) == [9]
    assert windows(3) == [3]


def test_resize_cache_keeps_the_written_positions():
    model, params = tiny_model(0, vocab=300)
    inputs = jnp.array([[4, 7, 9, EOS_ID]])
    own = family_decoder(model, params, inputs, 2, 12)
    cache = own.cache
    for step in range(3):
        _, cache = own.tokens_to_logits(jnp.full((2, 1), 4 + step, jnp.int32), cache)
    small = own.resize_cache(cache, 5)
    grown = own.resize_cache(small, 12)
    for path, before in jax.tree_util.tree_leaves_with_path(cache):
        name = path[-1].key
        after = dict(jax.tree_util.tree_leaves_with_path(grown))[path]
        if name in ("cached_key", "cached_value"):
            axis = 3 if name == "cached_key" else 2
            assert dict(jax.tree_util.tree_leaves_with_path(small))[path].shape[axis] == 5
            kept = jax.lax.slice_in_dim(after, 0, 5, axis=axis)
            np.testing.assert_array_equal(kept, jax.lax.slice_in_dim(before, 0, 5, axis=axis))
            assert not np.asarray(jax.lax.slice_in_dim(after, 5, 12, axis=axis)).any()
        else:  # cross-attention keys and values, step counters: as they were
            np.testing.assert_array_equal(after, before)


@pytest.mark.parametrize("seed", [0, 1])
def test_search_in_windows_equals_one_window(seed):
    """Beam, greedy and sampling on a cache grown 8 -> 16 -> 24 positions find what they
    find on one cache of 24: positions not yet written are masked out either way."""
    model, params = tiny_model(seed, vocab=300)
    rng = np.random.default_rng(seed)
    inputs = jnp.asarray(rng.integers(4, 300, (4, 9)), jnp.int32).at[2, 4:].set(0)
    max_lengths = jnp.array([23, 3, 12, 9])
    assert windows(24) == [8, 16, 24]
    searches = {
        4: lambda d: beam_search(d, max_lengths, beam_size=4, alpha=0.6, max_steps=24),
        1: lambda d: greedy_search(d, max_lengths, max_steps=24),
        -1: lambda d: sample_search(d, max_lengths, jax.random.PRNGKey(seed), max_steps=24),
    }
    for width, search in searches.items():
        windowed = family_decoder(model, params, inputs, abs(width), 24)
        assert windowed.resize_cache is not None
        got = search(windowed)
        want = search(windowed._replace(resize_cache=None))
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
        # Attention over 8 or 16 positions instead of 24 sums the same terms (the others
        # weigh exactly 0), maybe blocked otherwise: 1e-5 for <= 24 log-probabilities of
        # float32 rounding each. Observed: equal (seeds 0-4, 2 threads and taskset -c 0).
        np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), atol=1e-5)
