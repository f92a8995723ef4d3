"""A run written before the package moved into wings (commit 41d4361, the flat tx/) keeps
loading: tests/golden/run_before_wings is the tiny config trained 4 steps there, averaged,
and translated (--nbest 2) by that commit's code; translations_41d4361.nbest is its output."""

import os
import shutil

import pytest
from test_cli import tx_in_process

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "run_before_wings")


@pytest.fixture
def old_run(tmp_path):
    path = tmp_path / "run"
    shutil.copytree(GOLDEN, path)
    return str(path)


@pytest.fixture
def tx_cli(capfd, monkeypatch):
    """tx_cli(*args) -> (exit status, stdout, stderr) of `python -m tx ARGS`, run in this
    process (test_cli.tx_in_process): what is old is the run, not the process reading it."""
    return lambda *args: tx_in_process(capfd, monkeypatch, *args)


def _nbest(path):
    with open(path) as f:
        return [line.rstrip("\n").split("\t") for line in f]


def test_an_old_run_translates_as_it_did(tx_cli, old_run, tmp_path):
    out = tmp_path / "nbest.txt"
    src = os.path.join(old_run, "sentences.txt")
    status, _, err = tx_cli(
        "translate", "--workdir", old_run, "--input", src, "--output", str(out), "--nbest", "2"
    )
    assert status == 0, err[-3000:]
    want = _nbest(os.path.join(GOLDEN, "translations_41d4361.nbest"))
    got = _nbest(out)
    assert [(i, h) for i, _, h in got] == [(i, h) for i, _, h in want]
    # Scores: sums of ~60 float32 log-probabilities (|each| < 1): rounding differences between
    # machines stay below 60 * 2**-23 * 60 ~ 4e-4; other parameters would move them by >> 1e-3.
    for (_, s, _), (_, t, _) in zip(got, want, strict=True):
        assert float(s) == pytest.approx(float(t), abs=1e-3)


def test_an_old_run_resumes_training(tx_cli, old_run):
    config = os.path.join(old_run, "config.json")
    status, _, err = tx_cli(
        "train", "--workdir", old_run, "--config", config, "--config.train.num_steps=6"
    )
    assert status == 0, err[-3000:]
    assert os.path.isdir(os.path.join(old_run, "checkpoints", "6"))
    (cache,) = [d for d in os.listdir(os.path.join(old_run, "data")) if not d.startswith(".")]
    assert os.path.exists(os.path.join(old_run, "data", cache, "manifest.json"))  # adopted
