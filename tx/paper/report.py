"""The paper's tables from run cards: results/table<N>.md and .json, the paper's value beside
ours in every column, rows not yet run marked so (`python -m tx reproduce --report`).

Each row's card is read from its workdir (a directory or a bucket's prefix, tx.storage) and
kept beside the table, in results/cards/table<N>[-scale]/<row>.json; where the workdir is gone
(a fresh clone), the kept card is read. So the committed tables are re-derived byte for byte
from the committed cards, and every row names the commit, packages and hardware it was
trained with. The report says
when rows come from several commits, and when the code that decides a row's numbers
(CODE_PATHS) changed after the commit that trained it (git is asked in a source checkout only).
"""

from __future__ import annotations

import json
import os
import subprocess

import ml_collections

from tx import storage
from tx.config import checkout, model_config
from tx.model.counting import analytic_param_count
from tx.paper import real_page
from tx.paper.markdown import CODE_PATHS, code_lines, num, pair, title
from tx.paper.tables import Row, load_row, row_workdir, spec
from tx.train import runcard

# The ahead-of-time compile report lives in tx/train but never runs in a training run.
NOT_DECIDING = ("tx/train/aot.py",)


def stem(table: int, scale) -> str:
    return f"table{table}" + ("" if scale.name == "full" else f"-{scale.name}")


def card_copy(table: int, row: Row, scale, results_dir: str) -> str:
    return storage.join(results_dir, "cards", stem(table, scale), f"{row.key}.json")


def committed_card(table: int, row: Row, scale, results_dir: str | None = None) -> dict | None:
    """The copy of the row's card kept under `results_dir` (default: the checkout's results/;
    an installed tx has none), or None if there is none."""
    root = checkout()
    if results_dir is None and root is None:
        return None
    path = card_copy(table, row, scale, results_dir or os.path.join(root, "results"))
    if not storage.exists(path):
        return None
    return json.loads(storage.read_text(path))


def code(card: dict) -> dict:
    """The commits a row was trained with, whether any tree was dirty, and whether the code
    that decides its numbers has changed since (None: unknown, e.g. no git)."""
    segs = card.get("segments", [])
    commits = sorted({s.get("commit") for s in segs if s.get("commit")})
    changed = [c for c in commits if _changed_since(c)]
    return {
        "commits": commits,
        "dirty": any(s.get("dirty") for s in segs),
        "changed_since": changed if all(_changed_since(c) is not None for c in commits) else None,
        "packages": segs[-1].get("packages") if segs else None,
    }


def _changed_since(commit: str) -> bool | None:
    root = checkout()
    if root is None:  # an installed tx: no repository to ask
        return None
    try:
        out = subprocess.run(
            ["git", "-C", root, "diff", "--quiet", commit, "HEAD", "--", *CODE_PATHS]
            + [f":(exclude){path}" for path in NOT_DECIDING],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: False, 1: True}.get(out.returncode)  # else: not a checkout, unknown commit


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
    out["code"] = code(card)
    pairs = card.get("data", {}).get("splits", {}).get("train", {}).get("pairs_read")
    out["train_pairs"] = pairs
    if row.min_train_pairs and (pairs is None or pairs < row.min_train_pairs):
        # Not the paper's experiment (or not known to be): never beside its figure.
        out["comparable"] = False
    # The family's equations, equal to the parameter tree's count for every row (tests), and
    # without tracing a model per row.
    out["params"] = analytic_param_count(model_config(ml_collections.ConfigDict(cfg)))["params"]
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
    entries, cards = [], []
    for row in rows:
        workdir = row_workdir(root, table, row, scale)
        card = runcard.load(workdir)
        if card is not None:  # kept beside the table: what a fresh clone reports from
            if scale.name == "real":
                card["dev_curve"] = real_page.dev_curve(workdir)
            path = card_copy(table, row, scale, results_dir)
            storage.write_text(path, json.dumps(card, indent=2, sort_keys=True) + "\n")
        else:
            card = committed_card(table, row, scale, results_dir)
        cards += [card] if card else []
        cfg = card["config"] if card else runcard.resolved(load_row(row, scale))
        paper = {k: v for k, v in (cfg.get("reference") or {}).items() if v is not None}
        entries.append(
            {
                "row": row.name,
                **({"seed": row.seed} if scale.name == "real" else {}),
                "config": spec(row, scale),
                "workdir": workdir,
                "paper": paper,
                "measured": measured(table, row, card),
            }
        )
        if scale.name == "real":
            entries[-1]["dev_curve"] = (card or {}).get("dev_curve")
    real = table == 3 and scale.name == "real"
    if table == 3 and not real:
        _directions(entries)
    name = stem(table, scale)
    md, js = storage.join(results_dir, name + ".md"), storage.join(results_dir, name + ".json")
    # Dated by the cards (the last score written), not by the clock: the same cards give the
    # same bytes.
    times = [s.get("time", "") for c in cards for s in c.get("scores", {}).values()]
    data = {"table": table, "scale": scale.name, "cards_up_to": max(times, default=None)}
    data["rows"] = entries
    if real:
        real_page.add_noise_and_corpus(data, cards)
        real_page.picture(data, storage.join(results_dir, name + "-curves.png"))
    storage.write_text(js, json.dumps(data, indent=2) + "\n")
    storage.write_text(md, real_page.markdown(data) if real else MARKDOWN[table](data))
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


