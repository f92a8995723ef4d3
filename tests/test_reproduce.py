"""tx reproduce: the tables' rows, plans (params, FLOPs, time), mini scale, run and report."""

import functools
import json
import shutil

import pytest
import treebank

from tx.__main__ import main
from tx.config import load_config
from tx.model.counting import analytic_param_count, param_counts
from tx.model.transformer_config import ModelConfig
from tx.paper import report, reproduce, tables
from tx.train import runcard

# The smallest mini run that still trains, evaluates and scores: a few seconds per row.
FAST = [
    "--config.data.demo_train_size=1000",
    "--config.data.demo_eval_size=50",
    "--config.data.spm_sample_size=2000",
    "--config.data.vocab_size=200",
    "--config.data.tokens_per_step=400",
    "--config.decode.max_extra_len=8",
]


def _plan(capsys, *args):
    assert main(["reproduce", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plans_list_every_row_of_each_table(capsys):
    t3 = _plan(capsys, "--table", "3")
    names = [r["row"] for r in t3["rows"]]
    assert names[0] == "base" and names[-1] == "big" and len(names) == 20  # 18 variations
    for r in t3["rows"]:
        assert r["commands"][0].startswith(
            f"python -m tx train --config configs/table3.py:{r['row']}"
        )
        assert r["commands"][-1].endswith("--split dev --json")
        assert r["params"] > 0 and r["model_flops"] > 0 and r["estimate_source"]
        assert r["expected_hours"] is None or r["expected_hours"] > 0
        assert r["paper"]["params_m"] and r["paper"]["dev_ppl"] and r["paper"]["dev_bleu"]
    rows = {r["row"]: r for r in t3["rows"]}
    # PAPER.md's worked counts (V = 37,000): C4 26.82M, C5 163.82M, big 214.17M.
    assert rows["C4"]["params"] == pytest.approx(26.82e6, abs=0.005e6)
    assert rows["C5"]["params"] == pytest.approx(163.82e6, abs=0.005e6)
    assert rows["big"]["params"] == pytest.approx(214.17e6, abs=0.005e6)
    assert rows["C4"]["changes"] == {"model.d_model": 256, "model.d_k": 32, "model.d_v": 32}
    assert rows["base"]["changes"] == {}
    assert [r["row"] for r in _plan(capsys, "--table", "2")["rows"]] == [
        "base_ende",
        "big_ende",
        "base_enfr",
        "big_enfr",
    ]
    t2 = _plan(capsys, "--table", "2")["rows"][0]
    assert any(c.startswith("python -m tx average") and "--last 5" in c for c in t2["commands"])
    assert t2["paper"]["test_bleu"] == 27.3 and t2["paper"]["train_cost_flops"] == 3.3e18
    t4 = _plan(capsys, "--table", "4")["rows"]
    assert [r["row"] for r in t4] == ["wsj", "semi"]
    assert [r["paper"]["test_f1"] for r in t4] == [91.3, 92.7]


def test_the_papers_machine_gives_the_papers_time(capsys):
    """PAPER.md: base is about 9.5e17 model FLOPs, run in 12 h on 8 P100s (9.5 TFLOPS each)
    at about 29% of that peak. The plan must say the same."""
    p = _plan(
        capsys, "--table", "2", "--rows", "base_ende", "--hardware", "p100x8", "--mfu", "0.29"
    )
    (row,) = p["rows"]
    assert row["model_flops"] == pytest.approx(9.5e17, rel=0.02)
    assert row["expected_hours"] == pytest.approx(12.0, rel=0.05)
    assert row["estimate_source"] == "--mfu 0.29"


@pytest.mark.parametrize(
    "name,devices,peak",
    [
        ("h100x8", 8, 989.0),
        ("H100:8", 8, 989.0),
        ("a100x16", 16, 312.0),
        ("v4-32", 16, 275.0),
        ("v5e-8", 8, 197.0),
    ],
)
def test_hardware_names(name, devices, peak):
    hw = reproduce.hardware(name)
    assert (hw.devices, hw.peak_tflops) == (devices, peak)


def test_gpu_names_are_spelled_as_compile_spells_them():
    # The plan looks compiled step times up as CONFIG@<name> (benchmarks/results/compiled.json,
    # written by `tx compile --topology h100:8`): both spellings must reach the same entries.
    assert reproduce.hardware("h100x8").name == reproduce.hardware("h100:8").name == "h100:8"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--table", "5"], "--table: invalid choice: 5 (choose from 2, 3, 4)"),
        (["--table", "3", "--rows", "A1,Z9"], "Table 3 has no row Z9"),
        (["--table", "3", "--hardware", "x100"], "--hardware x100"),
        (["--table", "3", "--scale", "huge"], "--scale: invalid choice: 'huge'"),
        (["--table", "3", "--steps", "10"], "--steps N"),
    ],
)
def test_bad_arguments_are_one_line_errors(capsys, args, message):
    assert main(["reproduce", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


@pytest.mark.parametrize("row", [r.name for r in tables.TABLES[3]])
def test_mini_keeps_each_rows_proportions(root, row):
    full = load_config(str(root / "configs" / f"table3.py:{row}"))
    mini = load_config(str(root / "configs" / f"mini.py:table3.py:{row}"))
    f, m = ModelConfig.from_dict(full.model.to_dict()), ModelConfig.from_dict(mini.model.to_dict())
    for key in ("d_model", "d_ff", "d_k", "d_v"):
        assert getattr(m, key) * 8 == getattr(f, key), key
    assert m.num_encoder_layers * 2 == f.num_encoder_layers
    assert m.num_heads == f.num_heads and m.positional == f.positional
    assert m.dropout_rate == f.dropout_rate
    assert mini.train.label_smoothing == full.train.label_smoothing
    assert mini.decode.beam_size == full.decode.beam_size and mini.decode.alpha == full.decode.alpha
    assert mini.train.num_steps == full.train.num_steps * 400 // 100_000  # big: 3x base
    assert mini.reference.to_dict() == full.reference.to_dict()
    # plan and report count parameters from the family's equations, untraced: they must be
    # the tree's count for every row's change (the mini model has the same structure as full).
    assert analytic_param_count(m) == param_counts(m) and param_counts(m)["params"] > 0


def test_direction_against_base():
    base = {"row": "base", "paper": {"dev_ppl": 4.92}, "measured": {"dev_ppl": 10.0}}
    worse = {"row": "D1", "paper": {"dev_ppl": 5.77}, "measured": {"dev_ppl": 11.0}}
    better = {"row": "D3", "paper": {"dev_ppl": 4.67}, "measured": {"dev_ppl": 11.0}}
    same = {"row": "E", "paper": {"dev_ppl": 4.92}, "measured": {"dev_ppl": 9.0}}
    unmeasured = {"row": "A1", "paper": {"dev_ppl": 5.29}, "measured": {"status": "not run"}}
    pairs = [(worse, "agrees"), (better, "disagrees"), (same, "paper: equal"), (unmeasured, None)]
    for entry, expected in pairs:
        assert report._direction(entry, base, "dev_ppl", "dev_ppl") == expected


@pytest.mark.slow  # two mini rows trained, averaged and evaluated: 52 s on 2 cores
def test_plan_run_report_on_two_mini_rows(capsys, tmp_path):
    """The whole harness on this machine: plan two rows, run one, report both (one done, one
    not run), rerun (skips). Every row runs through the same loop; each row's change is
    traced through training and search by test_every_table3_row_traces_train_and_search_..."""
    runs, results = str(tmp_path / "runs"), str(tmp_path / "results")
    common = ["--table", "3", "--rows", "base,D1", "--scale", "mini", "--steps", "10"]
    common += ["--root", runs, "--results", results, *FAST]
    plan = _plan(capsys, *common)
    assert [r["row"] for r in plan["rows"]] == ["base", "D1"]
    assert plan["rows"][1]["changes"] == {"model.dropout_rate": 0.0}
    assert "configs/mini.py:table3.py:D1,steps=10" in plan["rows"][1]["commands"][0]
    assert main(["reproduce", *common, "--report"]) == 0  # nothing has run yet
    before = json.loads((tmp_path / "results" / "table3-mini.json").read_text())
    assert [r["measured"]["status"] for r in before["rows"]] == ["not run", "not run"]

    only_d1 = [a if a != "base,D1" else "D1" for a in common]
    assert main(["reproduce", *only_d1, "--run"]) == 0
    assert main(["reproduce", *common, "--report"]) == 0
    capsys.readouterr()
    report = json.loads((tmp_path / "results" / "table3-mini.json").read_text())
    base, d1 = report["rows"]
    assert base["measured"]["status"] == "not run"
    m = d1["measured"]
    assert m["status"] == "done" and m["steps"] == 10
    assert m["dev_ppl"] > 1 and m["tok_bleu"] >= 0 and "BLEU" not in str(m.get("bleu"))
    card = runcard.load(d1["workdir"])
    assert card["reproduce"] == {"table": 3, "row": "D1", "scale": "mini", "seed": None}
    assert card["scores"]["dev"]["trained_steps"] == 10
    assert d1["paper"]["dev_ppl"] == 5.77
    assert d1["direction"] == {"ppl": None, "bleu": None}  # base not measured: no direction
    md = (tmp_path / "results" / "table3-mini.md").read_text()
    assert "| base |" in md and "| D1 |" in md and "5.77" in md
    assert f"Trained at commit {card['segments'][0]['commit'][:10]}" in md
    assert m["code"]["commits"] == [card["segments"][0]["commit"]]
    # The card is kept beside the table: without the workdir the report is the same, byte
    # for byte.
    assert json.loads((tmp_path / "results" / "cards" / "table3-mini" / "D1.json").read_text())
    shutil.move(runs, str(tmp_path / "runs-moved"))
    assert main(["reproduce", *common, "--report"]) == 0
    assert (tmp_path / "results" / "table3-mini.md").read_text() == md
    shutil.move(str(tmp_path / "runs-moved"), runs)

    segments = card["segments"]
    assert main(["reproduce", *only_d1, "--run"]) == 0
    out = capsys.readouterr().out
    assert out.count("finished before: skipped") == 1
    assert runcard.load(d1["workdir"])["segments"] == segments


@pytest.mark.slow  # measured 55 s on a loaded 2-core machine; test_evaluate covers scoring
def test_table4_mini_runs_on_a_users_treebank(capsys, tmp_path):
    """Table 4's path end to end on a synthetic treebank: trees in, F1 out, in the report."""
    files = {
        s: treebank.write(tmp_path / f"{s}.mrg", n, i)
        for i, (s, n) in enumerate([("train", 400), ("dev", 20), ("test", 20)])
    }
    args = ["--table", "4", "--rows", "wsj", "--scale", "mini", "--steps", "10"]
    args += ["--root", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    args += [f"--config.data.{s}_prefix={path}" for s, path in files.items()]
    args += ["--config.data.vocab_size=60", "--config.decode.max_extra_len=8"]
    assert main(["reproduce", *args, "--run"]) == 0
    (entry,) = json.loads((tmp_path / "results" / "table4-mini.json").read_text())["rows"]
    m = entry["measured"]
    assert m["status"] == "done" and 0 <= m["f1"] <= 100
    assert entry["paper"]["test_f1"] == 91.3
    scores = runcard.load(entry["workdir"])["scores"]["test"]
    assert scores["scored_sentences"] == 20 and "COLLINS.prm" in scores["f1_recipe"]
    assert scores["search"]["beam_size"] == 21 and scores["search"]["alpha"] == 0.3


# Every row's change traced through training and search, without XLA's compile (training
# every row cost the slow suite most of its time: docs/development.md):
# test_plan_run_report_on_two_mini_rows runs the harness itself, and the rows differ from each
# other only in their configs.
@pytest.mark.slow  # a few seconds a row
@pytest.mark.parametrize("row", [r.name for r in tables.TABLES[3]])
def test_every_table3_row_traces_train_and_search_at_mini_scale(root, row):
    import jax
    import numpy as np

    from tx.infer.search import Strategy
    from tx.infer.translate import _search
    from tx.train.aot import lower_train_step

    cfg = load_config(str(root / "configs" / f"mini.py:table3.py:{row}"))
    trainer, state, batch, lowered = lower_train_step(cfg, jax.devices()[:1])
    out = lowered.out_info  # (new state, metrics)
    new_state = jax.tree_util.tree_leaves(out[0])
    assert [(x.shape, x.dtype) for x in new_state] == [
        (x.shape, x.dtype) for x in jax.tree_util.tree_leaves(state)
    ]
    strategy = Strategy.from_config(cfg.decode)
    rows, length = 2, batch["inputs"].shape[1]
    steps = length + cfg.decode.max_extra_len

    # translate's own search program (one model), traced for two sentences of this length
    search = functools.partial(_search, models=(trainer.model,), strategy=strategy, max_steps=steps)
    sequences, scores = jax.eval_shape(
        search,
        (state.params,),
        jax.ShapeDtypeStruct((rows, length), np.int32),
        np.full((rows,), steps, np.int32),
        np.uint32(0),  # sampling's seed
        np.int32(0),  # the batch's number
    )
    assert sequences.shape == (rows, strategy.width, steps)
    assert scores.shape == (rows, strategy.width)
