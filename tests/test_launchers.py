"""The tpu/ launch scripts print the expected commands in dry runs, run them otherwise (one
meaning of DRY_RUN everywhere), refuse missing variables, and ship the tracked files only."""

import os
import stat
import subprocess
import tarfile

import pytest

ENV = {
    "PROJECT": "my-proj",
    "ZONE": "us-central2-b",
    "TPU_NAME": "tx-pod",
    "ACCELERATOR_TYPE": "v4-32",
    "CONFIG": "configs/big.py",
    "WORKDIR": "gs://my-bucket/runs/big",
}
SCRIPTS = ["create.sh", "setup.sh", "prepare.sh", "run.sh", "logs.sh", "delete.sh"]


def script(root, name, *args, env=ENV, path=None):
    full = {k: v for k, v in os.environ.items() if k not in ENV and k != "DRY_RUN"} | env
    if path:  # stand-ins for gcloud / srun first on PATH
        full["PATH"] = f"{path}:{full['PATH']}"
    return subprocess.run(
        ["bash", str(root / "tpu" / name), *args], env=full, capture_output=True, text=True
    )


@pytest.fixture
def recorder(tmp_path):
    """A directory with `gcloud` and `srun` that append their arguments to calls.txt."""
    calls = tmp_path / "calls.txt"
    for name in ("gcloud", "srun"):
        tool = tmp_path / name
        tool.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >> {calls}\n')
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return tmp_path, calls


def test_create_dry_run(root):
    out = script(root, "create.sh", "--dry-run", "--spot").stdout
    assert "gcloud compute tpus tpu-vm create tx-pod --project=my-proj --zone=us-central2-b" in out
    assert "--accelerator-type=v4-32" in out and "--spot" in out
    queued = script(root, "create.sh", "--dry-run", "--queued").stdout
    assert "gcloud compute tpus queued-resources create tx-pod-qr" in queued
    assert "--node-id=tx-pod" in queued


def test_setup_prepare_run_logs_delete_dry_runs(root):
    setup = script(root, "setup.sh", "--dry-run").stdout
    assert f"git -C {root} archive --format=tar.gz" in setup and " HEAD" in setup
    assert "tpu-vm scp" in setup and "--recurse" not in setup and "--worker=all" in setup
    assert "tar -xzf ~/tx.tar.gz -C ~/tx" in setup and "pip install -q '.[tpu]'" in setup
    prepare = script(root, "prepare.sh", "--dry-run").stdout
    assert "--worker=0" in prepare and "JAX_PLATFORMS=cpu" in prepare
    assert "python3 -m tx prepare --config configs/big.py --workdir gs://my-bucket/runs/big" in (
        prepare
    )
    run = script(root, "run.sh", "--dry-run").stdout
    assert "--worker=all" in run
    assert "python3 -m tx train --config configs/big.py --workdir gs://my-bucket/runs/big >" in run
    extra = script(root, "run.sh", "--dry-run", env=ENV | {"EXTRA_ARGS": "--take-over-lock"})
    assert "--workdir gs://my-bucket/runs/big --take-over-lock >" in extra.stdout
    assert "--worker=0" in script(root, "logs.sh", "--dry-run").stdout
    assert (
        "~/prepare.log" in script(root, "logs.sh", "--dry-run", env=ENV | {"LOG": "prepare"}).stdout
    )
    assert "tpu-vm delete tx-pod" in script(root, "delete.sh", "--dry-run").stdout


@pytest.mark.parametrize("name", SCRIPTS)
def test_missing_variables_fail(root, name):
    res = script(root, name, "--dry-run", env={})
    assert res.returncode == 2 and "error: set" in res.stderr and "TPU_NAME" in res.stderr
    assert "tpu/README.md" in res.stderr and (root / "tpu" / "README.md").is_file()


@pytest.mark.parametrize("dry_run", ["1", "0", "", None])
def test_dry_run_means_one_thing_everywhere(root, recorder, dry_run):
    """DRY_RUN=1 prints the commands; any other value (or none) runs them."""
    bin_dir, calls = recorder
    env = ENV | ({} if dry_run is None else {"DRY_RUN": dry_run})
    for name in ("run.sh", "slurm.sbatch"):
        res = script(root, name, env=env, path=bin_dir)
        assert res.returncode == 0, res.stderr
    ran = calls.read_text().splitlines() if calls.exists() else []
    if dry_run == "1":
        assert ran == []
        return
    assert len(ran) == 2
    assert ran[0].startswith("gcloud compute tpus tpu-vm ssh tx-pod") and "--worker=all" in ran[0]
    assert ran[1] == (
        "srun python3 -m tx train --config configs/big.py --workdir gs://my-bucket/runs/big"
    )


def test_slurm_dry_run_prints(root):
    res = script(root, "slurm.sbatch", env=ENV | {"DRY_RUN": "1"})
    assert res.returncode == 0
    assert (
        "+ srun python3 -m tx train --config configs/big.py --workdir gs://my-bucket/runs/big"
        in (res.stdout)
    )


def test_setup_ships_the_tracked_files_only(root, recorder, tmp_path):
    """setup.sh's archive (git archive HEAD) holds the committed files, never .venv or runs/."""
    bin_dir, calls = recorder
    res = script(root, "setup.sh", env=ENV | {"TMPDIR": str(tmp_path)}, path=bin_dir)
    assert res.returncode == 0, res.stderr
    (archive,) = tmp_path.glob("tx-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = {m.name for m in tar.getmembers() if not m.isdir()}
    tracked = subprocess.run(
        ["git", "-C", str(root), "ls-tree", "-r", "--name-only", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert {"pyproject.toml", "tx/storage.py", "tpu/setup.sh"} <= names
    assert names == set(tracked)
    assert not [n for n in names if n.startswith((".venv", "runs/"))]
    ran = calls.read_text().splitlines()
    assert ran[0].startswith(f"gcloud compute tpus tpu-vm scp {archive} tx-pod:~/tx.tar.gz")
    assert "pip install -q '.[tpu]'" in ran[1] and "--worker=all" in ran[1]
