"""`python -m tx card --workdir W [--json]`: the run card of W for a person: what ran, on what
code, packages, hardware and data, for how long, and what it scored (tx.train.runcard)."""

from __future__ import annotations

import argparse
import json

from tx.cli import options

CONFIG = None


def add_options(p: argparse.ArgumentParser) -> None:
    options.workdir(p, "the run whose card is shown")
    p.add_argument("--json", action="store_true", help="the whole card as JSON")


def run(args: argparse.Namespace, cfg) -> int:
    from tx.train import runcard
    from tx.workdir import require_run

    if not args.workdir:
        raise FileNotFoundError("card needs --workdir W")
    require_run(args.workdir)
    card = runcard.load(args.workdir)
    if card is None:
        raise FileNotFoundError(f"{args.workdir} has no run card yet (train writes it)")
    card["totals"] = runcard.totals(card)
    print(json.dumps(card, indent=2, sort_keys=True) if args.json else runcard.markdown(card))
    return 0
