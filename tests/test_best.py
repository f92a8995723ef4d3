"""Checkpoints chosen by a dev score: ranking, keeping the best, early stopping, averaging the
best, decoding with the best, and the config's refusals (tx.train.best)."""

import json
import logging
import os
import shutil

import jax
import numpy as np
import pytest

from tx.config import ConfigError
from tx.infer.translate import StaleAverage, load_model
from tx.train import best
from tx.train.averaging import average
from tx.train.checkpoint import Checkpointer
from tx.train.loop import train
from tx.train.trainer import abstract_train_state, build


def test_ranking_prefers_the_better_score_then_the_earlier_step():
    bleu = {2: 10.0, 4: 30.0, 6: 30.0, 8: 25.0}
    assert best.ranked(bleu, "dev_bleu") == [4, 6, 8, 2]
    assert best.best_steps(bleu, "dev_bleu", 2) == [4, 6]
    loss = {2: 3.0, 4: 2.0, 6: 2.5}
    assert best.ranked(loss, "dev_loss") == [4, 6, 2]  # lower is better


def test_evaluations_since_best_count_from_steps():
    scores = {4: 30.0, 10: 12.0}  # the evaluations at 6 and 8 were pruned: still counted
    assert best.evaluations_since_best(scores, "dev_bleu", 10, 2) == 3
    assert best.evaluations_since_best(scores, "dev_bleu", 4, 2) == 0
    assert best.evaluations_since_best({}, "dev_bleu", 10, 2) == 0


class Scripted:
    """A dev BLEU hook that answers the given scores in turn (and counts its calls)."""

    def __init__(self, scores):
        self.scores, self.calls = list(scores), 0

    def __call__(self, params):
        self.calls += 1
        return {"bleu": self.scores[self.calls - 1], "tok_bleu": 0.0}


def _cfg(tiny, vocab, *extra):
    return tiny(
        f"data.vocab_path={vocab}",
        "train.num_steps=40",
        "train.checkpoint_every_steps=2",
        "train.keep_checkpoints=1",
        "train.eval_bleu_every_steps=2",
        "train.keep_best=2",
        "train.early_stopping_patience=3",
        *extra,
    )


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, vocab, tiny):
    """A tiny run whose dev BLEU peaks at step 4 (30) and that stops early at step 10."""
    workdir = str(tmp_path_factory.mktemp("best"))
    hook = Scripted([10, 30, 20, 25, 15, 12, 50, 50])
    result = train(_cfg(tiny, vocab), workdir, bleu_hook=hook)
    return workdir, result, hook


def test_early_stop_keeps_the_best_and_the_last(stopped):
    workdir, result, hook = stopped
    # Evaluations at 2..10 score 10 30 20 25 15: three after the best (6, 8, 10) -> stop at 10.
    assert result["step"] == 10 and hook.calls == 5
    ckpt = Checkpointer(workdir, keep=None)
    assert ckpt.all_steps() == [4, 8, 10]  # the best two (30, 25) and the last
    assert ckpt.scores() == {4: 30.0, 8: 25.0, 10: 15.0}
    ckpt.close()
    with open(os.path.join(workdir, "run_card.json")) as f:
        card = json.load(f)
    assert card["early_stop"] == {"step": 10, "metric": "dev_bleu", "best_step": 4, "best": 30.0}


def test_a_stopped_run_started_again_does_not_train(stopped, tiny, vocab):
    workdir, _, _ = stopped
    hook = Scripted([99])
    assert train(_cfg(tiny, vocab), workdir, bleu_hook=hook) == {"step": 10}
    assert hook.calls == 0
    assert Checkpointer(workdir, keep=None).all_steps() == [4, 8, 10]


def _params(cfg, workdir, step):
    target = abstract_train_state(build(cfg))
    return Checkpointer(workdir, keep=None).restore(step, target)[0].params


