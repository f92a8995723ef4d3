"""tx.paper.end_to_end: train -> average -> evaluate written once, and the demo through it."""

import os
import shutil

from test_plots import png_size

from tx import workdir as wd
from tx.paper.demo import run_demo
from tx.paper.end_to_end import train_average_evaluate
from tx.train import runcard

# The shared run's config (conftest `trained`).
SHARED = ("train.num_steps=20", "train.checkpoint_every_steps=5")


def _fresh_copy(trained, tmp_path) -> str:
    """The shared trained run without any average other tests may have added, nor the run
    card that records it (the tests read which steps this run's card gains)."""
    work = str(tmp_path / "run")
    shutil.copytree(trained, work)
    shutil.rmtree(wd.averaged_dir(work), ignore_errors=True)
    for card in (wd.run_card_file(work), wd.run_card_markdown(work)):
        if os.path.exists(card):
            os.remove(card)
    return work


def test_train_average_evaluate_runs_the_steps_in_order(trained, tiny, tmp_path):
    work = _fresh_copy(trained, tmp_path)
    cfg = tiny(*SHARED, "decode.average_last=2")
    seen = []

    def after_train():
        seen.append(("after_train", "average" in runcard.load(work)))

    def before_evaluate(loaded, averaged):
        scored = "test" in runcard.load(work).get("scores", {})
        seen.append(("before_evaluate", averaged, loaded.source, scored))

    out = train_average_evaluate(
        cfg, work, after_train=after_train, before_evaluate=before_evaluate
    )
    averaged = (os.path.join(wd.averaged_dir(work), "20"), [15, 20])
    assert seen == [
        ("after_train", False),
        ("before_evaluate", averaged, "averaged/20 (steps [15, 20])", False),
    ]
    assert out.averaged == averaged and out.metrics["step"] == 20
    assert out.loaded.source == out.scores["checkpoint"] == "averaged/20 (steps [15, 20])"
    assert out.scores["split"] == "test" and out.scores["num_sentences"] == 50
    assert "by_length" not in out.scores
    card = runcard.load(work)
    assert card["average"]["steps"] == [15, 20]
    assert card["scores"]["test"]["bleu"] == out.scores["bleu"]
    assert out.train_secs > 0 and out.evaluate_secs > 0


def test_without_averaging_the_last_checkpoint_is_scored(trained, tiny, tmp_path):
    work = _fresh_copy(trained, tmp_path)
    cfg = tiny(*SHARED)
    out = train_average_evaluate(cfg, work, split="dev", average=False, by_length=5)
    assert out.averaged is None and not os.path.exists(wd.averaged_dir(work))
    assert out.scores["checkpoint"] == "checkpoints/20" and out.scores["split"] == "dev"
    assert sum(b["sentences"] for b in out.scores["by_length"]) == out.scores["num_sentences"]
    assert "average" not in runcard.load(work)


def test_the_demo_prints_the_average_and_samples_before_the_scores(trained, tiny, tmp_path):
    work = _fresh_copy(trained, tmp_path)
    lines = []
    summary = run_demo(tiny(*SHARED), work, say=lines.append)
    text = "\n".join(lines)
    averaged = f"averaged checkpoints [5, 10, 15, 20] -> {wd.averaged_dir(work)}/20"
    assert (
        text.index(averaged) < text.index("sample test translations") < text.index("test sacreBLEU")
    )
    assert text.count("  EN   ") == 5
    assert summary["train_steps"] == 20 and summary["num_sentences"] == 50
    assert summary["train_seconds"] >= 0 and summary["decode_seconds"] > 0
    assert summary["dev_perplexity"] is None  # the run had finished: nothing was evaluated
    # tx.paper.demo.draw_pictures: one sentence's attention maps and the curves, under plots/.
    assert [os.path.relpath(p, work) for p in summary["pictures"]] == [
        "plots/attention/encoder_self_attention.png",
        "plots/attention/decoder_self_attention.png",
        "plots/attention/encoder_decoder_attention.png",
        "plots/curves.png",
    ]
    assert all(min(png_size(p)) > 300 for p in summary["pictures"])
