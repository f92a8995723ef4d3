"""`python -m tx info --config C [--devices N [--workdir W]]`: the config's parameter counts
(the actual tree, the analytic formula, the paper's figure) as JSON; with --devices N also the
rows and real tokens per step on N devices (tx.train.sizing)."""

from __future__ import annotations

import argparse
import json

from tx.cli import options

CONFIG = "file"


def add_options(p: argparse.ArgumentParser) -> None:
    options.config(p)
    p.add_argument("--devices", type=int, help="rows and real tokens per step on this many devices")
    options.workdir(
        p,
        "--devices: plan the batches of this run's training data (default: "
        "a WMT'14-like length model)",
    )


def run(args: argparse.Namespace, cfg) -> int:
    from tx.train.sizing import info_report

    print(json.dumps(info_report(cfg, devices=args.devices, run=args.workdir), indent=2))
    return 0
