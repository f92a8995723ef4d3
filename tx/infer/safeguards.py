"""Decoding safeguards, both off by default so that the paper's search stays exact
(tx.infer.search applies them; docs/decoding.md, "Safeguards"):

    max_output_length(source_len, max_extra_len, ratio)   # decode.max_length_ratio
    repeated_ngram_bans(seqs [r, T], length, n, vocab)     # decode.no_repeat_ngram_size
"""

from __future__ import annotations

import math
from fractions import Fraction

import jax
import jax.numpy as jnp

from tx.tokens import EOS_ID

# Output tokens allowed beyond ceil(ratio * input length) (`max_output_length`): fairseq's
# WMT recipes pair --max-len-a 1.2 with --max-len-b 10. Short inputs need it most: their
# sub-word counts differ most between languages.
RATIO_EXTRA_LEN = 10


def max_output_length(source_len: int, max_extra_len: int, ratio: float = 0.0) -> int:
    """The most output tokens (EOS excluded) for an input of `source_len` sub-words (EOS
    excluded): the paper's source_len + max_extra_len and, when ratio r > 0, also at most
    ceil(r * source_len) + RATIO_EXTRA_LEN. With r = 1.2 and max_extra_len 50: inputs of 1, 3,
    50, 300 sub-words allow 12, 14, 70, 350 (the paper's cap from 200 on). r counts as the
    decimal written (1.1 * 50 is 55, where float arithmetic gives 55.00000000000001).
    Non-decreasing in source_len, so a bucket's longest input bounds all of its sentences."""
    limit = source_len + max_extra_len
    if ratio > 0:
        scaled = math.ceil(Fraction(repr(float(ratio))) * source_len)
        limit = min(limit, scaled + RATIO_EXTRA_LEN)
    return limit


def repeated_ngram_bans(seqs: jax.Array, length: jax.Array, n: int, vocab: int) -> jax.Array:
    """fairseq's NGramRepeatBlock: the tokens that would repeat an n-gram of each row.

    seqs [r, T] int32 holds each row's generated tokens in positions 0 .. length-1 (no BOS:
    it is no token of an n-gram) and anything after; length is a scalar. Where the row's last
    n-1 tokens equal seqs[j : j+n-1] for a window j that ends before them (j + n-1 < length),
    seqs[j + n-1] is banned. EOS is never banned: a row at its maximum length must still end.
    Returns bool [r, vocab]. Comparisons over the n-1 shifts of [r, T - n + 1] windows and one
    scatter: no loop over steps.
    """
    rows, T = seqs.shape
    starts = T - n + 1  # windows j = 0 .. T-n (static)
    if starts <= 0:
        return jnp.zeros((rows, vocab), bool)
    hit = jnp.broadcast_to(jnp.arange(starts) <= length - n, (rows, starts))  # [r, starts]
    if n > 1:  # clamped start below n-1: no window is then complete, hit is all False
        suffix = jax.lax.dynamic_slice_in_dim(seqs, length - (n - 1), n - 1, axis=1)
        for m in range(n - 1):  # static: n-1 comparisons of [r, starts]
            hit = hit & (seqs[:, m : m + starts] == suffix[:, m : m + 1])
    following = jnp.where(hit, seqs[:, n - 1 :], vocab)  # [r, starts]; vocab: dropped below
    banned = jnp.zeros((rows, vocab), bool)
    banned = banned.at[jnp.arange(rows)[:, None], following].set(True, mode="drop")
    return banned.at[:, EOS_ID].set(False)
