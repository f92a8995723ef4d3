"""Real object-store servers for the tests, started by the tests: a GCS server
(tests/gcs_server.py: gcp-storage-emulator) and an S3 server (moto in server mode), each on a
free port of 127.0.0.1, and the environment that points tx at them.

tx is pointed at a server the way a user points any tool at one: STORAGE_EMULATOR_HOST for GCS,
AWS_ENDPOINT_URL with credentials and a region for S3. The rest keeps every request on this
machine: no metadata-server probes, no default credentials looked up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

BUCKET = "tx-tests"
HERE = os.path.dirname(os.path.abspath(__file__))

# Google's and AWS's libraries look for credentials on a metadata server they would reach
# over the network: never here.
OFFLINE = {
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
    "GCE_METADATA_ROOT": "127.0.0.1:9",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def gcs_server():
    """The GCS server with BUCKET; yields the variables that point at it."""
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "gcs_server.py"), "0", BUCKET],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        port = int(proc.stdout.readline().strip().split("=")[1])  # "PORT=<n>" once listening
        url = f"http://127.0.0.1:{port}"
        _wait(f"{url}/storage/v1/b", proc)
        yield {"STORAGE_EMULATOR_HOST": url}
    finally:
        _stop(proc)


@contextlib.contextmanager
def s3_server():
    """moto's S3 server with BUCKET; yields the variables that point at it."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait(f"{url}/moto-api/data.json", proc)
        urllib.request.urlopen(urllib.request.Request(f"{url}/{BUCKET}", method="PUT")).read()
        yield {
            "AWS_ENDPOINT_URL": url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    finally:
        _stop(proc)


def fresh_prefix(scheme: str) -> str:
    """A prefix of BUCKET no other test uses: gs://tx-tests/<random>."""
    return f"{scheme}://{BUCKET}/{uuid.uuid4().hex[:12]}"


def point_at(request, monkeypatch, scheme: str) -> str:
    """Points this process's environment (and its subprocesses') at the session's server for
    `scheme` ("gs" or "s3"; fixtures gcs_env, s3_env) and returns a fresh prefix there."""
    from tx import storage

    env = request.getfixturevalue("gcs_env" if scheme == "gs" else "s3_env")
    for key, value in {**OFFLINE, **env}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(storage, "_configured", False)  # configure() again for this server
    return fresh_prefix(scheme)
