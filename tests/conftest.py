"""Shared fixtures. Tests run on the CPU with a single device unless a test spawns its own
process with more (see tests/multidevice_worker.py)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def root():
    return ROOT


@pytest.fixture(scope="session")
def tiny_config_path():
    return str(ROOT / "configs" / "tiny.py")
