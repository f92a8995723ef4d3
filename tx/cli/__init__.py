"""Command line: python -m tx COMMAND [--config FILE] [--config.key=value ...] [options].

Commands:
  info       parameter counts (actual and analytic, beside the paper's) as JSON; with
             --devices N also rows and real tokens per step on N devices
  train      train (same as train.py)
  translate  translate stdin or --input to stdout or --output (--alignments: word links;
             --nbest N: n-best lists; --workdir W1 W2 ...: an ensemble; --engine ctranslate2)
  average    average the last N checkpoints into a new one
  evaluate   BLEU (sacreBLEU and the paper's tokenized BLEU) and chrF on a split
  export     --format ctranslate2 --out DIR [--quantization int8]: a CTranslate2 model
  serve      an HTTP JSON translation server (POST /translate, GET /health)
  attention  one sentence's attention maps (encoder, decoder, encoder-decoder) as PNGs
  plot       learning curves of runs (--workdir W [W2 ...]), or --positional encodings
  demo       the offline demo end to end: train, average, translate, score
  compile    lower and compile the train step ahead of time: memory and FLOPs
  reproduce  the paper's Tables 2, 3, 4: --plan (default), --run, --report (tx/paper/reproduce.py)
  road       the road to the Transformer: road digits | gradients | table1 | length (tx/paper/road/)

May import: every layer (it is the top one).
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
from tx.train.distributed import LaunchError, ProcessLost, exit_now, initialize, process_lost

# Each command imports what it needs when it runs: `info` and `--help` need not pay seconds
# for TensorFlow and Orbax.


def _info(args, cfg) -> int:
    from tx.model.counting import analytic_param_count, param_counts

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
    if args.devices:
        report["batches"] = _batches_on(cfg, args.devices, args.workdir)
    print(json.dumps(report, indent=2))
    return 0


def _batches_on(cfg, devices: int, run: str | None) -> dict:
    """Rows and real tokens per step, per batch length, on `devices` devices: the training
    data's lengths when `run` has its token cache, else a WMT'14-like length model."""
    from tx.data import dataset
    from tx.data.pipeline import filter_for_training, padding_efficiency, wmt_like
    from tx.data.tokenizer import Tokenizer
    from tx.train.sharding import data_shards

    shards = data_shards(cfg.mesh, devices)
    spec = dataset.batch_spec(cfg.data, shards * cfg.train.micro_batches)
    if run:
        workdir.require_run(run)
        tokenizer = Tokenizer(workdir.vocab_file(run))
        split, lengths = dataset.split_ids(cfg.data, run, tokenizer, "train"), f"train of {run}"
    else:
        split, lengths = wmt_like(1_000_000), "a WMT'14 EN-DE-like length model (1M pairs)"
    keep, _ = filter_for_training(split, cfg.data.max_len)
    report = padding_efficiency(split, keep, spec)
    report.pop("shapes")
    return {"devices": devices, "data_shards": shards, "lengths": lengths, **report}


def _train(args, cfg) -> int:
    from tx.eval.evaluate import dev_bleu_hook
    from tx.train.loop import train

    hook = dev_bleu_hook(cfg, args.workdir) if cfg.train.eval_bleu_every_steps else None
    metrics = train(cfg, args.workdir, bleu_hook=hook)
    print(json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in metrics.items()}))
    return 0


def _translate(args, cfg) -> int:
    from tx.data.sources import read_lines
    from tx.infer.translate import nbest_lines, translate, translate_nbest

    if args.input:  # read (and checked) before the model is loaded: bad input fails at once
        with open(args.input, "rb") as f:
            lines = read_lines(f, args.input)
    else:
        lines = read_lines(sys.stdin.buffer, "<stdin>")
    loaded = _engine(args, cfg)
    if args.alignments:
        if args.engine != "jax" or len(loaded.members) > 1:
            raise ConfigError("--alignments needs one model and --engine jax")
        outputs = _aligned(args, cfg, loaded, lines)
    elif args.nbest:
        width = cfg.decode.beam_size if cfg.decode.strategy == "beam" else 1
        if args.nbest > width:
            raise ConfigError(f"--nbest {args.nbest}: decode.{cfg.decode.strategy} keeps {width}")
        outputs = nbest_lines(translate_nbest(loaded, lines, cfg, args.nbest))
    else:
        outputs = translate(loaded, lines, cfg)
    text = "".join(o + "\n" for o in outputs)
    if args.output:  # written whole, then renamed: never a half-written file
        workdir.write_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


def _engine(args, cfg):
    """What translates: a CTranslate2 export (--engine ctranslate2 --model DIR), or the
    parameters of one workdir, or an ensemble of several workdirs or checkpoints."""
    if args.engine == "ctranslate2":
        from tx.infer import ct2

        if not args.model or args.workdirs:
            raise ConfigError("--engine ctranslate2 takes --model DIR (an export), no --workdir")
        return ct2.load(args.model, args.device, args.compute_type, args.threads)
    if args.model:
        raise ConfigError("--model DIR is for --engine ctranslate2")
    from tx.infer.translate import load_ensemble, load_model

    workdirs, steps = _members(args)
    if len(workdirs) == 1:
        return load_model(cfg, workdirs[0], steps[0])
    return load_ensemble(cfg, workdirs, steps)


def _members(args) -> tuple[list[str], list[int | None]]:
    """Ensemble members: several workdirs, several checkpoints of one, or pairs of both."""
    workdirs, steps = list(args.workdirs) or [args.workdir], list(args.checkpoints)
    if len(workdirs) > 1 and len(steps) > 1 and len(steps) != len(workdirs):
        raise ConfigError(f"{len(workdirs)} --workdir but {len(steps)} --checkpoint values")
    if len(workdirs) == 1 and len(steps) > 1:
        workdirs = workdirs * len(steps)
    steps = steps if len(steps) == len(workdirs) else [steps[0] if steps else None] * len(workdirs)
    return workdirs, steps


def _export(args, cfg) -> int:
    from tx.infer.export import export

    if not args.out:
        raise ConfigError("export needs --out DIR")
    record = export(cfg, args.workdir, args.out, args.format, args.quantization, args.checkpoint)
    print(json.dumps(record))
    return 0


def _serve(args, cfg) -> int:
    from tx.infer.server import serve

    serve(_engine(args, cfg), cfg, args.host, args.port)
    return 0


def _aligned(args, cfg, loaded, lines: list[str]) -> list[str]:
    """`translation ||| i-j ...` per line (Marian's --alignment layout)."""
    from tx.infer.alignment import DEFAULT_LAYER, align
    from tx.infer.translate import translate_pairs

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
    from tx.train.averaging import average

    path, steps = average(cfg, args.workdir, args.last)
    print(json.dumps({"averaged": path, "steps": steps}))
    return 0


def _evaluate(args, cfg) -> int:
    from tx.eval.evaluate import evaluate_split

    if args.by_length and args.bucket_width <= 0:
        raise SystemExit(f"error: --bucket_width must be positive, got {args.bucket_width}")
    loaded = _engine(args, cfg)
    # An export is scored into its own directory; the run card is the training run's.
    where = args.workdir if args.engine == "jax" else args.model
    width = args.bucket_width if args.by_length else 0
    result = evaluate_split(
        cfg,
        where,
        args.split,
        loaded,
        args.bootstrap,
        args.output,
        width,
        record=args.engine == "jax",
    )
    if args.engine != "jax":
        result["engine"] = args.engine
    if args.by_length:
        from tx.viz.pictures import by_length_picture

        out = args.out or os.path.join(workdir.plots_dir(where), f"bleu_by_length_{args.split}.png")
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
    from tx.infer.translate import load_model
    from tx.viz.pictures import attention_pictures

    loaded = load_model(cfg, args.workdir, args.checkpoint)
    out = args.out or os.path.join(workdir.plots_dir(args.workdir), "attention")
    for path in attention_pictures(loaded, cfg, args.text or "", out):
        print(f"wrote {path}")
    return 0


def _plot(args, cfg) -> int:
    from tx.viz.pictures import curves_picture, positional_picture

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
    from tx.paper.demo import run_demo

    run_demo(cfg, args.workdir or "runs/demo")
    return 0


def _compile(args, cfg) -> int:
    from tx.train.aot import compile_report, topology_devices

    devices = topology_devices(args.topology) if args.topology else None
    print(json.dumps(compile_report(cfg, devices), indent=2))
    return 0


def _reproduce(args, cfg) -> int:
    from tx.paper.reproduce import main as reproduce

    if args.table is None:
        raise ConfigError("reproduce needs --table 2, 3 or 4")
    return reproduce(args, args.overrides)


def _road(args, cfg) -> int:
    from tx.paper.road import main as road

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
    "export": _export,
    "serve": _serve,
    "road": _road,
}
# Commands that take several --workdir (plot: curves) or --checkpoint (an ensemble).
MANY_WORKDIRS = ("plot", "translate", "serve")
MANY_CHECKPOINTS = ("translate", "serve")
# Commands that may read the run's config from a CTranslate2 export (--model DIR).
FROM_EXPORT = ("translate", "evaluate", "serve")
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
        "experiment", nargs="?", help="road: digits | gradients | table1 | length (tx/paper/road/)"
    )
    p.add_argument(
        "--workdir",
        nargs="+",
        action="extend",
        help="run directory (checkpoints, vocabulary, logs); plot takes several (curves), "
        "translate and serve several (an ensemble)",
    )
    p.add_argument("--input", help="translate: read sentences from this file (default stdin)")
    p.add_argument("--output", help="translate / evaluate: write translations to this file")
    p.add_argument(
        "--checkpoint",
        type=int,
        nargs="+",
        action="extend",
        help="use this training step's checkpoint; translate and serve: several (an ensemble)",
    )
    _inference_arguments(p)
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
        "(default: the last, see tx/infer/alignment.py)",
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
    p.add_argument(
        "--devices", type=int, help="info: rows and real tokens per step on this many devices"
    )
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


