"""The pieces every table's page is written from (tx.paper.report, tx.paper.real_page): numbers
beside the paper's, the title, and where the rows' code came from."""

from __future__ import annotations

# What decides a row's numbers: a change here after a row's commit makes the row stale.
CODE_PATHS = ("tx/model", "tx/data", "tx/train", "tx/infer", "tx/eval", "configs")


def num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def pair(ours, paper, fmt) -> str:
    return f"{num(ours, fmt)} / {num(paper, fmt)}"


def title(data: dict, what: str) -> list[str]:
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
        "Measured (ours) beside the paper's figure, built from the rows' run cards (kept in "
        f"results/cards/; the last score written {data['cards_up_to'] or '-'})." + note,
        "",
    ]


def code_lines(data: dict) -> list[str]:
    """Which commits trained the rows, and whether that code still decides their numbers."""
    codes = [(e["row"], e["measured"]["code"]) for e in data["rows"] if "code" in e["measured"]]
    if not codes:
        return []
    commits = sorted({x for _, c in codes for x in c["commits"]})
    short = ", ".join(x[:10] for x in commits) or "unknown"
    text = (
        f"Trained at commit {short}"
        if len(commits) == 1
        else f"Rows come from {len(commits)} commits ({short}); each row's is in the JSON"
    )
    dirty = [r for r, c in codes if c["dirty"]]
    if dirty:
        text += f"; with uncommitted changes: {', '.join(dirty)}"
    stale = sorted({x[:10] for _, c in codes for x in (c["changed_since"] or [])})
    if stale:
        text += (
            f". The code that decides these numbers ({', '.join(CODE_PATHS)}) has changed "
            f"since {', '.join(stale)}: rerun the rows to refresh them"
        )
    return ["", text + "."]
