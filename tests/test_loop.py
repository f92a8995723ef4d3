"""The training loop: end to end, exact resume after SIGKILL, SIGTERM, NaN guard, refusals."""

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Tiny
from test_checkpoint import _files, damage

from tx.config import ConfigError
from tx.storage import WriteFailed
from tx.train.checkpoint import Checkpointer, UnreadableCheckpoint
from tx.train.events import read_scalars
from tx.train.loop import train
from tx.train.monitor import Diverged
from tx.train.trainer import abstract_train_state, build

# The steps a run goes on for after the checkpoint that triggers the last kill: the kill must come
# before the run ends, and a fast machine takes a step or two between seeing a checkpoint (polled
# every 0.05 s) and the kill (each step there waits for the previous step's save).
ROOM = 8
STEPS = 4 + ROOM  # the shared run's: those of the default SIGKILL test (one kill, at step 4)


@pytest.fixture(scope="module")
def shared_run(vocab, tmp_path_factory, tiny):
    """(workdir, final metrics) of a tiny run of STEPS steps: a checkpoint at 6 and at 12, a
    log line every 5 steps, the dev loss at the end. It is the end-to-end test's run, the
    uninterrupted reference of the default SIGKILL test (how often a run saves, logs or
    evaluates changes none of its numbers), and the existing run the refusals below copy."""
    path = tmp_path_factory.mktemp("shared_run")
    cfg = tiny(
        f"data.vocab_path={vocab}",
        f"train.num_steps={STEPS}",
        "train.checkpoint_every_steps=6",
        "train.log_every_steps=5",
        f"train.eval_every_steps={STEPS}",
    )
    return path, train(cfg, str(path))


def test_tiny_training_end_to_end(shared_run):
    path, last = shared_run
    # The loss of steps 1-5 as the run logged it: what a 5-step run would return, untrained again.
    steps, losses = read_scalars(str(path))["train/loss"]
    assert list(steps) == [5, 10, STEPS]
    assert last["step"] == STEPS and last["loss"] < losses[0] - 0.3
    assert np.isfinite(last["dev_perplexity"]) and last["dev_perplexity"] < 300
    assert Checkpointer(str(path)).all_steps() == [6, STEPS]
    assert os.path.exists(path / "config.json")
    assert os.listdir(path / "tensorboard")


def _copy(shared_run, tmp_path):
    """A copy of the shared run that a test may change."""
    return shutil.copytree(shared_run[0], tmp_path / "run")


def test_workdir_with_other_model_is_refused(vocab, shared_run, tmp_path, tiny):
    run = _copy(shared_run, tmp_path)
    with pytest.raises(ConfigError, match="model"):
        train(tiny(f"data.vocab_path={vocab}", "model.d_model=64"), str(run))


def test_nan_guard_stops_and_keeps_last_good_checkpoint(vocab, tmp_path, monkeypatch, tiny):
    import tx.train.trainer as trainer_lib

    real = trainer_lib.kept_train_step  # the loop's step: jitted, or kept traced

    def poisoned(trainer, cfg):
        step = real(trainer, cfg)

        def run(state, batch):
            if int(state.step) == 4:  # the 5th update sees NaN parameters
                state = state.replace(
                    params=jax.tree_util.tree_map(lambda x: x * jnp.nan, state.params)
                )
            return step(state, batch)

        return run

    monkeypatch.setattr(trainer_lib, "kept_train_step", poisoned)
    cfg = tiny(f"data.vocab_path={vocab}", "train.num_steps=10", "train.checkpoint_every_steps=2")
    with pytest.raises(Diverged, match="step 5"):
        train(cfg, str(tmp_path))
    ckpt = Checkpointer(str(tmp_path))
    assert ckpt.latest_step() == 4
    state, _ = ckpt.restore(4, abstract_train_state(build(cfg)))
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(state))


def _tx_train(workdir, *extra):
    """The command line of `python -m tx train` on the tiny config."""
    return [
        sys.executable,
        "-m",
        "tx",
        "train",
        "--config",
        Tiny.path,
        "--workdir",
        str(workdir),
        *extra,
    ]


def _overrides(vocab, steps, *extra):
    """The tiny config's overrides for the runs below: a checkpoint and a log line every step."""
    return [
        f"data.vocab_path={vocab}",
        f"train.num_steps={steps}",
        "train.checkpoint_every_steps=1",
        "train.log_every_steps=1",
        *extra,
    ]


