"""A run written before the package moved into wings (commit 41d4361, the flat tx/) keeps
loading: tests/golden/run_before_wings is the tiny config trained 4 steps there, averaged,
and translated (--nbest 2) by that commit's code; translations_41d4361.nbest is its output."""

import os
import shutil
import subprocess
import sys

import pytest

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "run_before_wings")


@pytest.fixture
def old_run(tmp_path):
    path = tmp_path / "run"
    shutil.copytree(GOLDEN, path)
    return str(path)


def _tx(*args):
    return subprocess.run(
        [sys.executable, "-m", "tx", *args], capture_output=True, text=True, timeout=600
    )


def _nbest(path):
    with open(path) as f:
        return [line.rstrip("\n").split("\t") for line in f]


def test_an_old_run_translates_as_it_did(old_run, tmp_path):
    out = tmp_path / "nbest.txt"
    src = os.path.join(old_run, "sentences.txt")
    res = _tx(
        "translate", "--workdir", old_run, "--input", src, "--output", str(out), "--nbest", "2"
    )
    assert res.returncode == 0, res.stderr
    want = _nbest(os.path.join(GOLDEN, "translations_41d4361.nbest"))
    got = _nbest(out)
    assert [(i, h) for i, _, h in got] == [(i, h) for i, _, h in want]
    # Scores: sums of ~60 float32 log-probabilities (|each| < 1): rounding differences between
    # machines stay below 60 * 2**-23 * 60 ~ 4e-4; other parameters would move them by >> 1e-3.
    for (_, s, _), (_, t, _) in zip(got, want, strict=True):
        assert float(s) == pytest.approx(float(t), abs=1e-3)


def test_an_old_run_resumes_training(old_run):
    res = _tx("train", "--workdir", old_run, "--config", os.path.join(old_run, "config.json"),
              "--config.train.num_steps=6")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert os.path.isdir(os.path.join(old_run, "checkpoints", "6"))
    (cache,) = [d for d in os.listdir(os.path.join(old_run, "data")) if not d.startswith(".")]
    assert os.path.exists(os.path.join(old_run, "data", cache, "manifest.json"))  # adopted
