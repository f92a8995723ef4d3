"""`python -m tx road NAME`: the seed's experiments on the road to the Transformer, measured
(the seed: "The Road to the Transformer", defined in docs/road.md).

    digits     reverse a list of digits: LSTM without / with attention and a small Transformer
    gradients  the gradient from step T back to step 0: tanh RNN, LSTM, LSTM with open forget gates
    table1     the paper's Table 1 measured: FLOPs, time, sequential operations, path length
    length     the demo corpus: RNN seq2seq, RNN + attention, Transformer; BLEU by length

Each writes `<results>/road_<NAME>.md` (a markdown table, the command and the runtime, with
the seed's or the paper's published numbers beside ours) and `<results>/road_<NAME>.png`, and
prints the table. The published numbers are in tx/paper/road/published.py; every other number in a
report is measured by the run that wrote it.
"""

from __future__ import annotations

import importlib
import os
import time

EXPERIMENTS = ("digits", "gradients", "table1", "length")


def config_path(path: str) -> str:
    """`configs/...` as one of tx's own configs (tx.config.configs_dir), wherever we run."""
    from tx.config import configs_dir

    return os.path.join(configs_dir(), path.removeprefix("configs/"))


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A GitHub markdown table; cells are written with str()."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_report(results: str, name: str, command: str, seconds: float, body: str, fig) -> list:
    """`<results>/road_<name>.md` (command and runtime, then `body`) and `.png`; their paths.
    `results` is a local directory (the repository's results/): the experiments' workdirs
    (`--root`) may be in a bucket, their reports are committed files."""
    from tx import storage
    from tx.viz import plots

    os.makedirs(results, exist_ok=True)
    md = os.path.join(results, f"road_{name}.md")
    png = os.path.join(results, f"road_{name}.png")
    minutes = f"{seconds / 60:.1f} min on the machine that ran it"
    head = f"# road {name}\n\nCommand: `{command}` ({minutes})\n\n"
    storage.write_text(md, head + body + f"\n![road {name}](road_{name}.png)\n")
    plots.save(fig, png)
    return [md, png]


def main(
    *, name: str | None, results: str = "results", root: str = "runs", overrides=(), say=print
) -> int:
    """Runs experiment `name` and writes its report under `results` (its workdirs, if it
    trains runs, under `root`); `overrides` (`key=value`) apply to the runs' configs."""
    if name not in EXPERIMENTS:
        from tx.config import ConfigError

        raise ConfigError(f"road needs one of {', '.join(EXPERIMENTS)}, got {name!r}")
    module = importlib.import_module(f"tx.paper.road.{name}")
    start = time.perf_counter()
    body, fig, command = module.run(results=results, root=root, overrides=overrides, say=say)
    paths = write_report(results, name, command, time.perf_counter() - start, body, fig)
    say(body)
    for p in paths:
        say(f"wrote {p}")
    return 0
