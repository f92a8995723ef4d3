"""The paper's tables as rows of configs: which config each row runs, at which scale, where.

A table is a list of rows; a row is a config of `configs/` (Table 3's `table3.py:A1`) and the
split its numbers come from. `Scale("mini")` runs each row through configs/mini.py: the row's
change on a small model and the demo corpus; `Scale("real", corpus=DIR)` through
configs/real.py: the paper's base divided evenly, on a real corpus, with the base row under
several seeds (`rows_at`) and a second seed for rows within the noise (tx.paper.noise). Used by
tx.paper.reproduce (plan and run) and tx.paper.report (the tables).
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections

from tx import storage
from tx.config import configs_dir, load_config

SCALES = ("full", "mini", "real")
# --scale real: the base row's extra seeds (seed 0 is the row itself), whose spread is the band
# every other row's difference from base is judged against (tx.paper.noise).
BASE_SEEDS = (1, 2)
SECOND_SEED = 1  # a row within the noise runs again under this seed


@dataclasses.dataclass(frozen=True)
class Row:
    name: str  # the row's name in the paper's table: "A1", "base_ende", "wsj"
    config: str  # a config of configs/, with its argument: "table3.py:A1"
    split: str  # the split the table reports: "dev" (Table 3) or "test"
    # The training data the paper's figure needs: a run on fewer pairs is another experiment,
    # refused by `reproduce --run` and never reported beside the paper's figure.
    min_train_pairs: int = 0
    data_needed: str = ""
    seed: int | None = None  # another seed of the row (train.seed and data.shuffle_seed)

    @property
    def key(self) -> str:
        """The row's name with its seed: its workdir's and its card's name ("base-seed1")."""
        return self.name if self.seed is None else f"{self.name}-seed{self.seed}"

    def with_seed(self, seed: int) -> Row:
        return dataclasses.replace(self, seed=seed)


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


def rows_at(table: int, scale: Scale) -> tuple[Row, ...]:
    """The rows a table runs at a scale: at --scale real, Table 3's base row's extra seeds
    follow the base row."""
    rows = TABLES[table]
    if scale.name != "real" or table != 3:
        return rows
    base = next(r for r in rows if r.name == BASE_ROW[table])
    at = rows.index(base) + 1
    return rows[:at] + tuple(base.with_seed(s) for s in BASE_SEEDS) + rows[at:]


def select(table: int, names: str | None, scale: Scale | None = None) -> list[Row]:
    """The rows of `table` named in `names` ("A1,B1", "base-seed1"; None = all), in the
    table's order at `scale` (default: full)."""
    if table not in TABLES:
        raise ReproduceError(f"--table {table}: choose one of {sorted(TABLES)}")
    rows = rows_at(table, scale or Scale())
    if not names:
        return list(rows)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {r.key for r in rows}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ReproduceError(
            f"--rows: Table {table} has no row {', '.join(unknown)}; its rows: "
            + ", ".join(r.key for r in rows)
        )
    return [r for r in rows if r.key in wanted]


@dataclasses.dataclass(frozen=True)
class Scale:
    """`full` (the paper's configs), `mini` (configs/mini.py) or `real` (configs/real.py, on
    the corpus in `corpus`), with a step budget for a 100k-step row (None: the config's)."""

    name: str = "full"
    steps: int | None = None
    corpus: str | None = None  # real: the folder benchmarks/real_corpus.py wrote

    def __post_init__(self):
        if self.name not in SCALES:
            raise ReproduceError(f"--scale {self.name}: choose one of {', '.join(SCALES)}")
        if self.steps is not None and (self.name == "full" or self.steps < 1):
            raise ReproduceError("--steps N (N >= 1) is a step budget for --scale mini or real")


def spec(row: Row, scale: Scale) -> str:
    """The --config argument of a row: `configs/table3.py:A1`, `configs/mini.py:table3.py:A1`,
    `configs/real.py:table3.py:A1,corpus=R/corpus[,seed=1]`."""
    if scale.name == "full":
        return f"configs/{row.config}"
    args = [f"corpus={scale.corpus}"] if scale.name == "real" and scale.corpus else []
    args += [f"steps={scale.steps}"] if scale.steps else []
    if row.seed is not None:
        if scale.name != "real":
            raise ReproduceError(f"row {row.key}: seeds of a row are run at --scale real")
        args.append(f"seed={row.seed}")
    return f"configs/{scale.name}.py:{row.config}" + "".join("," + a for a in args)


def load_row(row: Row, scale: Scale, overrides=()) -> ml_collections.ConfigDict:
    """The row's config, loaded from tx's own configs (tx.config.configs_dir) whatever the
    current directory."""
    path = os.path.join(configs_dir(), spec(row, scale).removeprefix("configs/"))
    return load_config(path, overrides)


def row_workdir(root: str, table: int, row: Row, scale: Scale) -> str:
    """The row's workdir under `root` (a directory or a bucket's prefix)."""
    suffix = "" if scale.name == "full" else f"-{scale.name}"
    return storage.join(root, f"table{table}{suffix}", row.key)
