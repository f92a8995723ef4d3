"""Search: beam against exhaustive search and greedy decoding; sampling against the model's
distribution; the KV cache and its reordering; max length; strategy selection.

Every search here runs through `search` (or `reference_search`): jitted with the model static
and its params, inputs and limits as arguments, so that it compiles once for all the seeds
and tests of the same shapes and options (a decoder that closes over params is traced and
compiled anew for each), as tx.infer.translate runs it."""

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
    length_penalty,
    log_probs,
    top_log_probs,
    windows,
)
from tx.infer.topk import top_k as search_top_k
from tx.model.families import family
from tx.model.transformer import Transformer
from tx.model.transformer_config import ModelConfig
from tx.model.transformer_decoding import incremental_decoder, init_cache
from tx.tokens import BOS_ID, EOS_ID

V = 6  # pad, eos, unk, bos + two word tokens: emittable = {eos, unk, 4, 5}
EMITTABLE = [EOS_ID, 2, 4, 5]

# The programs here run for milliseconds, each compiled once: LLVM's optimisations took half of
# every compile (a beam search's: 5.1 s of CPU, 2.5 s at level 0) and change results by float
# rounding at most (fused multiply-adds), which the tolerances below allow for.
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


@functools.partial(jit, static_argnums=0)
def _init(model, rng):
    tokens = jnp.ones((1, 3), jnp.int32)
    return nn.meta.unbox(model.init(rng, tokens, tokens)["params"])


def tiny_model(seed=0, vocab=V):
    cfg = ModelConfig(
        vocab_size=vocab, d_model=16, num_heads=2, d_ff=32, num_layers=1, dropout_rate=0.0
    )
    model = Transformer(cfg)
    params = _init(model, jax.random.PRNGKey(seed))
    # Sharpen the output distribution so that search choices matter.
    params["shared_embedding"]["embedding"] *= 6.0
    return model, params


def search(model, params, inputs, max_lengths, rng=None, **options):
    """`strategy`'s search of `inputs` [b, s] by the model's Decoder (tx.infer.decoders):
    sequences [b, w, max_steps] and scores [b, w], w = strategy.width. Options (keywords):
    strategy, max_steps; windowed=False: one cache of max_steps positions (no resize_cache);
    one_row_first=False: beam search's first step on every row (rows_independent off).
    `rng`: sampling's; a fixed key where none is given, so that every call passes the same
    arguments and tests share each compiled program."""
    rng = jax.random.PRNGKey(0) if rng is None else rng
    return _search(model, params, inputs, max_lengths, rng, **options)


@functools.partial(
    jit, static_argnames=("model", "strategy", "max_steps", "windowed", "one_row_first")
)
def _search(
    model,
    params,
    inputs,
    max_lengths,
    rng,
    *,
    strategy: Strategy,
    max_steps: int,
    windowed: bool = True,
    one_row_first: bool = True,
):
    decoder = family_decoder(model, params, inputs, strategy.width, max_steps)
    if not windowed:
        decoder = decoder._replace(resize_cache=None)
    if not one_row_first:
        decoder = decoder._replace(rows_independent=False)
    return strategy(decoder, max_lengths, max_steps, rng)


@functools.partial(jit, static_argnames=("model", "beam_size", "alpha", "max_steps"))
def reference_search(model, params, inputs, max_lengths, *, beam_size, alpha, max_steps):
    """tests/search_reference.py's beam search (the full-softmax one) by the same Decoder."""
    decoder = family_decoder(model, params, inputs, beam_size, max_steps)
    return search_reference.beam_search(
        decoder, max_lengths, beam_size=beam_size, alpha=alpha, max_steps=max_steps
    )


def beam(k, alpha=0.6):
    return Strategy("beam", beam_size=k, alpha=alpha)


GREEDY = Strategy("greedy")
TOP_1 = Strategy("sample", temperature=2.0, top_k=1)


