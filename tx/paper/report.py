"""The paper's tables from run cards: results/table<N>.md and .json, the paper's value beside
ours in every column, rows not yet run marked so (`python -m tx reproduce --report`).
"""

from __future__ import annotations

import datetime
import json
import os

import ml_collections

from tx import workdir as wd
from tx.config import model_config
from tx.model.counting import param_counts
from tx.paper.tables import Row, load_row, row_workdir, spec
from tx.train import runcard


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
        "paper's way = wall time x devices x each device's peak FLOP/s (tx.train.runcard.totals).",
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
