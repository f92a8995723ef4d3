"""Which parameters of a run (tx.workdir.Selection): every spelling parsed, bad ones refused in
one line naming them, resolved against what the run has; and each reader taking the one value:
tx.load, load_model, train.init_from and the commands translate, evaluate, export, attention."""

import json
import shutil

import pytest

import tx
from tx import storage
from tx import workdir as wd
from tx.__main__ import main
from tx.config import ConfigError, load_config
from tx.train import init_from

C, A = wd.CHECKPOINT, wd.AVERAGE


@pytest.fixture
def fake_run(tmp_path):
    """A directory that is a run to the parser (it has a config.json)."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    return str(tmp_path / "run")


def test_every_spelling(fake_run):
    r = fake_run
    cases = {
        (r, None): (None, None),
        (r + "/", None): (None, None),
        (f"{r}/checkpoints/15", None): (C, 15),
        (f"{r}/checkpoints/15/", None): (C, 15),
        (f"{r}/averaged/20", None): (A, 20),
        (f"{r}/averaged/20.1", None): (A, 20),  # its other name on a bucket
        (r, 15): (C, 15),
        (r, "15"): (C, 15),
        (r, "checkpoints/15"): (C, 15),
        (r, "best"): (C, "best"),
        (r, "averaged/20"): (A, 20),
        (r, "averaged/20.1"): (A, 20),
    }
    for (text, checkpoint), (kind, step) in cases.items():
        assert wd.Selection.parse(text, checkpoint) == wd.Selection(r, kind, step), text


def test_a_bucket_run_parses_as_a_local_one(bucket):
    storage.write_text(storage.join(bucket, "run", "config.json"), "{}")
    run = f"{bucket}/run"
    assert wd.Selection.parse(f"{run}/averaged/20.1") == wd.Selection(run, A, 20)
    assert wd.Selection.parse(run, "best") == wd.Selection(run, C, "best")
    with pytest.raises(wd.NotARun, match="is neither a tx run"):
        wd.Selection.parse(f"{bucket}/none")


def _one_line(error: pytest.ExceptionInfo, text: str) -> str:
    message = str(error.value)
    assert "\n" not in message and text in message, message
    return message


def test_bad_spellings_are_refused_naming_them(fake_run, tmp_path):
    for bad in ("x", "-3", "1.5", "averaged", "averaged/", "checkpoints/15.1", "best/1", "-"):
        with pytest.raises(ConfigError) as e:
            wd.Selection.parse(fake_run, bad)
        assert _one_line(e, repr(bad)).endswith("is not a step number, 'best' or averaged/STEP")
    with pytest.raises(ConfigError) as e:
        wd.Selection.parse(f"{fake_run}/checkpoints/15", 20)
    assert _one_line(e, f"{fake_run}/checkpoints/15").endswith("no checkpoint= to choose")
    for text in (f"{fake_run}/checkpoints/abc", f"{fake_run}/checkpoints/15.1", str(tmp_path)):
        with pytest.raises(wd.NotARun) as e:
            wd.Selection.parse(text)
        assert "is neither a tx run (it has no config.json)" in _one_line(e, text)
    # An export or a Hugging Face directory is no run, and is named so.
    (tmp_path / "hf").mkdir()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "hf" / name).write_text("{}")
    with pytest.raises(wd.NotARun) as e:
        wd.Selection.parse(str(tmp_path / "hf"))
    assert _one_line(e, "hf") == (
        f"{tmp_path}/hf is a Hugging Face model, not a tx run: `python -m tx import "
        f"--from-huggingface {tmp_path}/hf --workdir W` makes it one"
    )
    (tmp_path / "hf" / "tx_export.json").write_text("{}")
    with pytest.raises(wd.NotARun, match="hf is an export .*, not a tx run"):
        wd.Selection.parse(str(tmp_path / "hf"))


def test_resolve_takes_what_the_run_has(fake_run):
    def never():
        raise AssertionError("listed without need")

    sel = wd.Selection(fake_run)
    assert sel.resolve(lambda: [15, 20], never) == wd.Selection(fake_run, A, 20)
    assert sel.resolve(lambda: [], lambda: [5, 10]) == wd.Selection(fake_run, C, 10)
    assert wd.Selection(fake_run, C).resolve(never, lambda: [5, 10]).step == 10
    assert wd.Selection(fake_run, A, 15).resolve(lambda: [15, 20], never).step == 15
    for selection, message in (
        (sel, f"{fake_run} has no averages or checkpoints"),
        (wd.Selection(fake_run, C), f"no checkpoint in {fake_run}/checkpoints (available: [])"),
        (
            wd.Selection(fake_run, C, 7),
            f"no checkpoint at step 7 in {fake_run}/checkpoints (available: [])",
        ),
        (
            wd.Selection(fake_run, A, 7),
            f"no averaged checkpoint 7 in {fake_run}/averaged (available: [])",
        ),
    ):
        with pytest.raises(wd.CheckpointNotFound) as e:
            selection.resolve(list, list)
        assert str(e.value) == message


@pytest.fixture(scope="module")
def run(trained, tmp_path_factory):
    """A copy of the session's run (checkpoints 5 to 20) with checkpoints 15 and 20 averaged."""
    from tx.train.averaging import average

    path = str(tmp_path_factory.mktemp("selection") / "run")
    skip = shutil.ignore_patterns("averaged", "data", "plots", "*.hyp.*", "lock.json")
    shutil.copytree(trained, path, ignore=skip)
    average(load_config(wd.config_file(path)), path, last=2)
    return path


