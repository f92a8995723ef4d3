"""`python -m tx compile --config C [--topology v5p:2x2x1 | h100:8] [--layouts auto] [--json]`:
compiles one train step ahead of time for a slice (tx.train.aot), deviceless, and reports per
chip its memory against the chip's HBM, XLA's flops and bytes, the step time from the
compiler's cost model (or a roofline), tokens per second, the MFU ceiling and hours for the
config's steps: before any hardware is rented. TPU topologies need libtpu (pip install
'tx-transformer[tpu]'); GPU nodes jax's CUDA plugin (pip install 'tx-transformer[cuda]')."""

from __future__ import annotations

import argparse
import json

from tx.cli import options

CONFIG = "file"


def add_options(p: argparse.ArgumentParser) -> None:
    options.config(p)
    p.add_argument(
        "--topology",
        help="a TPU slice such as v5p:2x2x1 (libtpu) or a GPU node such as h100:8 (CUDA "
        "plugin); default: the devices here",
    )
    p.add_argument(
        "--layouts",
        choices=("config", "auto"),
        default="config",
        help="config: the config's mesh (default); auto: the sensible data / fsdp / tensor / "
        "micro-batch layouts of the slice, best first",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    options.distributed(p)


def run(args: argparse.Namespace, cfg) -> int:
    from tx.train.aot import compile_layouts, compile_report, describe, estimate, topology_devices

    devices = topology_devices(args.topology) if args.topology else None
    if args.layouts == "auto":
        import jax

        rows = compile_layouts(cfg, devices or jax.devices(), progress=None)
    else:
        report = compile_report(cfg, devices)
        rows = [report | estimate(report) | {"micro_batches": cfg.train.micro_batches}]
    if args.json:
        print(json.dumps({"topology": args.topology, "layouts": rows}, indent=2))
    else:
        for row in rows:
            print(describe(row))
    return 0
