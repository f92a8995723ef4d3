"""Watching a run: the metrics of the steps since the last report (checked for a non-finite
loss), a progress line, MFU from analytic FLOPs (its TensorBoard scalars: tx.train.events).

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

from tx.train.chips import chip


class Diverged(RuntimeError):
    """The loss or gradient became NaN or Inf."""


def peak_tflops(device=None, configured: float = 0.0) -> float:
    """Peak TFLOP/s of one device: the configured figure, the table, or a CPU estimate."""
    if configured > 0:
        return configured
    device = device or jax.devices()[0]
    known = chip(getattr(device, "device_kind", ""))
    if known is not None:
        return known.bf16_tflops
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
    """Step, loss, learning rate, tokens/s, MFU and ETA, in place on a terminal.

    The ETA and the step count run to whichever ends the run first: `total_steps`, or the
    time budget's `deadline` (a time.monotonic() value, train.max_minutes), the steps left at
    the last reported step time; a run the budget ends shows `step 120/~451 (time limit)`.
    """

    def __init__(self, total_steps: int, enabled: bool, stream=None, deadline: float | None = None):
        self.total = total_steps
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.tty = enabled and self.stream.isatty()
        self.deadline = deadline
        self._last_len = 0

    def update(self, step: int, metrics: dict, force_line: bool = False) -> None:
        if not self.enabled:
            return
        step_time = metrics.get("step_time", float("nan"))
        eta, end = (self.total - step) * step_time, f"{self.total}"
        if self.deadline is not None:
            left = max(self.deadline - time.monotonic(), 0.0)
            if left < eta:  # the budget ends the run first (NaN: no step time yet, no ETA)
                eta, end = left, f"~{step + int(left / step_time)} (time limit)"
        src, tgt = metrics["src_tokens_per_step"] / 1e3, metrics["tgt_tokens_per_step"] / 1e3
        line = (
            f"step {step}/{end} | loss {metrics['loss']:.3f} | "
            f"lr {metrics['learning_rate']:.2e} | {src:.1f}k+{tgt:.1f}k tok/step"
            f" | {metrics['tokens_per_sec'] / 1e3:.1f}k tok/s"
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


class Throughput:
    """Tokens/s and MFU over the steps since the last report."""

    def __init__(self, num_devices: int, peak: float):
        self.devices, self.peak = num_devices, peak
        self.start = time.perf_counter()

    def report(self, steps: int, tokens: float, flops: float) -> dict:
        """`tokens` real (source + target) tokens and `flops` model FLOPs of `steps` steps."""
        now = time.perf_counter()
        elapsed, self.start = max(now - self.start, 1e-9), now
        peak = self.devices * self.peak * 1e12
        return {
            "tokens_per_sec": tokens / elapsed,
            "step_time": elapsed / max(steps, 1),
            "mfu": flops / elapsed / peak if peak > 0 else 0.0,
        }


class Window:
    """Metrics of the steps since the last report, fetched lazily (no per-step sync).

    `flops_fn(src_tokens, tgt_tokens, src_len, tgt_len)` gives a step's model FLOPs.
    """

    def __init__(self, flops_fn):
        self.flops_fn = flops_fn
        self.items = []  # (step, metrics, (padded source length, padded target length))
        self.drained = (0.0, 0.0, 0.0)  # real source, target tokens and FLOPs reported so far

    def add(self, step, metrics, lengths):
        self.items.append((step, metrics, lengths))
        # Look at the step before this one: it has finished while this one was dispatched.
        if len(self.items) >= 2:
            self._check_one(*self.items[-2][:2])

    @staticmethod
    def _check_one(step, metrics):
        if not bool(metrics["finite"]):
            raise Diverged(
                f"non-finite loss or gradient at step {step} (loss sum "
                f"{float(metrics['loss'])}); the last checkpoint before it is intact"
            )

    def check(self):
        if self.items:
            self._check_one(*self.items[-1][:2])

    def _sums(self) -> tuple[dict, float]:
        """Sums over the pending steps of the scalar metrics, and their model FLOPs."""
        keys = ("loss", "nll", "weight", "src_tokens")
        if self.items and "unlikelihood" in self.items[0][1]:  # train.unlikelihood > 0
            keys += ("unlikelihood",)
        per_step = [({k: float(m[k]) for k in keys}, lengths) for _, m, lengths in self.items]
        sums = {k: sum(m[k] for m, _ in per_step) for k in keys}
        flops = sum(self.flops_fn(m["src_tokens"], m["weight"], *ls) for m, ls in per_step)
        return sums, flops

    def totals(self) -> tuple[float, float, float]:
        """Real source and target tokens and model FLOPs of every step added so far."""
        sums, flops = self._sums()
        src, tgt, done = self.drained
        return src + sums["src_tokens"], tgt + sums["weight"], done + flops

    def drain(self, throughput) -> dict:
        """Mean loss, perplexity, real tokens per step (global), speed and MFU; resets."""
        self.check()
        sums, flops = self._sums()
        src, tgt, done = self.drained
        self.drained = (src + sums["src_tokens"], tgt + sums["weight"], done + flops)
        lr = float(self.items[-1][1]["learning_rate"])
        n, self.items = len(self.items), []
        w = max(sums["weight"], 1.0)
        extra = {"unlikelihood": sums["unlikelihood"] / w} if "unlikelihood" in sums else {}
        return {
            "loss": sums["loss"] / w,
            **extra,
            "perplexity": math.exp(sums["nll"] / w),
            "learning_rate": lr,
            "src_tokens_per_step": sums["src_tokens"] / n,
            "tgt_tokens_per_step": sums["weight"] / n,
            **throughput.report(n, sums["src_tokens"] + sums["weight"], flops),
        }
