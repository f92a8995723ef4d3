"""The table to read before renting accelerators: each config compiled for each slice, deviceless.

    pip install -e '.[tpu]'      # libtpu: XLA's TPU compiler, which runs on a CPU host
    python benchmarks/compiled_table.py [--configs base,big,C5] [--topologies v4:2x2x1,...]

For every config and topology it compiles the train step's sensible layouts (tx.train.aot:
data parallel, fsdp, tensor parallel over 2 or 4 chips, more micro-batches only where fewer do
not fit) and keeps the best: the memory per chip against the chip's HBM, the step time from
the TPU compiler's cost model (`optimal_seconds`), the MFU ceiling it implies and the paper's
whole run (100k steps for base, 300k for big) in hours. These are the compiler's estimates,
not measurements. Results accumulate in tx/paper/compiled.json (package data; a
pair already there is not compiled again; --again recompiles) and the table is written to
docs/accelerators.md. `reproduce --plan --hardware v5p-8` reads the JSON.

GPU nodes (h100:8, h200:8) compile the same way with jax's CUDA plugin instead of libtpu
(`pip install -e '.[cuda]'`, in an environment without libtpu); XLA's GPU compiler gives
memory figures but no cost analysis, so their rows have no step time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tx.config import load_config  # noqa: E402
from tx.train.aot import compile_layouts, describe, topology_devices  # noqa: E402

RESULTS = os.path.join(ROOT, "tx", "paper", "compiled.json")
TABLE = os.path.join(ROOT, "docs", "accelerators.md")
CONFIGS = {"base": "configs/base.py", "big": "configs/big.py", "C5": "configs/table3.py:C5"}
# Cloud TPU slice names (chips x cores as Google counts them) -> jax topology names.
SLICES = {
    "v4-8": "v4:2x2x1",
    "v5e-8": "v5e:2x4",
    "v5p-8": "v5p:2x2x1",
    "v6e-8": "v6e:2x4",
    "v5p-128": "v5p:4x4x4",
}


def load() -> dict:
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            return json.load(f)
    return {"entries": {}}


def save(results: dict) -> None:
    tmp = RESULTS + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=2, sort_keys=True)
    os.replace(tmp, RESULTS)


def compile_pair(config: str, slice_name: str) -> dict:
    topology = SLICES.get(slice_name, slice_name)
    cfg = load_config(os.path.join(ROOT, CONFIGS[config]))
    started = time.time()
    rows = compile_layouts(cfg, topology_devices(topology), progress=print)
    best = rows[0]
    return {
        "config": config,
        "slice": slice_name,
        "topology": topology,
        "best": best,
        "layouts": rows,
        "compile_secs": round(time.time() - started, 1),
        "date": datetime.date.today().isoformat(),
        "commit": _commit(),
    }


def _commit() -> str:
    """The code compiled (a pair compiled before a change to the model keeps its own)."""
    res = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "tx"], cwd=ROOT).returncode
    return res.stdout.strip() + ("+changes" if dirty else "") if res.returncode == 0 else "?"


# How slices are named and counted, for the table's reader.
SLICES = """\
Slices are named as Google Cloud names them: v4-8 and v5p-8 are 8 TensorCores on 4 chips
(two per chip; v5p-128 is 64 chips), v5e-8 and v6e-8 are 8 chips of one TensorCore each. The
chips column counts chips, and memory is per chip. Compiled deviceless, a v4 slice lists each
TensorCore as a device, so v4-8's layouts span 8 devices on its 4 chips (`data8`: two
devices per chip, each with half the chip's HBM and peak); on a running v4 slice JAX shows
each chip as one device (megacore), so training there sees 4 devices and the same batch
split `data4`. v5p compiles one device per chip."""


def table(results: dict) -> str:
    lines = [
        "# Accelerators: the train step compiled for real slices, before renting them",
        "",
        "Written by `python benchmarks/compiled_table.py` (see its docstring) from",
        "`tx/paper/compiled.json`. Every figure is XLA's own estimate for the compiled",
        "program (memory analysis, and the TPU compiler's cost model `optimal_seconds`), not a",
        "measurement: no accelerator ran. The batch is each config's largest (the longest bucket",
        "at the paper's 25k-token budget), bf16 as the configs set it. MFU ceiling: the model's",
        "FLOPs over the chips' dense bf16 peak in the estimated step time. Where a TPU's cost",
        "model gives no `optimal_seconds` (v4, v5e, v6e), the step is a roofline of XLA's flops",
        "and bytes, and the per-pair list says so. GPU nodes (h100:8, h200:8; compiled with",
        "jax's CUDA plugin, `pip install -e '.[cuda]'`) have memory only: XLA's GPU compiler",
        "gives no cost analysis.",
        "",
        *SLICES.splitlines(),
        "",
        "Each row's code is the commit it was compiled at: a row compiled before a change",
        "to the model is that code's estimate (`--again` recompiles). Fused attention: the",
        "attention kernels in the compiled step (the splash kernel on TPUs since 2026-12-02,",
        "cuDNN's on GPUs; 0 or - : every attention in XLA's own ops).",
        "",
        "| config | slice | chips | best layout | HBM per chip (GB) | of the chip's | step (ms) "
        "| MFU ceiling | paper's run (h) | fused attention | compiled at |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(results["entries"]):
        e = results["entries"][key]
        b = e["best"]
        mesh = "x".join(f"{k}{v}" for k, v in b["mesh"].items() if v > 1) or "one chip"
        layout = f"{mesh}, {b['micro_batches']} micro-batch(es)"
        per_chip = b.get("devices_per_chip", 1)  # v4: two TensorCores per chip
        if not b.get("fits"):
            chips = b["devices"] // per_chip if "devices" in b else "?"
            lines.append(
                f"| {e['config']} | {e['slice']} | {chips} | none fits | "
                f"{(b.get('hbm_bytes_per_chip') or 0) * per_chip / 1e9:.1f} | - | - | - | - | - | "
                f"{_compiled_at(e)} |"
            )
            continue
        step = b.get("step_seconds")
        if not step:  # nothing to rank the layouts by: the first that fits, data parallel
            layout += " (unranked: no step time)"
        lines.append(
            f"| {e['config']} | {e['slice']} | {b['devices'] // per_chip} | {layout} | "
            f"{b['hbm_bytes_per_chip'] * per_chip / 1e9:.1f} | "
            f"{b['hbm_bytes_per_chip'] / b['hbm_capacity_bytes']:.0%} | "
            + (
                f"{step * 1e3:.1f} | {b['mfu_ceiling']:.2f} | {b['run_hours']:.1f} |"
                if step
                else f"- | - | - ({b.get('step_source')}) |"
            )
            + f" {b.get('attention_kernel_calls', '-')} | {_compiled_at(e)} |"
        )
    lines += ["", "Every layout compiled, per pair:", ""]
    for key in sorted(results["entries"]):
        e = results["entries"][key]
        lines.append(f"- {e['config']} on {e['slice']} ({e['topology']}, {_compiled_at(e)}):")
        lines += [f"  - {describe(r)}" for r in e["layouts"]]
    return "\n".join(lines) + "\n"


def _compiled_at(entry: dict) -> str:
    return f"{entry['date']}, {entry.get('commit', '?')}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--topologies", default=",".join(SLICES))
    p.add_argument("--again", action="store_true", help="recompile pairs already in the JSON")
    a = p.parse_args()
    results = load()
    for config in a.configs.split(","):
        for slice_name in a.topologies.split(","):
            key = f"{config}@{slice_name}"
            if key in results["entries"] and not a.again:
                continue
            print(f"== {key}", flush=True)
            results["entries"][key] = compile_pair(config, slice_name)
            save(results)  # after every pair: a long run keeps what it finished
            with open(TABLE, "w") as f:
                f.write(table(results))
    print(table(results))


if __name__ == "__main__":
    main()
