"""Everything the accelerator goals ask for, in one run and one JSON (benchmarks/accelerator.sh).

    python benchmarks/accelerator.py [--dry-run] [--out FILE] [--steps 5]

On the device: base and big in bf16 at the paper's batch (about 25,000 source + 25,000 target
tokens per step, rows of 64 positions), each with the fused attention (model.attention_impl
"auto": cuDNN on a GPU) and with the explicit one; per case the step time (median of
`--steps` after the compiling step), tokens/s, model TFLOP/s and MFU (model FLOPs over the
device's peak, tx.train.monitor), peak device memory; then beam-4 decoding of 128 sentences x 32
source tokens for 31 forced steps (tokens/s). `--dry-run` runs the same code on configs/tiny.py
with CI-sized batches on whatever JAX finds (the CPU here), so the script is known to work
before a device is lent. Synthetic token ids; the first call of each case is not timed.
"""

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import RESULTS, environment, full_length_beam_search  # noqa: E402

from tx.config import load_config  # noqa: E402
from tx.model.counting import train_flops_per_step  # noqa: E402
from tx.model.kernels import attention_impl  # noqa: E402
from tx.train.monitor import peak_tflops  # noqa: E402
from tx.train.trainer import build, create_train_state, jit_train_step  # noqa: E402

LENGTH = 64  # positions per row, both sides
DECODE = dict(sentences=128, source=32, steps=31)


def cases(dry_run: bool) -> list[dict]:
    """(name, config, overrides, rows) of every training measurement."""
    if dry_run:
        configs, rows = [("tiny", "configs/tiny.py")], 8
    else:
        configs, rows = [("base", "configs/base.py"), ("big", "configs/big.py")], 25_000 // LENGTH
    out = []
    for name, path in configs:
        for attention in ("auto", "explicit"):
            overrides = ["model.dtype=bfloat16", f"model.attention_impl={attention}"]
            out.append(
                dict(name=f"{name}/{attention}", config=path, overrides=overrides, rows=rows)
            )
    return out


def peak_memory() -> int | None:
    """Peak bytes in use on device 0 since the start, where the backend reports it."""
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def median_time(fn, steps: int) -> tuple[float, float]:
    """(seconds of the first, compiling call; median seconds of `steps` calls after it)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def train_case(case: dict, steps: int) -> dict:
    cfg = load_config(os.path.join(ROOT, case["config"]), case["overrides"])
    trainer = build(cfg)
    mc = trainer.model.config
    shards = trainer.layout.data_shards
    rows = max(1, case["rows"] // shards) * shards
    rng = np.random.default_rng(0)
    shape = (rows, LENGTH)
    batch = {
        k: rng.integers(4, mc.vocab_size, shape).astype(np.int32) for k in ("inputs", "targets")
    }
    batch = trainer.layout.global_batch(batch)
    holder = {"state": create_train_state(trainer, 0)}
    step = jit_train_step(trainer)

    def run():
        holder["state"], metrics = step(holder["state"], batch)
        jax.block_until_ready(metrics)

    first, seconds = median_time(run, steps)
    tokens = rows * LENGTH
    flops = train_flops_per_step(mc, tokens, tokens, LENGTH, LENGTH)
    peak = peak_tflops(configured=cfg.train.peak_tflops) * jax.device_count()
    return {
        "case": case["name"],
        "config": case["config"],
        "overrides": case["overrides"],
        "attention_impl": attention_impl(  # what "auto" resolved to on this device
            mc.attention_impl, mc.compute_dtype, mc.d_k, mc.d_v, jax.default_backend()
        ),
        "rows": rows,
        "length": LENGTH,
        "first_step_s": round(first, 2),
        "step_s": seconds,
        "tokens_per_s": 2 * tokens / seconds,
        "model_tflops_per_s": flops / seconds / 1e12,
        "peak_tflops_assumed": peak,
        "mfu": flops / seconds / (peak * 1e12) if peak else None,
        "peak_memory_bytes": peak_memory(),
    }


def decode_case(config: str, dry_run: bool, steps: int) -> dict:
    """Beam 4, alpha 0.6, every hypothesis forced to the full length (EOS pushed down)."""
    cfg = load_config(os.path.join(ROOT, config), ["model.dtype=bfloat16"])
    trainer = build(cfg)
    params = create_train_state(trainer, 0).params
    sentences = 8 if dry_run else DECODE["sentences"]
    n_steps = DECODE["steps"]
    rng = np.random.default_rng(1)
    inputs = jnp.asarray(
        rng.integers(4, cfg.model.vocab_size, (sentences, DECODE["source"])), jnp.int32
    )
    search = jax.jit(
        lambda params, inputs: full_length_beam_search(trainer.model, params, inputs, n_steps)
    )
    first, seconds = median_time(lambda: jax.block_until_ready(search(params, inputs)), steps)
    return {
        "config": config,
        "sentences": sentences,
        "beam": 4,
        "steps": n_steps,
        "first_call_s": round(first, 2),
        "seconds": seconds,
        "tokens_per_s": sentences * n_steps / seconds,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="tiny shapes, any backend")
    p.add_argument("--steps", type=int, default=5, help="timed steps per case")
    p.add_argument("--out", default="", help="JSON file (default benchmarks/results/...)")
    args = p.parse_args()
    started = time.perf_counter()
    result = {"benchmark": "accelerator", "dry_run": args.dry_run, "environment": environment()}
    result["train"] = []
    for case in cases(args.dry_run):
        result["train"].append(train_case(case, args.steps))
        print(json.dumps(result["train"][-1]), flush=True)
    config = "configs/tiny.py" if args.dry_run else "configs/base.py"
    result["decode"] = decode_case(config, args.dry_run, args.steps)
    print(json.dumps(result["decode"]), flush=True)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    kind = "dry-run" if args.dry_run else jax.devices()[0].device_kind.replace(" ", "_")
    out = args.out or os.path.join(RESULTS, f"accelerator-{kind}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {out} ({result['wall_s']} s)")


if __name__ == "__main__":
    main()
