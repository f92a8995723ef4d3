"""`python -m tx plot --workdir W [W2 ...] [--out F]`: learning curves of runs from their event
files (no TensorFlow, so a run still training can be watched); `plot --positional
[--d-model 512]`: the sinusoidal positional encodings. Prints the path it wrote."""

from __future__ import annotations

import argparse

from tx.cli import options

CONFIG = None  # it reads event files or draws a formula


def add_options(p: argparse.ArgumentParser) -> None:
    options.workdir(p, "runs whose curves share one figure", many=True)
    p.add_argument(
        "--out",
        metavar="PNG",
        help="the picture (default: W/plots/curves.png, or with --positional positional_d<D>.png)",
    )
    p.add_argument(
        "--positional", action="store_true", help="the sinusoidal positional encodings instead"
    )
    p.add_argument("--d-model", type=int, default=512, help="--positional: the model width")


def run(args: argparse.Namespace, cfg) -> int:
    from tx import storage
    from tx.config import ConfigError
    from tx.viz.pictures import curves_picture, positional_picture
    from tx.workdir import plots_dir

    if args.positional:
        path = positional_picture(args.d_model, args.out or f"positional_d{args.d_model}.png")
    elif args.workdirs:
        out = args.out or storage.join(plots_dir(args.workdirs[0]), "curves.png")
        path = curves_picture(args.workdirs, out)
    else:
        raise ConfigError("plot needs --workdir W [W2 ...] (learning curves) or --positional")
    print(f"wrote {path}")
    return 0
