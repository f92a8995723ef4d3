"""Beam search against exhaustive search and greedy decoding; the KV cache; max length."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tx.data.tokenizer import BOS_ID, EOS_ID
from tx.decode import _log_probs, beam_search, greedy_search, length_penalty
from tx.model import ModelConfig, Transformer, beam_decoder

V = 6  # pad, eos, unk, bos + two word tokens: emittable = {eos, unk, 4, 5}
EMITTABLE = [EOS_ID, 2, 4, 5]

# A beam score and `full_score` of the same sequence are the same sum of log-probabilities by two
# float32 paths (cached steps vs one teacher-forced pass), divided by the length penalty.
# Bound: for each path, the first-order rounding bound of every log-probability (as for the
# logits in tests/test_model.py: n u sum|terms| per reduction, 4 ulp per exp/log/rsqrt/sin/cos,
# propagated through the Jacobian), summed over the sequence, plus the float32 running sum
# (L u sum|log p|), the quotient and two pow evaluations ((1 + 2 x 8) u |score|). It is
# <= 3.8e-3 for the inputs of these tests and <= 6.8e-3 over model seeds 0-7 (and 5-45 for the
# cached test). Observed: <= 4.6e-6 (those seeds, 1 and 2 threads, 8 host devices); a wrong
# step, length or penalty moves a score by > 0.1.
SCORE_ATOL = 1e-2


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


def decode_fns(model, params, inputs, beam):
    """(tokens_to_logits, cache for `steps`) -> as a pair of callables for the tests."""
    return lambda steps: beam_decoder(model, params, inputs, beam, steps)


def full_score(model, params, inputs, seq, alpha):
    """Length-penalised log-probability of `seq` (ending in EOS) by one teacher-forced pass."""
    tgt = jnp.array([seq], jnp.int32)
    lp = _log_probs(model.apply({"params": params}, inputs, tgt))[0]
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
        *make(max_len + 1),
        jnp.array([max_len]),
        beam_size=beam,
        alpha=alpha,
        max_steps=max_len + 1,
    )
    top = list(np.asarray(seqs[0, 0]))
    # Exact match: the runner-up scores 3.4-5.1 lower at seeds 0-3, against a rounding bound of
    # 2.9e-3 on the difference of the two paths, so no near-tie can flip the order.
    assert top[: len(best)] == best
    assert float(got[0, 0]) == pytest.approx(max(scores), abs=SCORE_ATOL)
    # The returned n-best list is sorted and its scores are the true scores.
    for j in range(5):
        seq = list(np.asarray(seqs[0, j]))
        seq = seq[: seq.index(EOS_ID) + 1]
        assert float(got[0, j]) == pytest.approx(
            full_score(model, params, inputs, seq, alpha), abs=SCORE_ATOL
        )
    assert (np.diff(np.asarray(got[0])) <= 0).all()  # exact: top_k returns them sorted


def test_beam_one_without_length_penalty_is_greedy():
    model, params = tiny_model(4, vocab=12)
    inputs = jnp.array([[4, 7, 9, 5, EOS_ID], [6, 8, EOS_ID, 0, 0]], jnp.int32)
    max_lengths = jnp.array([4 + 5, 2 + 5])
    make = decode_fns(model, params, inputs, 1)
    beam_seqs, _ = beam_search(*make(10), max_lengths, beam_size=1, alpha=0.0, max_steps=10)
    greedy, _ = greedy_search(*make(10), max_lengths, max_steps=10)
    np.testing.assert_array_equal(np.asarray(beam_seqs[:, 0]), np.asarray(greedy))


def test_cached_scores_equal_full_forward_scores():
    model, params = tiny_model(5, vocab=12)
    inputs = jnp.array([[4, 7, 9, EOS_ID]], jnp.int32)
    make = decode_fns(model, params, inputs, 4)
    seqs, scores = beam_search(*make(8), jnp.array([7]), beam_size=4, alpha=0.6, max_steps=8)
    for j in range(4):
        seq = list(np.asarray(seqs[0, j]))
        seq = seq[: seq.index(EOS_ID) + 1]
        assert float(scores[0, j]) == pytest.approx(  # bound <= 3.3e-3 at seeds 5-45
            full_score(model, params, inputs, seq, 0.6), abs=SCORE_ATOL
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
    seqs, _ = beam_search(*make(steps), max_lengths, beam_size=4, alpha=0.6, max_steps=steps)
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
    lp = _log_probs(jnp.zeros((1, 6)))
    assert float(lp[0, 0]) < -1e8 and float(lp[0, BOS_ID]) < -1e8
    # four exp(-log 4): log and exp to 4 ulp each (4.8e-7 + 4.8e-7 relative) and three additions
    # (1.8e-7), 1.2e-6; observed 0
    assert float(jnp.exp(lp).sum()) == pytest.approx(1.0, rel=2e-6)
