"""`python -m tx average --workdir W [--last N] [--which last|best]`: averages the last N
step-spaced checkpoints (the paper: 5 for base, 20 for big; default decode.average_last), or the
N with the best dev score (--which best, default decode.average_which; the run must have kept
them: train.keep_best), into W/averaged/STEP and prints what it wrote as one JSON line."""

from __future__ import annotations

import argparse
import json

from tx.cli import options

CONFIG = "run"


def add_options(p: argparse.ArgumentParser) -> None:
    options.config(p)
    options.workdir(p, "the run whose checkpoints are averaged")
    p.add_argument(
        "--last", type=int, metavar="N", help="how many checkpoints (default decode.average_last)"
    )
    p.add_argument(
        "--which",
        choices=("last", "best"),
        help="the last checkpoints (the paper) or the best by train.best_metric "
        "(default decode.average_which)",
    )
    options.take_over_lock(p)
    options.distributed(p)


def run(args: argparse.Namespace, cfg) -> int:
    from tx.train.averaging import average

    path, steps = average(
        cfg, args.workdir, args.last, take_over_lock=args.take_over_lock, which=args.which
    )
    print(json.dumps({"averaged": path, "steps": steps}))
    return 0
