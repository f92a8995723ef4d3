"""`python -m tx export --workdir W --format ctranslate2 --out DIR [--quantization int8]`: a
CTranslate2 model of the run's (averaged) parameters, with its vocabulary and config
(tx.infer.export); prints what tx_export.json records."""

from __future__ import annotations

import argparse
import json

from tx.cli import options

CONFIG = "run"


def add_options(p: argparse.ArgumentParser) -> None:
    options.config(p)
    options.workdir(p, "the run to export")
    options.checkpoint(p)
    p.add_argument(
        "--out", metavar="DIR", help="where the export goes, a directory or gs://, s3:// (required)"
    )
    p.add_argument("--format", default="ctranslate2", help="the format")
    p.add_argument(
        "--quantization",
        default="float32",
        choices=("float32", "int8", "int16", "float16"),
        help="weight type",
    )


def run(args: argparse.Namespace, cfg) -> int:
    from tx.config import ConfigError
    from tx.infer.export import export

    if not args.out:
        raise ConfigError("export needs --out DIR")
    record = export(
        cfg,
        args.workdir,
        args.out,
        fmt=args.format,
        quantization=args.quantization,
        checkpoint_step=args.checkpoint,
    )
    print(json.dumps(record))
    return 0
