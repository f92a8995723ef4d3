"""`python -m tx reproduce --table {2,3,4} [--rows A1,B1] [--plan | --run | --report]`: a
table of the paper, row by row (tx.paper.reproduce): --plan (the default) prints each row's
config, commands, parameters, FLOPs and expected time; --run trains, averages and evaluates
the unfinished rows; --report writes results/table<N>.md and .json from the run cards.
Each --config.KEY=VALUE applies to every row's config."""

from __future__ import annotations

import argparse

from tx.cli import options

CONFIG = None  # every row brings its own


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--table", type=int, choices=(2, 3, 4), required=True, help="the paper's table")
    p.add_argument("--rows", help="rows of the table, e.g. A1,B1 (default: all)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--plan", action="store_true", help="what would run (default)")
    mode.add_argument("--run", action="store_true", help="run the unfinished rows, then report")
    mode.add_argument("--report", action="store_true", help="results/table<N>.md and .json")
    p.add_argument("--json", action="store_true", help="--plan: one JSON object")
    p.add_argument(
        "--scale",
        default="full",
        choices=("full", "mini", "real"),
        help="full: the paper's models; mini: each row's change on a small model and the "
        "demo corpus; real: on the paper's base divided evenly and a real corpus (<root>/corpus)",
    )
    p.add_argument("--steps", type=int, help="--scale mini or real: steps of a 100k-step row")
    p.add_argument(
        "--root",
        default="runs",
        help="the rows' workdirs go under this (a directory or gs://, s3://)",
    )
    p.add_argument("--results", default="results", help="where reports go")
    p.add_argument(
        "--hardware", help="--plan: h100x8 (or h100:8), a100x8, v4-32, ... (default: this machine)"
    )
    p.add_argument("--mfu", type=float, help="--plan: expected MFU (0-1)")
    options.overrides(p, "override one field of every row's config (any number)")
    options.distributed(p)


def run(args: argparse.Namespace, cfg) -> int:
    from tx.paper.reproduce import main as reproduce

    return reproduce(
        table=args.table,
        rows=args.rows,
        scale=args.scale,
        steps=args.steps,
        hardware_name=args.hardware,
        mfu=args.mfu,
        root=args.root,
        results=args.results,
        mode="run" if args.run else "report" if args.report else "plan",
        as_json=args.json,
        overrides=args.overrides,
    )
