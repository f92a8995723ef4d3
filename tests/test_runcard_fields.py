"""What a run card must hold to re-derive a result: code, packages, hardware, data, time."""

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys

from tx.data import sources
from tx.train import runcard


def test_a_card_has_every_field(trained):
    card = runcard.load(trained)
    (seg,) = card["segments"]
    packages = seg["packages"]
    assert packages["tensorflow_distribution"] in runcard.TENSORFLOW
    assert packages["tensorflow"] == importlib.metadata.version(packages["tensorflow_distribution"])
    for name in ("jaxlib", "libtpu", "jax-cuda12-plugin", "nvidia-cudnn-cu12"):
        assert name in packages  # the accelerator stack: None where not installed
    hw = seg["hardware"]
    assert hw["cpu"] and hw["cpu_count"] == os.cpu_count() and hw["platform_version"]
    assert seg["prepare_secs"] >= 0 and card["totals"]["prepare_secs"] == seg["prepare_secs"]
    data = card["data"]
    with open(os.path.join(trained, "spm.model"), "rb") as f:
        assert data["vocabulary_sha256"] == hashlib.sha256(f.read()).hexdigest()
    train = data["splits"]["train"]
    assert data["source"] == "demo" and train["generator"].startswith("demo-v")
    assert train["pairs_read"] == train["total"]
    assert train["kept"] + train["dropped_empty"] + train["dropped_too_long"] == train["total"]
    with open(os.path.join(trained, "run_card.md")) as f:
        text = f.read()
    assert "preparing data" in text and "vocabulary sha256" in text and hw["cpu"] in text


def test_text_files_are_recorded_with_their_sha256(tmp_path):
    for lang, text in (("en", "a b\nc\n"), ("fr", "x y\nz\n")):
        (tmp_path / f"train.{lang}").write_text(text)
    split = sources.text_split(str(tmp_path / "train"), "en", "fr")
    files = split.provenance["files_sha256"]
    for lang in ("en", "fr"):
        path = str(tmp_path / f"train.{lang}")
        assert files[path] == hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_an_untracked_file_makes_the_tree_dirty(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    clean = runcard.git_state(str(tmp_path))
    assert len(clean["commit"]) == 40 and clean["dirty"] is False
    (tmp_path / "new_module.py").write_text("y = 2\n")
    assert runcard.git_state(str(tmp_path))["dirty"] is True


def test_card_prints_the_card_for_a_person(trained, tmp_path):
    def card(*args):
        return subprocess.run(
            [sys.executable, "-m", "tx", "card", *args], capture_output=True, text=True, timeout=120
        )

    res = card("--workdir", trained)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("# Run card") and "preparing data" in res.stdout
    as_json = json.loads(card("--workdir", trained, "--json").stdout)
    assert as_json["data"]["source"] == "demo" and as_json["totals"]["steps"] == 20
    missing = card("--workdir", str(tmp_path))
    assert missing.returncode == 2 and "not a tx run" in missing.stderr
