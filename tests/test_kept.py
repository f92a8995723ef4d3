"""What is kept traced across commands (tx.train.kept): one entry per program and shape, the
same results read back, exported or jitted, donated or not, a damaged entry made again; the
parameters' abstract tree read back equal to the traced one."""

import functools
import hashlib
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.config import load_config, model_config
from tx.model import counting
from tx.train import kept


def scaled_cumsum(x, y, *, k: int):
    return jnp.cumsum(x * k) + y.sum()


@pytest.fixture
def place(tmp_path, monkeypatch):
    """The entries' directory under a compilation cache of this test's own, and no program of
    another test's in memory."""
    monkeypatch.setattr(kept, "_cache_dir", lambda: str(tmp_path))
    monkeypatch.setattr(kept, "_programs", {})
    monkeypatch.setenv(kept.ENV, "on")  # the suite's own default is off (tests/conftest.py)
    return tmp_path / kept.DIRECTORY


def warned(caplog) -> list[str]:
    """tx's warnings about kept entries (not another library's)."""
    return [r.getMessage() for r in caplog.records if r.pathname.endswith("kept.py")]


@functools.cache
def jitted(k: int):
    return jax.jit(functools.partial(scaled_cumsum, k=k))


def run(k: int, n: int):
    args = (np.arange(n, dtype=np.float32), np.ones(3, np.float32))
    return np.asarray(kept.program("scaled_cumsum", jitted(k), {"k": k}, args)(*args))


def test_an_entry_per_program_and_shape_read_back_the_same(place, monkeypatch, caplog):
    ones = np.ones(3, np.float32)
    want = {(k, n): np.asarray(scaled_cumsum(np.arange(n, dtype=np.float32), ones, k=k))
            for k in (2, 3) for n in (4, 5)}  # fmt: skip
    for (k, n), w in want.items():
        assert np.array_equal(run(k, n), w)
    entries = sorted(place.iterdir())
    assert len(entries) == 4 and all(p.name.startswith("scaled_cumsum-") for p in entries)
    monkeypatch.setattr(kept, "_programs", {})  # another process: read, not exported
    monkeypatch.setattr(kept.export, "export", None)  # exporting would warn
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
    garbage = kept.MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
    for damaged in (whole[: len(whole) // 2], whole[:-1] + b"x", b"", garbage):
        entry.write_bytes(damaged)
        monkeypatch.setattr(kept, "_programs", {})
        with caplog.at_level(logging.WARNING):
            assert np.array_equal(run(2, 4), want)
        assert f"kept entry {entry} cannot be read" in caplog.text
        caplog.clear()
        with monkeypatch.context() as m:  # replaced whole: the next process reads it
            m.setattr(kept, "_programs", {})
            m.setattr(kept.export, "export", None)
            assert np.array_equal(run(2, 4), want) and not warned(caplog)


def test_what_cannot_be_exported_is_jitted_with_a_warning(place, caplog):
    def with_callback(x, *, k: int):  # a host callback: jax.export refuses it
        return jax.pure_callback(lambda v: v * k, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    x = np.arange(3, dtype=np.float32)
    program = jax.jit(functools.partial(with_callback, k=2))
    with caplog.at_level(logging.WARNING):
        assert np.array_equal(kept.program("with_callback", program, {"k": 2}, (x,))(x), x * 2)
    assert "with_callback cannot be exported" in caplog.text and not place.exists()


def test_without_a_compilation_cache_on_several_devices_or_turned_off_the_program_is_jitted(
    place, monkeypatch, caplog
):
    monkeypatch.setattr(kept.export, "export", None)  # exporting would warn
    want = scaled_cumsum(np.arange(4, dtype=np.float32), np.ones(3, np.float32), k=2)
    with caplog.at_level(logging.WARNING):
        with monkeypatch.context() as m:
            m.setattr(kept, "_cache_dir", lambda: None)
            assert np.array_equal(run(2, 4), want)
        with monkeypatch.context() as m:
            m.setattr(kept.jax, "device_count", lambda: 8)
            assert np.array_equal(run(2, 4), want)
        for off in ("off", "0", " False "):
            with monkeypatch.context() as m:
                m.setenv(kept.ENV, off)
                assert np.array_equal(run(2, 4), want)
    assert kept._programs == {} and not place.exists() and not warned(caplog)


@pytest.mark.parametrize("config", ["tiny.py", "rnn_attention.py"])
def test_the_abstract_parameters_read_back_equal_to_the_traced(place, monkeypatch, caplog, config):
    mc = model_config(load_config(f"configs/{config}"))
    traced = counting.abstract_params(mc)
    assert kept.abstract_params(mc) == traced  # traced, and kept
    (entry,) = place.iterdir()
    assert entry.name.startswith("abstract_params-")
    monkeypatch.setattr(counting, "abstract_params", None)  # tracing would fail
    with caplog.at_level(logging.WARNING):
        assert kept.abstract_params(mc) == traced  # boxes, names, shapes and dtypes
    assert not warned(caplog)


def test_a_damaged_abstract_tree_is_a_warning_and_traced_again(place, caplog):
    mc = model_config(load_config("configs/tiny.py"))
    traced = kept.abstract_params(mc)
    (entry,) = place.iterdir()
    whole = entry.read_bytes()

    def checked(payload: bytes) -> bytes:  # whole, with its checksum
        return kept.MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload

    for damaged in (whole[:-3], kept.MAGIC + b"0" * 64 + b"\n[]", checked(b"[]"), checked(b"{")):
        entry.write_bytes(damaged)
        with caplog.at_level(logging.WARNING):
            assert kept.abstract_params(mc) == traced
        assert f"kept entry {entry} cannot be read" in caplog.text
        caplog.clear()
        assert entry.read_bytes() == whole  # replaced whole


def test_a_donated_argument_is_donated_cold_and_warm(place, monkeypatch):
    """The train step donates its state (tx.train.trainer.kept_train_step): the exported
    program called with donate_argnums takes the buffers over, as the jitted one does."""
    add = jax.jit(lambda x, y: (x + y, y.sum()), donate_argnums=(0,))
    for _ in ("cold", "warm"):
        monkeypatch.setattr(kept, "_programs", {})
        x, y = jnp.arange(4.0), jnp.ones(4)
        total, ones = kept.program("add", add, {}, (x, y), (0,))(x, y)
        assert x.is_deleted() and not y.is_deleted()
        assert np.array_equal(total, np.arange(4.0) + 1) and float(ones) == 4.0
    assert len(list(place.iterdir())) == 1


def test_only_a_trainer_with_the_configured_optimizer_keeps_its_step(place, tiny):
    """The kept step is keyed by the config: a trainer built with another optimizer (as the
    mesh tests build one with SGD) must not share, or leave, an entry."""
    import optax

    from tx.train.trainer import build, kept_train_step

    cfg = tiny()
    assert not hasattr(kept_train_step(build(cfg), cfg), "lower")  # kept: a wrapper
    other = kept_train_step(build(cfg, optimizer=optax.sgd(0.1)), cfg)
    assert hasattr(other, "lower")  # jax.jit's own: nothing kept
