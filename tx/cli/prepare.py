"""`python -m tx prepare --config C --workdir W`: the run's data, prepared once, before training
on many machines: config.json, the vocabulary and the token caches of train, dev and test,
recorded in the run card with the sources' checksums. Run it on any one machine (a CPU VM will
do); a multi-process `train` of W then finds the data ready and tokenizes nothing. Prints the
card's data record as one JSON line."""

from __future__ import annotations

import argparse
import json

from tx.cli import options

CONFIG = "new run"


def add_options(p: argparse.ArgumentParser) -> None:
    options.config(p)
    options.workdir(p, "the run directory (or gs://bucket/prefix, s3://bucket/prefix)")
    options.take_over_lock(p)


def run(args: argparse.Namespace, cfg) -> int:
    from tx.train.prepare import prepare

    print(json.dumps(prepare(cfg, args.workdir, take_over_lock=args.take_over_lock)))
    return 0
