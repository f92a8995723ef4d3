"""The best candidates of each row of logits, the hot spot of every search step:

    top_log_probs(logits [r, V], n, at_max, banned)  # log-probs and tokens, best first
    top_k(x [r, V], n)                                # jax.lax.top_k through blocks

Both give the same values and tokens as the plain operations (tests/test_search.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tx.tokens import BOS_ID, EOS_ID, PAD_ID

NEG = -1.0e9  # "minus infinity" that stays finite under addition


def top_log_probs(logits: jax.Array, n: int, at_max: jax.Array, banned: jax.Array | None = None):
    """The `n` most likely tokens of each row and their log-probabilities, without the
    full-vocabulary log-softmax: only the normaliser is a pass over [rows, V].

    Exactly `log_probs` followed by `_only_eos_at_max` and top_k on its rows (the same
    operations on the same values: the shifted top logits minus the log of the same sum), as
    long as `at_max` rows keep EOS among their best n, which every row does where EOS is the
    only token left. Args: logits [r, V]; n <= V; at_max bool [r, 1]; banned: None or bool
    [r, V], tokens whose log-probability is set to NEG after normalising (fairseq's order: the
    others keep the model's log-probabilities). Returns (log-probs [r, n] float32, tokens
    [r, n] int32), best first.
    """
    logits = logits.astype(jnp.float32)
    logits = logits.at[..., PAD_ID].set(NEG).at[..., BOS_ID].set(NEG)
    top = jnp.max(logits, -1, keepdims=True)  # the shift jax.nn.log_softmax uses
    log_sum = jnp.log(jnp.sum(jnp.exp(logits - top), -1, keepdims=True))
    if banned is not None:  # after the normaliser, before the top-k
        logits = jnp.where(banned, NEG, logits)
    # A row at its maximum length may only end: EOS first, every other token below NEG.
    eos_only = jnp.where(jnp.arange(logits.shape[-1]) == EOS_ID, logits, 2 * NEG)
    values, tokens = top_k(jnp.where(at_max, eos_only, logits), n)
    return (values - top) - log_sum, tokens


TOP_K_BLOCK = 128  # vocabulary entries per block in `top_k`


def top_k(x: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    """jax.lax.top_k over the last axis of x [r, V], ties to the lower index, found through
    blocks: the n best entries lie in the n blocks with the best maxima (an entry outside
    them has n block maxima, other entries, at least as large), so only those n blocks are
    searched: [r, n * 128] instead of [r, V] ([measured](docs/performance.md#what-made-tx-faster)).
    The chosen blocks are taken in vocabulary order, so equal values still come out lower
    index first."""
    rows, vocab = x.shape
    if vocab < 4 * n * TOP_K_BLOCK:  # few blocks: nothing to save
        return jax.lax.top_k(x, n)
    blocks = -(-vocab // TOP_K_BLOCK)
    x = jnp.pad(x, ((0, 0), (0, blocks * TOP_K_BLOCK - vocab)), constant_values=-jnp.inf)
    x = x.reshape(rows, blocks, TOP_K_BLOCK)
    chosen = jnp.sort(jax.lax.top_k(jnp.max(x, -1), n)[1], axis=-1)  # [r, n] block numbers
    candidates = jnp.take_along_axis(x, chosen[:, :, None], axis=1).reshape(rows, -1)
    values, at = jax.lax.top_k(candidates, n)
    block = jnp.take_along_axis(chosen, at // TOP_K_BLOCK, axis=1)
    return values, block * TOP_K_BLOCK + at % TOP_K_BLOCK
