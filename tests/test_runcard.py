"""Run cards: written by train (per segment, resumable), completed by average and evaluate."""

import json
import os
import shutil

import jax
import pytest

from tx import workdir as wd
from tx.eval.evaluate import evaluate_split
from tx.train import runcard
from tx.train.averaging import average
from tx.train.loop import train


def test_train_writes_a_card(trained, tiny):
    card = runcard.load(trained)
    cfg = tiny("train.num_steps=20", "train.checkpoint_every_steps=5")
    assert card["config"] == runcard.resolved(cfg)
    assert card["config_hash"] == runcard.config_hash(runcard.resolved(cfg))
    (seg,) = card["segments"]
    assert (seg["start_step"], seg["end_step"]) == (0, 20)
    assert seg["packages"]["jax"] == jax.__version__
    assert seg["hardware"]["devices"] == jax.device_count()
    assert seg["hardware"]["processes"] == 1
    assert "commit" in seg and "dirty" in seg
    # tiny: 512 real tokens per side per step on average (tx.data.pipeline), 20 steps.
    assert 0.5 * 20 * 512 < seg["src_tokens"] < 2 * 20 * 512
    assert 0.5 * 20 * 512 < seg["tgt_tokens"] < 2 * 20 * 512
    assert seg["model_flops"] > 0 and seg["wall_secs"] > 0
    t = card["totals"]
    assert t["steps"] == 20 and t["src_tokens"] == seg["src_tokens"]
    assert t["mean_mfu"] == pytest.approx(t["model_flops"] / t["cost_flops_paper_way"])
    with open(wd.run_card_markdown(trained)) as f:
        assert "steps 20 in 1 segment(s)" in f.read()


def test_resume_adds_a_segment(trained, tiny, tmp_path):
    work = str(tmp_path / "run")
    shutil.copytree(trained, work)
    first = runcard.load(work)["segments"][0]
    train(tiny("train.num_steps=30", "train.checkpoint_every_steps=5"), work)
    card = runcard.load(work)
    assert [(s["start_step"], s["end_step"]) for s in card["segments"]] == [(0, 20), (20, 30)]
    assert card["segments"][0] == first  # the earlier segment is kept as it was
    t = card["totals"]
    assert t["steps"] == 30
    assert t["src_tokens"] == pytest.approx(sum(s["src_tokens"] for s in card["segments"]))
    assert t["segments"] == 2
    # Training a finished run adds no empty segment.
    train(tiny("train.num_steps=30", "train.checkpoint_every_steps=5"), work)
    assert len(runcard.load(work)["segments"]) == 2


def test_a_resume_before_a_segment_end_clips_it():
    segment = {
        "start_step": 0,
        "end_step": 100,
        "wall_secs": 50.0,
        "src_tokens": 1000.0,
        "tgt_tokens": 2000.0,
        "model_flops": 4e9,
    }
    clipped = runcard._clip(segment, 40)  # checkpoints after 40 were lost
    assert clipped["end_step"] == 40 and clipped["clipped"]
    assert clipped["src_tokens"] == pytest.approx(400.0)
    assert clipped["wall_secs"] == pytest.approx(20.0)
    assert runcard._clip(segment, 100) is segment


def test_average_and_evaluate_complete_the_card(trained, tiny, tmp_path):
    work = str(tmp_path / "run")
    shutil.copytree(trained, work)
    cfg = tiny("train.num_steps=20", "train.checkpoint_every_steps=5")
    path, steps = average(cfg, work, 2)
    result = evaluate_split(cfg, work, "test")
    card = runcard.load(work)
    assert card["average"]["steps"] == steps == [15, 20]
    scores = card["scores"]["test"]
    assert scores["bleu"] == result["bleu"]
    assert scores["bleu_signature"] == result["bleu_signature"]
    assert scores["tok_bleu_recipe"] == result["tok_bleu_recipe"]
    assert scores["trained_steps"] == 20
    assert scores["checkpoint"].startswith("averaged/20")
    assert scores["search"] == {
        "strategy": "beam",
        "beam_size": 4,
        "alpha": 0.6,
        "max_extra_len": 4,
    }
    with open(wd.run_card_markdown(work)) as f:
        text = f.read()
    assert "averaged checkpoints [15, 20]" in text and "sacreBLEU" in text
    assert json.load(open(wd.run_card_file(work)))["totals"]["steps"] == 20


def test_config_hash_is_canonical():
    a = {"model": {"d_model": 512, "num_heads": 8}, "train": {"seed": 0}}
    b = {"train": {"seed": 0}, "model": {"num_heads": 8, "d_model": 512}}
    assert runcard.config_hash(a) == runcard.config_hash(b)
    assert runcard.config_hash(a) != runcard.config_hash({**a, "train": {"seed": 1}})


def test_code_version_names_this_checkout(root):
    version = runcard.code_version()
    if not os.path.isdir(root / ".git") and not os.path.isfile(root / ".git"):
        pytest.skip("not a git checkout")
    assert len(version["commit"]) == 40 and isinstance(version["dirty"], bool)
