"""`python -m tx import --from-huggingface DIR --workdir W`: a Hugging Face MarianMTModel
directory (OPUS-MT's Helsinki-NLP/opus-mt-*, saved with save_pretrained; DIR local or gs://,
s3://) as a new tx run W that translate, evaluate, export and train.init_from take
(tx.infer.huggingface_io); prints what it imported as one JSON line. A model tx cannot express
is refused, naming what; so is a W that holds a run."""

from __future__ import annotations

import argparse
import json

from tx.cli import options

CONFIG = None  # the run's config is made from DIR's


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from-huggingface",
        dest="source",
        metavar="DIR",
        required=True,
        help="a MarianMTModel directory: config.json, model.safetensors, source.spm, "
        "target.spm, vocab.json (what save_pretrained of the model and its MarianTokenizer write)",
    )
    options.workdir(p, "the new run (a directory or gs://, s3://; must not hold a run)")


def run(args: argparse.Namespace, cfg) -> int:
    from tx.config import ConfigError
    from tx.infer.huggingface_io import import_marian

    if not args.workdir:
        raise ConfigError("import needs --workdir W (the new run)")
    record = import_marian(args.source, args.workdir)
    print(json.dumps(record))
    return 0
