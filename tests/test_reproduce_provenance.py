"""What makes a published number re-derivable and honest: plans that say where each time
comes from, quoted commands, the Table 4 guard, and footnotes for inferred and unlike values."""

import json
import shlex

import pytest
import treebank

from tx.__main__ import main
from tx.config import ConfigError
from tx.paper import report, reproduce, running, tables
from tx.paper.tables import Scale


def _plan(capsys, *args):
    assert main(["reproduce", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_plan_states_no_time_that_nothing_produced(capsys, tmp_path):
    (row,) = _plan(capsys, "--table", "2", "--rows", "big_ende", "--hardware", "h100x8",
                   "--root", str(tmp_path))["rows"]  # fmt: skip
    assert row["expected_hours"] is None and "no estimate for h100:8" in row["estimate_source"]


def test_a_plan_takes_the_compiled_step_time(capsys, tmp_path, monkeypatch):
    compiled = tmp_path / "compiled.json"
    best = {"fits": True, "step_seconds": 0.05, "mesh": {"data": 4, "fsdp": 1, "tensor": 1}}
    best["step_source"] = "roofline of XLA's flops and bytes (memory bound)"  # v4, v5e, v6e
    entry = {"topology": "v5p:2x2x1", "date": "2026-12-02", "best": best | {"micro_batches": 1}}
    compiled.write_text(json.dumps({"entries": {"base@v5p-8": entry}}))
    monkeypatch.setattr(reproduce, "COMPILED", str(compiled))
    p = _plan(capsys, "--table", "2", "--rows", "base_ende", "--hardware", "v5p-8")
    (row,) = p["rows"]
    assert row["expected_hours"] == pytest.approx(100_000 * 0.05 / 3600)
    assert row["estimate_source"].startswith(
        "compiled for v5p:2x2x1 (data4, 1 micro-batch(es)): roofline of XLA's flops and bytes"
    )


def test_a_mini_plan_takes_the_rows_measured_time(capsys, tmp_path, monkeypatch):
    """The mini plan's time comes from a mini run of the same row on the same platform (the
    kept card), never from the full-size benchmark's MFU."""
    hw = reproduce.hardware(None)
    here = {"devices": hw.devices, "device_kind": hw.kind, "cpu": "a test CPU"}
    seg = {"start_step": 0, "end_step": 400, "wall_secs": 200.0, "hardware": here}
    card = {"segments": [seg]}
    monkeypatch.setattr(
        reproduce, "committed_card", lambda t, r, s: card if r.name == "A1" else None
    )
    rows = _plan(capsys, "--table", "3", "--rows", "A1,A2", "--scale", "mini",
                 "--root", str(tmp_path))["rows"]  # fmt: skip
    assert rows[0]["expected_hours"] == pytest.approx(200 / 3600)
    assert rows[0]["estimate_source"] == "measured: this row's run card, 400 steps on a test CPU"
    assert rows[1]["expected_hours"] is None


def test_printed_commands_survive_a_shell(capsys):
    glob = "ptb/wsj/0[2-9]/*.mrg,ptb/wsj/1?/*.mrg"
    (row,) = _plan(capsys, "--table", "4", "--rows", "wsj", f"--config.data.train_prefix={glob}")[
        "rows"
    ]
    words = shlex.split(row["commands"][0])
    assert f"--config.data.train_prefix={glob}" in words  # one word, unexpanded


def test_table4_semi_refuses_the_wsj_trees_alone(tmp_path):
    files = {
        s: treebank.write(tmp_path / f"{s}.mrg", n, i)
        for i, (s, n) in enumerate([("train", 40), ("dev", 5), ("test", 5)])
    }
    row = next(r for r in tables.TABLES[4] if r.name == "semi")
    overrides = [f"data.{s}_prefix={p}" for s, p in files.items()]
    cfg = tables.load_row(row, Scale("mini"), overrides)
    with pytest.raises(ConfigError, match="row semi needs WSJ plus the ~17M-sentence"):
        running.check_data(row, cfg)
    running.check_data(tables.TABLES[4][0], cfg)  # the wsj row takes them


def _card(pairs, f1=90.0):
    return {
        "config": {"train": {"num_steps": 10}, "model": {}},
        "totals": {"steps": 10, "model_flops": 1.0, "cost_flops_paper_way": 2.0,
                   "wall_secs": 1.0, "mean_mfu": 0.5, "src_tokens": 1.0, "tgt_tokens": 1.0},
        "scores": {"test": {"trained_steps": 10, "f1": f1, "time": "2026-12-02T00:00:00"}},
        "data": {"splits": {"train": {"pairs_read": pairs}}},
        "segments": [],
    }  # fmt: skip


def test_a_semi_run_on_other_data_is_never_beside_the_papers_figure(monkeypatch):
    monkeypatch.setattr(report, "analytic_param_count", lambda mc: {"params": 1})
    monkeypatch.setattr(report, "model_config", lambda cfg: None)
    semi = next(r for r in tables.TABLES[4] if r.name == "semi")
    small = report.measured(4, semi, _card(40_000))
    assert small["comparable"] is False
    data = {"table": 4, "scale": "full", "cards_up_to": None}
    data["rows"] = [{"row": "semi", "paper": {"test_f1": 92.7}, "measured": small}]
    md = report.MARKDOWN[4](data)
    assert "another experiment: 40000 training trees" in md and "92.7" not in md
    assert "comparable" not in report.measured(4, semi, _card(17_000_000))


def test_inferred_params_and_the_perplexity_unit_are_footnoted():
    data = {"table": 3, "scale": "mini", "cards_up_to": None, "rows": []}
    for name, inferred in (("A1", True), ("B1", False)):
        paper = {"params_m": 65.0 if inferred else 58.0, "params_m_inferred": inferred}
        data["rows"].append({"row": name, "paper": paper, "measured": {"status": "not run"}})
    md = report.MARKDOWN[3](data)
    assert "| A1 | - / 65.0† |" in md and "| B1 | - / 58.0 |" in md
    assert "† The paper leaves this row's params blank" in md
    assert "per SentencePiece piece" in md
