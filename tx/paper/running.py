"""`python -m tx reproduce --run` (tx.paper.reproduce): trains, averages and evaluates each row
not yet finished, in its workdir under --root, or kept from an earlier sitting in results/;
then, at --scale real, the second seeds the base row's noise asks for (tx.paper.real)."""

from __future__ import annotations

import functools

import jax
import ml_collections

from tx.config import ConfigError
from tx.paper import real
from tx.paper.report import committed_card
from tx.paper.tables import Row, Scale, load_row, row_workdir, spec
from tx.train import runcard


def finished(card: dict | None, row: Row, num_steps: int) -> bool:
    """Trained to the end and evaluated on the row's split after that."""
    score = (card or {}).get("scores", {}).get(row.split, {})
    return score.get("trained_steps") == num_steps


def kept(table, row: Row, scale: Scale, num_steps: int, results: str) -> dict | None:
    """The card of a row finished in an earlier sitting and kept under `results` (what
    --report copies there; a fresh machine has no workdir), when it was trained on this same
    corpus (--scale real: the sha256 of its text, `real.text_sha256`): such a row is not
    trained again."""
    card = committed_card(table, row, scale, results)
    if not finished(card, row, num_steps):
        return None
    if scale.name == "real":
        theirs = card.get("reproduce", {}).get("corpus", {}).get("text_sha256")
        if theirs != real.corpus_record(scale.corpus)["text_sha256"]:
            return None
    return card


def run(table, rows, scale, root, *, overrides=(), say=print, results="results") -> list[str]:
    """Trains, averages and evaluates each row not yet finished (in its workdir, or `kept` in
    `results`), then (--scale real) the second seeds the noise asks for (`second_seeds`);
    returns the workdirs."""
    done = _run_rows(table, rows, scale, root, overrides=overrides, say=say, results=results)
    if scale.name == "real":
        again = real.second_seeds(table, rows, scale, root, results)
        if again:
            say("second seeds (within 2 bands of base): " + ", ".join(r.key for r in again))
        done += _run_rows(table, again, scale, root, overrides=overrides, say=say, results=results)
    return done


def _run_rows(table, rows, scale, root, *, overrides, say, results) -> list[str]:
    from tx.paper.end_to_end import train_average_evaluate  # downstream of the planning half

    done = []
    for row in rows:
        cfg = load_row(row, scale, overrides)
        workdir = row_workdir(root, table, row, scale)
        steps = cfg.train.num_steps
        if _agreed(finished(runcard.load(workdir), row, steps)):
            say(f"[{row.key}] finished before: skipped ({workdir})")
            done.append(workdir)
            continue
        if _agreed(kept(table, row, scale, steps, results) is not None):
            say(f"[{row.key}] finished in an earlier sitting: skipped (its card in {results})")
            continue
        check_data(row, cfg)
        say(f"[{row.key}] {spec(row, scale)} -> {workdir}")
        entry = {"table": table, "row": row.name, "scale": scale.name, "seed": row.seed}
        if scale.name == "real":
            entry["corpus"] = real.corpus_record(scale.corpus)
        result = train_average_evaluate(
            cfg,
            workdir,
            split=row.split,
            average=cfg.decode.average_last > 1,
            after_train=functools.partial(runcard.record, workdir, "reproduce", entry),
        ).scores
        say(f"[{row.key}] {row.split}: " + _scores_line(result))
        done.append(workdir)
    return done


def check_data(row: Row, cfg: ml_collections.ConfigDict) -> None:
    """Refuses a row whose training data cannot give the paper's setting (Table 4's semi row
    on WSJ alone): its result would be another experiment beside the paper's figure."""
    if not row.min_train_pairs:
        return
    from tx.data import sources  # reading the data: downstream of planning

    pairs = sum(1 for _ in sources.load_split(cfg.data, "train"))
    if pairs < row.min_train_pairs:
        raise ConfigError(
            f"row {row.name} needs {row.data_needed} (at least {row.min_train_pairs:,} "
            f"training pairs); data.train_prefix gives {pairs:,}: that is another experiment, "
            f"not the paper's. Point data.train_prefix at that corpus too (comma-separated "
            f"globs), or run the other rows (--rows)"
        )


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
