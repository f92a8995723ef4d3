"""The paper's tables as rows of configs: which config each row runs, at which scale, where.

A table is a list of rows; a row is a config of `configs/` (Table 3's `table3.py:A1`) and the
split its numbers come from. `Scale("mini")` runs each row through configs/mini.py: the row's
change on a small model. Used by tx.paper.reproduce (plan and run) and tx.paper.report (the tables).
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections

from tx import storage
from tx.config import load_config

# The repository root: tx/paper/tables.py is three levels below it.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs")
SCALES = ("full", "mini")


@dataclasses.dataclass(frozen=True)
class Row:
    name: str  # the row's name in the paper's table: "A1", "base_ende", "wsj"
    config: str  # a config of configs/, with its argument: "table3.py:A1"
    split: str  # the split the table reports: "dev" (Table 3) or "test"
    # The training data the paper's figure needs: a run on fewer pairs is another experiment,
    # refused by `reproduce --run` and never reported beside the paper's figure.
    min_train_pairs: int = 0
    data_needed: str = ""


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
    4: (
        Row("wsj", "table4.py:wsj", "test"),
        # The paper's semi-supervised setting: WSJ plus the ~17M-sentence high-confidence and
        # BerkeleyParser corpora. A million trees is far above WSJ's 40k and far below 17M:
        # enough to tell the two settings apart, not a claim that 1M reproduces 92.7.
        Row(
            "semi",
            "table4.py:semi",
            "test",
            min_train_pairs=1_000_000,
            data_needed="WSJ plus the ~17M-sentence semi-supervised corpus",
        ),
    ),
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
    """The row's workdir under `root` (a directory or a bucket's prefix)."""
    suffix = "" if scale.name == "full" else f"-{scale.name}"
    return storage.join(root, f"table{table}{suffix}", row.name)
