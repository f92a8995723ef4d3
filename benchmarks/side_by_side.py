"""tx against the Flax WMT example, side by side in one process: `../shared/bench/side_by_side.py`
with its tx side written for tx's current names, and the matmul rate of this machine beside it.

    python benchmarks/side_by_side.py [../shared/bench/flax_wmt] [--what train,decode] [--rounds 3]
    python benchmarks/side_by_side.py ../shared/bench/flax_wmt --topology v5p:2x2x1

With --topology, nothing is timed: both train steps are compiled for that TPU slice on this
CPU (libtpu) and compared on the TPU compiler's own cost model (benchmarks/tpu_compiled.py);
the SUMMARY line carries tpu_optimal_seconds_tx_over_flax and tpu_mfu_ceiling_tx.

The shared script (read-only for the project) imports tx names from an earlier layout
(tx.train.make_trainer, tx.decode, tx.model.beam_decoder, ...). This copy takes everything else
from it unchanged: the Flax side (the example's own model, train step and beam search), the
shapes (base model, shared vocabulary 32,000, fp32, 32 rows x 64 tokens per side; decode 32
sentences x 32 source tokens, beam 4, alpha 0.6, 31 forced steps) and the interleaved timing.
It adds the fp32 matmul rate, measured in the same run, and each side's train step as a
fraction of it (model FLOPs of the step / median step time / matmul rate). Prints one JSON
line per measurement, a SUMMARY line, and saves benchmarks/results/side_by_side.json.
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared", "bench")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import full_length_beam_search, save  # noqa: E402

from tx.config import load_config  # noqa: E402
from tx.model.counting import train_flops_per_step  # noqa: E402
from tx.model.families import build_model  # noqa: E402
from tx.train.trainer import build, create_train_state, jit_train_step  # noqa: E402


def shared_script():
    """The shared benchmark as a module (its Flax side, shapes and timer)."""
    spec = importlib.util.spec_from_file_location(
        "shared_side_by_side", os.path.join(SHARED, "side_by_side.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tx_side(bench, vocab: int, overrides=()):
    """The shared script's tx_side, with tx's current names; same shapes, same protocol."""
    cfg = load_config(
        os.path.join(ROOT, "configs/base.py"),
        [f"model.vocab_size={vocab}", "model.dtype=float32", *overrides],
    )
    trainer = build(cfg)
    holder = {"state": create_train_state(trainer, 0)}
    step = jit_train_step(trainer)
    rng = np.random.default_rng(0)
    shape = (bench.ROWS, bench.LEN)
    batch = {k: rng.integers(4, vocab, shape).astype(np.int32) for k in ("inputs", "targets")}
    batch = trainer.layout.global_batch(batch)

    def train_step():
        holder["state"], m_ = step(holder["state"], batch)
        jax.block_until_ready(m_)

    model = build_model(trainer.model.config)
    dec_inputs = jnp.asarray(rng.integers(4, vocab, (bench.DEC_B, bench.DEC_S)).astype(np.int32))
    steps = bench.DEC_STEPS

    @jax.jit
    def predict(params, inputs):  # the Flax side's EOS bias too: every hypothesis 31 steps
        return full_length_beam_search(model, params, inputs, steps)

    def decode_batch():
        jax.block_until_ready(predict(holder["state"].params, dec_inputs))

    return train_step, decode_batch, trainer.model.config


def matmul_rate(rounds: int = 5) -> dict:
    """fp32 GFLOP/s of the train step's two kinds of product: [2048, 512] x [512, 2048]
    (projections, feed-forward) and [2048, 512] x [512, 32000] (the softmax layer)."""
    out = {}
    for name, (m, k, n) in {"ffn": (2048, 512, 2048), "softmax": (2048, 512, 32000)}.items():
        a = jnp.ones((m, k), jnp.float32)
        b = jnp.ones((k, n), jnp.float32)
        f = jax.jit(lambda x, y: x @ y)
        jax.block_until_ready(f(a, b))
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            jax.block_until_ready(f(a, b))
            times.append(time.perf_counter() - t)
        out[name] = round(2 * m * k * n / min(times) / 1e9, 1)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("flaxsrc", nargs="?", default=os.path.join(SHARED, "flax_wmt"))
    p.add_argument("--what", default="train,decode")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--tx-override", action="append", default=[], help="config key=value")
    p.add_argument("--topology", help="compare compiled steps for this TPU slice instead")
    a = p.parse_args()
    bench = shared_script()
    if a.topology:
        return compiled_side_by_side(bench, a)
    sides = {}
    t = time.perf_counter()
    sides["flax"] = bench.flax_side(os.path.abspath(a.flaxsrc), a.vocab)
    fi = time.perf_counter() - t
    t = time.perf_counter()
    *sides["tx"], model_cfg = tx_side(bench, a.vocab, a.tx_override)
    ti = time.perf_counter() - t
    print(json.dumps({"init_s": {"flax": round(fi, 1), "tx": round(ti, 1)}}), flush=True)
    rates = [matmul_rate()]
    tokens = bench.ROWS * bench.LEN
    flops = train_flops_per_step(model_cfg, tokens, tokens, bench.LEN, bench.LEN)
    res = {}
    units = (("train", 0, 2 * tokens), ("decode", 1, bench.DEC_B * bench.DEC_STEPS))
    for what, idx, unit in units:
        if what not in a.what:
            continue
        comp = {name: round(bench.timed(fns[idx], 1)[0], 1) for name, fns in sides.items()}
        times = {n: [] for n in sides}
        for _ in range(a.rounds):  # interleaved
            for name, fns in sides.items():
                times[name] += bench.timed(fns[idx], 2 if what == "train" else 3)
        med = {n: statistics.median(v) for n, v in times.items()}
        res[what] = {
            "first_call_s": comp,
            "median_s": {n: round(v, 3) for n, v in med.items()},
            "spread": {
                n: round((max(v) - min(v)) / statistics.median(v), 3) for n, v in times.items()
            },
            "times_s": {n: [round(x, 3) for x in v] for n, v in times.items()},  # in order
            "tokens_per_s": {n: round(unit / v, 1) for n, v in med.items()},
            "tx_over_flax": round(med["flax"] / med["tx"], 3),
        }
        if what == "train":
            res[what]["model_gflops_per_step"] = round(flops / 1e9, 1)
            res[what]["achieved_gflops_per_s"] = {
                n: round(flops / v / 1e9, 1) for n, v in med.items()
            }
        print(json.dumps({what: res[what]}), flush=True)
    rates.append(matmul_rate())
    best = max(max(r.values()) for r in rates)
    res["matmul_gflops_per_s"] = {"before": rates[0], "after": rates[1], "best": best}
    if "train" in res:
        res["train"]["fraction_of_matmul_rate"] = {
            n: round(g / best, 3) for n, g in res["train"]["achieved_gflops_per_s"].items()
        }
        print(
            json.dumps({"train_fraction_of_matmul_rate": res["train"]["fraction_of_matmul_rate"]})
        )
    print(json.dumps({"matmul_gflops_per_s": res["matmul_gflops_per_s"]}))
    save("side_by_side", {"overrides": a.tx_override, **res})
    print(
        "SUMMARY "
        + json.dumps({w: r["tx_over_flax"] for w, r in res.items() if "tx_over_flax" in r})
    )


def compiled_side_by_side(bench, a) -> None:
    from tpu_compiled import side_by_side

    res = side_by_side(bench, os.path.abspath(a.flaxsrc), a.topology, a.vocab, a.tx_override)
    print(json.dumps(res), flush=True)
    save("side_by_side_tpu", res)
    keys = ("tpu_optimal_seconds_tx_over_flax", "tpu_mfu_ceiling_tx", "tpu_mfu_ceiling_flax")
    print("SUMMARY " + json.dumps({k: round(res[k], 3) for k in keys}))


if __name__ == "__main__":
    main()
