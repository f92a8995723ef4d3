"""Force-decoding: a model's log-probability of given translations, per sentence and per token.

    score_texts(loaded, sources, targets) -> [Scored(log_prob, tokens, token_log_probs)]

One teacher-forced pass over each batch of (source, target) pairs. The log-probabilities are
the search's (tx.infer.search.log_probs: PAD and BOS are never emitted; an ensemble's
members' are averaged and normalised again, as tx.infer.decoders combines them), so a beam
search with alpha 0 scores its best output as `score_texts` scores it, up to float32
rounding between the incremental and the teacher-forced decoder. A CTranslate2 export
(tx.infer.ct2) scores with its own `score_batch`: the export gives PAD and BOS probability 0
too (tx.infer.export.NEVER_LOGIT), so its log-probabilities are these up to float32 rounding.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from tx.infer.alignment import padded_batches
from tx.infer.search import log_probs
from tx.infer.translate import LoadedModel

ROWS = 32  # pairs per batch
MULTIPLE = 16  # lengths are padded up to a multiple of this: a few shapes, a few compilations


@dataclasses.dataclass(frozen=True)
class Scored:
    """One target's log-probability given its source (natural log)."""

    log_prob: float  # the sentence's: the sum of token_log_probs
    tokens: list[str]  # the target's sub-word pieces, ending in "</s>"
    token_log_probs: list[float]  # of each of `tokens`, given the source and those before it


def score_texts(loaded, sources: list[str], targets: list[str]) -> list[Scored]:
    """Each target's log-probability given its source, in input order. An empty target
    scores its EOS alone; an empty source is the EOS alone too."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources for {len(targets)} targets")
    tokenizer = loaded.tokenizer
    pairs = [  # ids ending in EOS
        (
            np.asarray(tokenizer.encode(s.strip()), np.int32),
            np.asarray(tokenizer.encode(t.strip(), target=True), np.int32),
        )
        for s, t in zip(sources, targets, strict=True)
    ]
    if isinstance(loaded, LoadedModel):
        scores = _score_ids(loaded, pairs)
    else:
        scores = _score_ct2(loaded, pairs)
    out = []
    for (_, target), lps in zip(pairs, scores, strict=True):
        pieces = [*map(tokenizer.piece, target[:-1]), "</s>"]
        out.append(Scored(float(np.sum(lps, dtype=np.float64)), pieces, [float(x) for x in lps]))
    return out


def _score_ids(loaded: LoadedModel, pairs: list[tuple[np.ndarray, np.ndarray]]) -> list:
    """Per pair (ids with EOS) the log-probability of each target id, EOS included."""
    out: list = [None] * len(pairs)
    models = tuple(m for m, _ in loaded.members)
    params = tuple(p for _, p in loaded.members)
    bare = [(s[:-1], t[:-1]) for s, t in pairs]  # padded_batches appends the EOS again
    for idx, inputs, targets in padded_batches(bare, ROWS, MULTIPLE, skip_empty=False):
        lps = np.asarray(_token_log_probs(models, params, inputs, targets))
        for r, i in enumerate(idx):
            out[i] = lps[r, : len(pairs[i][1])]
    return out


@functools.partial(jax.jit, static_argnames=("models",))
def _token_log_probs(models: tuple, params: tuple, inputs, targets):
    """inputs [b, s], targets [b, t] (0-padded) -> log p(targets[:, i] | source, before) [b, t]."""
    members = [
        log_probs(m.apply({"params": p}, inputs, targets))
        for m, p in zip(models, params, strict=True)
    ]
    lp = members[0] if len(members) == 1 else log_probs(jnp.mean(jnp.stack(members), 0))
    return jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]


def _score_ct2(model, pairs: list[tuple[np.ndarray, np.ndarray]]) -> list:
    """CTranslate2's log-probabilities (tx.infer.ct2.CT2Model): pieces without EOS in, each
    target piece's and the EOS's out."""
    pieces = model.pieces
    results = model.translator.score_batch(
        [[pieces[t] for t in s[:-1]] for s, _ in pairs],
        [[pieces[t] for t in t[:-1]] for _, t in pairs],
        max_input_length=0,  # tx never truncates an input
    )
    return [np.asarray(r.log_probs, np.float32) for r in results]
