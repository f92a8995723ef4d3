"""Training throughput: tokens/s and MFU of the train step for a config, on this machine.

    python benchmarks/train_throughput.py --config configs/base.py --steps 3 [--rows 8]
Synthetic batches of the longest bucket; the first step (compilation) is not timed.
"""

import argparse
import os
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import save  # noqa: E402

from tx.config import load_config  # noqa: E402
from tx.model.counting import train_flops_per_step  # noqa: E402
from tx.train.monitor import peak_tflops  # noqa: E402
from tx.train.trainer import build, create_train_state, jit_train_step  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="configs/base.py")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument(
        "--rows", type=int, default=0, help="rows per step (0: from data.tokens_per_step)"
    )
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--dtype", default="", help="override model.dtype")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override")
    args = p.parse_args()
    overrides = ([f"model.dtype={args.dtype}"] if args.dtype else []) + args.set
    cfg = load_config(args.config, overrides)
    trainer = build(cfg)
    mc = trainer.model.config
    state = create_train_state(trainer, 0)
    step = jit_train_step(trainer)
    rows = args.rows or cfg.data.tokens_per_step // args.length
    shards = trainer.layout.data_shards
    rows = max(1, rows // shards) * shards
    rng = np.random.default_rng(0)
    batch = {
        k: rng.integers(4, mc.vocab_size, (rows, args.length)).astype(np.int32)
        for k in ("inputs", "targets")
    }
    batch = trainer.layout.global_batch(batch)
    state, m = step(state, batch)
    jax.block_until_ready(m)
    start = time.perf_counter()
    for _ in range(args.steps):
        state, m = step(state, batch)
    jax.block_until_ready(m)
    elapsed = (time.perf_counter() - start) / args.steps
    tokens = rows * args.length
    flops = train_flops_per_step(mc, tokens, tokens, args.length, args.length)
    peak = peak_tflops(configured=cfg.train.peak_tflops) * jax.device_count()
    save(
        f"train_throughput_{os.path.basename(args.config).removesuffix('.py')}",
        {
            "config": args.config,
            "dtype": mc.dtype,
            "rows": rows,
            "length": args.length,
            "seconds_per_step": elapsed,
            "tokens_per_sec": 2 * tokens / elapsed,
            "model_tflops_per_sec": flops / elapsed / 1e12,
            "peak_tflops_assumed": peak,
            "mfu": flops / elapsed / (peak * 1e12) if peak else None,
        },
    )


if __name__ == "__main__":
    main()
