"""`road length`: the bottleneck on real (demo) sentences, through the ordinary commands.

RNN seq2seq (configs/rnn_seq2seq.py), RNN + additive attention (configs/rnn_attention.py) and
the Transformer (configs/demo.py) train on the same corpus, vocabulary size, token budget
(600 steps of 3,800 real tokens per side) and schedule, each in its own workdir under
`--root`, then are averaged, decoded (beam 4) and scored on the 500 test sentences, with
sacreBLEU per source-length bucket (Bahdanau et al. 2015, Figure 2) and training tokens/s
from each run card. The Transformer runs with data.pack=False here, as the RNNs must, so that
tokens/s compares models and not batch layouts. A finished workdir is reused (training
resumes to its last step and stops); `--config.KEY=VALUE` overrides apply to all three.
Time: each model about the demo's budget (7 min on 2 idle CPU cores); see README.md.
"""

from __future__ import annotations

import numpy as np

from tx import storage
from tx.config import load_config, model_config
from tx.model.counting import param_counts
from tx.paper.road import config_path, markdown_table
from tx.train import runcard
from tx.viz import plots

MODELS = (  # name, config, overrides
    ("rnn_seq2seq", "configs/rnn_seq2seq.py", ()),
    ("rnn_attention", "configs/rnn_attention.py", ()),
    ("transformer", "configs/demo.py", ("data.pack=False",)),
)
BUCKET_WIDTH = 5  # source words per bucket: the demo's sentences have 2 to about 25 words


def train_and_score(name: str, path: str, overrides, root: str, say=print) -> dict:
    """Trains (or finishes) one model, averages, evaluates the test split by length."""
    from tx.paper.end_to_end import train_average_evaluate

    cfg = load_config(config_path(path), list(overrides))
    workdir = storage.join(root, name)
    say(f"road length: {name} ({path}) in {workdir}")
    result = train_average_evaluate(cfg, workdir, split="test", by_length=BUCKET_WIDTH).scores
    t = runcard.load(workdir)["totals"]
    return {
        "name": name,
        "config": path,
        "params": param_counts(model_config(cfg))["params"],
        "bleu": result["bleu"],
        "by_length": result["by_length"],
        "steps": t["steps"],
        "train_secs": t["wall_secs"],
        "tokens_per_sec": (t["src_tokens"] + t["tgt_tokens"]) / max(t["wall_secs"], 1e-9),
        "workdir": workdir,
    }


def run(results: str, root: str, overrides=(), say=print):
    root = storage.join(root, "road_length")
    runs = [train_and_score(n, p, (*o, *overrides), root, say) for n, p, o in MODELS]
    buckets = [b["bucket"] for b in runs[-1]["by_length"]]
    header = ["model", "params", "test sacreBLEU", *[f"{b} words" for b in buckets]]
    header += ["train tokens/s", "train time"]
    rows = []
    for r in runs:
        by = {b["bucket"]: b["bleu"] for b in r["by_length"]}
        rows.append(
            [
                f"{r['name']} (`{r['config']}`)",
                f"{r['params'] / 1e6:.2f}M",
                f"{r['bleu']:.2f}",
                *[f"{by[b]:.2f}" if b in by else "-" for b in buckets],
                f"{r['tokens_per_sec']:.0f}",
                f"{r['train_secs'] / 60:.1f} min ({r['steps']} steps)",
            ]
        )
    counts = ", ".join(f"{b['bucket']}: {b['sentences']}" for b in runs[-1]["by_length"])
    total = sum(b["sentences"] for b in runs[-1]["by_length"])
    body = (
        f"BLEU by source length on the demo's {total} test sentences (sentences per bucket: "
        f"{counts}); beam 4, alpha 0.6, last 5 checkpoints averaged; tokens/s = real source + "
        "target tokens over the run card's wall time (compilation included); a workdir that "
        "already holds a finished run is reused, and the header's time is then that of "
        "averaging and decoding only. Bahdanau et al. "
        "(2015, Figure 2) saw the fixed-length model fall with sentence length and attention "
        "hold up; the seed prints no number for this experiment.\n\n" + markdown_table(header, rows)
    )
    extra = "".join(f" --config.{o}" for o in overrides)
    return body, figure(runs, buckets), f"python -m tx road length{extra}"


def figure(runs: list[dict], buckets: list[str]):
    fig = plots.new_figure(9, 4.5)
    ax = fig.subplots()
    x = np.arange(len(buckets))
    width = 0.8 / len(runs)
    for k, r in enumerate(runs):
        by = {b["bucket"]: b["bleu"] for b in r["by_length"]}
        ax.bar(
            x + (k - (len(runs) - 1) / 2) * width,
            [by.get(b, np.nan) for b in buckets],
            width,
            label=f"{r['name']} ({r['bleu']:.1f} overall)",
        )
    counts = {b["bucket"]: b["sentences"] for b in runs[-1]["by_length"]}
    ax.set_xticks(x, [f"{b}\n({counts[b]} sentences)" for b in buckets])
    ax.set(xlabel="source length (words)", ylabel="test sacreBLEU")
    ax.set_title("Demo test set: BLEU by source length (same data, budget and search)")
    ax.set_ylim(0, 119)
    ax.legend(fontsize=8, loc="upper center", ncol=len(runs))
    return fig
