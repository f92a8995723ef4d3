"""`python -m tx attention --workdir W --text "..." [--out DIR]`: one sentence's attention maps
(encoder self-attention, decoder self-attention, encoder-decoder), every layer and head, as
PNGs (tx.viz.pictures); prints the paths it wrote."""

from __future__ import annotations

import argparse

from tx.cli import options

CONFIG = "run"


def add_options(p: argparse.ArgumentParser) -> None:
    options.config(p)
    options.workdir(p, "the run")
    options.checkpoint(p)
    p.add_argument("--text", help="the sentence to translate and draw")
    p.add_argument("--out", metavar="DIR", help="where the PNGs go (default W/plots/attention)")


def run(args: argparse.Namespace, cfg) -> int:
    from tx import storage
    from tx.infer.translate import load_model
    from tx.viz.pictures import attention_pictures
    from tx.workdir import plots_dir

    loaded = load_model(cfg, args.workdir, args.checkpoint)
    out = args.out or storage.join(plots_dir(args.workdir), "attention")
    for path in attention_pictures(loaded, cfg, args.text or "", out):
        print(f"wrote {path}")
    return 0
