"""`python -m tx demo [--workdir W]`: the offline demo end to end (tx's own config `demo`,
configs/demo.py, unless --config): train, average, translate samples, score the test set, draw
the pictures."""

from __future__ import annotations

import argparse

from tx.cli import options

CONFIG = "file"
DEFAULT_CONFIG = "demo"  # tx.cli.main.find_config: configs/demo.py


def add_options(p: argparse.ArgumentParser) -> None:
    options.config(p, "default: demo")
    options.workdir(p, "the run directory (default: runs/demo)")
    options.distributed(p)


def run(args: argparse.Namespace, cfg) -> int:
    from tx.paper.demo import run_demo

    run_demo(cfg, workdir=args.workdir or "runs/demo")
    return 0