def test_average_and_decode_with_the_best(stopped, tiny, vocab):
    workdir, _, _ = stopped
    cfg = _cfg(tiny, vocab, "decode.average_which=best")
    path, steps = average(cfg, workdir)
    assert steps == [4, 8] and path.endswith(os.path.join("averaged", "8"))
    loaded = load_model(cfg, workdir)
    assert loaded.source == "averaged/8 (best by dev_bleu: steps [4, 8])"
    want = jax.tree_util.tree_map(
        lambda a, b: (a + b) / 2, _params(cfg, workdir, 4), _params(cfg, workdir, 8)
    )
    # (a + b) / 2 in float32 both ways: the same rounding, so equal up to the last bit.
    leaves = jax.tree_util.tree_leaves
    for got, ref in zip(leaves(loaded.params), leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
    single = load_model(cfg, workdir, "best")
    assert single.source == "checkpoints/4 (best by dev_bleu)"
    with open(os.path.join(workdir, "run_card.json")) as f:
        record = json.load(f)["average"]
    assert record["best_by"] == "dev_bleu" and record["scores"] == {"4": 30.0, "8": 25.0}


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory, vocab, tiny):
    """A run of 4 steps whose dev BLEU is 10 at step 2 and 30 at step 4, trained once: each
    test below changes a copy of it (`_copy`)."""
    workdir = str(tmp_path_factory.mktemp("four_steps"))
    train(_cfg(tiny, vocab, "train.num_steps=4"), workdir, bleu_hook=Scripted([10, 30]))
    return workdir


def _copy(run, tmp_path) -> str:
    copy = str(tmp_path / "run")
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("lock.json"))
    return copy


def test_an_average_of_the_best_goes_stale_when_the_best_change(four_steps, tmp_path, vocab, tiny):
    workdir = _copy(four_steps, tmp_path)
    cfg = _cfg(tiny, vocab, "decode.average_which=best")
    average(cfg, workdir)
    ckpt = Checkpointer(workdir, keep=None)
    state, position = ckpt.restore(4, abstract_train_state(build(cfg)))
    ckpt.save(6, state, position, {"dev_bleu": 40.0})  # a better one since
    ckpt.close()
    with pytest.raises(StaleAverage, match=r"they are now \[4, 6\]"):
        load_model(cfg, workdir)


def test_loss_as_the_metric_keeps_the_lowest(tmp_path, vocab, tiny):
    cfg = tiny(
        f"data.vocab_path={vocab}",
        "train.num_steps=4",
        "train.checkpoint_every_steps=100",
        "train.keep_checkpoints=1",
        "train.eval_every_steps=2",
        "train.keep_best=1",
        "train.best_metric=dev_loss",
    )
    train(cfg, str(tmp_path))
    ckpt = Checkpointer(str(tmp_path), keep=None)
    scores = ckpt.scores("dev_loss")
    assert set(scores) <= {2, 4} and 4 in scores
    lowest = min(scores, key=scores.get)
    assert ckpt.all_steps() == sorted({lowest, 4})  # the best and the newest


def test_a_damaged_score_is_not_counted(four_steps, tmp_path, caplog):
    workdir = _copy(four_steps, tmp_path)
    with open(os.path.join(workdir, "checkpoints", "4", "data", "metadata"), "w") as f:
        f.write("{not json")
    with caplog.at_level(logging.WARNING):
        assert Checkpointer(workdir, keep=None).scores() == {2: 10.0}
    assert "checkpoints/4 cannot be restored (data/metadata is not JSON)" in caplog.text


def test_without_scores_average_best_says_how_to_get_them(trained, tiny):
    cfg = tiny("train.keep_best=1", "train.eval_bleu_every_steps=5", "decode.average_which=best")
    with pytest.raises(ConfigError, match="carries a dev_bleu score"):
        average(cfg, trained)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["train.keep_best=2"], "train.eval_bleu_every_steps"),
        (["train.early_stopping_patience=3"], "train.keep_best"),
        (["train.best_metric=bleu"], "train.best_metric"),
        (["train.keep_best=-1"], "train.keep_best"),
        (["decode.average_which=best"], "train.keep_best"),
        (["decode.average_which=first"], "decode.average_which"),
    ],
)
def test_the_config_refuses_what_cannot_work(tiny, overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        tiny(*overrides)


def test_the_paper_configs_keep_the_last(tiny):
    cfg = tiny()
    assert cfg.train.keep_best == 0 and cfg.decode.average_which == "last"
    assert best.Criterion.from_config(cfg.train) is None
