"""Helpers for the benchmark scripts: results are printed and saved as JSON."""

import datetime
import json
import os
import platform

import jax

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def environment() -> dict:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "device_kind": jax.devices()[0].device_kind,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }


def save(name: str, result: dict) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    result = {"benchmark": name, "environment": environment(), **result}
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
    return path
