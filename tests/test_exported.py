"""Programs kept traced across commands (tx.infer.exported): one entry per program and shape,
the same results read back, exported or jitted, and a damaged entry exported again."""

import hashlib
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.infer import exported


def scaled_cumsum(x, y, *, k: int):
    return jnp.cumsum(x * k) + y.sum()


@pytest.fixture
def place(tmp_path, monkeypatch):
    """The entries' directory under a compilation cache of this test's own, and no program of
    another test's in memory."""
    monkeypatch.setattr(exported, "_cache_dir", lambda: str(tmp_path))
    monkeypatch.setattr(exported, "_programs", {})
    return tmp_path / exported.DIRECTORY


def warned(caplog) -> list[str]:
    """tx.infer.exported's warnings (not another library's)."""
    return [r.getMessage() for r in caplog.records if r.pathname.endswith("exported.py")]


def run(k: int, n: int):
    args = (np.arange(n, dtype=np.float32), np.ones(3, np.float32))
    return np.asarray(exported.search(scaled_cumsum, {"k": k}, args)(*args))


def test_an_entry_per_program_and_shape_read_back_the_same(place, monkeypatch, caplog):
    ones = np.ones(3, np.float32)
    want = {(k, n): np.asarray(scaled_cumsum(np.arange(n, dtype=np.float32), ones, k=k))
            for k in (2, 3) for n in (4, 5)}  # fmt: skip
    for (k, n), w in want.items():
        assert np.array_equal(run(k, n), w)
    entries = sorted(place.iterdir())
    assert len(entries) == 4 and all(p.name.startswith("scaled_cumsum-") for p in entries)
    monkeypatch.setattr(exported, "_programs", {})  # another process: read, not exported
    monkeypatch.setattr(exported.export, "export", None)  # exporting would warn
    with caplog.at_level(logging.WARNING):
        for (k, n), w in want.items():
            assert np.array_equal(run(k, n), w)
    assert not warned(caplog)


def test_jax_settings_that_change_a_trace_are_in_the_key(place):
    want = run(2, 4)
    jax.config.update("jax_default_matmul_precision", "highest")
    try:
        assert np.array_equal(run(2, 4), want)
    finally:
        jax.config.update("jax_default_matmul_precision", None)
    assert len(list(place.iterdir())) == 2


def test_a_damaged_entry_is_a_warning_and_exported_again(place, caplog, monkeypatch):
    want = run(2, 4)
    (entry,) = place.iterdir()
    whole = entry.read_bytes()
    payload = b"not a program"  # whole, with its checksum: jax.export cannot parse it
    garbage = exported.MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
    for damaged in (whole[: len(whole) // 2], whole[:-1] + b"x", b"", garbage):
        entry.write_bytes(damaged)
        monkeypatch.setattr(exported, "_programs", {})
        with caplog.at_level(logging.WARNING):
            assert np.array_equal(run(2, 4), want)
        assert f"exported program {entry} cannot be read" in caplog.text
        caplog.clear()
        with monkeypatch.context() as m:  # replaced whole: the next process reads it
            m.setattr(exported, "_programs", {})
            m.setattr(exported.export, "export", None)
            assert np.array_equal(run(2, 4), want) and not warned(caplog)


def test_what_cannot_be_exported_is_jitted_with_a_warning(place, caplog):
    def with_callback(x, *, k: int):  # a host callback: jax.export refuses it
        return jax.pure_callback(lambda v: v * k, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    x = np.arange(3, dtype=np.float32)
    with caplog.at_level(logging.WARNING):
        assert np.array_equal(exported.search(with_callback, {"k": 2}, (x,))(x), x * 2)
    assert "with_callback cannot be exported" in caplog.text and not place.exists()


def test_without_a_compilation_cache_or_on_several_devices_the_program_is_jitted(
    place, monkeypatch, caplog
):
    monkeypatch.setattr(exported.export, "export", None)  # exporting would warn
    want = scaled_cumsum(np.arange(4, dtype=np.float32), np.ones(3, np.float32), k=2)
    with caplog.at_level(logging.WARNING):
        with monkeypatch.context() as m:
            m.setattr(exported, "_cache_dir", lambda: None)
            assert np.array_equal(run(2, 4), want)
        with monkeypatch.context() as m:
            m.setattr(exported.jax, "device_count", lambda: 8)
            assert np.array_equal(run(2, 4), want)
    assert exported._programs == {} and not place.exists() and not warned(caplog)
