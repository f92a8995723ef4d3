"""The training loop: end to end, exact resume after SIGKILL, SIGTERM, NaN guard, refusals."""

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
from tx.train.loop import train
from tx.train.monitor import Diverged
from tx.train.trainer import abstract_train_state, build


def test_tiny_training_end_to_end(vocab, tmp_path, tiny):
    cfg = tiny(
        f"data.vocab_path={vocab}",
        "train.num_steps=30",
        "train.log_every_steps=5",
        "train.eval_every_steps=30",
    )
    first = train(
        tiny(f"data.vocab_path={vocab}", "train.num_steps=5", "train.log_every_steps=5"),
        str(tmp_path / "a"),
    )
    last = train(cfg, str(tmp_path / "b"))
    assert last["step"] == 30 and last["loss"] < first["loss"] - 0.3
    assert np.isfinite(last["dev_perplexity"]) and last["dev_perplexity"] < 300
    assert Checkpointer(str(tmp_path / "b")).latest_step() == 30
    assert os.path.exists(tmp_path / "b" / "config.json")
    assert os.listdir(tmp_path / "b" / "tensorboard")


def test_workdir_with_other_model_is_refused(vocab, tmp_path, tiny):
    train(tiny(f"data.vocab_path={vocab}", "train.num_steps=2"), str(tmp_path))
    with pytest.raises(ConfigError, match="model"):
        train(tiny(f"data.vocab_path={vocab}", "model.d_model=64"), str(tmp_path))


def test_nan_guard_stops_and_keeps_last_good_checkpoint(vocab, tmp_path, monkeypatch, tiny):
    import tx.train.trainer as trainer_lib

    real = trainer_lib.jit_train_step

    def poisoned(trainer):
        step = real(trainer)

        def run(state, batch):
            if int(state.step) == 4:  # the 5th update sees NaN parameters
                state = state.replace(
                    params=jax.tree_util.tree_map(lambda x: x * jnp.nan, state.params)
                )
            return step(state, batch)

        return run

    monkeypatch.setattr(trainer_lib, "jit_train_step", poisoned)
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


def _train_cmd(workdir, vocab, steps, *extra):
    return _tx_train(
        workdir,
        f"--config.data.vocab_path={vocab}",
        f"--config.train.num_steps={steps}",
        "--config.train.checkpoint_every_steps=1",
        "--config.train.log_every_steps=1",
        *extra,
    )


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
        time.sleep(0.2)


# Two kills cost another process start and run (89 s against 79 s with one at 40 steps; one kill
# at 30 steps 68 s in the suite, 2 cores): the default suite kills once, `-m slow` twice.
@pytest.mark.parametrize("kills", [(11,), pytest.param((3, 11), marks=pytest.mark.slow)])
def test_sigkill_and_resume_is_bitwise_identical(root, vocab, tmp_path, tiny, kills):
    """Killed (once, or twice at different points); after the last kill the newest checkpoint
    is damaged on disk, so the last run resumes from the one before it (set aside, never
    deleted), still bit for bit."""
    steps = 30  # room after the last kill (step 11) on a fast machine: killing a finished run fails
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    subprocess.run(_train_cmd(ref_dir, vocab, steps), check=True, cwd=root, capture_output=True)
    killed_at = []
    for kill_after in kills:  # each kill mid-run, then run to the end
        proc = subprocess.Popen(
            _train_cmd(run_dir, vocab, steps),
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for_checkpoint(str(run_dir), proc, kill_after)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL  # killed mid-run, not finished
        killed_at.append(Checkpointer(str(run_dir)).latest_step())
    damaged = os.path.join(run_dir, "checkpoints", str(killed_at[-1]))
    damage(damaged, "metadata overwritten")  # the case
    before = _files(damaged)
    res = subprocess.run(
        _train_cmd(run_dir, vocab, steps), check=True, cwd=root, capture_output=True, text=True
    )
    assert f"{damaged} cannot be restored (state/_METADATA is not JSON)" in res.stderr
    assert f"resuming from {run_dir}/checkpoints step {killed_at[-1] - 1}" in res.stderr
    assert _files(damaged + ".damaged") == before  # kept as it was, past pruning (keep 20)
    assert killed_at == sorted(set(killed_at)) and killed_at[-1] < steps, killed_at
    cfg = tiny()
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
        "--config.train.checkpoint_every_steps=0",
        "--config.train.checkpoint_every_secs=0",
    )
    code, out = _sigterm_at(cmd, root, 5)
    assert code == 0, out
    assert "SIGTERM received: saved step" in out
    step = Checkpointer(str(tmp_path)).latest_step()
    assert step is not None and step >= 5
    shutil.rmtree(tmp_path)


