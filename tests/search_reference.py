"""The beam search as it was before the exact top-k shortcut (tx.infer.search, November 2026): a
full-vocabulary log-softmax and one top_k over every beam's k x V candidates. Kept as the
oracle that the faster search must equal (tests/test_search.py)."""

import functools

import jax
import jax.numpy as jnp

from tx.infer.search import NEG, Decoder, _only_eos_at_max, length_penalty, log_probs
from tx.tokens import BOS_ID, EOS_ID, PAD_ID


def beam_search(
    decoder: Decoder,
    max_lengths: jax.Array,
    *,
    beam_size: int,
    alpha: float,
    max_steps: int,
) -> tuple[jax.Array, jax.Array]:
    """Batched beam search.

    Args:
      decoder: its cache holds b*k rows (k = beam_size rows per sentence, sentence-major).
      max_lengths: [b] int, the most output tokens (excluding EOS) per sentence; a padding
        row uses 0.
      beam_size: k.
      alpha: length-penalty exponent.
      max_steps: static bound >= max(max_lengths) + 1 (the EOS step).

    Returns:
      sequences [b, k, max_steps] int32 (EOS-terminated, PAD after), best first;
      scores [b, k] float32, length-penalised log-probabilities.
    """
    batch, k, T = max_lengths.shape[0], beam_size, max_steps
    init = {
        "i": jnp.array(0, jnp.int32),
        "live_seqs": jnp.full((batch, k, T + 1), PAD_ID, jnp.int32).at[:, :, 0].set(BOS_ID),
        "live_logprobs": jnp.tile(jnp.array([0.0] + [NEG] * (k - 1)), (batch, 1)),
        "fin_seqs": jnp.full((batch, k, T + 1), PAD_ID, jnp.int32),
        "fin_scores": jnp.full((batch, k), NEG),
        "cache": decoder.cache,
    }
    max_lp = length_penalty(max_lengths + 1, alpha)  # [b]

    def not_done(s):
        full = s["fin_scores"][:, -1] > NEG / 2  # k finished hypotheses
        best_live = s["live_logprobs"][:, 0] / max_lp
        can_improve = ~full | (best_live > s["fin_scores"][:, -1])
        live = s["live_logprobs"][:, 0] > NEG / 2
        return (s["i"] < T) & jnp.any(can_improve & live)

    step = functools.partial(_beam_step, decoder, max_lengths, k, alpha)
    final = jax.lax.while_loop(not_done, step, init)
    return final["fin_seqs"][:, :, 1:], final["fin_scores"]


def _beam_step(decoder: Decoder, max_lengths, k, alpha, s):
    batch = s["live_seqs"].shape[0]
    i = s["i"]
    ids = jax.lax.dynamic_slice_in_dim(s["live_seqs"], i, 1, axis=2).reshape(batch * k, 1)
    logits, cache = decoder.tokens_to_logits(ids, s["cache"])
    lp = log_probs(logits).reshape(batch, k, -1)  # [b, k, V]
    vocab = lp.shape[-1]
    # A sentence that has reached its maximum length may only end.
    lp = _only_eos_at_max(lp, (i >= max_lengths)[:, None, None])
    candidates = (s["live_logprobs"][:, :, None] + lp).reshape(batch, k * vocab)
    top_lp, top_idx = jax.lax.top_k(candidates, 2 * k)  # [b, 2k]
    top_beam, top_tok = top_idx // vocab, top_idx % vocab
    top_seqs = jnp.take_along_axis(s["live_seqs"], top_beam[:, :, None], axis=1)
    top_seqs = jax.lax.dynamic_update_slice_in_dim(top_seqs, top_tok[:, :, None], i + 1, axis=2)
    is_eos = top_tok == EOS_ID
    # Live: the best k candidates that did not end.
    live_lp = jnp.where(is_eos, NEG, top_lp)
    live_lp, live_pos = jax.lax.top_k(live_lp, k)
    live_seqs = jnp.take_along_axis(top_seqs, live_pos[:, :, None], axis=1)
    live_beam = jnp.take_along_axis(top_beam, live_pos, axis=1)  # [b, k] beam within sentence
    rows = (jnp.arange(batch)[:, None] * k + live_beam).reshape(-1)  # [b*k] rows of the cache
    cache = decoder.reorder_cache(cache, rows)
    # Finished: EOS candidates within the top k, merged with those found earlier.
    rank_ok = jnp.arange(2 * k)[None, :] < k
    fin_new = jnp.where(
        is_eos & rank_ok & (top_lp > NEG / 2), top_lp / length_penalty(i + 1, alpha), NEG
    )
    all_scores = jnp.concatenate([s["fin_scores"], fin_new], axis=1)
    all_seqs = jnp.concatenate([s["fin_seqs"], top_seqs], axis=1)
    fin_scores, fin_pos = jax.lax.top_k(all_scores, k)
    fin_seqs = jnp.take_along_axis(all_seqs, fin_pos[:, :, None], axis=1)
    return {
        "i": i + 1,
        "live_seqs": live_seqs,
        "live_logprobs": jnp.maximum(live_lp, NEG),
        "fin_seqs": fin_seqs,
        "fin_scores": fin_scores,
        "cache": cache,
    }
