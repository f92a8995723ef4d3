"""The paper's tables, one command each: plan the runs, run them, report them beside the paper.

    python -m tx reproduce --table 3 [--rows A1,B1] [--scale mini] [--root runs]
                           [--plan | --run | --report]

A table is a list of rows; a row is a config of `configs/` (Table 3's `table3.py:A1`) and the
split its numbers come from. `--plan` says what each row will run and cost, `--run` runs the
rows one after another with the same train / average / evaluate functions as the commands
(each row in its own workdir; finished rows are skipped, interrupted ones resume), and
`--report` writes results/table<N>.md and .json from the rows' run cards (tx.runcard) alone.
`--scale mini` runs each row through configs/mini.py: the row's change on a small model.
"""

from __future__ import annotations

import dataclasses
import datetime
import glob
import json
import os
import re

import jax
import ml_collections

from tx import runcard
from tx import workdir as wd
from tx.config import ConfigError, load_config, model_config
from tx.counting import param_counts, train_flops_per_step
from tx.monitor import peak_tflops

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
BENCHMARK_RESULTS = os.path.join(os.path.dirname(CONFIGS), "benchmarks", "results")
SCALES = ("full", "mini")
# Padded tokens per sentence assumed for the attention-score FLOPs of a plan (WMT'14 EN-DE
# sentences average about 27-30 word pieces); those terms are under 2% of the total.
PLAN_LENGTH = 32
# MFU assumed when neither --mfu nor a benchmarks/results figure for the hardware exists:
# the paper's base ran at about 29% of its GPUs' assumed peak and big at about 42%.
DEFAULT_MFU = 0.35


@dataclasses.dataclass(frozen=True)
class Row:
    name: str  # the row's name in the paper's table: "A1", "base_ende", "wsj"
    config: str  # a config of configs/, with its argument: "table3.py:A1"
    split: str  # the split the table reports: "dev" (Table 3) or "test"


TABLES = {
    2: (
        Row("base_ende", "base.py", "test"),
        Row("big_ende", "big.py", "test"),
        Row("base_enfr", "base_enfr.py", "test"),
        Row("big_enfr", "big_enfr.py", "test"),
    ),
    3: tuple(
        Row(name, f"table3.py:{name}", "dev")
        for name in ("base", "A1", "A2", "A3", "A4", "B1", "B2")
        + tuple(f"C{i}" for i in range(1, 8))
        + ("D1", "D2", "D3", "D4", "E", "big")
    ),
    4: (Row("wsj", "table4.py:wsj", "test"), Row("semi", "table4.py:semi", "test")),
}
BASE_ROW = {2: "base_ende", 3: "base", 4: "wsj"}  # what a row's changes are listed against


class ReproduceError(ValueError):
    """A bad --table, --rows, --scale or --hardware."""


def select(table: int, names: str | None) -> list[Row]:
    """The rows of `table` named in `names` ("A1,B1"; None = all), in the table's order."""
    if table not in TABLES:
        raise ReproduceError(f"--table {table}: choose one of {sorted(TABLES)}")
    rows = TABLES[table]
    if not names:
        return list(rows)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {r.name for r in rows}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ReproduceError(
            f"--rows: Table {table} has no row {', '.join(unknown)}; its rows: "
            + ", ".join(r.name for r in rows)
        )
    return [r for r in rows if r.name in wanted]


@dataclasses.dataclass(frozen=True)
class Scale:
    """`full` (the paper's configs) or `mini` (configs/mini.py), with mini's step budget."""

    name: str = "full"
    steps: int | None = None  # mini: steps for a 100k-step row (None: configs/mini.py's)

    def __post_init__(self):
        if self.name not in SCALES:
            raise ReproduceError(f"--scale {self.name}: choose one of {', '.join(SCALES)}")
        if self.steps is not None and (self.name != "mini" or self.steps < 1):
            raise ReproduceError("--steps N (N >= 1) is a step budget for --scale mini")


