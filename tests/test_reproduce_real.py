"""Table 3 at --scale real: each row's change kept in proportion on the paper's base divided
evenly (configs/real.py), the base row's seeds and the noise band (tx.paper.noise), plans timed
from the pilot, and the report rebuilt from run cards alone. The runs themselves are never
here: results/table3-real.md is their record."""

import dataclasses
import json
import shutil

import pytest

from tx.__main__ import main
from tx.config import ConfigError, load_config
from tx.model.transformer_config import ModelConfig
from tx.paper import noise, report, reproduce, running, tables
from tx.paper.tables import Row, Scale
from tx.train import runcard

REAL = Scale("real", corpus="/corpus")
STEPS = 3000  # a row's steps where a test names them (configs/real.py's are the pilot's)


@pytest.mark.parametrize("row", [r.name for r in tables.TABLES[3]])
def test_real_keeps_each_rows_proportions(root, row):
    full = load_config(str(root / "configs" / f"table3.py:{row}"))
    real = load_config(str(root / "configs" / f"real.py:table3.py:{row},corpus=/c,steps={STEPS}"))
    base = load_config(str(root / "configs" / f"real.py:table3.py:base,corpus=/c,steps={STEPS}"))
    f, r = (ModelConfig.from_dict(c.model.to_dict()) for c in (full, real))
    for key in ("d_model", "d_ff", "d_k", "d_v"):
        assert getattr(r, key) * 4 == getattr(f, key), key
    assert r.num_encoder_layers * 2 == f.num_encoder_layers
    assert r.num_decoder_layers * 2 == f.num_decoder_layers
    assert (r.num_heads, r.positional, r.pre_ln) == (f.num_heads, f.positional, False)
    assert r.dropout_rate == f.dropout_rate
    assert real.train.label_smoothing == full.train.label_smoothing
    assert real.train.num_steps == full.train.num_steps * base.train.num_steps // 100_000
    assert real.reference.to_dict() == full.reference.to_dict()
    # What is not the row's change is the same in every row: data, schedule, evaluation.
    for section in ("data", "optim"):
        assert real[section].to_dict() == base[section].to_dict(), section
    assert real.data.train_prefix == "/c/train" and real.data.source == "text"
    assert real.train.unlikelihood == 0 and real.decode.average_last == 1


def test_a_seed_sets_the_models_and_the_datas():
    cfg = load_config(f"configs/real.py:table3.py:A1,corpus=/c,seed=2,steps={STEPS}")
    assert cfg.train.seed == cfg.data.shuffle_seed == 2
    base = load_config(f"configs/real.py:table3.py:A1,corpus=/c,steps={STEPS}")
    assert base.train.seed == base.data.shuffle_seed == 0


@pytest.mark.parametrize("arg", ["corpus", "seed=x", "steps=0", "size=3"])
def test_bad_arguments_name_the_config(arg):
    with pytest.raises(ConfigError, match="configs/real.py"):
        load_config(f"configs/real.py:table3.py:A1,{arg}")


def test_the_rows_and_the_base_rows_seeds():
    keys = [r.key for r in tables.select(3, None, REAL)]
    assert keys[:4] == ["base", "base-seed1", "base-seed2", "A1"] and keys[-1] == "big"
    assert len(keys) == 22
    assert tables.spec(Row("A1", "table3.py:A1", "dev", seed=1), REAL) == (
        "configs/real.py:table3.py:A1,corpus=/corpus,seed=1"
    )
    assert tables.row_workdir("R", 3, Row("A1", "x", "dev", seed=1), REAL) == (
        "R/table3-real/A1-seed1"
    )


@pytest.mark.parametrize(
    "difference, paper, cls",
    [
        (0.5, 0.4, "agrees"),  # the paper's sign, beyond the band (0.2)
        (-0.5, 0.4, "disagrees"),
        (0.1, 0.4, "within noise"),
        (0.1, 0.01, "agrees"),  # the paper: equal (|dPPL| <= 0.02), ours inside the band
        (0.5, 0.01, "disagrees"),  # the paper: equal, ours beyond the band
    ],
)
def test_classes(difference, paper, cls):
    assert noise.classify(difference, paper, 0.2, 0.02) == cls