def _page(data: dict, what: str, header: str, row, notes: tuple[str, ...] = ()) -> str:
    """A table's markdown: its title (`what`), `header` (one markdown row) and rule,
    `row(entry)` for each row, then the notes (a blank line before each) and where the rows'
    code came from."""
    lines = title(data, what) + [header, "|" + "---|" * (header.count("|") - 1)]
    lines += [row(e) for e in data["rows"]]
    for note in notes:
        lines += ["", note]
    return "\n".join(lines + code_lines(data)) + "\n"


def _table3_row(e: dict) -> str:
    m, p, d = e["measured"], e["paper"], e.get("direction", {})
    params = m.get("params")
    inferred = "†" if p.get("params_m_inferred") else ""
    return (
        f"| {e['row']} | {pair(params and params / 1e6, p.get('params_m'), '.1f')}{inferred} "
        f"| {pair(m.get('dev_ppl'), p.get('dev_ppl'), '.2f')} "
        f"| {pair(m.get('tok_bleu'), p.get('dev_bleu'), '.1f')} "
        f"| {num(m.get('bleu'), '.1f')} "
        f"| {m.get('steps', '-')} / {_paper_steps(e)} "
        f"| {d.get('ppl') or '-'}, {d.get('bleu') or '-'} | {m['status']} |"
    )


def _table3_md(data: dict) -> str:
    return _page(
        data,
        "variations of the base model (dev set)",
        "| Row | Params (M) ours / paper | Dev PPL ours / paper | Dev BLEU ours / paper "
        "| sacreBLEU | Steps ours / paper | Direction vs base (PPL, BLEU) | Status |",
        _table3_row,
        (
            "Dev BLEU is tokenized (the paper's way); the recipe and sacreBLEU signature "
            "are in the JSON beside every score.",
            "† The paper leaves this row's params blank (the base model's size): 65 is inferred.",
            "Dev PPL is per SentencePiece piece of each run's own vocabulary; the paper's is per "
            "word piece of its 37k-piece vocabulary. Compare each column's direction against the "
            "base row, not the values.",
        ),
    )


def _paper_steps(entry: dict) -> str:
    return "300K" if entry["row"] == "big" else "100K"


def _table2_row(e: dict) -> str:
    m, p = e["measured"], e["paper"]
    sacre = f"{m['bleu']:.1f} ({m.get('bleu_signature')})" if m.get("bleu") is not None else "-"
    hw = "; ".join(m.get("hardware", [])) or "-"
    hours = num(m.get("wall_hours"), ".3g")
    return (
        f"| {e['row']} | {pair(m.get('tok_bleu'), p.get('test_bleu'), '.2f')} | {sacre} "
        f"| {pair(m.get('cost_flops_paper_way'), p.get('train_cost_flops'), '.2g')} "
        f"| {num(m.get('model_flops'), '.2g')} | {hw}, {hours} "
        f"| {m.get('averaged') or '-'} | {m['status']} |"
    )


def _table2_md(data: dict) -> str:
    return _page(
        data,
        "newstest2014 BLEU and training cost",
        "| Model | BLEU ours / paper | sacreBLEU (signature) | Cost, the paper's way: ours / "
        "paper (FLOPs) | Model FLOPs (ours) | Hardware, hours | Averaged | Status |",
        _table2_row,
        (
            "BLEU is tokenized and compound-split as the paper's (recipe in the JSON); cost the "
            "paper's way = wall time x devices x each device's peak FLOP/s "
            "(tx.train.runcard.totals).",
        ),
    )


def _table4_row(e: dict) -> str:
    m, p = e["measured"], e["paper"]
    f1 = pair(m.get("f1"), p.get("test_f1"), ".1f")
    if m.get("comparable") is False:  # another experiment: not beside the paper's figure
        pairs = m.get("train_pairs")
        f1 = f"{num(m.get('f1'), '.1f')} (another experiment: {pairs or '?'} training trees)"
    return f"| {e['row']} | {f1} | {m.get('steps', '-')} | {m['status']} |"


def _table4_md(data: dict) -> str:
    return _page(
        data,
        "English constituency parsing (WSJ section 23)",
        "| Training data | F1 ours / paper | Steps | Status |",
        _table4_row,
    )


MARKDOWN = {2: _table2_md, 3: _table3_md, 4: _table4_md}
