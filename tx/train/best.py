"""Choosing checkpoints by a dev score: keeping the best, stopping early, averaging the best.

    criterion = Criterion.from_config(cfg.train)     # None unless train.keep_best > 0
    best_steps(scores, criterion.metric, n)          # the n best steps, in step order
    evaluations_since_best(scores, metric, step, every)

The paper keeps and averages the LAST checkpoints, and on WMT that is right: the dev score still
rises when training ends. On a corpus of a few hundred thousand pairs or fewer it peaks and then
falls as the model over-fits, so the user wants the best ones (fairseq's
--keep-best-checkpoints, --best-checkpoint-metric and --patience). With `train.keep_best` = N > 0,
every evaluation of `train.best_metric` saves a checkpoint that carries its score, the N best are
never pruned, and `train.early_stopping_patience` = P stops training once P evaluations in a row
have not beaten the best. `decode.average_which = "best"` makes `tx average` average the N best;
`--checkpoint best` decodes with the single best.

The score is written inside its checkpoint (the data item, beside the data position; see
tx.train.checkpoint), so it is committed atomically with the state it scores and goes when that
checkpoint goes: nothing else in the workdir can disagree with it.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from tx.train.settings import BEST_METRICS

# A metric -> whether higher is better. Where it comes from: dev_bleu from the dev BLEU hook
# (every train.eval_bleu_every_steps, sacreBLEU of the configured search), dev_loss from the
# dev loss evaluation (every train.eval_every_steps, label-smoothed cross-entropy).
METRICS = {"dev_bleu": True, "dev_loss": False}
assert set(METRICS) == set(BEST_METRICS)


@dataclasses.dataclass(frozen=True)
class Criterion:
    metric: str  # one of METRICS
    keep: int  # best checkpoints kept beside the last ones
    patience: int  # evaluations without a new best before training stops; 0 = never
    every: int  # steps between two evaluations of `metric`

    @classmethod
    def from_config(cls, t: ml_collections.ConfigDict) -> Criterion | None:
        """From `cfg.train`; None when no best checkpoints are kept (the paper's recipe).
        The config has been validated (tx.config): the metric is known and evaluated."""
        keep = int(t.get("keep_best", 0))
        if keep <= 0:
            return None
        metric = t.best_metric
        every = int(t[BEST_METRICS[metric].removeprefix("train.")])
        return cls(metric, keep, int(t.early_stopping_patience), every)


def ranked(scores: dict[int, float], metric: str) -> list[int]:
    """Steps ordered best score first; of equal scores the earlier step first (it was reached
    with less training)."""
    sign = -1.0 if METRICS[metric] else 1.0
    return sorted(scores, key=lambda step: (sign * scores[step], step))


def best_steps(scores: dict[int, float], metric: str, n: int) -> list[int]:
    """The `n` best-scoring steps, in step order."""
    return sorted(ranked(scores, metric)[:n])


def evaluations_since_best(scores: dict[int, float], metric: str, step: int, every: int) -> int:
    """How many evaluations (one every `every` steps) up to `step` came after the best one; 0
    when there is no score yet. Counted from the steps alone, so it holds after a resume: the
    best checkpoint is always kept, and the evaluations in between need not be."""
    if not scores or every <= 0:
        return 0
    return step // every - ranked(scores, metric)[0] // every
