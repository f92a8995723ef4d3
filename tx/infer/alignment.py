"""Hard word alignments from encoder-decoder attention, in Pharaoh format ("i-j").

A target word is linked to the source word it attends to most in one decoder layer's
cross-attention (averaged over heads), on words, not sub-words: a source word receives the
attention of all its pieces (summed), a target word gives the mean of its pieces' rows. Words
are the whitespace-separated words of the text, which SentencePiece marks by a leading "▁"
on the first piece of each. EOS rows and columns are left out: heads park attention there
when nothing else fits, which is no evidence of a link.

Pharaoh pairs are "source index - target index", 0-based, one line per sentence; the
translate command prints `translation ||| 0-0 1-2 ...` (Marian's --alignment layout).
"""

from __future__ import annotations

import itertools

import numpy as np

from tx.infer.attention_maps import attention_weights, pieces
from tx.tokens import EOS_ID, PAD_ID

WORD_START = "\u2581"  # SentencePiece's "▁"

# The last decoder layer: the one that aligns best on the demo, read at row t (the position
# that predicts target piece t); deeper models may align best lower, so measure with
# benchmarks/alignment.py ([figures](docs/pictures.md#word-alignments)).
DEFAULT_LAYER = -1


def word_ids(tokens: list[str]) -> np.ndarray:
    """int [n]: the word each piece belongs to (0-based); "</s>" gets -1.

    A piece starting with "▁" starts a word; so does the first piece, with or without it.
    """
    starts = np.array([t.startswith(WORD_START) for t in tokens], bool)
    starts[:1] = True
    ids = np.cumsum(starts) - 1
    return np.where(np.array([t == "</s>" for t in tokens], bool), -1, ids)


def word_attention(cross: np.ndarray, source_words: np.ndarray, target_words: np.ndarray):
    """Sub-word attention [t, s] -> word attention [T, S] (rows sum to 1 over real words).

    source_words [s], target_words [t]: word_ids of the pieces (-1 = EOS or padding, left out).
    """
    n_src, n_tgt = source_words.max() + 1, target_words.max() + 1
    real = cross[target_words >= 0][:, source_words >= 0]  # [t', s']
    real = real / np.maximum(real.sum(-1, keepdims=True), 1e-12)  # without EOS's share
    src_onehot = np.eye(n_src)[source_words[source_words >= 0]]  # [s', S]
    tgt_onehot = np.eye(n_tgt)[target_words[target_words >= 0]]  # [t', T]
    summed = tgt_onehot.T @ real @ src_onehot  # [T, S]: piece rows summed per target word
    return summed / tgt_onehot.sum(0)[:, None]  # mean over each target word's pieces


def hard_alignment(word_attn: np.ndarray) -> list[tuple[int, int]]:
    """[T, S] -> (source i, target j) pairs: each target word to its most attended source word."""
    return [(int(i), j) for j, i in enumerate(word_attn.argmax(-1))]


def pharaoh(pairs: list[tuple[int, int]]) -> str:
    """'i-j i-j ...' sorted by source then target index."""
    return " ".join(f"{i}-{j}" for i, j in sorted(pairs))


def align_pair(cross: np.ndarray, source: list[str], target: list[str]) -> list[tuple[int, int]]:
    """One pair's links from its cross-attention [t, s] (one layer, mean over heads) and pieces."""
    src_words, tgt_words = word_ids(source), word_ids(target)
    if not (src_words >= 0).any() or not (tgt_words >= 0).any():  # an empty side: no links
        return []
    return hard_alignment(word_attention(cross, src_words, tgt_words))


def align(loaded, pairs: list[tuple[list[int], list[int]]], layer: int = DEFAULT_LAYER):
    """Pharaoh strings for (source ids, target ids) pairs, ids without EOS; "" where a side
    is empty. Pairs are padded into a few shapes (one compilation each) and run in batches:
    padding changes no weight of a real position (masked keys get exactly 0)."""
    out = [""] * len(pairs)
    for idx, inputs, targets in padded_batches(pairs):
        _, _, cross = attention_weights(loaded.model, loaded.params, inputs, targets)
        cross = cross[:, layer].mean(1)  # [b, t, s]: the chosen layer, mean over heads
        src_pieces = batch_pieces(loaded.tokenizer, inputs, source=True)
        tgt_pieces = batch_pieces(loaded.tokenizer, targets)
        for r, i in enumerate(idx):
            s, t = len(src_pieces[r]), len(tgt_pieces[r])
            out[i] = pharaoh(align_pair(cross[r, :t, :s], src_pieces[r], tgt_pieces[r]))
    return out


def padded_batches(pairs, rows: int = 32, multiple: int = 16, skip_empty: bool = True):
    """(indices, inputs [rows, S], targets [rows, T]) with EOS appended and zero padding; S
    and T rounded up to `multiple`, so a file of sentences compiles a handful of shapes.
    Pairs with an empty side are left out unless not `skip_empty`."""

    def shape(i):
        return tuple(-(-(len(x) + 1) // multiple) * multiple for x in pairs[i])

    todo = (i for i, (s, t) in enumerate(pairs) if not skip_empty or (len(s) and len(t)))
    todo = sorted(todo, key=shape)
    for (s_len, t_len), group in itertools.groupby(todo, key=shape):
        group = list(group)
        for start in range(0, len(group), rows):
            idx = group[start : start + rows]
            inputs = np.zeros((rows, s_len), np.int32)
            targets = np.zeros((rows, t_len), np.int32)
            for r, i in enumerate(idx):
                src, tgt = pairs[i]
                inputs[r, : len(src) + 1] = [*src, EOS_ID]
                targets[r, : len(tgt) + 1] = [*tgt, EOS_ID]
            yield idx, inputs, targets


def batch_pieces(tokenizer, ids: np.ndarray, source: bool = False) -> list[list[str]]:
    """Pieces of each row of a padded id array [b, l] (padding left out)."""
    return [pieces(tokenizer, row[row != PAD_ID], source) for row in ids]
