"""Several training corpora sampled by weight (data.train_weights): which pairs of each corpus
an epoch draws (`Mix`), for tx.data.pipeline to batch as it batches one corpus."""

from __future__ import annotations

import dataclasses

import numpy as np

from tx.data.sources import DataError


@dataclasses.dataclass(frozen=True)
class Mix:
    """Several training corpora sampled by weight (data.train_weights), as fairseq's and
    OpenNMT's weighted corpora: each epoch draws each corpus's share of the kept pairs
    (`counts`). A corpus is read as an endless sequence of passes, each a permutation of its
    kept pairs, and epoch e takes the next `counts` pairs of it: a corpus smaller than its
    share is passed over more than once an epoch, a larger one over several epochs, and no
    pair comes round again before every pair of its corpus has. Each pass is a pure function
    of (seed, corpus, pass), so an epoch's pairs are one of (seed, epoch), as a single corpus's
    are, and a resumed run goes on with the very next batch.

    `corpus_of` [n]: each pair's corpus, an index into `shares` (which sum to 1) and `names`.
    """

    corpus_of: np.ndarray
    shares: tuple[float, ...]
    names: tuple[str, ...]

    @classmethod
    def of(cls, sizes, weights, names) -> Mix:
        """The mix of corpora of `sizes` pairs (in order, as tx.data.token_cache.joined puts
        them one after another) with `weights` (any positive scale)."""
        total = float(sum(weights))
        corpus_of = np.repeat(np.arange(len(sizes)), sizes).astype(np.int32)
        return cls(corpus_of, tuple(float(w) / total for w in weights), tuple(names))

    def counts(self, keep: np.ndarray) -> np.ndarray:
        """Pairs of each corpus an epoch draws: share x kept pairs, rounded so that they add
        up to the kept pairs (largest remainders, a tie to the earlier corpus), and at least
        one of each (a share under one pair adds it)."""
        exact = np.asarray(self.shares) * len(keep)
        out = np.floor(exact).astype(np.int64)
        short = len(keep) - int(out.sum())
        out[np.argsort(out - exact, kind="stable")[:short]] += 1
        return np.maximum(out, 1)

    def members(self, keep: np.ndarray) -> list[np.ndarray]:
        """The kept pairs of each corpus; a corpus left with none is an error naming it."""
        out = [keep[self.corpus_of[keep] == c] for c in range(len(self.shares))]
        for c, m in enumerate(out):
            if len(m) == 0:
                raise DataError(
                    f"training corpus {self.names[c]} has no pairs left after filtering "
                    "(every pair empty or longer than data.max_len), but data.train_weights "
                    f"gives it {self.shares[c]:.1%} of the pairs"
                )
        return out

    def draw(self, keep: np.ndarray, seed: int, epoch: int, rng: np.random.Generator):
        """Epoch `epoch`'s pairs [sum of `counts`], shuffled across corpora by `rng`."""
        parts = []
        for c, (members, need) in enumerate(
            zip(self.members(keep), self.counts(keep), strict=True)
        ):
            n, start = len(members), epoch * int(need)
            first, last = start // n, (start + int(need) - 1) // n
            passes = [
                members[np.random.default_rng([seed, 2**30 + c, p]).permutation(n)]
                for p in range(first, last + 1)
            ]
            parts.append(np.concatenate(passes)[start - first * n : start - first * n + need])
        order = np.concatenate(parts)
        return order[rng.permutation(len(order))]

    def frequency(self, keep: np.ndarray) -> np.ndarray:
        """[len(keep)]: how many times an epoch draws each kept pair, on average."""
        members = self.members(keep)
        per_corpus = self.counts(keep) / np.array([len(m) for m in members])
        return per_corpus[self.corpus_of[keep]]
