"""`python -m tx train --config C --workdir W` (or `python train.py ...`): trains; resumes from
the latest checkpoint in W (`--workdir W` alone resumes a run with its own config.json). Prints
the final metrics as one JSON line. One run per workdir: a second `train` on W stops at once."""

from __future__ import annotations

import argparse
import json

from tx.cli import options

CONFIG = "new run"


def add_options(p: argparse.ArgumentParser) -> None:
    options.config(p)
    options.workdir(p, "the run directory: checkpoints, vocabulary, logs, run card")
    options.take_over_lock(p)
    options.distributed(p)


def run(args: argparse.Namespace, cfg) -> int:
    from tx.eval.evaluate import dev_bleu_hook
    from tx.train.loop import train

    # Dev BLEU during training decodes, which lives downstream of the loop: passed in.
    hook = dev_bleu_hook(cfg, args.workdir) if cfg.train.eval_bleu_every_steps else None
    metrics = train(cfg, args.workdir, bleu_hook=hook, take_over_lock=args.take_over_lock)
    print(json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in metrics.items()}))
    return 0
