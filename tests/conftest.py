"""Shared fixtures. Tests run on the CPU with a single device unless a test spawns its own
process with more (see tests/multidevice_worker.py)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib

import pytest

from tx.config import load_config

ROOT = pathlib.Path(__file__).resolve().parents[1]


class Tiny:
    """configs/tiny.py: `tiny("train.num_steps=5", ...)` loads it with overrides; `tiny.path`
    is the file (for command lines)."""

    path = str(ROOT / "configs" / "tiny.py")

    def __call__(self, *overrides: str):
        return load_config(self.path, list(overrides))


@pytest.fixture(scope="session")
def root():
    return ROOT


@pytest.fixture(scope="session")
def tiny():
    return Tiny()


@pytest.fixture(scope="session")
def trained(tmp_path_factory, tiny):
    """A tiny workdir trained for 20 steps, a checkpoint every 5 (shared: tests that change
    it only add averaged checkpoints, hypotheses files or plots/)."""
    from tx.loop import train

    path = str(tmp_path_factory.mktemp("trained"))
    train(tiny("train.num_steps=20", "train.checkpoint_every_steps=5"), path)
    return path


@pytest.fixture(scope="session")
def vocab(tmp_path_factory, tiny):
    """The tiny config's vocabulary, trained once: runs given it (`data.vocab_path`) skip
    training one and are comparable bit for bit."""
    from tx.data import dataset

    workdir = str(tmp_path_factory.mktemp("vocab"))
    dataset.vocabulary(tiny().data, workdir)
    return os.path.join(workdir, "spm.model")
