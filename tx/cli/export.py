"""`python -m tx export --workdir W --format ctranslate2|huggingface --out DIR`: the run's
(averaged) parameters with its vocabulary and config as a CTranslate2 model (`--quantization
int8` and others) or a Hugging Face MarianMTModel directory (float32), tx.infer.export; prints
what tx_export.json records."""

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
        "--out",
        metavar="DIR",
        required=True,
        help="where the export goes, a directory or gs://, s3://",
    )
    p.add_argument(
        "--format",
        default="ctranslate2",
        choices=("ctranslate2", "huggingface"),  # tx.infer.export.FORMATS
        help="ctranslate2: CTranslate2's model (translate --engine ctranslate2, serve); "
        "huggingface: MarianMTModel and MarianTokenizer files for transformers",
    )
    p.add_argument(
        "--quantization",
        default="float32",
        choices=("float32", "int8", "int16", "float16"),  # tx.infer.export.QUANTIZATIONS
        help="weight type (ctranslate2; huggingface is float32)",
    )


def run(args: argparse.Namespace, cfg) -> int:
    from tx.infer.export import export

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
