"""The offline demo end to end: train, average, translate samples, score the test set, and
draw one sentence's attention maps and the run's learning curves."""

from __future__ import annotations

import json
import os
import time

import jax
import ml_collections

from tx.data.dataset import split_text
from tx.eval.evaluate import copy_baseline, evaluate_split
from tx.infer.translate import load_model, translate
from tx.train.checkpoint import average
from tx.train.loop import train
from tx.workdir import plots_dir

SAMPLES = 5
# Fronted time: German puts the verb second, so the alignment crosses (needs-braucht, she-sie).
ATTENTION_SENTENCE = "Today, she needs the boat."


def run_demo(cfg: ml_collections.ConfigDict, workdir: str, say=print) -> dict:
    start = time.perf_counter()
    metrics = train(cfg, workdir)
    train_secs = time.perf_counter() - start
    path, steps = average(cfg, workdir)
    say(f"\naveraged checkpoints {steps} -> {path}")
    loaded = load_model(cfg, workdir)
    pairs = split_text(cfg.data, "test")[:SAMPLES]
    say("\nsample test translations (English -> German):")
    for (src, ref), hyp in zip(pairs, translate(loaded, [s for s, _ in pairs], cfg), strict=True):
        say(f"  EN   {src}\n  tx   {hyp}\n  REF  {ref}\n")
    t0 = time.perf_counter()
    result = evaluate_split(cfg, workdir, "test", loaded)
    decode_secs = time.perf_counter() - t0
    baseline = copy_baseline(cfg, "test")
    summary = {
        "test_bleu": round(result["bleu"], 2),
        "test_tok_bleu": round(result["tok_bleu"], 2),
        "test_chrf": round(result["chrf"], 2),
        "bleu_signature": result["bleu_signature"],
        "copy_source_bleu": round(baseline["bleu"], 2),
        # None when training had already finished before this run (nothing was evaluated).
        "dev_perplexity": round(metrics["dev_perplexity"], 3)
        if "dev_perplexity" in metrics
        else None,
        "train_steps": metrics["step"],
        "train_seconds": round(train_secs, 1),
        "decode_seconds": round(decode_secs, 1),
        "num_sentences": result["num_sentences"],
        "devices": jax.device_count(),
    }
    say(
        f"test sacreBLEU {summary['test_bleu']} (copying the source: "
        f"{summary['copy_source_bleu']}), tokenized BLEU {summary['test_tok_bleu']}, "
        f"chrF {summary['test_chrf']}"
    )
    summary["pictures"] = draw_pictures(cfg, workdir, loaded)
    say("\npictures (attention maps of one sentence, learning curves):")
    say("\n".join(f"  {p}" for p in summary["pictures"]))
    say(json.dumps(summary))
    return summary


def draw_pictures(cfg: ml_collections.ConfigDict, workdir: str, loaded) -> list[str]:
    """ATTENTION_SENTENCE's attention maps and the learning curves, under W/plots/."""
    from tx.viz.pictures import attention_pictures, curves_picture

    out = plots_dir(workdir)
    paths = []
    if loaded.model.config.family == "transformer":  # the maps are a Transformer's layers
        paths = attention_pictures(loaded, cfg, ATTENTION_SENTENCE, os.path.join(out, "attention"))
    return [*paths, curves_picture([workdir], os.path.join(out, "curves.png"))]
