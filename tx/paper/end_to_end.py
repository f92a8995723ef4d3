"""One run of a config end to end: train -> average -> evaluate, as the commands do it.

    python -m tx train ...; python -m tx average ...; python -m tx evaluate ...

written once for the demo (tx.paper.demo), the tables' rows (tx.paper.reproduce) and the road's
length experiment (tx.paper.road.length). A run that was stopped resumes, and one that has
finished is reused: training stops at once and the average of the same checkpoints is kept.
One stopped by a signal before it finished (SIGTERM, SIGINT) raises Stopped: a part is never
scored (train.max_minutes reached is a finished run).
What a caller adds between the steps goes in the two hooks.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import ml_collections

from tx.eval.evaluate import evaluate_split
from tx.infer.translate import LoadedModel, load_model
from tx.train import averaging
from tx.train.loop import train


class Stopped(RuntimeError):
    """Training was stopped by a signal before it finished: nothing is averaged or scored,
    and the same command resumes it."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What `train_average_evaluate` did, and how long its two long parts took."""

    metrics: dict  # the last metrics of training (tx.train.loop.train)
    train_secs: float  # wall time of training in this call
    averaged: tuple[str, list[int]] | None  # (path, checkpoint steps) of the average, or None
    loaded: LoadedModel  # the model that was scored: the average when there is one
    scores: dict  # tx.eval.evaluate.evaluate_split's result
    evaluate_secs: float  # wall time of translating and scoring the split


def train_average_evaluate(
    cfg: ml_collections.ConfigDict,
    workdir: str,
    *,
    split: str = "test",
    average: bool = True,
    by_length: int = 0,
    after_train: Callable[[], None] | None = None,
    before_evaluate: Callable[[LoadedModel, tuple[str, list[int]] | None], None] | None = None,
) -> Outcome:
    """Trains `cfg` in `workdir` (or finishes it), averages, and scores `split`.

    Args:
      average: whether to average the last `decode.average_last` checkpoints first; without an
        average the newest training checkpoint is scored (tx.infer.translate.load_model).
      by_length: a bucket width in source words for BLEU by length (0: none).
      after_train: called once training has stopped, before averaging.
      before_evaluate: called with the loaded model and `averaged` before the split is scored.
    """
    start = time.perf_counter()
    metrics = train(cfg, workdir)
    train_secs = time.perf_counter() - start
    if "stopped" in metrics:
        raise Stopped(
            f"{workdir}: training stopped at step {metrics['step']} ({metrics['stopped']}): "
            "nothing was averaged or scored; run the same command again to resume"
        )
    if after_train is not None:
        after_train()
    averaged = averaging.average(cfg, workdir) if average else None
    loaded = load_model(cfg, workdir)
    if before_evaluate is not None:
        before_evaluate(loaded, averaged)
    start = time.perf_counter()
    scores = evaluate_split(cfg, workdir, split, loaded, by_length=by_length)
    return Outcome(metrics, train_secs, averaged, loaded, scores, time.perf_counter() - start)
