"""The offline demo end to end: train, average, translate samples, score the test set, and
draw one sentence's attention maps and the run's learning curves."""

from __future__ import annotations

import json

import jax
import ml_collections

from tx import storage
from tx.data.dataset import split_text
from tx.eval.evaluate import copy_baseline
from tx.infer.translate import translate
from tx.paper.end_to_end import train_average_evaluate
from tx.workdir import plots_dir

SAMPLES = 5
# Fronted time: German puts the verb second, so the alignment crosses (needs-braucht, she-sie).
ATTENTION_SENTENCE = "Today, she needs the boat."


def run_demo(cfg: ml_collections.ConfigDict, workdir: str, say=print) -> dict:
    def show_samples(loaded, averaged) -> None:
        path, steps = averaged
        say(f"\naveraged checkpoints {steps} -> {path}")
        pairs = split_text(cfg.data, "test")[:SAMPLES]
        say("\nsample test translations (English -> German):")
        sources = [s for s, _ in pairs]
        for (src, ref), hyp in zip(pairs, translate(loaded, sources, cfg), strict=True):
            say(f"  EN   {src}\n  tx   {hyp}\n  REF  {ref}\n")

    run = train_average_evaluate(cfg, workdir, split="test", before_evaluate=show_samples)
    metrics, result, loaded = run.metrics, run.scores, run.loaded
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
        "train_seconds": round(run.train_secs, 1),
        "decode_seconds": round(run.evaluate_secs, 1),
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
        paths = attention_pictures(loaded, cfg, ATTENTION_SENTENCE, storage.join(out, "attention"))
    return [*paths, curves_picture([workdir], storage.join(out, "curves.png"))]
