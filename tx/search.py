"""Beam search and greedy decoding: pure functions over a tokens -> logits callable.

    tokens_to_logits(ids [b*k, 1] int32, cache) -> (logits [b*k, V] float32, new cache)

Section 6.1: beam size 4, length penalty alpha = 0.6 in the GNMT form
lp(Y) = ((5 + |Y|) / 6)^alpha, maximum output length = input length + 50 per sentence.
Scores are log-probabilities divided by lp, where |Y| counts the EOS token.
The search stops once no live hypothesis can beat the k finished ones: a live hypothesis's
log-probability can only fall, so its best possible score is logprob / lp(its maximum length).
EOS is accepted only when it ranks among the top k candidates, so beam 1 with alpha = 0 is
exactly greedy decoding. PAD and BOS are never generated.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from tx.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

NEG = -1.0e9  # "minus infinity" that stays finite under addition


def length_penalty(length, alpha: float):
    """GNMT length penalty ((5 + length) / 6)^alpha."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def _log_probs(logits: jax.Array) -> jax.Array:
    """log softmax over the tokens the decoder may emit (never PAD or BOS)."""
    logits = logits.astype(jnp.float32)
    logits = logits.at[..., PAD_ID].set(NEG).at[..., BOS_ID].set(NEG)
    return jax.nn.log_softmax(logits, axis=-1)


def _gather_beams(tree, indices: jax.Array, batch: int, beam: int):
    """Selects beams: every batched leaf [b*k, ...] -> [b*n, ...] by beam indices [b, n]."""

    def gather(path, x):
        # Counters are shared by all beams; cross-attention keys/values ("static_*") are the
        # same for every beam of a sentence, so selecting beams would only copy them.
        if x.ndim == 0 or str(getattr(path[-1], "key", "")).startswith("static_"):
            return x
        y = x.reshape(batch, beam, *x.shape[1:])
        y = jnp.take_along_axis(y, indices.reshape(batch, -1, *([1] * (y.ndim - 2))), axis=1)
        return y.reshape(batch * indices.shape[1], *x.shape[1:])

    return jax.tree_util.tree_map_with_path(gather, tree)


def beam_search(
    tokens_to_logits: Callable[[jax.Array, Any], tuple[jax.Array, Any]],
    cache: Any,
    max_lengths: jax.Array,
    *,
    beam_size: int,
    alpha: float,
    max_steps: int,
) -> tuple[jax.Array, jax.Array]:
    """Batched beam search.

    Args:
      tokens_to_logits: see the module docstring; called on [b*k, 1] ids.
      cache: decoder cache whose batched leaves have leading dimension b*k.
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
        "cache": cache,
    }
    max_lp = length_penalty(max_lengths + 1, alpha)  # [b]

    def not_done(s):
        full = s["fin_scores"][:, -1] > NEG / 2  # k finished hypotheses
        best_live = s["live_logprobs"][:, 0] / max_lp
        can_improve = ~full | (best_live > s["fin_scores"][:, -1])
        live = s["live_logprobs"][:, 0] > NEG / 2
        return (s["i"] < T) & jnp.any(can_improve & live)

    step = functools.partial(_beam_step, tokens_to_logits, max_lengths, k, alpha)
    final = jax.lax.while_loop(not_done, step, init)
    return final["fin_seqs"][:, :, 1:], final["fin_scores"]


def _beam_step(tokens_to_logits, max_lengths, k, alpha, s):
    batch = s["live_seqs"].shape[0]
    i = s["i"]
    ids = jax.lax.dynamic_slice_in_dim(s["live_seqs"], i, 1, axis=2).reshape(batch * k, 1)
    logits, cache = tokens_to_logits(ids, s["cache"])
    log_probs = _log_probs(logits).reshape(batch, k, -1)  # [b, k, V]
    vocab = log_probs.shape[-1]
    # A sentence that has reached its maximum length may only end.
    at_max = (i >= max_lengths)[:, None, None]
    eos_only = jnp.full((vocab,), NEG).at[EOS_ID].set(0.0)
    log_probs = jnp.where(at_max, jnp.maximum(log_probs, NEG) + eos_only, log_probs)
    candidates = (s["live_logprobs"][:, :, None] + log_probs).reshape(batch, k * vocab)
    top_lp, top_idx = jax.lax.top_k(candidates, 2 * k)  # [b, 2k]
    top_beam, top_tok = top_idx // vocab, top_idx % vocab
    top_seqs = jnp.take_along_axis(s["live_seqs"], top_beam[:, :, None], axis=1)
    top_seqs = jax.lax.dynamic_update_slice_in_dim(top_seqs, top_tok[:, :, None], i + 1, axis=2)
    is_eos = top_tok == EOS_ID
    # Live: the best k candidates that did not end.
    live_lp = jnp.where(is_eos, NEG, top_lp)
    live_lp, live_pos = jax.lax.top_k(live_lp, k)
    live_seqs = jnp.take_along_axis(top_seqs, live_pos[:, :, None], axis=1)
    live_beam = jnp.take_along_axis(top_beam, live_pos, axis=1)
    cache = _gather_beams(cache, live_beam, batch, k)
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


def greedy_search(tokens_to_logits, cache, max_lengths: jax.Array, *, max_steps: int):
    """Argmax at every step until EOS (or the sentence's maximum length).

    Returns sequences [b, max_steps] int32 (EOS-terminated, PAD after) and their summed
    log-probabilities [b].
    """
    batch = max_lengths.shape[0]

    def body(i, s):
        ids = jnp.where(i == 0, BOS_ID, s["seqs"][:, jnp.maximum(i - 1, 0)])[:, None]
        logits, cache = tokens_to_logits(ids, s["cache"])
        lp = _log_probs(logits)
        lp = jnp.where(
            (i >= max_lengths)[:, None], jnp.full_like(lp, NEG).at[:, EOS_ID].set(0.0), lp
        )
        tok = jnp.argmax(lp, -1).astype(jnp.int32)
        tok = jnp.where(s["done"], PAD_ID, tok)
        score = s["score"] + jnp.where(
            s["done"], 0.0, jnp.take_along_axis(lp, tok[:, None], 1)[:, 0]
        )
        return {
            "seqs": s["seqs"].at[:, i].set(tok),
            "cache": cache,
            "score": score,
            "done": s["done"] | (tok == EOS_ID),
        }

    init = {
        "seqs": jnp.full((batch, max_steps), PAD_ID, jnp.int32),
        "cache": cache,
        "score": jnp.zeros((batch,), jnp.float32),
        "done": jnp.zeros((batch,), bool),
    }
    out = jax.lax.fori_loop(0, max_steps, body, init)
    return out["seqs"], out["score"]
