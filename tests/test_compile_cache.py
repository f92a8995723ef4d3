"""Compiled programs kept across commands (tx.cli.compile_cache, and the programs kept traced:
tx.train.kept): where the cache is, that a command translates the same cold, warm, with the
cache off (the search jitted, not exported), and over damaged entries, and that training is
bitwise the same cold, warm and off, resumed or not."""

import logging
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np

from tx import storage
from tx.cli.compile_cache import directory
from tx.train import kept
from tx.train.checkpoint import Checkpointer
from tx.train.loop import train
from tx.train.trainer import abstract_train_state, build

SENTENCES = "The dog sees a cat.\nWe count three small birds.\n"


def test_where_the_cache_is():
    assert (
        directory({"JAX_COMPILATION_CACHE_DIR": "/yours", "TX_COMPILATION_CACHE": "/b"}) == "/yours"
    )
    assert directory({"TX_COMPILATION_CACHE": "gs://b/jax"}) == "gs://b/jax"
    for off in ("off", "0", "False", "none"):
        assert directory({"TX_COMPILATION_CACHE": off}) is None
    assert directory({}) == storage.cache_dir("jax")
    assert directory({"TX_COMPILATION_CACHE": " "}) == storage.cache_dir("jax")


def _translate(root, workdir, **env) -> str:
    """`python -m tx translate` of SENTENCES in a process of its own, without the suite's
    JAX_COMPILATION_CACHE_DIR and with `env` added; its output."""
    environ = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    environ.update(JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", TX_KEPT_PROGRAMS="on", **env)
    done = subprocess.run(
        [sys.executable, "-m", "tx", "translate", "--workdir", workdir],
        input=SENTENCES, capture_output=True, text=True, cwd=root, env=environ, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _entries(cache: pathlib.Path) -> dict[str, tuple[int, int]]:
    """Each file under `cache`: (size, modification time): a file written again is seen."""
    files = (p for p in cache.rglob("*") if p.is_file())
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in files}


def test_a_command_translates_the_same_cold_warm_off_and_over_damaged_entries(
    root, trained, tmp_path
):
    """Cold (the default place: TX_CACHE_DIR/jax), warm (nothing compiled anew, so nothing new
    kept), off (nothing kept, even where the default would be), and every entry cut short
    (a warning and a compile): the same translations each time."""
    cache = tmp_path / "tx" / "jax"
    cold = _translate(root, trained, TX_CACHE_DIR=str(tmp_path / "tx"))
    written = _entries(cache)
    assert written and len(cold.splitlines()) == 2  # the programs it compiled were kept
    # and what it traced: its search (exported) and the parameters' tree (tx.train.kept)
    searches = sorted((cache / "tx-exported").iterdir())
    assert [p.name.split("-")[0] for p in searches] == ["_search", "abstract_params"]
    assert _translate(root, trained, TX_COMPILATION_CACHE=str(cache)) == cold
    assert _entries(cache) == written
    off = tmp_path / "off"
    assert _translate(root, trained, TX_CACHE_DIR=str(off), TX_COMPILATION_CACHE="off") == cold
    assert not off.exists()
    for path in written:
        pathlib.Path(path).write_bytes(pathlib.Path(path).read_bytes()[:7])
    assert _translate(root, trained, TX_COMPILATION_CACHE=str(cache)) == cold
    for entry in searches:  # made again, whole
        assert entry.stat().st_size == written[str(entry)][0]


def test_training_is_bitwise_the_same_off_cold_and_warm_resumed_or_not(
    vocab, tiny, tmp_path, monkeypatch, caplog
):
    """The tiny run trained two steps with nothing kept (off: the step jitted), resumed for a
    third with the step exported and kept (cold), and trained three steps in a process that
    has no program in memory (warm: read back, nothing exported, nothing written): the same
    parameters, bit for bit."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(kept.ENV, "on")  # the suite's own default is off (tests/conftest.py)

    def run(name: str, steps: int, where):
        monkeypatch.setattr(kept, "_cache_dir", lambda: where)
        monkeypatch.setattr(kept, "_programs", {})  # a new process: no program in memory
        cfg = tiny(f"data.vocab_path={vocab}", f"train.num_steps={steps}")
        train(cfg, str(tmp_path / name))
        state, _ = Checkpointer(str(tmp_path / name)).restore(
            steps, abstract_train_state(build(cfg))
        )
        return jax.tree_util.tree_leaves(jax.device_get(state))

    run("resumed", 2, None)
    assert not cache.exists()
    cold = run("resumed", 3, str(cache))
    entries = sorted(p.name.split("-")[0] for p in (cache / kept.DIRECTORY).iterdir())
    assert entries == ["abstract_params", "train_step"]
    written = _entries(cache)
    monkeypatch.setattr(kept.export, "export", None)  # exporting would warn
    with caplog.at_level(logging.WARNING):
        warm = run("warm", 3, str(cache))
    assert not [r for r in caplog.records if r.pathname.endswith("kept.py")]
    assert _entries(cache) == written
    assert all(np.array_equal(a, b) for a, b in zip(cold, warm, strict=True))
