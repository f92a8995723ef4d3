"""The tpu/ launch scripts print the expected commands in dry runs and refuse missing vars."""

import os
import subprocess

import pytest

ENV = {
    "PROJECT": "my-proj",
    "ZONE": "us-central2-b",
    "TPU_NAME": "tx-pod",
    "ACCELERATOR_TYPE": "v4-32",
    "CONFIG": "configs/big.py",
    "WORKDIR": "/mnt/runs/big",
}


def script(root, name, *args, env=ENV):
    full = {k: v for k, v in os.environ.items() if k not in ENV} | env
    return subprocess.run(
        ["bash", str(root / "tpu" / name), *args], env=full, capture_output=True, text=True
    )


def test_create_dry_run(root):
    out = script(root, "create.sh", "--dry-run", "--spot").stdout
    assert "gcloud compute tpus tpu-vm create tx-pod --project=my-proj --zone=us-central2-b" in out
    assert "--accelerator-type=v4-32" in out and "--spot" in out
    queued = script(root, "create.sh", "--dry-run", "--queued").stdout
    assert "gcloud compute tpus queued-resources create tx-pod-qr" in queued
    assert "--node-id=tx-pod" in queued


def test_setup_run_logs_delete_dry_runs(root):
    setup = script(root, "setup.sh", "--dry-run").stdout
    assert "tpu-vm scp --recurse" in setup and "--worker=all" in setup
    assert "pip install -q -e '.[tpu]'" in setup
    run = script(root, "run.sh", "--dry-run").stdout
    assert "--worker=all" in run
    assert "train.py --config configs/big.py --workdir /mnt/runs/big" in run
    assert "--worker=0" in script(root, "logs.sh", "--dry-run").stdout
    assert "tpu-vm delete tx-pod" in script(root, "delete.sh", "--dry-run").stdout


@pytest.mark.parametrize("name", ["create.sh", "setup.sh", "run.sh", "logs.sh", "delete.sh"])
def test_missing_variables_fail(root, name):
    res = script(root, name, "--dry-run", env={})
    assert res.returncode == 2 and "error: set" in res.stderr and "TPU_NAME" in res.stderr


def test_slurm_dry_run(root):
    res = subprocess.run(
        ["bash", str(root / "tpu" / "slurm.sbatch")],
        capture_output=True,
        text=True,
        env={**os.environ, "DRY_RUN": "1", **ENV},
    )
    assert res.returncode == 0
    assert "python3 train.py --config configs/big.py --workdir /mnt/runs/big" in res.stdout