def test_a_stopped_run_end_to_end_is_neither_averaged_nor_scored(root, vocab, tmp_path):
    # `demo` (as `reproduce --run`) trains, averages and scores: a SIGTERM while it trains
    # must end the command with one line, and never score the part trained so far.
    cmd = _train_cmd(tmp_path, vocab, 100000)
    cmd[cmd.index("train")] = "demo"
    code, out = _sigterm_at(cmd, root, 3)
    assert code == 2, out
    assert f"error: {tmp_path}: training stopped at step " in out
    assert "(SIGTERM received): nothing was averaged or scored" in out
    assert not os.path.exists(tmp_path / "averaged") and "BLEU" not in out


def test_resume_with_no_readable_checkpoint_names_each_and_changes_nothing(vocab, tmp_path, tiny):
    cfg = tiny(f"data.vocab_path={vocab}", "train.num_steps=2", "train.checkpoint_every_steps=1")
    train(cfg, str(tmp_path))
    for step in (1, 2):
        damage(str(tmp_path / "checkpoints" / str(step)), "every file emptied")
    with pytest.raises(UnreadableCheckpoint) as e:
        train(tiny(f"data.vocab_path={vocab}", "train.num_steps=4"), str(tmp_path))
    assert f"checkpoints/2 cannot be restored (state/_METADATA is not JSON); {tmp_path}" in str(
        e.value
    )
    assert "checkpoints/1 cannot be restored" in str(e.value)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_checkpoint_that_cannot_be_written_stops_training_and_resume_goes_on(
    vocab, tmp_path, tiny, monkeypatch, caplog
):
    from test_checkpoint import fail_writes_under

    cfg = tiny(f"data.vocab_path={vocab}", "train.num_steps=6", "train.checkpoint_every_steps=3")
    fail_writes_under(monkeypatch, "/6.orbax-checkpoint-tmp")  # the disk fills at step 6
    with pytest.raises(WriteFailed, match=r"checkpoint .*checkpoints/6 was not written \(OSError"):
        train(cfg, str(tmp_path))
    monkeypatch.undo()
    assert Checkpointer(str(tmp_path)).all_steps() == [3]
    with caplog.at_level("INFO"):
        assert train(cfg, str(tmp_path))["step"] == 6
    assert f"resuming from {tmp_path}/checkpoints step 3" in caplog.text
    assert Checkpointer(str(tmp_path)).all_steps() == [3, 6]


def test_workdir_refuses_another_vocabulary(vocab, tmp_path, tiny):
    from tx.data.tokenizer import VocabularyError

    train(tiny(f"data.vocab_path={vocab}", "train.num_steps=2"), str(tmp_path / "run"))
    # Same size, other data: a different vocabulary that would silently scramble the ids.
    other = tiny("data.demo_seed=7")
    from tx.data import vocabulary

    vocabulary.obtain(other.data, str(tmp_path / "other"))
    shutil.copy(tmp_path / "other" / "spm.model", tmp_path / "run" / "spm.model")
    with pytest.raises(VocabularyError, match="spm.model is damaged or replaced"):
        train(tiny("train.num_steps=4"), str(tmp_path / "run"))


def test_cli_bad_input_is_one_clear_line(root, tmp_path):
    cmd = _tx_train(
        tmp_path,
        "--config.data.source=text",
        f"--config.data.train_prefix={tmp_path}/missing",
    )
    res = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    assert res.returncode == 2
    assert "error: data file not found:" in res.stderr and "missing.en" in res.stderr
    assert "Traceback" not in res.stderr


def test_max_minutes_stops_with_a_checkpoint_and_train_goes_on(vocab, tmp_path, tiny):
    # 0.0001 minutes (6 ms) run out during data preparation: the first step is the last.
    cfg = tiny(f"data.vocab_path={vocab}", "train.num_steps=6", "train.max_minutes=0.0001")
    assert train(cfg, str(tmp_path))["step"] == 1
    assert Checkpointer(str(tmp_path)).all_steps() == [1]
    assert train(tiny(f"data.vocab_path={vocab}", "train.num_steps=6"), str(tmp_path))["step"] == 6
