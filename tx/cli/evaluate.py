"""`python -m tx evaluate --workdir W [--split test] [--json]`: decodes every sentence of the
split and scores it: sacreBLEU with its signature, the paper's tokenized BLEU, chrF (a parsing
run: EVALB's bracketing F1); --by-length adds BLEU per source-length bucket and its bar chart.
The scores join the run card; the hypotheses are written beside the run's other files.

Any files instead of the run's split: `--src F --ref R` translates F and scores it against R;
`--hyp H --ref R` scores given translations, without a model (with no --workdir, the
paper-style tokenized BLEU tokenizes as --config's data.tgt_lang, by default base's: de).
Their scores join no run card. --beam, --alpha and --batch-tokens set the search over the
run's config."""

from __future__ import annotations

import argparse
import json

from tx.cli import options

CONFIG = "run"


def add_options(p: argparse.ArgumentParser) -> None:
    options.config(p)
    options.workdir(p, "the run to evaluate")
    options.checkpoint(p)
    p.add_argument(
        "--split",
        choices=("dev", "test", "dev2"),
        help="the run's split to evaluate (default: test; dev2: data.dev2_prefix)",
    )
    files = p.add_argument_group("any files instead of the run's split")
    files.add_argument("--src", metavar="FILE", help="source sentences to translate and score")
    files.add_argument("--ref", metavar="FILE", help="their reference translations")
    files.add_argument(
        "--hyp", metavar="FILE", help="translations to score against --ref, without a model"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--bootstrap",
        type=int,
        default=0,
        metavar="N",
        help="bootstrap samples for a 95%% interval (0: none)",
    )
    p.add_argument(
        "--output",
        metavar="FILE",
        help="write the translations to this file (default: W/<split>.hyp.<lang>, or "
        "W/<source file>.hyp.<lang>)",
    )
    p.add_argument(
        "--by-length", action="store_true", help="BLEU per source-length bucket (JSON and a PNG)"
    )
    p.add_argument(
        "--bucket-width", type=int, default=10, metavar="WORDS", help="--by-length: bucket width"
    )
    p.add_argument(
        "--by-length-png",
        metavar="PNG",
        help="--by-length: where the picture goes (default: W/plots/bleu_by_length_<split>.png)",
    )
    # The picture's option before it was named for what it writes: still parses.
    p.add_argument("--out", dest="by_length_png", help=argparse.SUPPRESS)
    options.search(p)
    options.engine(p)
    options.distributed(p)


def needs_run(args: argparse.Namespace) -> bool:
    """Whether the options read a run (tx.cli.main): --hyp alone needs none."""
    return not (args.hyp and not args.workdir and not args.model)


def run(args: argparse.Namespace, cfg) -> int:
    from tx import storage
    from tx.eval.evaluate import evaluate, summary

    label, where, result = evaluate(
        cfg,
        split=args.split,
        references=args.ref,
        sources=args.src,
        hypotheses=args.hyp,
        output=args.output,
        bootstrap=args.bootstrap,
        by_length=args.bucket_width if args.by_length else None,
        search=options.search_settings(args),
        **options.engine_kwargs(args),
    )
    if args.by_length:
        from tx.viz.pictures import by_length_picture
        from tx.workdir import plots_dir

        name = f"bleu_by_length_{label}.png"
        out = args.by_length_png or (storage.join(plots_dir(where), name) if where else name)
        result["by_length_png"] = by_length_picture(result, out)
    print(json.dumps(result) if args.json else "\n".join(summary(result, label)))
    return 0