def test_judge_bands_and_second_seeds():
    paper = {"base": {"dev_ppl": 4.92, "dev_bleu": 25.8}, "A1": {"dev_ppl": 5.29, "dev_bleu": 24.9}}
    paper["D1"] = {"dev_ppl": 5.77, "dev_bleu": 24.6}
    rows = {
        "base": {"dev_ppl": [10.0, 10.2, 10.4], "tok_bleu": [20.0, 20.5, 21.0]},
        "A1": {"dev_ppl": [11.1], "tok_bleu": [20.0, 20.2]},  # BLEU: two seeds, near base
        "D1": {"dev_ppl": [10.5], "tok_bleu": [15.0]},
    }
    judged = noise.judge(rows, paper)
    assert judged["band"]["ppl"] == pytest.approx(0.4)  # 2 x stdev(10.0, 10.2, 10.4)
    assert judged["band"]["bleu"] == pytest.approx(1.0)
    a1, d1 = judged["rows"]["A1"], judged["rows"]["D1"]
    assert a1["ppl"]["class"] == "agrees" and not a1["ppl"]["second_seed"]  # 0.9 > 2 bands
    assert a1["bleu"]["class"] == "within noise" and a1["bleu"]["mean"] == pytest.approx(20.1)
    assert a1["bleu"]["second_seed"]
    assert d1["ppl"]["class"] == "within noise" and d1["ppl"]["second_seed"]
    assert d1["bleu"]["class"] == "agrees"
    assert noise.judge({"base": {"dev_ppl": [10.0]}}, paper)["band"]["ppl"] is None


