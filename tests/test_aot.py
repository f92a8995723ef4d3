"""Ahead-of-time compilation report: memory per device and FLOPs, before renting hardware."""

import jax
import pytest

from tx.config import model_config
from tx.data.dataset import batch_spec
from tx.model.counting import param_counts
from tx.train.aot import compile_report, topology_devices


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