AVERAGED = "averaged/20 (steps [15, 20])"


def test_load_and_init_from_take_the_one_value(run, tmp_path):
    assert tx.load(run).source == AVERAGED == tx.load(run, "averaged/20").source
    assert tx.load(f"{run}/averaged/20.1").source == AVERAGED
    assert tx.load(run, "checkpoints/15").source == "checkpoints/15"
    found = init_from.find(f"{run}/averaged/20.1")
    assert (found.run, found.kind, found.step) == (run, A, 20)
    (tmp_path / "hf").mkdir()
    for name in ("config.json", "pytorch_model.bin"):
        (tmp_path / "hf" / name).write_text("{}")
    hf = str(tmp_path / "hf")
    with pytest.raises(wd.NotARun, match=f"^{hf} is a Hugging Face model, not a tx run"):
        tx.load(hf)
    with pytest.raises(ConfigError, match=f"^train.init_from={hf} is a Hugging Face model"):
        init_from.find(hf)


def test_each_command_takes_the_selector(run, tmp_path, capsys):
    source = tmp_path / "src.en"
    source.write_text("The dog sees a cat.\nWe count three small birds.\n")
    reference = tmp_path / "ref.de"
    reference.write_text("Der Hund sieht eine Katze.\nWir zählen drei kleine Vögel.\n")
    for which, expected in (("averaged/20", AVERAGED), ("15", "checkpoints/15")):
        args = ["--workdir", run, "--checkpoint", which]
        assert main(["translate", *args, "--input", str(source), "--nbest", "2"]) == 0
        nbest = tx.load(run, which).translate(source.read_text().splitlines(), nbest=2)
        assert capsys.readouterr().out.splitlines() == [
            f"{i}\t{score:.6f}\t{text}" for i, hyps in enumerate(nbest) for text, score in hyps
        ]
        files = ["--src", str(source), "--ref", str(reference), "--output", str(tmp_path / "o")]
        assert main(["evaluate", *args, *files, "--json"]) == 0
        assert json.loads(capsys.readouterr().out.splitlines()[-1])["checkpoint"] == expected
        out = str(tmp_path / f"export-{which.replace('/', '-')}")
        assert main(["export", *args, "--format", "huggingface", "--out", out]) == 0
        assert json.loads(capsys.readouterr().out.splitlines()[-1])["checkpoint"] == expected
        pictures = str(tmp_path / "attention")
        assert main(["attention", *args, "--text", "The dog.", "--out", pictures]) == 0
        assert capsys.readouterr().out.startswith(f"wrote {pictures}/")
    for command in ("translate", "evaluate", "export", "attention", "serve"):
        assert main([command, "--workdir", run, "--checkpoint", "latest"]) == 2
        assert capsys.readouterr().err == (
            f"error: python -m tx {command}: argument --checkpoint: 'latest' is not a step "
            "number, 'best' or averaged/STEP (--help lists the options)\n"
        )