@functools.partial(jit, static_argnums=0)
def _teacher_forced(model, params, inputs, targets):
    """inputs [1, s], targets [n, T] -> [n, T, V] log-probabilities, one full forward pass."""
    rows = jnp.repeat(inputs, targets.shape[0], axis=0)
    return log_probs(model.apply({"params": params}, rows, targets))


def full_scores(model, params, inputs, seqs, alpha, length):
    """Length-penalised log-probabilities of `seqs` (each ending in EOS) by one teacher-forced
    pass over all of them, PAD after each up to `length` positions: the decoder is causal, so
    what follows a sequence changes none of its log-probabilities (one shape: one compile)."""
    targets = np.zeros((len(seqs), length), np.int32)
    for r, seq in enumerate(seqs):
        targets[r, : len(seq)] = seq
    lp = np.asarray(_teacher_forced(model, params, inputs, jnp.asarray(targets)))
    return [
        float(sum(lp[r, t, tok] for t, tok in enumerate(seq)))
        / float(length_penalty(len(seq), alpha))
        for r, seq in enumerate(seqs)
    ]


def finished(seqs):
    """[k, T] sequences -> lists up to and including their EOS."""
    return [row[: row.index(EOS_ID) + 1] for row in np.asarray(seqs).tolist()]


@pytest.mark.parametrize("seed,alpha", [(0, 0.6), (1, 0.6), (2, 0.0), (3, 1.0)])
def test_wide_beam_equals_exhaustive_search(seed, alpha):
    model, params = tiny_model(seed)
    inputs = jnp.array([[4, 5, EOS_ID]], jnp.int32)
    max_len = 3  # at most 3 tokens before EOS: 1 + 3 + 9 + 27 = 40 sequences
    words = [t for t in EMITTABLE if t != EOS_ID]
    candidates = [
        list(p) + [EOS_ID] for n in range(max_len + 1) for p in itertools.product(words, repeat=n)
    ]
    scores = full_scores(model, params, inputs, candidates, alpha, max_len + 1)
    best = candidates[int(np.argmax(scores))]
    seqs, got = search(
        model, params, inputs, jnp.array([max_len]), strategy=beam(64, alpha), max_steps=max_len + 1
    )
    top = list(np.asarray(seqs[0, 0]))
    assert top[: len(best)] == best
    assert float(got[0, 0]) == pytest.approx(max(scores), abs=1e-4)
    # The returned n-best list is sorted and its scores are the true scores (each hypothesis
    # is one of the candidates, scored above by the full forward pass).
    for j, seq in enumerate(finished(seqs[0, :5])):
        assert float(got[0, j]) == pytest.approx(scores[candidates.index(seq)], abs=1e-4)
    assert (np.diff(np.asarray(got[0])) <= 1e-6).all()


# The searches of the vocabulary-12 models below: two sentences, up to 10 steps. Tests that
# share these shapes and options share each compiled program (parameters are arguments).
INPUTS_12 = jnp.array([[4, 7, 9, 5, EOS_ID], [6, 8, EOS_ID, 0, 0]], jnp.int32)
STEPS_12 = 10


def test_beam_one_without_length_penalty_is_greedy():
    model, params = tiny_model(4, vocab=12)
    inputs, max_lengths = INPUTS_12, jnp.array([4 + 5, 2 + 5])
    run = functools.partial(search, model, params, inputs, max_lengths, max_steps=STEPS_12)
    beam_seqs, _ = run(strategy=beam(1, 0.0))
    greedy, _ = run(strategy=GREEDY)
    np.testing.assert_array_equal(np.asarray(beam_seqs[:, 0]), np.asarray(greedy[:, 0]))


