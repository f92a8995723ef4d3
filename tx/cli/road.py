"""`python -m tx road NAME [--results DIR]`: one experiment on the road to the Transformer that
the seed describes ("The Road to the Transformer": docs/road.md, tx.paper.road): digits,
gradients, table1 or length; writes DIR/road_NAME.md and .png and prints the table."""

from __future__ import annotations

import argparse

from tx.cli import options

CONFIG = None  # each experiment brings its own


def add_options(p: argparse.ArgumentParser) -> None:
    # Not argparse choices: tx.paper.road names the experiments in its one-line error.
    p.add_argument("experiment", nargs="?", help="digits | gradients | table1 | length")
    p.add_argument("--results", default="results", help="where the report and picture go")
    p.add_argument("--root", default="runs", help="length: the workdirs go under this")
    options.overrides(p, "override one field of the experiment's configs (any number)")
    options.distributed(p)


def run(args: argparse.Namespace, cfg) -> int:
    from tx.paper.road import main as road

    return road(
        name=args.experiment, results=args.results, root=args.root, overrides=args.overrides
    )
