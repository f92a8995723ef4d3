"""The paper's tables, one command each: plan the runs, run them, report them beside the paper.

    python -m tx reproduce --table 3 [--rows A1,B1] [--scale mini] [--root runs]
                           [--plan | --run | --report]

A table is a list of rows; a row is a config of `configs/` (Table 3's `table3.py:A1`) and the
split its numbers come from. `--plan` says what each row will run and cost, `--run` runs the
rows one after another with the same train / average / evaluate functions as the commands
(each row in its own workdir; finished rows are skipped, interrupted ones resume), and
`--report` writes results/table<N>.md and .json from the rows' run cards (tx.train.runcard) alone.
`--scale mini` runs each row through configs/mini.py: the row's change on a small model;
`--scale real` through configs/real.py on the corpus in <root>/corpus, the base row under
several seeds and a second seed for rows within the noise (tx.paper.noise).
`--root` may be a bucket's prefix (gs://, s3://): the rows' workdirs and run cards are then
there; the reports go to `--results` (results/ of the current directory by default). An
installed tx needs no checkout: what plans read (COMPILED, PILOT) is package data.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex

import jax
import ml_collections

from tx import storage
from tx.config import ConfigError, model_config
from tx.model.counting import analytic_param_count, train_flops_per_step
from tx.paper import real
from tx.paper.report import committed_card, report
from tx.paper.running import run
from tx.paper.tables import (
    BASE_ROW,
    TABLES,
    ReproduceError,
    Row,
    Scale,
    load_row,
    row_workdir,
    select,
    spec,
)
from tx.train import runcard
from tx.train.monitor import peak_tflops

HERE = os.path.dirname(os.path.abspath(__file__))  # PILOT and COMPILED: package data
# --scale real: the pilot (benchmarks/table3_pilot.py), whose measured step time plans the rows
# not run yet, scaled by their model FLOPs per step.
PILOT = os.path.join(HERE, "table3_real_pilot.json")
# Padded tokens per sentence assumed for the attention-score FLOPs of a plan (WMT'14 EN-DE
# sentences average about 27-30 word pieces); those terms are under 2% of the total.
PLAN_LENGTH = 32
# Compiled step times per (config, slice): benchmarks/compiled_table.py writes them.
COMPILED = os.path.join(HERE, "compiled.json")
# Rows whose config the compiled table covers (the paper's own configs, full scale).
COMPILED_CONFIGS = {"base_ende": "base", "big_ende": "big", "base": "base", "big": "big"}
COMPILED_CONFIGS |= {"C5": "C5"}


# ---------------------------------------------------------------------------------------
# Hardware: peak FLOP/s and the MFU to expect, for --plan's wall times.


@dataclasses.dataclass(frozen=True)
class Hardware:
    name: str
    devices: int
    peak_tflops: float  # per device
    kind: str  # matched against benchmark results' device_kind


# --hardware names: GPUs as <kind>x<count> (h100x8) or, as `tx compile --topology` and
# COMPILED spell them, <kind>:<count> (h100:8), the name the plan
# uses; TPUs as Cloud TPU slices (v4-32), whose
# number counts TensorCores for v2-v4 and v5p (2 per chip) and chips for v5e and v6e.
# Peaks are dense bf16 per device (tx.train.monitor's table), except P100: the paper's own 9.5
# TFLOPS single-precision figure, so that a plan for the paper's machine reads like its Table 2.
GPU_PEAKS = {"p100": 9.5, "v100": 125.0, "a100": 312.0, "h100": 989.0, "h200": 989.0}
TPU_PEAKS = {"v2": 45.0, "v3": 123.0, "v4": 275.0, "v5p": 459.0, "v5e": 197.0, "v6e": 918.0}
TPU_CORES_PER_CHIP = {"v2": 2, "v3": 2, "v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}


def hardware(name: str | None) -> Hardware:
    """`--hardware` parsed, or this machine's devices when None."""
    if not name:
        device = jax.devices()[0]
        return Hardware("detected", jax.device_count(), peak_tflops(device), device.device_kind)
    name = name.lower()
    gpu = re.fullmatch(r"([a-z]\d+)[x:](\d+)", name)
    if gpu and gpu.group(1) in GPU_PEAKS:
        kind, count = gpu.group(1), int(gpu.group(2))
        return Hardware(f"{kind}:{count}", count, GPU_PEAKS[kind], kind)
    tpu = re.fullmatch(r"(v\d[a-z]*)-(\d+)", name.replace("litepod", "e"))
    if tpu and tpu.group(1) in TPU_PEAKS:
        kind = tpu.group(1)
        chips = max(int(tpu.group(2)) // TPU_CORES_PER_CHIP[kind], 1)
        return Hardware(name, chips, TPU_PEAKS[kind], kind)
    raise ReproduceError(
        f"--hardware {name}: give <gpu>x<count> with gpu in {', '.join(GPU_PEAKS)} "
        f"(h100x8 or h100:8), or a TPU slice such as "
        f"{', '.join(k + '-8' for k in TPU_CORES_PER_CHIP)}"
    )


def expected_hours(
    table: int, row: Row, scale: Scale, hw: Hardware, steps: int, flops: float, *, mfu, root: str
):
    """(hours, where the figure comes from) for a row on `hw`: a given --mfu; else the step
    time the TPU compiler estimated for this config on this slice; else the step time a run
    of this row at this scale measured on this platform; else (None, why there is none).
    Nothing is assumed: a plan without a figure says what would give one."""
    if mfu:
        return flops / (hw.devices * hw.peak_tflops * 1e12 * mfu) / 3600, f"--mfu {mfu}"
    compiled = _compiled_step(row, scale, hw)
    if compiled:
        seconds, where = compiled
        return steps * seconds / 3600, where
    measured = _measured_step(table, row, scale, hw, root)
    if measured:
        seconds, where = measured
        return steps * seconds / 3600, where
    pilot = _pilot_step(scale, hw, flops / steps)
    if pilot:
        seconds, where = pilot
        return steps * seconds / 3600, where
    return None, (
        f"no estimate for {hw.name}: compile it (python benchmarks/compiled_table.py, or "
        "python -m tx compile --topology ...), run the row here once, or pass --mfu"
    )


def _compiled_step(row: Row, scale: Scale, hw: Hardware):
    key = f"{COMPILED_CONFIGS.get(row.name)}@{hw.name}"
    if scale.name != "full" or not os.path.exists(COMPILED):
        return None
    with open(COMPILED) as f:
        entry = json.load(f)["entries"].get(key)
    best = (entry or {}).get("best", {})
    if not best.get("fits") or not best.get("step_seconds"):
        return None
    mesh = "x".join(f"{k}{v}" for k, v in best["mesh"].items() if v > 1)
    return best["step_seconds"], (
        f"compiled for {entry['topology']} ({mesh}, {best['micro_batches']} micro-batch(es)): "
        f"{best.get('step_source') or 'source not recorded'}, tx/paper/compiled.json of "
        f"{entry['date']}"
    )


def _measured_step(table: int, row: Row, scale: Scale, hw: Hardware, root: str):
    """Seconds per step from this row's own run card (its workdir under `root`, or the copy a
    checkout's results/ keeps) when it ran on the same kind and number of devices."""
    own = runcard.load(row_workdir(root, table, row, scale))
    for card in (own, committed_card(table, row, scale)):
        segs = [s for s in (card or {}).get("segments", []) if s["end_step"] > s["start_step"]]
        same = [s for s in segs if _same_platform(s["hardware"], hw)]
        if same:
            secs = sum(s["wall_secs"] for s in same)
            steps = sum(s["end_step"] - s["start_step"] for s in same)
            where = same[-1]["hardware"].get("cpu") or same[-1]["hardware"]["device_kind"]
            return secs / steps, f"measured: this row's run card, {steps} steps on {where}"
    return None


def _pilot_step(scale: Scale, hw: Hardware, flops_per_step: float):
    """--scale real: the pilot's measured seconds per step (benchmarks/table3_pilot.py),
    scaled by this row's model FLOPs per step against the base row's."""
    if scale.name != "real" or not os.path.exists(PILOT):
        return None
    with open(PILOT, encoding="utf-8") as f:
        pilot = json.load(f)
    if not _same_platform(pilot["hardware"], hw):
        return None
    base = load_row(Row("base", "table3.py:base", "dev"), scale)
    tokens = base.data.tokens_per_step
    base_flops = train_flops_per_step(model_config(base), tokens, tokens, PLAN_LENGTH, PLAN_LENGTH)
    seconds = pilot["pilot"]["seconds_per_step"] * flops_per_step / base_flops
    return seconds, (
        f"the pilot's {pilot['pilot']['seconds_per_step']:.3f} s/step x this row's model FLOPs "
        f"per step / the base's ({flops_per_step / base_flops:.2f})"
    )


def _same_platform(h: dict, hw: Hardware) -> bool:
    return h["devices"] == hw.devices and hw.kind.lower() in h["device_kind"].lower()


# ---------------------------------------------------------------------------------------
# --plan


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def changes(cfg: ml_collections.ConfigDict, base: ml_collections.ConfigDict) -> dict:
    """The config keys (dotted) where `cfg` differs from `base`, with cfg's values."""
    a, b = _flat(runcard.resolved(cfg)), _flat(runcard.resolved(base))
    return {
        k: v
        for k, v in sorted(a.items())
        if not k.startswith("reference.") and b.get(k, object()) != v
    }


def commands(cfg, row: Row, scale: Scale, workdir: str, overrides=()) -> list[str]:
    """The commands a user would type for this row, in order, quoted for a POSIX shell (an
    override such as data.train_prefix=ptb/wsj/0[2-9]/*.mrg must reach tx unexpanded)."""
    q = shlex.quote
    extra = "".join(" " + q(f"--config.{o}") for o in overrides)
    run = f"--workdir {q(workdir)}"
    out = [f"python -m tx train --config {q(spec(row, scale))} {run}{extra}"]
    if cfg.decode.average_last > 1:
        out.append(f"python -m tx average {run} --last {cfg.decode.average_last}")
    out.append(f"python -m tx evaluate {run} --split {row.split} --json")
    return out


def plan_row(
    table: int, row: Row, scale: Scale, root: str, hw: Hardware, *, mfu=None, overrides=()
) -> dict:
    cfg = load_row(row, scale, overrides)
    base = load_row(next(r for r in TABLES[table] if r.name == BASE_ROW[table]), scale, overrides)
    workdir = row_workdir(root, table, row, scale)
    mc = model_config(cfg)
    steps, tokens = cfg.train.num_steps, cfg.data.tokens_per_step
    flops = steps * train_flops_per_step(mc, tokens, tokens, PLAN_LENGTH, PLAN_LENGTH)
    ref = cfg.get("reference") or {}
    hours, source = expected_hours(table, row, scale, hw, steps, flops, mfu=mfu, root=root)
    return {
        "table": table,
        "row": row.key,
        "config": spec(row, scale),
        "changes": changes(cfg, base),
        "workdir": workdir,
        "commands": commands(cfg, row, scale, workdir, overrides),
        "split": row.split,
        "steps": steps,
        "tokens_per_step": tokens,
        "params": analytic_param_count(mc)["params"],  # = the tree's, untraced (tests)
        "paper": {k: v for k, v in ref.items() if v is not None},
        "model_flops": flops,
        "expected_hours": hours,
        "estimate_source": source,
    }


def plan(table, rows, scale, root, hw: Hardware, *, mfu=None, overrides=()) -> dict:
    return {
        "table": table,
        "scale": scale.name,
        "hardware": dataclasses.asdict(hw),
        "plan_length": PLAN_LENGTH,
        "rows": [plan_row(table, r, scale, root, hw, mfu=mfu, overrides=overrides) for r in rows],
    }


def format_plan(p: dict) -> str:
    hw = p["hardware"]
    lines = [
        f"Table {p['table']} ({p['scale']} scale) on {hw['devices']} x {hw['kind']} "
        f"({hw['peak_tflops']:g} TFLOP/s peak each); each row's time says where it comes from",
        "",
    ]
    for r in p["rows"]:
        paper = r["paper"].get("params_m")
        hours = "?" if r["expected_hours"] is None else f"{r['expected_hours']:.3g} h"
        change = ", ".join(f"{k}={v}" for k, v in r["changes"].items()) or "(the base)"
        if len(change) > 160:
            change = change[:157] + "..."
        lines += [
            f"[{r['row']}] {r['config']}: {change}",
            f"    params {r['params'] / 1e6:.2f}M (paper {paper or '-'}M); {r['steps']} steps x "
            f"{r['tokens_per_step']} tokens per side; model FLOPs {r['model_flops']:.3g}; "
            f"expected {hours} ({r['estimate_source']})",
            *(f"    $ {c}" for c in r["commands"]),
        ]
    known = [r["expected_hours"] for r in p["rows"] if r["expected_hours"] is not None]
    if known:
        lines += ["", f"Total: {sum(known):.3g} h for {len(known)} of {len(p['rows'])} rows"]
    if p["scale"] == "real":
        lines.append(
            "Then a second seed for each row within 2 bands of the base row (tx.paper.noise): "
            "known once the base row's seeds are done; `--run` runs them"
        )
    return "\n".join(lines)


def main(
    *,
    table: int,
    rows: str | None = None,
    scale: str = "full",
    steps: int | None = None,
    hardware_name: str | None = None,
    mfu: float | None = None,
    root: str = "runs",
    results: str = "results",
    mode: str = "plan",
    as_json: bool = False,
    overrides=(),
) -> int:
    """`python -m tx reproduce ...` (tx.cli.reproduce): `mode` "plan" prints what would run
    (JSON with `as_json`), "run" runs the unfinished rows and reports, "report" reports."""
    if mode not in ("plan", "run", "report"):
        raise ConfigError(f"reproduce: mode {mode!r} is not plan, run or report")
    try:
        corpus = storage.absolute(storage.join(root, "corpus")) if scale == "real" else None
        sized = Scale(scale, steps, corpus)
        chosen = select(table, rows, sized)
        hw = hardware(hardware_name)
    except ReproduceError as e:
        raise ConfigError(str(e)) from e
    if mode == "run":
        if scale == "real":
            real.corpus_record(corpus)  # the corpus is there, before any row starts
        run(table, chosen, sized, root, overrides=overrides, results=results)
    if mode in ("run", "report"):
        shown = chosen + real.seconds_run(table, chosen, sized, root, results)
        for path in report(table, shown, sized, root, results):
            print(f"wrote {path}")
    if mode == "plan":
        p = plan(table, chosen, sized, root, hw, mfu=mfu, overrides=overrides)
        print(json.dumps(p, indent=2) if as_json else format_plan(p))
    return 0