def test_cached_scores_equal_full_forward_scores():
    model, params = tiny_model(5, vocab=12)
    inputs = INPUTS_12.at[0, 3:].set(jnp.array([EOS_ID, 0]))  # [4, 7, 9, EOS], [6, 8, EOS]
    max_lengths = jnp.array([7, 5])
    seqs, scores = search(model, params, inputs, max_lengths, strategy=beam(4), max_steps=STEPS_12)
    for row in range(2):
        hypotheses = finished(seqs[row])
        want = full_scores(model, params, inputs[row : row + 1], hypotheses, 0.6, STEPS_12)
        for j in range(4):
            assert float(scores[row, j]) == pytest.approx(want[j], abs=1e-4)


def test_output_never_exceeds_input_plus_extra():
    model, params = tiny_model(6, vocab=12)
    # Push EOS far down so every hypothesis runs to its maximum length.
    params["shared_embedding"]["embedding"] = (
        params["shared_embedding"]["embedding"].at[EOS_ID].set(-5.0)
    )
    inputs = jnp.array([[4, 5, 6, EOS_ID, 0], [7, EOS_ID, 0, 0, 0]], jnp.int32)
    src_lens = np.array([3, 1])
    extra = 4
    max_lengths = jnp.array(src_lens + extra)
    # Room for more steps than the limits allow: the limits, not the buffer, end the outputs.
    assert max(src_lens) + extra + 1 < STEPS_12
    seqs, _ = search(model, params, inputs, max_lengths, strategy=beam(4), max_steps=STEPS_12)
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
    args = dict(beam_size=4, alpha=0.6, max_steps=9)

    @jit  # one program for both searches (params an argument, not a constant)
    def own_and_every(params, inputs):
        t2l, cache, reorder = incremental_decoder(model, params, inputs, 4, 9)
        own = beam_search(Decoder(t2l, cache, reorder), jnp.array([8, 6]), **args)
        rows = jnp.repeat(inputs, 4, axis=0)
        encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
        encoded = jnp.repeat(encoded, 4, 0)

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
        return own, beam_search(Decoder(every_row, copies), jnp.array([8, 6]), **args)

    own, every = own_and_every(params, inputs)
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
    max_lengths = jnp.array([8, 6, 5])
    args = dict(beam_size=4, alpha=0.6, max_steps=9)
    rows_seen = []

    def traced(params):  # the rows tokens_to_logits sees: step 0, then each window's loop
        own = family_decoder(model, params, inputs, 4, 9)
        assert own.rows_independent

        def t2l(ids, c):
            rows_seen.append(ids.shape[0])
            return own.tokens_to_logits(ids, c)

        return beam_search(own._replace(tokens_to_logits=t2l), max_lengths, **args)

    jax.eval_shape(traced, params)  # traced only: `search` below runs the same program
    assert rows_seen == [3] + [12] * len(windows(9))
    first = search(model, params, inputs, max_lengths, strategy=beam(4), max_steps=9)
    every = search(
        model, params, inputs, max_lengths, strategy=beam(4), max_steps=9, one_row_first=False
    )
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
    run = functools.partial(search, model, params, INPUTS_12, jnp.array([9, 7]), max_steps=STEPS_12)
    greedy, g_scores = run(strategy=GREEDY)
    sampled, s_scores = run(jax.random.PRNGKey(3), strategy=TOP_1)
    np.testing.assert_array_equal(np.asarray(sampled), np.asarray(greedy))
    np.testing.assert_array_equal(np.asarray(s_scores), np.asarray(g_scores))


@functools.partial(jit, static_argnums=0)
def first_token_log_probs(model, params, inputs):
    """The model's log-distribution of the first output token for inputs [1, s]."""
    decoder = family_decoder(model, params, inputs, 1, 1)
    logits, _ = decoder.tokens_to_logits(jnp.full((1, 1), BOS_ID, jnp.int32), decoder.cache)
    return log_probs(logits)[0]


def first_token_probs(model, params, inputs):
    """The model's distribution of the first output token for inputs[:1] (one row: one
    compiled program for every number of rows)."""
    return np.exp(np.asarray(first_token_log_probs(model, params, inputs[:1]), np.float64))


