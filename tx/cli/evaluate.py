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
import os

from tx.cli import options

CONFIG = "run"


def add_options(p: argparse.ArgumentParser) -> None:
    options.config(p)
    options.workdir(p, "the run to evaluate")
    options.checkpoint(p)
    p.add_argument(
        "--split", choices=("dev", "test"), help="the run's split to evaluate (default: test)"
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
    from tx.infer.engines import load_engine, with_search

    label = _check(args)
    cfg = with_search(cfg, **options.search_settings(args))
    own = args.engine == "jax"
    # An export is scored into its own directory; the run card is the training run's.
    where = args.workdir if own else args.model
    loaded = None if args.hyp else load_engine(cfg, **options.engine_kwargs(args))
    if args.ref:
        from tx.eval.evaluate import evaluate_files

        default = f"{os.path.basename(args.src or '')}.hyp.{cfg.data.tgt_lang}"
        result = evaluate_files(
            cfg,
            args.ref,
            sources=args.src,
            hypotheses=args.hyp,
            loaded=loaded,
            output=args.output or (None if args.hyp else storage.join(where, default)),
            bootstrap=args.bootstrap,
            by_length=args.bucket_width if args.by_length else 0,
        )
    else:
        from tx.eval.evaluate import evaluate_split

        result = evaluate_split(
            cfg,
            where,
            label,
            loaded,
            bootstrap=args.bootstrap,
            output=args.output,
            by_length=args.bucket_width if args.by_length else 0,
            record=own,
        )
    if loaded is not None and not own:
        result["engine"] = args.engine
    if args.by_length:
        from tx.viz.pictures import by_length_picture
        from tx.workdir import plots_dir

        name = f"bleu_by_length_{label}.png"
        out = args.by_length_png or (storage.join(plots_dir(where), name) if where else name)
        result["by_length_png"] = by_length_picture(result, out)
    print(json.dumps(result) if args.json else "\n".join(summary(result, label)))
    return 0


def _check(args: argparse.Namespace) -> str:
    """The options that make one evaluation; the name its scores are printed under (the split,
    or the reference file's name)."""
    from tx.config import ConfigError

    if args.by_length and args.bucket_width <= 0:
        raise ConfigError(f"--bucket-width must be positive, got {args.bucket_width}")
    if not (args.src or args.ref or args.hyp):
        return args.split or "test"
    if args.split:
        raise ConfigError("--split evaluates the run's split; --src, --ref and --hyp name files")
    if not args.ref or not (args.src or args.hyp):
        raise ConfigError("evaluate needs --ref FILE with --src FILE (translated) or --hyp FILE")
    if args.hyp and args.output:
        raise ConfigError("--output writes translations; --hyp gives them")
    if args.by_length and not args.src:
        raise ConfigError("--by-length needs --src FILE (the source sentences' lengths)")
    return os.path.basename(args.ref)


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
