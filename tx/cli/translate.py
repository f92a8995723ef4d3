"""`python -m tx translate --workdir W [--input F] [--output F]`: one translation per line of
stdin or F, in input order, an empty line for an empty line. Several --workdir, or several
--checkpoint of one, decode as an ensemble; --engine ctranslate2 --model DIR decodes an
export; --nbest N prints N best per line, --alignments each translation's word links."""

from __future__ import annotations

import argparse
import sys

from tx.cli import options

CONFIG = "run"


def add_options(p: argparse.ArgumentParser) -> None:
    with options.translating(p):
        p.add_argument(
            "--input", metavar="FILE", help="read sentences from this file (default stdin)"
        )
        p.add_argument("--output", metavar="FILE", help="write translations to this file")
        # Either may be an object: gs://bucket/file, s3://bucket/file (tx.storage).
        p.add_argument(
            "--nbest", type=positive_int, metavar="N", help="N best per line, `index\tscore\ttext`"
        )
        p.add_argument(
            "--alignments",
            action="store_true",
            help="append ' ||| i-j ...' word alignments (source-target, Pharaoh)",
        )
        p.add_argument(
            "--align_layer",
            type=int,
            metavar="K",
            help="--alignments: the decoder layer whose cross-attention aligns "
            "(default: the last, see tx/infer/alignment.py)",
        )


def positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def run(args: argparse.Namespace, cfg) -> int:
    from tx import storage
    from tx.data.sources import read_lines
    from tx.infer.engines import load_engine, translate_lines

    if args.input:  # read (and checked) before the model is loaded: bad input fails at once
        with storage.open_read(args.input) as f:
            lines = read_lines(f, args.input)
    else:
        lines = read_lines(sys.stdin.buffer, "<stdin>")
    loaded = load_engine(cfg, **options.engine_kwargs(args))
    outputs = translate_lines(
        loaded,
        lines,
        cfg,
        nbest=args.nbest,
        alignments=args.alignments,
        align_layer=args.align_layer,
    )
    text = "".join(o + "\n" for o in outputs)
    if args.output:  # written whole (tx.storage): never a half-written file or object
        storage.write_text(args.output, text)
    else:
        sys.stdout.write(text)
    return 0