def test_samples_follow_the_model_distribution():
    """First tokens of n samples: each frequency within 5 binomial standard deviations of the
    model's probability (a fixed seed: deterministic, and the bound is the mathematics')."""
    model, params = tiny_model(8, vocab=V)
    n = 4000
    inputs = jnp.tile(jnp.array([[4, 5, EOS_ID]], jnp.int32), (n, 1))
    seqs, _ = search(
        model,
        params,
        inputs,
        jnp.full((n,), 1),
        jax.random.PRNGKey(0),
        strategy=Strategy("sample"),
        max_steps=2,
    )
    first = np.asarray(seqs[:, 0, 0])
    probs = first_token_probs(model, params, inputs)
    for token in range(V):
        p, f = probs[token], float((first == token).mean())
        assert abs(f - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-9, (token, f, p)


def test_top_k_keeps_only_the_k_most_likely_first_tokens():
    model, params = tiny_model(8, vocab=V)
    n = 512
    inputs = jnp.tile(jnp.array([[4, 5, EOS_ID]], jnp.int32), (n, 1))
    seqs, _ = search(
        model,
        params,
        inputs,
        jnp.full((n,), 1),
        jax.random.PRNGKey(1),
        strategy=Strategy("sample", temperature=5.0, top_k=2),
        max_steps=2,
    )
    top2 = set(np.argsort(first_token_probs(model, params, inputs))[-2:].tolist())
    assert set(np.asarray(seqs[:, 0, 0]).tolist()) == top2  # temperature 5: both appear


def test_strategy_from_config_dispatches_and_keeps_its_width():
    model, params = tiny_model(4, vocab=12)
    max_lengths = jnp.array([9, 7])
    rng = jax.random.PRNGKey(0)
    run = functools.partial(search, model, params, INPUTS_12, max_lengths, rng, max_steps=STEPS_12)
    # Each strategy with the fields the tests above search with: every program (beam 4,
    # greedy, beam 1 without penalty, top-1 sampling) is compiled once for them all.
    wanted = {"beam": beam(4), "greedy": GREEDY, "sample": TOP_1}
    for name in STRATEGIES:
        want = wanted[name]
        cfg = ml_collections.ConfigDict(
            dict(
                strategy=name,
                beam_size=want.beam_size,
                alpha=want.alpha,
                temperature=want.temperature,
                top_k=want.top_k,
            )
        )
        strategy = Strategy.from_config(cfg)
        assert strategy == want  # every field read
        assert strategy.width == (4 if name == "beam" else 1)
        seqs, scores = run(strategy=strategy)
        assert seqs.shape == (2, strategy.width, 10) and scores.shape == (2, strategy.width)
    greedy = run(strategy=GREEDY)
    beam1 = run(strategy=Strategy("beam", beam_size=1, alpha=0.0))
    np.testing.assert_array_equal(np.asarray(greedy[0]), np.asarray(beam1[0]))
    with pytest.raises(ValueError, match="decode.strategy"):
        run(strategy=Strategy("nucleus"))


# Jitted as in a search (op by op, each shape compiled every operation its own).
lax_top_k = jit(jax.lax.top_k, static_argnums=1)
block_top_k = jit(search_top_k, static_argnums=1)


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
            want = lax_top_k(jnp.asarray(x), n)
            got = block_top_k(jnp.asarray(x), n)
            np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
            np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


def test_top_log_probs_are_the_full_log_softmax_at_the_top():
    """The best tokens of each row and their log-probabilities equal the full log-softmax's
    (PAD and BOS excluded; a row at its maximum length gets EOS first)."""
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(6, 5003)).astype(np.float32) * 4)
    at_max = np.array([[False], [True], [False], [False], [True], [False]])
    # Each side its own program, as in a search (op by op, every operation compiled its own).
    lp, tok = jit(top_log_probs, static_argnums=1)(logits, 8, jnp.asarray(at_max))
    full = jit(log_probs)(logits)
    want_lp, want_tok = lax_top_k(jnp.where(at_max, -jnp.inf, full), 8)
    lp, tok, full, want_lp, want_tok = map(np.asarray, (lp, tok, full, want_lp, want_tok))
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
    # Room for 24 steps, as test_search_in_windows_equals_one_window searches the same shapes
    # (one program for both); the limits end every output by its 13th step.
    for alpha in (0.0, 0.6):
        new = search(model, params, inputs, max_lengths, strategy=beam(4, alpha), max_steps=24)
        old = reference_search(
            model, params, inputs, max_lengths, beam_size=4, alpha=alpha, max_steps=24
        )
        np.testing.assert_array_equal(np.asarray(new[0]), np.asarray(old[0]))
        # Observed <= 3.8e-6 jitted, <= 5.7e-6 op by op (seeds 0-4; scores up to 39, where a
        # float32 ulp is 3.8e-6); 1e-5 allows the normaliser to be summed in another order
        # (1.2e-7 per log-probability, <= 13 steps).
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

    @jit  # one program (op by op, every step and resize compiled its own)
    def three_steps_cut_and_grown(params, inputs):
        own = family_decoder(model, params, inputs, 2, 12)
        cache = own.cache
        for i in range(3):
            _, cache = own.tokens_to_logits(jnp.full((2, 1), 4 + i, jnp.int32), cache)
        small = own.resize_cache(cache, 5)
        return cache, small, own.resize_cache(small, 12)

    cache, small, grown = jax.tree.map(np.asarray, three_steps_cut_and_grown(params, inputs))
    for path, before in jax.tree_util.tree_leaves_with_path(cache):
        name = path[-1].key
        after = dict(jax.tree_util.tree_leaves_with_path(grown))[path]
        if name in ("cached_key", "cached_value"):
            axis = 3 if name == "cached_key" else 2
            assert dict(jax.tree_util.tree_leaves_with_path(small))[path].shape[axis] == 5
            kept = after.take(range(5), axis=axis)
            np.testing.assert_array_equal(kept, before.take(range(5), axis=axis))
            assert not after.take(range(5, 12), axis=axis).any()
        else:  # cross-attention keys and values, step counters: as they were
            np.testing.assert_array_equal(after, before)


