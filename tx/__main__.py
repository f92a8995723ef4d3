"""Command line: python -m tx COMMAND [--config FILE] [--config.key=value ...] [options].

Commands:
  info       parameter counts (actual and analytic, beside the paper's) as JSON
  train      train (same as train.py)
  translate  translate stdin or --input to stdout or --output
  average    average the last N checkpoints into a new one
  evaluate   BLEU (sacreBLEU and the paper's tokenized BLEU) and chrF on a split
  demo       the offline demo end to end: train, average, translate, score
  compile    lower and compile the train step ahead of time: memory and FLOPs
"""

from __future__ import annotations

import argparse
import logging
import os
import json
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow is imported anywhere
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from tx.config import ConfigError, load_config, model_config, split_config_args


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
    from tx.loop import train

    metrics = train(cfg, _need_workdir(args))
    print(json.dumps({k: round(v, 6) if isinstance(v, float) else v
                      for k, v in metrics.items()}))
    return 0


COMMANDS = {"info": _info, "train": _train}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tx",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("command", choices=sorted(COMMANDS))
    p.add_argument("--workdir", help="run directory (checkpoints, vocabulary, logs)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for noisy in ("absl", "jax._src", "orbax", "tensorflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    rest, config_path, overrides = split_config_args(argv)
    args = _parser().parse_args(rest)
    try:
        cfg = load_config(config_path, overrides) if config_path else None
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cfg is None:
        print("error: --config FILE is required", file=sys.stderr)
        return 2
    return COMMANDS[args.command](args, cfg)


if __name__ == "__main__":
    sys.exit(main())
