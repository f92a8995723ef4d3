"""Inference, evaluation, export, run cards, plots and the paper's report of a run in a bucket
(gs:// and s3://, the session's servers: tests/object_store.py): the same outputs as the local
run gives, what they write in the bucket, nothing written locally but the cache."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from object_store import point_at

from tx import storage
from tx import workdir as wd
from tx.cli.main import main
from tx.config import load_config

LINES = ["The dog sees a cat.", "", "I know that the man buys two hundred red cars."]
TEXT = "".join(line + "\n" for line in LINES)


@pytest.fixture(scope="module")
def snapshot(trained, tmp_path_factory):
    """The session's trained run as it is now (other tests add averages and pictures to it):
    checkpoints, vocabulary, config, run card, events."""
    path = str(tmp_path_factory.mktemp("snapshot") / "run")
    skip = shutil.ignore_patterns("averaged", "data", "plots", "*.hyp.*", "lock.json")
    shutil.copytree(trained, path, ignore=skip)
    return path


def nbest(engine, cfg) -> list[str]:
    """`translate --nbest 2`'s lines for LINES: the scores tell whether two engines' parameters
    are the same (the tiny run's best translation is often empty)."""
    from tx.infer.translate import nbest_lines, translate_nbest

    return nbest_lines(translate_nbest(engine, LINES, cfg, 2))


@pytest.fixture(scope="module")
def translations(snapshot):
    """The local run's two best translations of LINES, with their scores."""
    from tx.infer.translate import load_model

    cfg = load_config(wd.config_file(snapshot))
    return nbest(load_model(cfg, snapshot), cfg)


@pytest.fixture(scope="module")
def ct2_translations(snapshot, tmp_path_factory):
    """The two best translations of LINES by the local run's CTranslate2 export."""
    pytest.importorskip("ctranslate2")
    from tx.infer import ct2
    from tx.infer.export import export

    cfg = load_config(wd.config_file(snapshot))
    out = str(tmp_path_factory.mktemp("export") / "ct2")
    export(cfg, snapshot, out)
    return nbest(ct2.load(out, threads=1), cfg)


# s3 under -m slow: the commands reach both schemes through tx.storage, whose primitives
# tests/test_storage.py runs on both servers by default.
@pytest.fixture(scope="module", params=["gs", pytest.param("s3", marks=pytest.mark.slow)])
def run(request, snapshot, tmp_path_factory):
    """The snapshot copied into a fresh prefix of the bucket, as training there writes it
    (this module's environment points at that scheme's server; the cache is the module's)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TX_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        path = point_at(request, mp, request.param) + "/run"
        upload_run(snapshot, path)
        yield path


def upload_run(local: str, path: str) -> None:
    """Copies a local run's files to `path`. Orbax finalizes a checkpoint on a bucket with
    commit_success.txt files (in the step and in each item: nothing is renamed there), which a
    local checkpoint (finalized by a rename) lacks: they are added as Orbax writes them."""
    storage.upload_tree(local, path)
    steps = os.path.join(local, "checkpoints")
    for step in os.listdir(steps):
        items = [i for i in os.listdir(os.path.join(steps, step)) if not i.startswith("_")]
        for part in ("", *items):
            if os.path.isdir(os.path.join(steps, step, part)):
                where = storage.join(path, "checkpoints", step, part).rstrip("/")
                text = f"Checkpoint commit was successful to {where}"
                storage.write_text(storage.join(where, "commit_success.txt"), text)


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """An empty working directory: a path of the bucket taken for a local one would appear
    in it (`gs:/...`)."""
    path = tmp_path / "cwd"
    path.mkdir()
    monkeypatch.chdir(path)
    return path


def beside(run: str, name: str) -> str:
    return storage.join(storage.dirname(run), name)


def test_translate_reads_the_run_and_its_input_from_the_bucket(run, translations, cwd):
    source, output = beside(run, "in.txt"), beside(run, "out.txt")
    storage.write_text(source, TEXT)
    args = ["translate", "--workdir", run, "--nbest", "2", "--input", source, "--output", output]
    res = subprocess.run(
        [sys.executable, "-m", "tx", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert storage.read_text(output).splitlines() == translations
    assert os.listdir(cwd) == []


def test_evaluate_writes_its_hypotheses_and_scores_into_the_bucket(run, cwd, capsys):
    assert main(["evaluate", "--workdir", run, "--split", "test", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    hypotheses = wd.hypotheses_file(run, "test", "de")
    assert result["hypotheses_file"] == hypotheses
    assert len(storage.read_text(hypotheses).splitlines()) == result["num_sentences"] == 50
    card = json.loads(storage.read_text(wd.run_card_file(run)))
    assert card["scores"]["test"]["bleu"] == result["bleu"]
    assert os.listdir(cwd) == []


def test_an_export_to_the_bucket_translates_as_the_local_export(run, ct2_translations, cwd, capsys):
    from tx.infer import ct2
    from tx.infer.export import EXPORT_FILE, PARTIAL_FILE

    out = beside(run, "ct2")
    assert main(["export", "--workdir", run, "--out", out]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["out"] == out and record["workdir"] == run
    files = ["config.json", "model.bin", "shared_vocabulary.json", "spm.model"]
    assert storage.listdir(out) == sorted([*files, "tx_config.json", EXPORT_FILE])
    source, output = beside(run, "in.txt"), beside(run, "ct2.txt")
    storage.write_text(source, TEXT)
    args = ["--engine", "ctranslate2", "--model", out, "--threads", "1", "--nbest", "2"]
    assert main(["translate", *args, "--input", source, "--output", output]) == 0
    assert storage.read_text(output).splitlines() == ct2_translations
    # A second export replaces the first whole, and is what translates from then on (the local
    # copy of the first is not reused); someone else's files are refused.
    assert main(["export", "--workdir", run, "--out", out, "--quantization", "int8"]) == 0
    capsys.readouterr()
    assert json.loads(storage.read_text(storage.join(out, EXPORT_FILE)))["quantization"] == "int8"
    assert not storage.exists(storage.join(out, PARTIAL_FILE))
    assert f"{out} (int8, " in ct2.load(out, threads=1).source
    notes = beside(run, "notes")
    storage.write_text(storage.join(notes, "keep.txt"), "mine")
    assert main(["export", "--workdir", run, "--out", notes]) == 2
    assert f"error: --out {notes} exists and is not a tx export" in capsys.readouterr().err
    assert storage.listdir(notes) == ["keep.txt"]
    assert os.listdir(cwd) == []


def test_card_plot_and_attention_read_the_bucket(run, snapshot, cwd, capsys):
    assert main(["card", "--workdir", run, "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    with open(os.path.join(snapshot, "run_card.json"), encoding="utf-8") as f:
        assert card["segments"] == json.load(f)["segments"]
    assert main(["plot", "--workdir", run]) == 0
    picture = storage.join(wd.plots_dir(run), "curves.png")
    assert capsys.readouterr().out == f"wrote {picture}\n"
    assert storage.read_bytes(picture).startswith(b"\x89PNG")
    assert main(["attention", "--workdir", run, "--text", LINES[0]]) == 0
    wrote = sorted(capsys.readouterr().out.splitlines())
    maps = storage.join(wd.plots_dir(run), "attention")
    assert len(wrote) == 3
    assert wrote == [f"wrote {storage.join(maps, name)}" for name in storage.listdir(maps)]
    assert os.listdir(cwd) == []


def test_reproduce_reports_from_run_cards_in_the_bucket(run, snapshot, cwd, capsys):
    root = beside(run, "runs")
    with open(os.path.join(snapshot, "run_card.json"), "rb") as f:
        storage.write_bytes(storage.join(root, "table3-mini", "base", "run_card.json"), f.read())
    results = cwd.parent / "results"
    args = ["--table", "3", "--rows", "base,A1", "--scale", "mini", "--root", root]
    assert main(["reproduce", *args, "--report", "--results", str(results)]) == 0
    rows = json.loads((results / "table3-mini.json").read_text())["rows"]
    assert [r["workdir"] for r in rows] == [f"{root}/table3-mini/base", f"{root}/table3-mini/A1"]
    assert rows[0]["measured"]["steps"] == 20 and rows[1]["measured"] == {"status": "not run"}
    assert os.listdir(cwd) == []


def test_a_missing_prefix_is_refused_as_a_missing_directory_is(bucket, tmp_path, capsys):
    foreign = [str(tmp_path / "other"), bucket + "/other"]
    for where in foreign:
        storage.write_text(storage.join(where, "notes.txt"), "not a run")
    for where in (str(tmp_path / "missing"), bucket + "/missing"):
        for command in ("translate", "evaluate", "card"):
            assert main([command, "--workdir", where]) == 2
            assert capsys.readouterr().err == f"error: --workdir {where} does not exist\n"
    for where in foreign:
        assert main(["evaluate", "--workdir", where]) == 2
        assert capsys.readouterr().err == (
            f"error: {where} is not a tx run (it has no config.json): train into it with "
            "`python -m tx train --config FILE --workdir DIR`, or pass --config FILE\n"
        )