@pytest.mark.parametrize("seed", [0, 1])
def test_search_in_windows_equals_one_window(seed):
    """Beam, greedy and sampling on a cache grown 8 -> 16 -> 24 positions find what they
    find on one cache of 24: positions not yet written are masked out either way."""
    model, params = tiny_model(seed, vocab=300)
    rng = np.random.default_rng(seed)
    # The shapes of test_beam_search_equals_the_full_softmax_search: beam search's program is
    # compiled once for both.
    inputs = jnp.asarray(rng.integers(4, 300, (5, 9)), jnp.int32).at[2, 4:].set(0)
    max_lengths = jnp.array([23, 3, 12, 9, 17])
    assert windows(24) == [8, 16, 24]
    assert family(model.config).resize_cache is not None  # the Decoder's: `search` windows
    run = functools.partial(search, model, params, inputs, max_lengths, jax.random.PRNGKey(seed))
    for strategy in (beam(4), GREEDY, Strategy("sample")):
        got = run(strategy=strategy, max_steps=24)
        want = run(strategy=strategy, max_steps=24, windowed=False)
        np.testing.assert_array_equal(
            np.asarray(got[0]), np.asarray(want[0]), err_msg=strategy.name
        )
        # Attention over 8 or 16 positions instead of 24 sums the same terms (the others
        # weigh exactly 0), maybe blocked otherwise: 1e-5 for <= 24 log-probabilities of
        # float32 rounding each. Observed: equal (seeds 0-4, 2 threads and taskset -c 0).
        np.testing.assert_allclose(
            np.asarray(got[1]), np.asarray(want[1]), atol=1e-5, err_msg=strategy.name
        )
