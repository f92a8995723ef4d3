"""`python -m tx compile --config C [--topology v4:2x2x2]`: lowers and compiles one train step
ahead of time on the configured mesh (tx.train.aot) and prints per-device memory and FLOPs as
JSON, before any hardware is rented."""

from __future__ import annotations

import argparse
import json

from tx.cli import options

CONFIG = "file"


def add_options(p: argparse.ArgumentParser) -> None:
    options.config(p)
    p.add_argument(
        "--topology",
        help="a TPU topology such as v4:2x2x2 (needs libtpu); default: the devices here",
    )
    options.distributed(p)


def run(args: argparse.Namespace, cfg) -> int:
    from tx.train.aot import compile_report, topology_devices

    devices = topology_devices(args.topology) if args.topology else None
    print(json.dumps(compile_report(cfg, devices), indent=2))
    return 0