def spec(row: Row, scale: Scale) -> str:
    """The --config argument of a row: `configs/table3.py:A1`, `configs/mini.py:table3.py:A1`."""
    if scale.name == "full":
        return f"configs/{row.config}"
    budget = f",steps={scale.steps}" if scale.steps else ""
    return f"configs/mini.py:{row.config}{budget}"


def load_row(row: Row, scale: Scale, overrides=()) -> ml_collections.ConfigDict:
    """The row's config, loaded from the repository's configs/ whatever the current directory."""
    path = os.path.join(os.path.dirname(CONFIGS), spec(row, scale))
    return load_config(path, overrides)


def row_workdir(root: str, table: int, row: Row, scale: Scale) -> str:
    suffix = "" if scale.name == "full" else f"-{scale.name}"
    return os.path.join(root, f"table{table}{suffix}", row.name)


# ---------------------------------------------------------------------------------------
# Hardware: peak FLOP/s and the MFU to expect, for --plan's wall times.


@dataclasses.dataclass(frozen=True)
class Hardware:
    name: str
    devices: int
    peak_tflops: float  # per device
    kind: str  # matched against benchmark results' device_kind


# --hardware names: GPUs as <kind>x<count> (h100x8); TPUs as Cloud TPU slices (v4-32), whose
# number counts TensorCores for v2-v4 and v5p (2 per chip) and chips for v5e and v6e.
# Peaks are dense bf16 per device (tx.monitor's table), except P100: the paper's own 9.5
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
    gpu = re.fullmatch(r"([a-z]\d+)x(\d+)", name)
    if gpu and gpu.group(1) in GPU_PEAKS:
        return Hardware(name, int(gpu.group(2)), GPU_PEAKS[gpu.group(1)], gpu.group(1))
    tpu = re.fullmatch(r"(v\d[a-z]*)-(\d+)", name.replace("litepod", "e"))
    if tpu and tpu.group(1) in TPU_PEAKS:
        kind = tpu.group(1)
        chips = max(int(tpu.group(2)) // TPU_CORES_PER_CHIP[kind], 1)
        return Hardware(name, chips, TPU_PEAKS[kind], kind)
    raise ReproduceError(
        f"--hardware {name}: give <gpu>x<count> with gpu in {', '.join(GPU_PEAKS)} "
        f"(h100x8), or a TPU slice such as {', '.join(k + '-8' for k in TPU_CORES_PER_CHIP)}"
    )


def expected_mfu(hw: Hardware, given: float | None) -> tuple[float, str]:
    """The MFU to plan with and where it comes from."""
    if given:
        return given, "--mfu"
    for path in sorted(glob.glob(os.path.join(BENCHMARK_RESULTS, "train_throughput_*.json"))):
        with open(path) as f:
            result = json.load(f)
        kind = result.get("environment", {}).get("device_kind", "")
        if result.get("mfu") and hw.kind.lower() in kind.lower():
            return float(result["mfu"]), os.path.relpath(path, os.path.dirname(CONFIGS))
    return DEFAULT_MFU, f"assumed (no benchmark result for {hw.kind}; pass --mfu)"


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
    """The commands a user would type for this row, in order."""
    extra = "".join(f" --config.{o}" for o in overrides)
    out = [f"python -m tx train --config {spec(row, scale)} --workdir {workdir}{extra}"]
    if cfg.decode.average_last > 1:
        out.append(f"python -m tx average --workdir {workdir} --last {cfg.decode.average_last}")
    out.append(f"python -m tx evaluate --workdir {workdir} --split {row.split} --json")
    return out


def plan_row(
    table: int, row: Row, scale: Scale, root: str, hw: Hardware, mfu: float, overrides=()
) -> dict:
    cfg = load_row(row, scale, overrides)
    base = load_row(next(r for r in TABLES[table] if r.name == BASE_ROW[table]), scale, overrides)
    workdir = row_workdir(root, table, row, scale)
    mc = model_config(cfg)
    steps, tokens = cfg.train.num_steps, cfg.data.tokens_per_step
    flops = steps * train_flops_per_step(mc, tokens, tokens, PLAN_LENGTH, PLAN_LENGTH)
    ref = cfg.get("reference") or {}
    return {
        "table": table,
        "row": row.name,
        "config": spec(row, scale),
        "changes": changes(cfg, base),
        "workdir": workdir,
        "commands": commands(cfg, row, scale, workdir, overrides),
        "split": row.split,
        "steps": steps,
        "tokens_per_step": tokens,
        "params": param_counts(mc)["params"],
        "paper": {k: v for k, v in ref.items() if v is not None},
        "model_flops": flops,
        "expected_hours": flops / (hw.devices * hw.peak_tflops * 1e12 * mfu) / 3600
        if hw.peak_tflops > 0
        else None,
    }


def plan(table, rows, scale, root, hw: Hardware, mfu=None, overrides=()) -> dict:
    mfu, mfu_source = expected_mfu(hw, mfu)
    return {
        "table": table,
        "scale": scale.name,
        "hardware": dataclasses.asdict(hw),
        "mfu": mfu,
        "mfu_source": mfu_source,
        "plan_length": PLAN_LENGTH,
        "rows": [plan_row(table, r, scale, root, hw, mfu, overrides) for r in rows],
    }


def format_plan(p: dict) -> str:
    hw = p["hardware"]
    lines = [
        f"Table {p['table']} ({p['scale']} scale) on {hw['devices']} x {hw['kind']} "
        f"({hw['peak_tflops']:g} TFLOP/s peak each) at MFU {p['mfu']:.2f} ({p['mfu_source']})",
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
            f"expected {hours}",
            *(f"    $ {c}" for c in r["commands"]),
        ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# --run


def finished(workdir: str, row: Row, num_steps: int) -> bool:
    """Trained to the end and evaluated on the row's split after that."""
    card = runcard.load(workdir) or {}
    score = card.get("scores", {}).get(row.split, {})
    return score.get("trained_steps") == num_steps


def run(table, rows, scale, root, overrides=(), say=print) -> list[str]:
    """Trains, averages and evaluates each row not yet finished; returns the workdirs."""
    from tx.checkpoint import average  # downstream of this module's planning half
    from tx.evaluate import evaluate_split
    from tx.loop import train

    done = []
    for row in rows:
        cfg = load_row(row, scale, overrides)
        workdir = row_workdir(root, table, row, scale)
        if _agreed(finished(workdir, row, cfg.train.num_steps)):
            say(f"[{row.name}] finished before: skipped ({workdir})")
            done.append(workdir)
            continue
        say(f"[{row.name}] {spec(row, scale)} -> {workdir}")
        train(cfg, workdir)
        runcard.record(workdir, "reproduce", {"table": table, "row": row.name, "scale": scale.name})
        if cfg.decode.average_last > 1:
            average(cfg, workdir)
        result = evaluate_split(cfg, workdir, row.split)
        say(f"[{row.name}] {row.split}: " + _scores_line(result))
        done.append(workdir)
    return done


def _agreed(flag: bool) -> bool:
    """Process 0's answer on every process: a row is skipped everywhere or nowhere."""
    if jax.process_count() == 1:
        return flag
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.array(flag)))


