"""The accelerator benchmark runs end to end before a device is lent (its --dry-run)."""

import json
import subprocess
import sys


def test_accelerator_script_dry_run_writes_every_figure(root, tmp_path):
    out = tmp_path / "accelerator.json"
    res = subprocess.run(
        ["bash", "benchmarks/accelerator.sh", "--dry-run", "--steps", "1", "--out", str(out)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PY": sys.executable, "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] is True
    assert [c["case"] for c in result["train"]] == ["tiny/auto", "tiny/explicit"]
    for case in result["train"]:
        assert case["step_s"] > 0 and case["tokens_per_s"] > 0 and case["model_tflops_per_s"] > 0
        assert case["mfu"] is None or 0 < case["mfu"] < 1
        assert "peak_memory_bytes" in case
    assert [c["attention_impl"] for c in result["train"]] == ["xla", "explicit"]  # on a CPU
    assert result["decode"]["tokens_per_s"] > 0 and result["decode"]["beam"] == 4