def _train_cmd(workdir, vocab, steps, *extra):
    return _tx_train(workdir, *(f"--config.{o}" for o in _overrides(vocab, steps, *extra)))


def _final_params(workdir, cfg, step):
    ckpt = Checkpointer(str(workdir))
    state, position = ckpt.restore(step, abstract_train_state(build(cfg)))
    return jax.device_get(state), position


def _wait_for_checkpoint(workdir, proc, at_least, timeout=120):
    path = os.path.join(workdir, "checkpoints")
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        done = [int(d) for d in os.listdir(path) if d.isdigit()] if os.path.isdir(path) else []
        if done and max(done) >= at_least:
            return
        time.sleep(0.05)


def _killed_after(cmd, root, workdir, at_least):
    """The newest checkpoint of `cmd` (a training run) SIGKILLed once it has one >= `at_least`."""
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_checkpoint(str(workdir), proc, at_least)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # killed mid-run, not finished
    return Checkpointer(str(workdir)).latest_step()


# Two kills cost another process start and run: the default suite kills once, `-m slow` twice.
@pytest.mark.parametrize("kills", [(4,), pytest.param((3, 11), marks=pytest.mark.slow)])
def test_sigkill_and_resume_is_bitwise_identical(
    root, vocab, tmp_path, tiny, caplog, kills, shared_run
):
    """Killed (once, or twice at different points); after the last kill the newest checkpoint
    is damaged on disk, so the last run resumes from the one before it (set aside, never
    deleted), still bit for bit. The kills need processes of their own; the last resume runs
    here, and the uninterrupted reference is the shared run (the same model, data and steps)
    or, for other steps, a run here on the same config."""
    steps = kills[-1] + ROOM
    extra = ("train.keep_checkpoints=3",)  # pruning goes past the damaged checkpoint
    cfg = tiny(*_overrides(vocab, steps, *extra))
    ref_dir, run_dir = shared_run[0], tmp_path / "run"
    if steps != STEPS:
        ref_dir = tmp_path / "ref"
        train(cfg, str(ref_dir))
    cmd = _train_cmd(run_dir, vocab, steps, *extra)
    killed_at = [_killed_after(cmd, root, run_dir, kill_after) for kill_after in kills]
    damaged = os.path.join(run_dir, "checkpoints", str(killed_at[-1]))
    damage(damaged, "metadata overwritten")  # the case
    before = _files(damaged)
    with caplog.at_level("INFO"):
        assert train(cfg, str(run_dir))["step"] == steps
    assert f"{damaged} cannot be restored (state/_METADATA is not JSON)" in caplog.text
    assert f"resuming from {run_dir}/checkpoints step {killed_at[-1] - 1}" in caplog.text
    assert _files(damaged + ".damaged") == before  # kept as it was, past pruning (keep 3)
    assert killed_at == sorted(set(killed_at)) and killed_at[-1] < steps, killed_at
    ref, ref_pos = _final_params(ref_dir, cfg, steps)
    got, got_pos = _final_params(run_dir, cfg, steps)
    assert ref_pos == got_pos
    for a, b in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(got), strict=True):
        np.testing.assert_array_equal(a, b)  # bitwise: params, Adam moments, step, rng


def _sigterm_at(cmd, root, step):
    """(exit code, output) of `cmd` sent SIGTERM once it has logged `step`."""
    proc = subprocess.Popen(
        cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.time() + 120
    for line in proc.stdout:
        if line.startswith(f"step {step}/") or time.time() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(root, vocab, tmp_path):
    cmd = _train_cmd(
        tmp_path,
        vocab,
        100000,
        "train.checkpoint_every_steps=0",
        "train.checkpoint_every_secs=0",
    )
    code, out = _sigterm_at(cmd, root, 5)
    assert code == 0, out
    assert "SIGTERM received: saved step" in out
    step = Checkpointer(str(tmp_path)).latest_step()
    assert step is not None and step >= 5
    shutil.rmtree(tmp_path)


class _SigtermAt(io.StringIO):
    """Output that sends this process SIGTERM once the training loop has logged `step` (its
    handler, tx.train.distributed.StopSignal, is installed while the loop runs)."""

    def __init__(self, step: int):
        super().__init__()
        self.line, self.sent = f"step {step}/", False

    def write(self, text: str) -> int:
        if not self.sent and text.startswith(self.line):
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)
        return super().write(text)


