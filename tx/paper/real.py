"""What --scale real adds to running a table (tx.paper.reproduce): the corpus each row's card
records, and the second seeds of the rows the base row's noise cannot tell apart from it
(tx.paper.noise)."""

from __future__ import annotations

import hashlib
import json

from tx import storage
from tx.config import ConfigError
from tx.paper.noise import judge
from tx.paper.report import committed_card, measured
from tx.paper.tables import BASE_ROW, SECOND_SEED, TABLES, Row, load_row, row_workdir, rows_at
from tx.train import runcard


def corpus_record(corpus: str) -> dict:
    """What a --scale real row's card says of its corpus: SOURCES.json's pair, command and
    split sizes, and that file's sha256 (it names every package and its sha256)."""
    path = storage.join(corpus, "SOURCES.json")
    if not storage.exists(path):
        raise ConfigError(
            f"--scale real reads its corpus from {corpus} (<root>/corpus), which has no "
            f"SOURCES.json: build it with python benchmarks/real_corpus.py --out {corpus} "
            "--pair en-nl --train-pairs 15000"
        )
    text = storage.read_text(path)
    sources = json.loads(text)
    return {
        "path": corpus,
        "pair": sources["pair"],
        "built_by": sources["built_by"],
        "splits": sources["splits"],
        "sources_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "text_sha256": text_sha256(corpus, sources["pair"]),
    }


def text_sha256(corpus: str, pair: str) -> str:
    """One sha256 of the corpus's six text files ({train,dev,test}.{src,tgt}, each file's own
    sha256 in that order): the same text gives the same value wherever and whenever it was
    built (SOURCES.json also records how long the build took)."""
    files = [f"{split}.{lang}" for split in ("train", "dev", "test") for lang in pair.split("-")]
    joined = "".join(storage.sha256(storage.join(corpus, f)) for f in files if _there(corpus, f))
    return hashlib.sha256(joined.encode("ascii")).hexdigest()


def _there(corpus: str, name: str) -> bool:
    if not storage.exists(storage.join(corpus, name)):
        raise ConfigError(f"{storage.join(corpus, name)} is missing: rebuild {corpus}")
    return True


def second_seeds(table, rows, scale, root, results: str | None = None) -> list[Row]:
    """The rows (of `rows`) whose first seed's dev PPL or BLEU differs from base by under
    tx.paper.noise.RERUN bands, as SECOND_SEED rows; none until the base row's seeds are done."""
    groups, paper = {}, {}
    for row in rows_at(table, scale):
        card = runcard.load(row_workdir(root, table, row, scale)) or committed_card(
            table, row, scale, results
        )
        m = measured(table, row, card) if card else {"status": "not run"}
        cfg = card["config"] if card else runcard.resolved(load_row(row, scale))
        paper.setdefault(row.name, cfg.get("reference") or {})
        g = groups.setdefault(row.name, {"dev_ppl": [], "tok_bleu": []})
        if m["status"] == "done":
            for key in g:
                if m.get(key) is not None:
                    g[key].append(m[key])
    judged = judge(groups, paper)["rows"]
    chosen = {r.name for r in rows if r.seed is None}
    return [
        r.with_seed(SECOND_SEED)
        for r in TABLES[table]
        if r.name in chosen and any(c["second_seed"] for c in judged.get(r.name, {}).values())
    ]


def seconds_run(table, rows, scale, root, results: str | None = None) -> list[Row]:
    """The second seeds of `rows` that have a run card (in their workdir or kept in results/):
    what a report shows beside the first."""
    if scale.name != "real":
        return []
    out = []
    for row in rows:
        again = row.with_seed(SECOND_SEED)
        if (
            row.seed is None
            and row.name != BASE_ROW[table]
            and (
                runcard.load(row_workdir(root, table, again, scale))
                or committed_card(table, again, scale, results)
            )
        ):
            out.append(again)
    return out