def _scores_line(s: dict) -> str:
    if "f1" in s:
        return f"bracketing F1 {s['f1']:.2f}"
    return f"tokenized BLEU {s['tok_bleu']:.2f}, sacreBLEU {s['bleu']:.2f}"


# ---------------------------------------------------------------------------------------
# --report


def measured(table: int, row: Row, card: dict | None) -> dict:
    """What the row's run card says, in the table's columns (None where not measured)."""
    if card is None:
        return {"status": "not run"}
    t = card["totals"]
    cfg = card["config"]
    steps, target = t["steps"], cfg["train"]["num_steps"]
    score = card.get("scores", {}).get(row.split, {})
    if steps < target:
        status = f"training: step {steps} of {target}"
    elif score.get("trained_steps") != target:
        status = "trained; not evaluated"
    else:
        status = "done"
    out = {"status": status, "steps": steps, "scale": card.get("reproduce", {}).get("scale")}
    out["params"] = param_counts(model_config(ml_collections.ConfigDict(cfg)))["params"]
    dev = card.get("dev", {})
    if dev.get("step") == steps:
        out["dev_ppl"] = dev.get("dev_perplexity")
    for key in ("tok_bleu", "bleu", "bleu_signature", "tok_bleu_recipe", "f1", "checkpoint"):
        if key in score:
            out[key] = score[key]
    out.update(
        model_flops=t["model_flops"],
        cost_flops_paper_way=t["cost_flops_paper_way"],
        wall_hours=t["wall_secs"] / 3600,
        mean_mfu=t["mean_mfu"],
        hardware=sorted({_hw(s["hardware"]) for s in card.get("segments", [])}),
        averaged=card.get("average", {}).get("steps"),
        src_tokens=t["src_tokens"],
        tgt_tokens=t["tgt_tokens"],
    )
    return out


