"""A run in a bucket of a loaded service: each test server (tests/object_store.py) behind a
proxy that refuses one request in seven (tests/flaky_proxy.py: S3's 503 SlowDown; GCS's 503 and
429 with Retry-After). Every layer that reaches a bucket retries them with backoff (gcsfs and
s3fs for tx.storage and Orbax's files, TensorStore for the arrays; tx.storage.configure): the
run trains, resumes, averages and evaluates, to the same parameters as on a local disk."""

import contextlib
import json
import logging

import fsspec
import jax
import numpy as np
import pytest
from flaky_proxy import flaky
from object_store import OFFLINE, fresh_prefix

from tx import storage
from tx.cli.main import main
from tx.train.checkpoint import Checkpointer

SETTINGS = ("train.num_steps=4", "train.checkpoint_every_steps=2", "train.log_every_steps=2")
ENDPOINT = {"gs": "STORAGE_EMULATOR_HOST", "s3": "AWS_ENDPOINT_URL"}
# The variables pointed at the proxy: TensorStore's gcs driver reads its own, which configure()
# sets only where unset; set here, it is undone with the others when the test ends.
POINTED = {"gs": [ENDPOINT["gs"], "TENSORSTORE_GCS_HTTP_URL"], "s3": [ENDPOINT["s3"]]}


@pytest.fixture(scope="session")
def proxies():
    """A proxy per scheme, started on first use and kept until the session ends: a file system
    a library made while a test pointed at one (etils.epath keeps one per protocol for the
    process, and Orbax reads through it) still points there after the test, so the proxy keeps
    forwarding, without refusals, for the later tests of this process."""
    with contextlib.ExitStack() as stack:
        yield lambda upstream, scheme: stack.enter_context(flaky(upstream, scheme))


@pytest.fixture
def behind_a_flaky_proxy(request, monkeypatch, proxies):
    """(scheme, a fresh prefix in its bucket, the proxy) with this process pointed at the
    proxy, refusing one request in seven until the test ends; file systems made for the server
    itself are not reused, nor those made here after."""
    scheme = request.param
    env = request.getfixturevalue("gcs_env" if scheme == "gs" else "s3_env")
    proxy = proxies(env[ENDPOINT[scheme]], scheme)
    for key, value in {**OFFLINE, **env, **dict.fromkeys(POINTED[scheme], proxy.url)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(storage, "_configured", False)
    storage.configure()
    _forget_file_systems()
    try:
        yield scheme, fresh_prefix(scheme), proxy
    finally:
        proxy.refusing = False
        _forget_file_systems()


def _forget_file_systems() -> None:
    """fsspec keeps a file system per protocol and options, not per endpoint."""
    for protocol in ENDPOINT:
        fsspec.get_filesystem_class(protocol).clear_instance_cache()


def _state(workdir: str, abstract):
    ckpt = Checkpointer(workdir, keep=None)
    try:
        return ckpt.restore(4, abstract)
    finally:
        ckpt.close()


# Minutes a scheme on two cores (the refusals waited out, a local run to compare): -m slow.
@pytest.mark.slow
@pytest.mark.parametrize("behind_a_flaky_proxy", ["gs", "s3"], indirect=True)
def test_a_run_trains_resumes_averages_and_evaluates_through_refusals(
    behind_a_flaky_proxy, tiny, vocab, tmp_path, caplog, capsys
):
    from tx.train.averaging import average
    from tx.train.loop import train
    from tx.train.trainer import abstract_train_state, build

    scheme, run, proxy = behind_a_flaky_proxy
    cfg = tiny(f"data.vocab_path={vocab}", *SETTINGS)
    with caplog.at_level(logging.INFO):
        # 0.0001 minutes run out before the first step ends: it stops there, with a checkpoint.
        stopped = tiny(f"data.vocab_path={vocab}", *SETTINGS, "train.max_minutes=0.0001")
        assert train(stopped, run)["step"] == 1
        assert train(cfg, run)["step"] == 4
    assert f"resuming from {run}/checkpoints step 1" in caplog.text
    local = str(tmp_path / "local")
    train(cfg, local)
    abstract = abstract_train_state(build(cfg))
    (got, got_position), (want, want_position) = _state(run, abstract), _state(local, abstract)
    assert got_position == want_position
    for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bit for bit
    assert average(cfg, run, last=2)[1] == [2, 4]
    capsys.readouterr()
    args = ["evaluate", "--workdir", run, "--json", "--config.data.demo_eval_size=20"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["num_sentences"] == 20
    assert proxy.refused > 10, proxy.refused  # (a few hundred requests in all)