def _without_traceback(record: logging.LogRecord) -> bool:
    """Libraries' errors keep their message, not their traceback: Orbax logs a failed
    background save with one per thread, and the command's own one-line error says what
    failed and what is intact."""
    record.exc_info, record.exc_text = None, None
    return True


def _unraisable(info) -> None:
    """Drops one harmless report: after a failed save, TensorStore's callbacks still arrive for
    Orbax's event loop, which is closed by then. Anything else is reported as usual."""
    if isinstance(info.exc_value, RuntimeError) and str(info.exc_value) == "Event loop is closed":
        return
    sys.__unraisablehook__(info)


def _inference_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("inference (translate, evaluate, export, serve)")
    g.add_argument("--nbest", type=int, help="translate: N best per line, `index\tscore\ttext`")
    g.add_argument(
        "--engine",
        default="jax",
        choices=("jax", "ctranslate2"),
        help="translate / evaluate / serve: tx's own search, or a CTranslate2 export (--model)",
    )
    g.add_argument("--model", help="--engine ctranslate2: the directory `export` wrote")
    g.add_argument("--device", default="cpu", help="--engine ctranslate2: cpu, cuda or auto")
    g.add_argument(
        "--compute_type",
        default="default",
        help="--engine ctranslate2: default (as exported), int8, float32, ...",
    )
    g.add_argument("--threads", type=int, default=0, help="--engine ctranslate2: 0 = one per core")
    g.add_argument("--format", default="ctranslate2", help="export: the format")
    g.add_argument(
        "--quantization",
        default="float32",
        choices=("float32", "int8", "int16", "float16"),
        help="export: weight type",
    )
    g.add_argument("--host", default="127.0.0.1", help="serve: address to listen on")
    g.add_argument("--port", type=int, default=8080, help="serve: port")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for noisy in ("absl", "jax._src", "orbax", "tensorflow"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
        logging.getLogger(noisy).addFilter(_without_traceback)
    # tx runs no event loop of its own: asyncio's reports come from Orbax's tasks, whose
    # failures Orbax has raised already (dozens of "never retrieved" lines after a full disk).
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    sys.unraisablehook = _unraisable
    rest, config_path, overrides = split_config_args(argv)
    args = _parser().parse_args(rest)
    args.workdirs, args.workdir = args.workdir or [], (args.workdir or [None])[0]
    args.checkpoints, args.checkpoint = args.checkpoint or [], (args.checkpoint or [None])[0]
    if len(args.workdirs) > 1 and args.command not in MANY_WORKDIRS:
        print(f"error: {args.command} takes one --workdir", file=sys.stderr)
        return 2
    if len(args.checkpoints) > 1 and args.command not in MANY_CHECKPOINTS:
        print(f"error: {args.command} takes one --checkpoint", file=sys.stderr)
        return 2
    if args.nbest is not None and args.nbest < 1:
        print(f"error: --nbest must be >= 1, got {args.nbest}", file=sys.stderr)
        return 2
    args.overrides = overrides  # reproduce applies them to every row's config
    try:
        cfg = None if args.command in NO_CONFIG else _config(args, config_path, overrides)
        # After the config (it sets the heartbeat timeout), before anything touches a device.
        initialize(
            args.coordinator_address,
            args.num_processes,
            args.process_id,
            cfg.mesh.heartbeat_timeout_secs if cfg is not None else None,
        )
    except (ConfigError, workdir.NotARun, UsageError, LaunchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return _run(args, cfg)
    except _user_errors() as e:  # bad input: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        if isinstance(e, ProcessLost):
            exit_now(2)
        return 2


class UsageError(ValueError):
    """Command-line options that do not make a command."""


# They read what `train` wrote.
RUN_COMMANDS = ("translate", "average", "evaluate", "attention", "export", "serve")


def _config(args, config_path: str | None, overrides: list[str]):
    """The command's config: --config, else the run's resolved config.json for the commands
    that read a run (or the one a CTranslate2 export carries), else the command's default."""
    from_export = bool(args.model) and args.command in FROM_EXPORT
    if args.command in ("train", *RUN_COMMANDS) and not args.workdir and not from_export:
        raise UsageError(f"{args.command} needs --workdir DIR")
    if args.command in RUN_COMMANDS and args.workdir:
        run_config = workdir.require_run(args.workdir)
        config_path = config_path or run_config
    elif from_export:
        config_path = config_path or _export_config(args.model)
    config_path = config_path or DEFAULT_CONFIGS.get(args.command)
    if config_path is None:
        raise UsageError("--config FILE is required")
    return load_config(config_path, overrides)


def _export_config(model_dir: str) -> str:
    """The run's config an export carries (tx.infer.export.CONFIG_FILE)."""
    path = os.path.join(model_dir, "tx_config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"--model {model_dir} is not a tx export (no tx_config.json)")
    return path


def _run(args, cfg) -> int:
    """Runs the command; a collective that failed because another process died becomes
    ProcessLost (see tx.train.distributed)."""
    try:
        return COMMANDS[args.command](args, cfg)
    except Exception as e:
        lost = process_lost(e)
        if lost is None:
            raise
        raise lost from e


def _user_errors() -> tuple:
    from tx.data.sources import DataError
    from tx.data.tokenizer import VocabularyError
    from tx.infer.ct2 import EngineError
    from tx.infer.export import ExportError
    from tx.infer.translate import StaleAverage
    from tx.train.checkpoint import UnreadableCheckpoint
    from tx.train.loop import Diverged
    from tx.train.sharding import MeshError
    from tx.viz.pictures import PictureError

    return (
        ConfigError,
        DataError,
        VocabularyError,
        MeshError,
        Diverged,
        StaleAverage,
        PictureError,
        UnreadableCheckpoint,
        workdir.WriteFailed,
        ProcessLost,
        ExportError,
        EngineError,
        FileNotFoundError,
    )


if __name__ == "__main__":
    sys.exit(main())