def _hw(h: dict) -> str:
    return f"{h['devices']} x {h['device_kind']}"


def report(table, rows, scale, root, results_dir="results") -> tuple[str, str]:
    """Writes results/table<N>.md and .json from the run cards; returns their paths."""
    entries = []
    for row in rows:
        workdir = row_workdir(root, table, row, scale)
        card = runcard.load(workdir)
        cfg = card["config"] if card else runcard.resolved(load_row(row, scale))
        paper = {k: v for k, v in (cfg.get("reference") or {}).items() if v is not None}
        entries.append(
            {
                "row": row.name,
                "config": spec(row, scale),
                "workdir": workdir,
                "paper": paper,
                "measured": measured(table, row, card),
            }
        )
    if table == 3:
        _directions(entries)
    stem = f"table{table}" + ("" if scale.name == "full" else f"-{scale.name}")
    os.makedirs(results_dir, exist_ok=True)
    md, js = os.path.join(results_dir, stem + ".md"), os.path.join(results_dir, stem + ".json")
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    data = {"table": table, "scale": scale.name, "generated": now, "rows": entries}
    wd.write_atomic(js, json.dumps(data, indent=2) + "\n")
    wd.write_atomic(md, MARKDOWN[table](data))
    return md, js


def _directions(entries: list[dict]) -> None:
    """Table 3: does each row move dev PPL and BLEU the way the paper's row does, vs base?"""
    base = next((e for e in entries if e["row"] == "base"), None)
    if base is None:
        return
    for e in entries:
        if e is base:
            continue
        e["direction"] = {
            col: _direction(e, base, ours, theirs)
            for col, ours, theirs in (
                ("ppl", "dev_ppl", "dev_ppl"),
                ("bleu", "tok_bleu", "dev_bleu"),
            )
        }


def _direction(e, base, ours_key, paper_key) -> str | None:
    """ "agrees" / "disagrees" / "paper: equal" / None (not measured)."""
    p_row, p_base = e["paper"].get(paper_key), base["paper"].get(paper_key)
    o_row, o_base = e["measured"].get(ours_key), base["measured"].get(ours_key)
    if None in (p_row, p_base, o_row, o_base):
        return None
    paper_sign = (p_row > p_base) - (p_row < p_base)
    if paper_sign == 0:
        return "paper: equal"
    ours_sign = (o_row > o_base) - (o_row < o_base)
    if ours_sign == 0:
        return "ours: equal"
    return "agrees" if ours_sign == paper_sign else "disagrees"


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _pair(ours, paper, fmt) -> str:
    return f"{_num(ours, fmt)} / {_num(paper, fmt)}"


def _title(data: dict, what: str) -> list[str]:
    scale = data["scale"]
    note = (
        " Mini scale (configs/mini.py): each row's change on a small model and the demo "
        "corpus, so only the direction of each change can be compared with the paper."
        if scale == "mini"
        else ""
    )
    return [
        f"# Table {data['table']}: {what}",
        "",
        f"Measured (ours) beside the paper's figure; built from run cards on {data['generated']}."
        + note,
        "",
    ]


