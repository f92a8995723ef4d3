"""A model's search Decoder, and ensembles: several models decoding as one.

    decoder(model, params, inputs, w, n)   # the tx.infer.search.Decoder of any family's model
    ensemble_decoder([d1, d2, ...])        # one Decoder averaging the members' log-probabilities

Ensembles on the command line:

    python -m tx translate --workdir W1 --workdir W2 ...     (or --checkpoint S1 S2 of one run)

An ensemble is a tx.infer.search.Decoder like any model's: its cache is the tuple of the members'
caches, reordered member by member, and its scores at each step are the mean of the members'
log-softmaxes (PAD and BOS masked in each, as tx.infer.search.log_probs does). The search then
normalises that mean once more (its own log_softmax): the ensemble's distribution is the
normalised geometric mean of the members', a product of experts. The search knows nothing of
it: beam, greedy and sampling run unchanged. The members must share the vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from tx.infer.search import Decoder, log_probs
from tx.model.families import family


def decoder(model: nn.Module, params, inputs, width: int, max_len: int) -> Decoder:
    """The Decoder of the family's incremental_decoder (tx.model.families) for `width` rows
    per sentence of `inputs`, with the family's `rows_independent` and `resize_cache`."""
    fam = family(model.config)
    return Decoder(
        *fam.incremental_decoder(model, params, inputs, width, max_len),
        rows_independent=fam.rows_independent,
        resize_cache=fam.resize_cache,
    )


def ensemble_decoder(members: Sequence[Decoder]) -> Decoder:
    """One Decoder whose tokens_to_logits returns the mean log-probabilities [n, V] of
    `members`, each of which decodes the same rows (same batch, width and maximum length)."""
    members = tuple(members)
    if not members:
        raise ValueError("an ensemble needs at least one model")

    def tokens_to_logits(ids: jax.Array, caches: tuple):
        outs = [m.tokens_to_logits(ids, c) for m, c in zip(members, caches, strict=True)]
        mean = jnp.mean(jnp.stack([log_probs(logits) for logits, _ in outs]), axis=0)
        return mean, tuple(cache for _, cache in outs)

    def reorder_cache(caches: tuple, rows: jax.Array) -> tuple:
        return tuple(m.reorder_cache(c, rows) for m, c in zip(members, caches, strict=True))

    def resize_cache(caches: tuple, length: int) -> tuple:
        return tuple(m.resize_cache(c, length) for m, c in zip(members, caches, strict=True))

    independent = all(m.rows_independent for m in members)  # each member on the same rows
    resizable = all(m.resize_cache is not None for m in members)  # else one window
    return Decoder(
        tokens_to_logits,
        tuple(m.cache for m in members),
        reorder_cache,
        independent,
        resize_cache if resizable else None,
    )