def test_the_plan_times_rows_from_the_pilot(capsys, tmp_path, monkeypatch):
    hw = reproduce.hardware(None)
    pilot = tmp_path / "pilot.json"
    here = {"devices": hw.devices, "device_kind": hw.kind}
    pilot.write_text(json.dumps({"hardware": here, "pilot": {"seconds_per_step": 0.3}}))
    monkeypatch.setattr(reproduce, "PILOT", str(pilot))
    # No row has run: not the checkout's kept cards either (the base row's would time it).
    monkeypatch.setattr(reproduce, "committed_card", lambda *args, **kwargs: None)
    rows = "base,base-seed2,C5,big"
    assert main(["reproduce", "--table", "3", "--scale", "real", "--root", str(tmp_path),
                 "--rows", rows, "--steps", str(STEPS), "--json"]) == 0  # fmt: skip
    rows = {r["row"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    steps = rows["base"]["steps"]
    assert rows["base"]["expected_hours"] == pytest.approx(steps * 0.3 / 3600)
    assert rows["base-seed2"]["commands"][0].endswith(
        f"--workdir {tmp_path}/table3-real/base-seed2"
    )
    assert "seed=2" in rows["base-seed2"]["config"]
    assert rows["big"]["steps"] == 3 * steps
    ratio = rows["big"]["model_flops"] / rows["base"]["model_flops"] / 3
    assert rows["big"]["expected_hours"] == pytest.approx(3 * steps * 0.3 * ratio / 3600)
    assert "the pilot's 0.300 s/step" in rows["C5"]["estimate_source"]


def test_a_run_needs_the_corpus(tmp_path, capsys):
    assert main(["reproduce", "--table", "3", "--scale", "real", "--root", str(tmp_path),
                 "--rows", "D1", "--run"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "SOURCES.json" in err and "real_corpus.py" in err


def _card(row: Row, ppl: float, bleu: float, steps: int | None = None) -> dict:
    """A run card as a finished --scale real row leaves it (the fields the report reads)."""
    cfg = runcard.resolved(tables.load_row(row, dataclasses.replace(REAL, steps=STEPS)))
    steps = steps or cfg["train"]["num_steps"]
    totals = {"steps": steps, "model_flops": 1.0, "cost_flops_paper_way": 2.0}
    totals |= {"wall_secs": 900.0, "mean_mfu": 0.3, "src_tokens": 1, "tgt_tokens": 1}
    corpus = {"pair": "en-nl", "built_by": "python benchmarks/real_corpus.py --pair en-nl"}
    corpus["splits"] = {"train": 50000, "dev": 1000, "test": 1000}
    return {
        "config": cfg,
        "totals": totals,
        "segments": [],
        "dev": {"step": steps, "dev_perplexity": ppl},
        "scores": {"dev": {"trained_steps": cfg["train"]["num_steps"], "tok_bleu": bleu}},
        "reproduce": {"table": 3, "row": row.name, "scale": "real", "corpus": corpus},
        "dev_curve": {"steps": [steps], "dev_ppl": [ppl]},
    }


def test_the_report_from_cards_alone(tmp_path):
    """Cards kept under results/ (no workdirs): the band, every row's class, a row still
    training, and the same bytes twice."""
    results = tmp_path / "results"
    cards = results / "cards" / "table3-real"
    cards.mkdir(parents=True)
    rows = {r.key: r for r in tables.select(3, None, REAL)}
    made = {
        "base": (10.0, 20.0),
        "base-seed1": (10.2, 20.5),
        "base-seed2": (10.4, 21.0),
        "A1": (11.0, 18.0),  # paper: worse on both -> agrees, agrees
        "D3": (10.3, 20.3),  # paper: PPL better, BLEU worse -> within noise (both)
    }
    for key, (ppl, bleu) in made.items():
        (cards / f"{key}.json").write_text(json.dumps(_card(rows[key], ppl, bleu)))
    again = tables.Row("D3", "table3.py:D3", "dev", seed=1)
    (cards / "D3-seed1.json").write_text(json.dumps(_card(again, 10.1, 20.1)))
    (cards / "C1.json").write_text(json.dumps(_card(rows["C1"], 12.0, 15.0, steps=10)))
    chosen = list(rows.values()) + [again]
    scaled = dataclasses.replace(REAL, steps=STEPS)
    md, js = report.report(3, chosen, scaled, str(tmp_path / "gone"), str(results))
    data = json.loads(open(js).read())
    entries = {(e["row"], e["seed"]): e for e in data["rows"]}
    assert data["noise"]["band"]["ppl"] == pytest.approx(0.4)
    assert entries[("A1", None)]["judged"]["ppl"]["class"] == "agrees"
    assert entries[("A1", None)]["judged"]["bleu"]["class"] == "agrees"
    d3 = entries[("D3", None)]["judged"]
    assert d3["ppl"]["seeds"] == 2 and d3["ppl"]["mean"] == pytest.approx(10.2)
    assert d3["ppl"]["class"] == d3["bleu"]["class"] == "within noise"
    assert "C1" not in data["noise"]["seeds"] or not data["noise"]["seeds"]["C1"]["dev_ppl"]
    text = open(md).read()
    assert "the band (2 standard deviations) is 0.400 PPL and 1.00 BLEU" in text
    assert "| A1 |" in text and "agrees" in text and "seed 0: training: step 10 of" in text
    assert "Dev PPL: 1 agrees; 1 within noise (D3); 0 disagrees." in text
    assert "50,000 training pairs" in text
    assert (results / "table3-real-curves.png").stat().st_size > 0  # base's and A1's curves
    shutil.copy(md, tmp_path / "first.md")
    report.report(3, chosen, scaled, str(tmp_path / "gone"), str(results))
    assert open(md).read() == (tmp_path / "first.md").read_text()


def test_a_row_finished_in_an_earlier_sitting_is_not_trained_again(tmp_path):
    """A fresh machine has no workdirs: a row whose card --report kept under results/ is
    skipped when it trained on this same corpus, and trained again when the corpus differs or
    the card stopped short (here a corpus without its training text stops it at once)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    sources = {"pair": "en-nl", "built_by": "real_corpus.py", "splits": {"train": 1}}
    (corpus / "SOURCES.json").write_text(json.dumps(sources))
    for name in ("train.en", "train.nl", "dev.en", "dev.nl", "test.en", "test.nl"):
        (corpus / name).write_text("A line.\n")
    scale = dataclasses.replace(REAL, steps=STEPS, corpus=str(corpus))
    row = next(r for r in tables.select(3, "D1", scale))
    results = tmp_path / "results"
    cards = results / "cards" / "table3-real"
    cards.mkdir(parents=True)
    card = _card(row, 10.0, 20.0)
    card["reproduce"]["corpus"] = reproduce.real.corpus_record(str(corpus))
    (cards / "D1.json").write_text(json.dumps(card))
    said = []
    running._run_rows(
        3, [row], scale, str(tmp_path), overrides=(), say=said.append, results=str(results)
    )
    assert said == [f"[D1] finished in an earlier sitting: skipped (its card in {results})"]
    steps = card["config"]["train"]["num_steps"]
    assert running.kept(3, row, scale, steps, str(results)) == card
    assert running.kept(3, row, scale, steps + 1, str(results)) is None  # stopped short
    sources["seconds"] = 160.1  # rebuilt another day, the same text: still the same corpus
    (corpus / "SOURCES.json").write_text(json.dumps(sources))
    assert running.kept(3, row, scale, steps, str(results)) == card
    (corpus / "dev.nl").write_text("Een regel.\n")  # a rebuilt corpus whose text differs
    assert running.kept(3, row, scale, steps, str(results)) is None
    (corpus / "train.en").unlink()
    with pytest.raises(ConfigError, match=r"/corpus/train\.en is missing: rebuild .*/corpus"):
        running._run_rows(
            3, [row], scale, str(tmp_path), overrides=(), say=said.append, results=str(results)
        )
