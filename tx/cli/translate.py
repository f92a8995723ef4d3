"""`python -m tx translate --workdir W [--input F] [--output F]`: one translation per line of
stdin or F, in input order, an empty line for an empty line. From stdin, lines are translated
as they arrive, in batches of what has arrived (a terminal, or a pipe that stays open, gets
each translation once its line is in), each batch's output flushed at once. Several
--workdir, or several --checkpoint of one, decode as an ensemble; --engine ctranslate2 --model
DIR decodes an export; --nbest N prints N best per line, --alignments each translation's word
links; --beam, --alpha and --batch-tokens set the search over the run's config."""

from __future__ import annotations

import argparse
import sys

from tx.cli import options

CONFIG = "run"


def add_options(p: argparse.ArgumentParser) -> None:
    with options.translating(p):
        # Either may be an object: gs://bucket/file, s3://bucket/file (tx.storage).
        p.add_argument(
            "--input", metavar="FILE", help="read sentences from this file (default: stdin)"
        )
        p.add_argument(
            "--output", metavar="FILE", help="write translations to this file (default: stdout)"
        )
        p.add_argument(
            "--nbest",
            type=options.positive_int,
            metavar="N",
            help="N best per line, `index<TAB>score<TAB>text`, index counting input lines from 0",
        )
        p.add_argument(
            "--alignments",
            action="store_true",
            help="append ' ||| i-j ...' word alignments (source-target, Pharaoh)",
        )
        p.add_argument(
            "--align-layer",
            type=int,
            metavar="K",
            help="--alignments: the decoder layer whose cross-attention aligns "
            "(default: the last, -1)",
        )


def run(args: argparse.Namespace, cfg) -> int:
    from tx import storage
    from tx.data.sources import read_lines
    from tx.infer import engines

    cfg = engines.with_search(cfg, **options.search_settings(args))
    if args.nbest:
        engines.check_nbest(cfg, args.nbest)
    if args.input:  # read (and checked) before the model is loaded: bad input fails at once
        with storage.open_read(args.input) as f:
            batches = iter([read_lines(f, args.input)])
    loaded = engines.load_engine(cfg, **options.engine_kwargs(args))
    if args.alignments:  # before the first line is read
        engines.check_alignments(loaded, args.align_layer)
    if not args.input:
        encode = loaded.tokenizer.encode  # a line's tokens, as the search counts them

        def count(line: str) -> int:
            return len(encode(line.strip()))

        budget = int(cfg.decode.batch_tokens)
        batches = engines.arriving(sys.stdin.buffer, "<stdin>", budget, count)
    done, written = 0, []
    for lines in batches:
        outputs = engines.translate_lines(
            loaded,
            lines,
            cfg,
            nbest=args.nbest,
            alignments=args.alignments,
            align_layer=args.align_layer,
            first=done,
        )
        done += len(lines)
        text = "".join(o + "\n" for o in outputs)
        if args.output:
            written.append(text)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()
    if args.output:  # written whole (tx.storage): never a half-written file or object
        storage.write_text(args.output, "".join(written))
    return 0
