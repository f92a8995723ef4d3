"""Ahead-of-time compilation report: memory per device and FLOPs, before renting hardware."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from tx.config import model_config
from tx.data.dataset import batch_spec
from tx.model.counting import param_counts
from tx.train.aot import compile_report, describe, estimate, layouts, topology_devices
from tx.train.chips import by_name, chip


def test_compile_report_of_the_tiny_config(tiny):
    cfg = tiny()
    report = compile_report(cfg, jax.devices()[:1])  # one device, whatever the host has
    mc = model_config(cfg)
    params = param_counts(mc)["params"]
    padding = (mc.vocab_rows - mc.vocab_size) * mc.d_model  # rows padding the vocabulary
    memory = report["per_device_bytes"]
    assert report["devices"] == 1 and report["mesh"] == {"data": 1, "fsdp": 1, "tensor": 1}
    assert memory["params"] == 4 * (params + padding)  # float32, one device holds everything
    assert memory["optimizer_state"] >= 2 * memory["params"]  # Adam's two moments
    # The largest batch the data can make: max_len rows of packed pairs (tiny packs).
    assert report["batch"]["length"] == cfg.data.max_len
    assert report["batch"]["rows"] == batch_spec(cfg.data, 1).max_rows(cfg.data.max_len)
    assert report["xla_flops_per_device"] > 0 and report["analytic_model_flops"] > 0


def test_an_unknown_topology_says_what_to_install():
    with pytest.raises(RuntimeError, match="cannot describe TPU topology"):
        topology_devices("v99:1x1x1")


def _fake_report(**over):
    report = {
        "device_kind": "TPU v5",
        "devices": 4,
        "per_device_bytes": {"arguments": 10e9, "temporaries": 20e9, "outputs": 9e9, "alias": 9e9},
        "xla_flops_per_device": 4.59e12,  # 10 ms at v5p's 459 TFLOP/s
        "xla_bytes_accessed_per_device": 55.3e9,  # 20 ms at 2.765 TB/s
        "optimal_seconds": None,
        "analytic_model_flops": 4 * 4.59e12,
        "tokens_per_step": 50_000,
        "num_steps": 100_000,
    }
    return report | over


def test_estimate_is_a_roofline_without_the_compilers_model():
    est = estimate(_fake_report())
    assert est["chip"] == "v5p" and est["fits"] and est["hbm_bytes_per_chip"] == 30e9
    assert est["step_seconds"] == pytest.approx(0.02) and "memory bound" in est["step_source"]
    assert est["mfu_ceiling"] == pytest.approx(0.5)  # 10 ms of compute in a 20 ms step
    assert est["tokens_per_sec"] == pytest.approx(50_000 / 0.02)
    assert est["run_hours"] == pytest.approx(100_000 * 0.02 / 3600)


def test_estimate_takes_the_compilers_step_time_and_says_what_does_not_fit():
    est = estimate(_fake_report(optimal_seconds=0.04))
    assert est["step_seconds"] == 0.04 and "optimal_seconds" in est["step_source"]
    assert est["mfu_ceiling"] == pytest.approx(0.25)
    big = _fake_report(per_device_bytes={"arguments": 50e9, "temporaries": 60e9, "outputs": 0})
    row = estimate(big) | big | {"mesh": {"data": 4, "fsdp": 1, "tensor": 1}, "micro_batches": 1}
    assert row["fits"] is False
    over = (110e9 - by_name("v5p").hbm_bytes) / 1e9
    assert describe(row).endswith(f"{over:.1f} GB over the chip's HBM")


def test_layouts_split_heads_evenly():
    assert layouts(8, 8) == [
        {"data": 8, "fsdp": 1, "tensor": 1},
        {"data": 1, "fsdp": 8, "tensor": 1},
        {"data": 4, "fsdp": 1, "tensor": 2},
        {"data": 2, "fsdp": 1, "tensor": 4},
    ]
    assert {"data": 2, "fsdp": 1, "tensor": 2} in layouts(4, 6)  # 6 heads split 2 ways
    assert all(m["tensor"] != 4 for m in layouts(8, 6))  # 6 heads do not split 4 ways
    assert layouts(1, 8) == [{"data": 1, "fsdp": 1, "tensor": 1}]


def test_the_chip_table_knows_what_jax_calls_each_tpu():
    assert chip("TPU v5").name == "v5p" and chip("TPU v5 lite").name == "v5e"
    assert chip("TPU v6 lite").name == "v6e" and chip("TPU v4").name == "v4"
    assert chip("NVIDIA H100 80GB HBM3").name == "H100" and chip("cpu") is None


def test_compile_cli_prints_layouts_as_json(root, tiny):
    res = subprocess.run(
        [sys.executable, "-m", "tx", "compile", "--config", tiny.path, "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    (row,) = json.loads(res.stdout)["layouts"]
    for key in ("mesh", "micro_batches", "fits", "hbm_bytes_per_chip", "step_seconds"):
        assert key in row
    assert row["hbm_bytes_per_chip"] > 0 and row["micro_batches"] == 1


# libtpu: installed in this environment (pip install -e '.[tpu]'), or where the Makefile puts
# it (.venv/libtpu, kept off the environment's path so that nothing else probes for TPUs).
LIBTPU = pathlib.Path(sys.prefix) / "libtpu"  # .venv/libtpu, .venv312/libtpu
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None or (LIBTPU / "libtpu").is_dir()


@pytest.mark.skipif(
    not HAS_LIBTPU,
    reason="libtpu is not installed (make test puts it in .venv/libtpu on Linux x86-64; or "
    "pip install -e '.[tpu]'): XLA's TPU compiler is not here",
)
def test_tiny_compiles_for_a_tpu_slice_on_this_cpu(tiny):
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(LIBTPU), os.environ.get("PYTHONPATH", "")])
    )
    # Rows of 128 packed tokens: the lengths the splash kernel's blocks tile (tx.model.splash).
    res = subprocess.run(
        [sys.executable, "-m", "tx", "compile", "--config", tiny.path, "--topology", "v5e:2x2",
         "--config.data.max_len=128", "--config.data.bucket_lengths=(32,64,128)", "--json"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    (row,) = json.loads(res.stdout)["layouts"]
    params = param_counts(model_config(tiny()))["params"]
    # Every attention (encoder, decoder, cross) of each layer through the kernel, once forward
    # and once backward (its fused backward kernel).
    assert row["batch"]["length"] == 128
    assert row["attention_kernel_calls"] == 2 * 3 * tiny().model.num_layers
    assert row["device_kind"] == "TPU v5 lite" and row["chip"] == "v5e" and row["devices"] == 4
    assert row["per_device_bytes"]["params"] >= 4 * params  # float32, replicated over data
    assert row["fits"] and "optimal_seconds" in row["step_source"] and row["step_seconds"] > 0
    assert 0 < row["mfu_ceiling"] < 1


def test_a_core_of_a_two_core_chip_gets_half_of_it():
    """Deviceless v4 slices list both TensorCores of a chip as devices; the cost model answers
    -407.9 s there (libtpu 0.0.42): the estimate falls back to the roofline of half a chip."""
    report = _fake_report(
        device_kind="TPU v4", devices=8, devices_per_chip=2, optimal_seconds=-407.9
    )
    est = estimate(report)
    assert est["hbm_capacity_bytes"] == by_name("v4").hbm_bytes // 2
    assert "roofline" in est["step_source"]
    # 55.3 GB at half of v4's 1.2 TB/s; 4.59 TFLOP at half of 275 TFLOP/s
    assert est["step_seconds"] == pytest.approx(max(55.3e9 / 0.6e12, 4.59e12 / 137.5e12))
    assert est["mfu_ceiling"] == pytest.approx(4 * 4.59e12 / (est["step_seconds"] * 4 * 275e12))
