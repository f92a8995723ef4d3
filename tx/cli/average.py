"""`python -m tx average --workdir W [--last N]`: averages the last N step-spaced checkpoints
(the paper: 5 for base, 20 for big; default decode.average_last) into W/averaged/STEP and
prints what it wrote as one JSON line."""

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
    options.take_over_lock(p)
    options.distributed(p)


def run(args: argparse.Namespace, cfg) -> int:
    from tx.train.averaging import average

    path, steps = average(cfg, args.workdir, args.last, take_over_lock=args.take_over_lock)
    print(json.dumps({"averaged": path, "steps": steps}))
    return 0
