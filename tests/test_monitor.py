"""Watching a run: the progress line, the metrics window, speed and MFU, peak FLOP/s by device,
TensorBoard."""

import io
import math
import os

import pytest

from tx.train import monitor
from tx.train.events import Summaries
from tx.train.monitor import Progress, Throughput, Window, peak_tflops


class FakeDevice:
    def __init__(self, kind, platform="gpu"):
        self.device_kind, self.platform = kind, platform


def test_peak_tflops_by_device_kind_or_configured():
    assert peak_tflops(FakeDevice("NVIDIA H100 80GB HBM3")) == 989.0
    assert peak_tflops(FakeDevice("TPU v4", "tpu")) == 275.0
    assert peak_tflops(FakeDevice("TPU v5 lite", "tpu")) == 197.0
    assert peak_tflops(FakeDevice("Some GPU")) == 0.0  # unknown: no MFU rather than a guess
    assert peak_tflops(FakeDevice("NVIDIA H100"), configured=5.0) == 5.0
    assert peak_tflops(FakeDevice("cpu", "cpu")) == monitor.cpu_peak_tflops() >= 0.0


def test_throughput_is_tokens_and_flops_over_elapsed_time(monkeypatch):
    clock = iter([100.0, 102.0])
    monkeypatch.setattr(monitor.time, "perf_counter", lambda: next(clock))
    throughput = Throughput(num_devices=2, peak=1.0)  # 2 x 1 TFLOP/s
    report = throughput.report(steps=4, tokens=1000.0, flops=1e12)
    assert report == {"tokens_per_sec": 500.0, "step_time": 0.5, "mfu": 0.25}


def test_progress_line_shows_real_tokens_per_step_and_eta():
    out = io.StringIO()
    metrics = {
        "loss": 2.5,
        "learning_rate": 1e-3,
        "src_tokens_per_step": 24_900.0,
        "tgt_tokens_per_step": 25_300.0,
        "tokens_per_sec": 12_000.0,
        "mfu": 0.31,
        "step_time": 0.4,
    }
    Progress(100, enabled=True, stream=out).update(10, metrics)
    line = out.getvalue()
    assert line == (
        "step 10/100 | loss 2.500 | lr 1.00e-03 | 24.9k+25.3k tok/step | 12.0k tok/s"
        " | MFU 31.0% | ETA 0m36s\n"
    )
    quiet = io.StringIO()
    Progress(100, enabled=False, stream=quiet).update(10, metrics)
    assert quiet.getvalue() == ""


def test_durations():
    assert monitor._fmt_duration(65) == "1m05s"
    assert monitor._fmt_duration(3725) == "1h02m"
    assert monitor._fmt_duration(math.nan) == "?"


@pytest.mark.parametrize("enabled", [True, False])
def test_summaries_write_only_where_enabled(tmp_path, enabled):
    directory = str(tmp_path / "tb")
    summaries = Summaries(directory, enabled)
    summaries.scalars(3, {"train/loss": 1.5})
    summaries.close()
    assert os.path.isdir(directory) == enabled
    if enabled:
        assert any(name.startswith("events.out.tfevents") for name in os.listdir(directory))


def test_progress_reports_the_unlikelihood_term_per_token_when_trained_with_it():
    """`train.unlikelihood` > 0: the logged (and TensorBoard's train/) metrics carry its sum
    over the logged steps per target token, as the loss; without it there is no such key."""

    def step_metrics(unlikelihood):
        m = dict(loss=6.0, nll=8.0, weight=4.0, src_tokens=3.0, finite=True, learning_rate=1e-3)
        return m if unlikelihood is None else {**m, "unlikelihood": unlikelihood}

    window = Window(lambda *args: 0.0)
    for step, ul in ((1, 2.0), (2, 1.0)):
        window.add(step, step_metrics(ul), (8, 8))
    out = window.drain(Throughput(1, 0.0))
    assert out["unlikelihood"] == pytest.approx(3.0 / 8.0)
    assert out["loss"] == pytest.approx(12.0 / 8.0)
    window.add(3, step_metrics(None), (8, 8))
    assert "unlikelihood" not in window.drain(Throughput(1, 0.0))


def test_eta_and_step_count_follow_whichever_ends_the_run_first(monkeypatch):
    """train.max_minutes ends a run before num_steps: the ETA is the time left and the count
    runs to the step the budget reaches at the last step time; otherwise as before."""
    monkeypatch.setattr(monitor.time, "monotonic", lambda: 1000.0)
    metrics = {
        "loss": 2.5,
        "learning_rate": 1e-3,
        "src_tokens_per_step": 1_000.0,
        "tgt_tokens_per_step": 1_000.0,
        "tokens_per_sec": 2_000.0,
        "mfu": 0.1,
        "step_time": 2.0,
    }

    def line(deadline, total=1000):
        out = io.StringIO()
        Progress(total, enabled=True, stream=out, deadline=deadline).update(10, metrics)
        return out.getvalue()

    # 990 steps x 2 s = 33 min to go, 27 min left: the budget ends the run at step 10 + 810.
    assert line(1000.0 + 27 * 60).startswith("step 10/~820 (time limit) | loss 2.500")
    assert line(1000.0 + 27 * 60).endswith(" | ETA 27m00s\n")
    # 90 steps x 2 s = 3 min to go, 27 min left: num_steps ends it.
    assert line(1000.0 + 27 * 60, total=100).startswith("step 10/100 | ")
    assert line(1000.0 + 27 * 60, total=100).endswith(" | ETA 3m00s\n")
    assert line(None) == line(1e9)  # no budget, or one that outlasts num_steps: the same
    past = line(900.0)  # past the deadline: the run stops at this step
    assert past.startswith("step 10/~10 (time limit) | ") and past.endswith(" | ETA 0m00s\n")
    no_time = {**metrics, "step_time": math.nan}  # no step timed yet: no ETA either way
    out = io.StringIO()
    Progress(100, enabled=True, stream=out, deadline=1060.0).update(0, no_time)
    assert out.getvalue().startswith("step 0/100 | ") and out.getvalue().endswith("ETA ?\n")
