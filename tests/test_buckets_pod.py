"""A pod's run, end to end, with its workdir in a bucket (GCS; S3 under -m slow): prepared once,
trained by two processes (jax.distributed on this CPU), both killed with SIGKILL, resumed from
the bucket to the same parameters as a run that was never killed, guarded by the lock against a
second `train`, then averaged and evaluated from the bucket. Every file in the bucket; nothing
written locally but the cache."""

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import ROOT, Tiny, multiprocess_env
from object_store import point_at

from tx import storage
from tx import workdir as wd

STEPS = 6


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _train(workdir: str, vocab: str, logs: str, name: str) -> list[subprocess.Popen]:
    """Processes 0 and 1 of `train` on `workdir`; their output in logs/<name><i>."""
    port = _free_port()
    env = multiprocess_env({**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
    procs = []
    for i in range(2):
        cmd = [
            sys.executable, "-m", "tx", "train", "--config", Tiny.path, "--workdir", workdir,
            f"--config.data.vocab_path={vocab}", f"--config.train.num_steps={STEPS}",
            "--config.train.checkpoint_every_steps=1", "--config.train.log_every_steps=1",
            "--coordinator_address", f"localhost:{port}",
            "--num_processes", "2", "--process_id", str(i),
        ]  # fmt: skip
        log = open(os.path.join(logs, f"{name}{i}"), "w")
        procs.append(subprocess.Popen(cmd, cwd=logs, env=env, stdout=log, stderr=log))
    return procs


def _wait(procs, timeout: float = 300) -> None:
    for p in procs:
        assert p.wait(timeout=timeout) == 0


def _log(logs: str, name: str) -> str:
    with open(os.path.join(logs, name)) as f:
        return f.read()


def _until(condition, procs, logs, name, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, _log(logs, name)[-3000:]
        assert all(p.poll() is None for p in procs), _log(logs, name)[-3000:]
        time.sleep(0.2)


def _committed(workdir: str, step: int) -> bool:
    """Orbax on a bucket: a step is whole once its commit file is there."""
    return storage.exists(
        storage.join(wd.checkpoints_dir(workdir), str(step), "commit_success.txt")
    )


def _final_state(workdir: str):
    from tx.train.checkpoint import Checkpointer
    from tx.train.trainer import abstract_train_state, build

    abstract = abstract_train_state(build(Tiny()()))
    ckpt = Checkpointer(workdir, keep=None)
    try:
        return ckpt.restore(STEPS, abstract)
    finally:
        ckpt.close()


# 3-6 minutes: under -m slow. Each guarantee it joins runs by default on its own:
# test_buckets_train (resume in a bucket as uninterrupted, the lock), test_distributed (two
# processes on prepared data in a bucket), test_loop (SIGKILL and bitwise resume).
@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_a_pod_run_in_a_bucket_is_killed_resumed_guarded_averaged_and_evaluated(
    scheme, request, monkeypatch, tmp_path, vocab
):
    from tx.train.prepare import prepare

    run = point_at(request, monkeypatch, scheme)
    reference = run + "-uninterrupted"
    logs = str(tmp_path / "logs")
    os.makedirs(logs)
    for workdir in (run, reference):
        prepare(Tiny()(f"data.vocab_path={vocab}", f"train.num_steps={STEPS}"), workdir)
    _wait(_train(reference, vocab, logs, "reference"))

    killed = _train(run, vocab, logs, "killed")
    _until(lambda: _committed(run, 3), killed, logs, "killed0")
    for p in killed:
        p.send_signal(signal.SIGKILL)
        p.wait()
    resumed = _train(run, vocab, logs, "resumed")
    _until(lambda: "resuming from" in _log(logs, "resumed0"), resumed, logs, "resumed0")
    second = subprocess.run(
        [sys.executable, "-m", "tx", "train", "--workdir", run],
        cwd=logs, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert second.returncode == 2 and f"{run} is in use by pid" in second.stderr, second.stderr
    _wait(resumed)
    said = _log(logs, "resumed0")
    assert "taking over the lock" in said and "tokenizing" not in said  # the killed run's lock

    (got, got_position), (want, want_position) = _final_state(run), _final_state(reference)
    assert got_position == want_position
    for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bit for bit

    for command in (["average", "--workdir", run], ["evaluate", "--workdir", run, "--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "tx", *command, "--config.data.demo_eval_size=20"],
            cwd=logs, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    assert storage.exists(wd.hypotheses_file(run, "test", "de"))
    # Nothing but the logs where the commands ran (a path taken for a local one would show).
    names = {f"{n}{i}" for n in ("reference", "killed", "resumed") for i in (0, 1)}
    assert set(os.listdir(logs)) == names
    assert not any(os.path.exists(os.path.join(ROOT, f"{s}:")) for s in ("gs", "s3"))