def _table3_md(data: dict) -> str:
    lines = _title(data, "variations of the base model (dev set)") + [
        "| Row | Params (M) ours / paper | Dev PPL ours / paper | Dev BLEU ours / paper "
        "| sacreBLEU | Steps ours / paper | Direction vs base (PPL, BLEU) | Status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in data["rows"]:
        m, p, d = e["measured"], e["paper"], e.get("direction", {})
        params = m.get("params")
        lines.append(
            f"| {e['row']} | {_pair(params and params / 1e6, p.get('params_m'), '.1f')} "
            f"| {_pair(m.get('dev_ppl'), p.get('dev_ppl'), '.2f')} "
            f"| {_pair(m.get('tok_bleu'), p.get('dev_bleu'), '.1f')} "
            f"| {_num(m.get('bleu'), '.1f')} "
            f"| {m.get('steps', '-')} / {_paper_steps(e)} "
            f"| {d.get('ppl') or '-'}, {d.get('bleu') or '-'} | {m['status']} |"
        )
    lines += [
        "",
        "Dev BLEU is tokenized (the paper's way); the recipe and sacreBLEU signature "
        "are in the JSON beside every score.",
    ]
    return "\n".join(lines) + "\n"


def _paper_steps(entry: dict) -> str:
    return "300K" if entry["row"] == "big" else "100K"


def _table2_md(data: dict) -> str:
    lines = _title(data, "newstest2014 BLEU and training cost") + [
        "| Model | BLEU ours / paper | sacreBLEU (signature) | Cost, the paper's way: ours / "
        "paper (FLOPs) | Model FLOPs (ours) | Hardware, hours | Averaged | Status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in data["rows"]:
        m, p = e["measured"], e["paper"]
        sacre = f"{m['bleu']:.1f} ({m.get('bleu_signature')})" if m.get("bleu") is not None else "-"
        hw = "; ".join(m.get("hardware", [])) or "-"
        hours = _num(m.get("wall_hours"), ".3g")
        lines.append(
            f"| {e['row']} | {_pair(m.get('tok_bleu'), p.get('test_bleu'), '.2f')} | {sacre} "
            f"| {_pair(m.get('cost_flops_paper_way'), p.get('train_cost_flops'), '.2g')} "
            f"| {_num(m.get('model_flops'), '.2g')} | {hw}, {hours} "
            f"| {m.get('averaged') or '-'} | {m['status']} |"
        )
    lines += [
        "",
        "BLEU is tokenized and compound-split as the paper's (recipe in the JSON); cost the "
        "paper's way = wall time x devices x each device's peak FLOP/s (tx.runcard.totals).",
    ]
    return "\n".join(lines) + "\n"


def _table4_md(data: dict) -> str:
    lines = _title(data, "English constituency parsing (WSJ section 23)") + [
        "| Training data | F1 ours / paper | Steps | Status |",
        "|---|---|---|---|",
    ]
    for e in data["rows"]:
        m, p = e["measured"], e["paper"]
        lines.append(
            f"| {e['row']} | {_pair(m.get('f1'), p.get('test_f1'), '.1f')} "
            f"| {m.get('steps', '-')} | {m['status']} |"
        )
    return "\n".join(lines) + "\n"


MARKDOWN = {2: _table2_md, 3: _table3_md, 4: _table4_md}


def main(args, overrides) -> int:
    """`python -m tx reproduce ...` (flags parsed by tx.__main__)."""
    try:
        rows = select(args.table, args.rows)
        scale = Scale(args.scale, args.steps)
        hw = hardware(args.hardware)
    except ReproduceError as e:
        raise ConfigError(str(e)) from e
    if args.run:
        run(args.table, rows, scale, args.root, overrides)
    if args.report or args.run:
        for path in report(args.table, rows, scale, args.root, args.results):
            print(f"wrote {path}")
    if not (args.run or args.report):
        p = plan(args.table, rows, scale, args.root, hw, args.mfu, overrides)
        print(json.dumps(p, indent=2) if args.json else format_plan(p))
    return 0
