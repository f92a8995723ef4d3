"""Command line: python -m tx COMMAND [--config FILE] [--config.key=value ...] [options].

Commands:
  info       parameter counts (actual and analytic, beside the paper's) as JSON
  train      train (same as train.py)
  translate  translate stdin or --input to stdout or --output (--alignments: word links)
  average    average the last N checkpoints into a new one
  evaluate   BLEU (sacreBLEU and the paper's tokenized BLEU) and chrF on a split
  attention  one sentence's attention maps (encoder, decoder, encoder-decoder) as PNGs
  plot       learning curves of runs (--workdir W [W2 ...]), or --positional encodings
  demo       the offline demo end to end: train, average, translate, score
  compile    lower and compile the train step ahead of time: memory and FLOPs
  reproduce  the paper's Tables 2, 3, 4: --plan (default), --run, --report (tx/reproduce.py)
  road       the road to the Transformer: road digits | gradients | table1 | length (tx/road/)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow is imported anywhere
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from tx import workdir
from tx.config import ConfigError, load_config, model_config, split_config_args
from tx.distributed import initialize

# Each command imports what it needs when it runs: `info` and `--help` need not pay seconds
# for TensorFlow and Orbax.


def _info(args, cfg) -> int:
    from tx.counting import analytic_param_count, param_counts

    mc = model_config(cfg)
    actual = param_counts(mc)
    report = dict(actual)
    report["analytic"] = analytic_param_count(mc)
    report["matches_analytic"] = report["analytic"]["params"] == actual["params"]
    ref = cfg.get("reference", None)
    if ref is not None and ref.get("params_m") is not None:
        report["paper_params_m"] = ref.params_m
        report["ratio_to_paper"] = round(actual["params"] / (ref.params_m * 1e6), 4)
    report["model"] = {k: getattr(mc, k) for k in mc.__dataclass_fields__}
    print(json.dumps(report, indent=2))
    return 0


def _need_workdir(args) -> str:
    if not args.workdir:
        raise SystemExit("error: --workdir DIR is required")
    return args.workdir


def _train(args, cfg) -> int:
    from tx.evaluate import dev_bleu_hook
    from tx.loop import train

    workdir = _need_workdir(args)
    hook = dev_bleu_hook(cfg, workdir) if cfg.train.eval_bleu_every_steps else None
    metrics = train(cfg, workdir, bleu_hook=hook)
    print(json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in metrics.items()}))
    return 0


def _translate(args, cfg) -> int:
    from tx.translate import load_model, translate

    loaded = load_model(cfg, _need_workdir(args), args.checkpoint)
    source = open(args.input, encoding="utf-8") if args.input else sys.stdin
    with source:
        lines = [line.rstrip("\r\n") for line in source]
    if args.alignments:
        outputs = _aligned(args, cfg, loaded, lines)
    else:
        outputs = translate(loaded, lines, cfg)
    text = "".join(o + "\n" for o in outputs)
    if args.output:  # written whole, then renamed: never a half-written file
        workdir.write_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


def _aligned(args, cfg, loaded, lines: list[str]) -> list[str]:
    """`translation ||| i-j ...` per line (Marian's --alignment layout)."""
    from tx.alignment import DEFAULT_LAYER, align
    from tx.translate import translate_pairs

    if loaded.model.config.family != "transformer":
        raise SystemExit(
            "error: --alignments reads a Transformer's encoder-decoder attention; this run's "
            f"model.family is {loaded.model.config.family!r}"
        )
    layer = DEFAULT_LAYER if args.align_layer is None else args.align_layer
    layers = loaded.model.config.num_decoder_layers
    if not -layers <= layer < layers:
        raise SystemExit(
            f"error: --align_layer {layer}: the model has {layers} decoder layers "
            f"(0 to {layers - 1}; -1 is the last)"
        )
    pairs = translate_pairs(loaded, lines, cfg)
    links = align(loaded, pairs, layer)
    decode = loaded.tokenizer.decode
    return [f"{decode(out)} ||| {a}" for (_, out), a in zip(pairs, links, strict=True)]


def _average(args, cfg) -> int:
    from tx.checkpoint import average

    path, steps = average(cfg, _need_workdir(args), args.last)
    print(json.dumps({"averaged": path, "steps": steps}))
    return 0


def _evaluate(args, cfg) -> int:
    from tx.evaluate import evaluate_split
    from tx.translate import load_model

    if args.by_length and args.bucket_width <= 0:
        raise SystemExit(f"error: --bucket_width must be positive, got {args.bucket_width}")
    loaded = load_model(cfg, _need_workdir(args), args.checkpoint)
    width = args.bucket_width if args.by_length else 0
    result = evaluate_split(
        cfg, args.workdir, args.split, loaded, args.bootstrap, args.output, width
    )
    if args.by_length:
        from tx.pictures import by_length_picture

        out = args.out or os.path.join(
            workdir.plots_dir(args.workdir), f"bleu_by_length_{args.split}.png"
        )
        result["by_length_png"] = by_length_picture(result, out)
    if args.json:
        print(json.dumps(result))
    elif "f1" in result:
        print(
            f"{args.split}: bracketing F1 {result['f1']:.2f} (precision {result['precision']:.2f}"
            f", recall {result['recall']:.2f}; {result['f1_recipe']}); "
            f"{result['scored_sentences']} of {result['num_sentences']} sentences scored; "
            f"parses in {result['hypotheses_file']}"
        )
    else:
        print(f"{args.split}: sacreBLEU {result['bleu']:.2f} ({result['bleu_signature']})")
        print(
            f"{args.split}: tokenized BLEU {result['tok_bleu']:.2f} "
            f"(paper style: {result['tok_bleu_recipe']})"
        )
        print(
            f"{args.split}: chrF {result['chrf']:.2f}; {result['num_sentences']} sentences; "
            f"hypotheses in {result['hypotheses_file']}"
        )
        for b in result.get("by_length", []):
            print(
                f"{args.split}: {b['bucket']:>7} words: sacreBLEU {b['bleu']:6.2f} "
                f"({b['sentences']} sentences)"
            )
        if args.by_length:
            print(f"wrote {result['by_length_png']}")
    return 0


def _attention(args, cfg) -> int:
    from tx.pictures import attention_pictures
    from tx.translate import load_model

    loaded = load_model(cfg, _need_workdir(args), args.checkpoint)
    out = args.out or os.path.join(workdir.plots_dir(args.workdir), "attention")
    for path in attention_pictures(loaded, cfg, args.text or "", out):
        print(f"wrote {path}")
    return 0


def _plot(args, cfg) -> int:
    from tx.pictures import curves_picture, positional_picture

    if args.positional:
        path = positional_picture(args.d_model, args.out or f"positional_d{args.d_model}.png")
    elif args.workdirs:
        out = args.out or os.path.join(workdir.plots_dir(args.workdirs[0]), "curves.png")
        path = curves_picture(args.workdirs, out)
    else:
        raise SystemExit("error: plot needs --workdir W [W2 ...] (learning curves) or --positional")
    print(f"wrote {path}")
    return 0


def _demo(args, cfg) -> int:
    from tx.demo import run_demo

    run_demo(cfg, args.workdir or "runs/demo")
    return 0


def _compile(args, cfg) -> int:
    from tx.aot import compile_report, topology_devices

    devices = topology_devices(args.topology) if args.topology else None
    print(json.dumps(compile_report(cfg, devices), indent=2))
    return 0


def _reproduce(args, cfg) -> int:
    from tx.reproduce import main as reproduce

    if args.table is None:
        raise ConfigError("reproduce needs --table 2, 3 or 4")
    return reproduce(args, args.overrides)


def _road(args, cfg) -> int:
    from tx.road import main as road

    return road(args.experiment, args.results, args.root, args.overrides)


COMMANDS = {
    "info": _info,
    "compile": _compile,
    "reproduce": _reproduce,
    "train": _train,
    "translate": _translate,
    "average": _average,
    "evaluate": _evaluate,
    "demo": _demo,
    "attention": _attention,
    "plot": _plot,
    "road": _road,
}
DEFAULT_CONFIGS = {"demo": "configs/demo.py"}
# plot reads event files or draws formulas; reproduce and road bring their own configs.
NO_CONFIG = ("plot", "reproduce", "road")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tx",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("command", choices=sorted(COMMANDS))
    p.add_argument(
        "experiment", nargs="?", help="road: digits | gradients | table1 | length (tx/road/)"
    )
    p.add_argument(
        "--workdir",
        nargs="+",
        help="run directory (checkpoints, vocabulary, logs); plot takes several",
    )
    p.add_argument("--input", help="translate: read sentences from this file (default stdin)")
    p.add_argument("--output", help="translate / evaluate: write translations to this file")
    p.add_argument("--checkpoint", type=int, help="use this training step's checkpoint")
    p.add_argument(
        "--last", type=int, help="average: how many checkpoints (default decode.average_last)"
    )
    p.add_argument("--split", default="test", choices=("dev", "test"), help="evaluate: split")
    p.add_argument("--json", action="store_true", help="evaluate: one JSON object")
    p.add_argument(
        "--alignments",
        action="store_true",
        help="translate: append ' ||| i-j ...' word alignments (source-target, Pharaoh)",
    )
    p.add_argument(
        "--align_layer",
        type=int,
        help="translate --alignments: the decoder layer whose cross-attention aligns "
        "(default: the last, see tx/alignment.py)",
    )
    p.add_argument(
        "--by-length",
        "--by_length",
        dest="by_length",
        action="store_true",
        help="evaluate: BLEU per source-length bucket (JSON and a PNG)",
    )
    p.add_argument(
        "--bucket_width", type=int, default=10, help="evaluate --by-length: words per bucket"
    )
    p.add_argument("--text", help="attention: the sentence to translate and draw")
    p.add_argument("--out", help="attention: a directory; plot, evaluate --by-length: a PNG")
    p.add_argument(
        "--positional", action="store_true", help="plot: the sinusoidal positional encodings"
    )
    p.add_argument("--d_model", type=int, default=512, help="plot --positional: model width")
    p.add_argument("--topology", help="compile: a TPU topology such as v4:2x2x2 (needs libtpu)")
    p.add_argument("--coordinator_address", help="multi-process: HOST:PORT of process 0")
    p.add_argument("--num_processes", type=int, help="multi-process: number of processes")
    p.add_argument("--process_id", type=int, help="multi-process: this process's index")
    g = p.add_argument_group("reproduce")
    g.add_argument("--table", type=int, help="reproduce: the paper's table (2, 3 or 4)")
    g.add_argument("--rows", help="reproduce: rows of the table, e.g. A1,B1 (default: all)")
    g.add_argument(
        "--root", default="runs", help="reproduce, road length: the workdirs go under this"
    )
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--plan", action="store_true", help="reproduce: what would run (default)")
    mode.add_argument("--run", action="store_true", help="reproduce: run unfinished rows")
    mode.add_argument("--report", action="store_true", help="reproduce: results/table<N>.md")
    g.add_argument("--scale", default="full", help="reproduce: full (the paper's) or mini")
    g.add_argument("--steps", type=int, help="reproduce --scale mini: steps of a 100k-step row")
    g.add_argument("--hardware", help="reproduce --plan: h100x8, a100x8, v4-32, ...")
    g.add_argument("--mfu", type=float, help="reproduce --plan: expected MFU (0-1)")
    g.add_argument("--results", default="results", help="reproduce, road: where reports go")
    p.add_argument(
        "--bootstrap",
        type=int,
        default=0,
        help="evaluate: bootstrap samples for a 95%% interval (0 = none)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for noisy in ("absl", "jax._src", "orbax", "tensorflow"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    rest, config_path, overrides = split_config_args(argv)
    args = _parser().parse_args(rest)
    args.workdirs, args.workdir = args.workdir or [], (args.workdir or [None])[0]
    if len(args.workdirs) > 1 and args.command != "plot":
        print(f"error: {args.command} takes one --workdir", file=sys.stderr)
        return 2
    initialize(args.coordinator_address, args.num_processes, args.process_id)
    if args.command in NO_CONFIG:
        args.overrides = overrides  # reproduce: applied to every row's config
        return _run(args, None)
    try:
        if config_path is None and args.workdir and args.command not in ("train", "demo"):
            config_path = workdir.require_run(args.workdir)  # the run's resolved config
        config_path = config_path or DEFAULT_CONFIGS.get(args.command)
        cfg = load_config(config_path, overrides) if config_path else None
    except (ConfigError, workdir.NotARun) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cfg is None:
        print("error: --config FILE is required", file=sys.stderr)
        return 2
    return _run(args, cfg)


def _run(args, cfg) -> int:
    try:
        return COMMANDS[args.command](args, cfg)
    except _user_errors() as e:  # bad input: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


def _user_errors() -> tuple:
    from tx.data.sources import DataError
    from tx.data.tokenizer import VocabularyError
    from tx.loop import Diverged
    from tx.pictures import PictureError
    from tx.sharding import MeshError
    from tx.translate import StaleAverage

    return (
        ConfigError,
        DataError,
        VocabularyError,
        MeshError,
        Diverged,
        StaleAverage,
        PictureError,
        FileNotFoundError,
    )


if __name__ == "__main__":
    sys.exit(main())
