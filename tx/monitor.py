"""Watching a run: a progress line, TensorBoard scalars, MFU from analytic FLOPs.

Only process 0 writes anything. On a terminal the progress line updates in place; otherwise
(logs, CI, SLURM) a plain line is printed every `log_every_steps`.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time

import jax

# Dense bf16 peak TFLOP/s per device (PAPER.md, "Figures from later work"). Matched in order
# against jax's device_kind.
PEAK_TFLOPS = (
    ("v6", 918.0),
    ("v5p", 459.0),
    ("v5 lite", 197.0),
    ("v5e", 197.0),
    ("v4", 275.0),
    ("v3", 123.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("V100", 125.0),
)


def peak_tflops(device=None, configured: float = 0.0) -> float:
    """Peak TFLOP/s of one device: the configured figure, the table, or a CPU estimate."""
    if configured > 0:
        return configured
    device = device or jax.devices()[0]
    kind = getattr(device, "device_kind", "")
    for key, tflops in PEAK_TFLOPS:
        if key.lower() in kind.lower():
            return tflops
    if device.platform == "cpu":
        return cpu_peak_tflops()
    return 0.0


def cpu_peak_tflops() -> float:
    """fp32 FMA peak of this machine's cores: cores x GHz x FLOPs/cycle (from the ISA flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return 0.0
    flags = (
        set(re.search(r"^flags\s*:(.*)$", info, re.M).group(1).split())
        if "flags" in info
        else set()
    )
    mhz = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", info, re.M)] or [2000.0]
    # Two FMA units x vector lanes x 2 FLOPs per FMA.
    per_cycle = 64 if "avx512f" in flags else 32 if "avx2" in flags else 8
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores * max(mhz) / 1000.0 * per_cycle / 1000.0


def _fmt_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    """Step, loss, learning rate, tokens/s, MFU and ETA, in place on a terminal."""

    def __init__(self, total_steps: int, enabled: bool, stream=None):
        self.total = total_steps
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.tty = enabled and self.stream.isatty()
        self._last_len = 0

    def update(self, step: int, metrics: dict, force_line: bool = False) -> None:
        if not self.enabled:
            return
        eta = (self.total - step) * metrics.get("step_time", float("nan"))
        line = (
            f"step {step}/{self.total} | loss {metrics['loss']:.3f} | "
            f"lr {metrics['learning_rate']:.2e} | {metrics['tokens_per_sec'] / 1e3:.1f}k tok/s"
            f" | MFU {100 * metrics['mfu']:.1f}% | ETA {_fmt_duration(eta)}"
        )
        if self.tty and not force_line:
            pad = " " * max(0, self._last_len - len(line))
            self.stream.write("\r" + line + pad)
            self._last_len = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.tty and self._last_len:
            self.stream.write("\n")
            self._last_len = 0
        self.stream.write(text + "\n")
        self.stream.flush()


class Summaries:
    """TensorBoard scalars under `workdir/tensorboard` (process 0 only; no-op elsewhere)."""

    def __init__(self, workdir: str, enabled: bool):
        self.writer = None
        if enabled:
            import tensorflow as tf

            self._tf = tf
            self.writer = tf.summary.create_file_writer(os.path.join(workdir, "tensorboard"))

    def scalars(self, step: int, values: dict) -> None:
        if self.writer is None:
            return
        with self.writer.as_default():
            for key, value in values.items():
                self._tf.summary.scalar(key, float(value), step=step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Throughput:
    """Tokens/s and MFU over the steps since the last report."""

    def __init__(self, flops_fn, num_devices: int, peak: float):
        self.flops_fn, self.devices, self.peak = flops_fn, num_devices, peak
        self.reset()

    def reset(self) -> None:
        self.start = time.perf_counter()
        self.steps = self.tokens = 0
        self.flops = 0.0

    def add(self, src_tokens: int, tgt_tokens: int, src_len: float, tgt_len: float) -> None:
        self.steps += 1
        self.tokens += src_tokens + tgt_tokens
        self.flops += self.flops_fn(src_tokens, tgt_tokens, src_len, tgt_len)

    def report(self) -> dict:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        peak = self.devices * self.peak * 1e12
        out = {
            "tokens_per_sec": self.tokens / elapsed,
            "step_time": elapsed / max(self.steps, 1),
            "mfu": self.flops / elapsed / peak if peak > 0 else 0.0,
        }
        self.reset()
        return out