def test_a_stopped_run_end_to_end_is_neither_averaged_nor_scored(vocab, tmp_path):
    # `demo` (as `reproduce --run`) trains, averages and scores: a SIGTERM while it trains
    # must end the command with one line, and never score the part trained so far. The
    # command runs in this process (the test above has a process of its own receive SIGTERM).
    from tx.cli.main import main

    out = _SigtermAt(3)
    args = ["demo", "--config", Tiny.path, "--workdir", str(tmp_path)]
    # 40 steps: were SIGTERM never sent, the command would end (and the test fail), not hang.
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main([*args, *(f"--config.{o}" for o in _overrides(vocab, 40))])
    out = out.getvalue()
    assert code == 2, out
    assert f"error: {tmp_path}: training stopped at step " in out
    assert "(SIGTERM received): nothing was averaged or scored" in out
    assert not os.path.exists(tmp_path / "averaged") and "BLEU" not in out


def test_resume_with_no_readable_checkpoint_names_each_and_changes_nothing(
    vocab, shared_run, tmp_path, tiny
):
    run = _copy(shared_run, tmp_path)
    for step in (6, 12):
        damage(str(run / "checkpoints" / str(step)), "every file emptied")
    with pytest.raises(UnreadableCheckpoint) as e:
        train(tiny(f"data.vocab_path={vocab}", "train.num_steps=14"), str(run))
    assert f"checkpoints/12 cannot be restored (state/_METADATA is not JSON); {run}" in str(e.value)
    assert "checkpoints/6 cannot be restored" in str(e.value)
    assert sorted(os.listdir(run / "checkpoints")) == ["12", "6"]


def test_workdir_refuses_another_vocabulary(shared_run, tmp_path, tiny):
    from tx.data.tokenizer import VocabularyError

    _copy(shared_run, tmp_path)
    # Same size, other data: a different vocabulary that would silently scramble the ids.
    other = tiny("data.demo_seed=7")
    from tx.data import vocabulary

    vocabulary.obtain(other.data, str(tmp_path / "other"))
    shutil.copy(tmp_path / "other" / "spm.model", tmp_path / "run" / "spm.model")
    with pytest.raises(VocabularyError, match="spm.model is damaged or replaced"):
        train(tiny("train.num_steps=4"), str(tmp_path / "run"))


def test_cli_bad_input_is_one_clear_line(tmp_path, capsys):
    from tx.cli.main import main  # the command line in this process: a Traceback would raise

    args = ["train", "--config", Tiny.path, "--workdir", str(tmp_path)]
    args += ["--config.data.source=text", f"--config.data.train_prefix={tmp_path}/missing"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "error: data file not found:" in err and "missing.en" in err
    assert "Traceback" not in err


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_max_minutes_or_a_checkpoint_that_cannot_be_written_stops_and_train_goes_on(
    vocab, tmp_path, tiny, monkeypatch, caplog
):
    """One workdir stopped twice: by train.max_minutes, then by a checkpoint that cannot be
    written; each time the next run resumes from the last checkpoint written."""
    from test_checkpoint import fail_writes_under

    base = (f"data.vocab_path={vocab}", "train.num_steps=6", "train.checkpoint_every_steps=3")
    cfg = tiny(*base)
    # 0.0001 minutes (6 ms) run out during data preparation: the first step is the last.
    assert train(tiny(*base, "train.max_minutes=0.0001"), str(tmp_path))["step"] == 1
    assert Checkpointer(str(tmp_path)).all_steps() == [1]
    fail_writes_under(monkeypatch, "/6.orbax-checkpoint-tmp")  # the disk fills at step 6
    with (
        caplog.at_level("INFO"),
        pytest.raises(WriteFailed, match=r"checkpoint .*checkpoints/6 was not written \(OSError"),
    ):
        train(cfg, str(tmp_path))
    assert f"resuming from {tmp_path}/checkpoints step 1" in caplog.text
    monkeypatch.undo()
    assert Checkpointer(str(tmp_path)).all_steps() == [3]  # 1 was not on the 3-step spacing
    caplog.clear()
    with caplog.at_level("INFO"):
        assert train(cfg, str(tmp_path))["step"] == 6
    assert f"resuming from {tmp_path}/checkpoints step 3" in caplog.text
    assert Checkpointer(str(tmp_path)).all_steps() == [3, 6]
