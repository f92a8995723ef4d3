"""`python -m tx evaluate --workdir W [--split test] [--json]`: decodes every sentence of the
split and scores it: sacreBLEU with its signature, the paper's tokenized BLEU, chrF (a parsing
run: EVALB's bracketing F1); --by-length adds BLEU per source-length bucket and its bar chart.
The scores join the run card; the hypotheses are written beside the run's other files."""

from __future__ import annotations

import argparse
import json

from tx.cli import options

CONFIG = "run"


def add_options(p: argparse.ArgumentParser) -> None:
    options.config(p)
    options.workdir(p, "the run to evaluate")
    options.checkpoint(p)
    p.add_argument("--split", default="test", choices=("dev", "test"), help="the split")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--bootstrap",
        type=int,
        default=0,
        metavar="N",
        help="bootstrap samples for a 95%% interval (0 = none)",
    )
    p.add_argument("--output", metavar="FILE", help="write the translations to this file")
    p.add_argument(
        "--by-length",
        "--by_length",
        dest="by_length",
        action="store_true",
        help="BLEU per source-length bucket (JSON and a PNG)",
    )
    p.add_argument(
        "--bucket_width", type=int, default=10, metavar="WORDS", help="--by-length: bucket width"
    )
    p.add_argument("--out", metavar="PNG", help="--by-length: the picture (default W/plots/)")
    options.engine(p)
    options.distributed(p)


def run(args: argparse.Namespace, cfg) -> int:
    from tx import storage
    from tx.config import ConfigError
    from tx.eval.evaluate import evaluate_split
    from tx.infer.engines import load_engine

    if args.by_length and args.bucket_width <= 0:
        raise ConfigError(f"--bucket_width must be positive, got {args.bucket_width}")
    loaded = load_engine(cfg, **options.engine_kwargs(args))
    own = args.engine == "jax"
    # An export is scored into its own directory; the run card is the training run's.
    where = args.workdir if own else args.model
    result = evaluate_split(
        cfg,
        where,
        args.split,
        loaded,
        bootstrap=args.bootstrap,
        output=args.output,
        by_length=args.bucket_width if args.by_length else 0,
        record=own,
    )
    if not own:
        result["engine"] = args.engine
    if args.by_length:
        from tx.viz.pictures import by_length_picture
        from tx.workdir import plots_dir

        out = args.out or storage.join(plots_dir(where), f"bleu_by_length_{args.split}.png")
        result["by_length_png"] = by_length_picture(result, out)
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(summary(result, args.split)))
    return 0


def summary(result: dict, split: str) -> list[str]:
    """evaluate_split's result as the lines a person reads."""
    if "f1" in result:
        return [
            f"{split}: bracketing F1 {result['f1']:.2f} (precision {result['precision']:.2f}"
            f", recall {result['recall']:.2f}; {result['f1_recipe']}); "
            f"{result['scored_sentences']} of {result['num_sentences']} sentences scored; "
            f"parses in {result['hypotheses_file']}"
        ]
    lines = [
        f"{split}: sacreBLEU {result['bleu']:.2f} ({result['bleu_signature']})",
        f"{split}: tokenized BLEU {result['tok_bleu']:.2f} "
        f"(paper style: {result['tok_bleu_recipe']})",
        f"{split}: chrF {result['chrf']:.2f}; {result['num_sentences']} sentences, "
        f"{result.get('repetition_loops', 0)} with a repetition loop; "
        f"hypotheses in {result['hypotheses_file']}",
    ]
    lines += [
        f"{split}: {b['bucket']:>7} words: sacreBLEU {b['bleu']:6.2f} ({b['sentences']} sentences)"
        for b in result.get("by_length", [])
    ]
    if "by_length_png" in result:
        lines.append(f"wrote {result['by_length_png']}")
    return lines
