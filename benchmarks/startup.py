"""What a command imports before its first useful work, and how long each package takes: the
imports of `translate` (tx.cli.main, tx.cli.translate, tx.infer.engines, tx.infer.translate),
each round a fresh process under `python -X importtime`.

    python benchmarks/startup.py [--rounds 5] [--python PATH ...]

Per interpreter (default: this one), the medians over the rounds of the whole import and of
the heavy packages in it (cumulative seconds: a package's own imports included; a package not
imported is absent), printed and saved (benchmarks/results/startup.json). Several --python
compare environments side by side in one run (e.g. two ml_dtypes releases). Nothing else
should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common import save  # noqa: E402

IMPORTS = "import tx.cli.main, tx.cli.translate, tx.infer.engines, tx.infer.translate"
PACKAGES = (
    "jax", "ml_dtypes", "jaxlib", "numpy", "flax", "optax", "orbax.checkpoint", "ml_collections",
    "sentencepiece", "tensorflow", "torch", "num2words", "jax.experimental.pallas.ops.tpu",
)  # fmt: skip


def one_round(python: str) -> dict[str, float]:
    """{package: cumulative seconds} of one fresh process importing IMPORTS, and "total"."""
    done = subprocess.run(
        [python, "-X", "importtime", "-c", IMPORTS], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"{python} could not import tx:\n{done.stderr[-3000:]}")
    seconds, total = {}, 0.0
    for line in done.stderr.splitlines():  # "import time: self | cumulative | name"
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line[len("import time:") :].split("|")
        us, name = int(cumulative), name.rstrip()
        if name.strip() in PACKAGES:
            seconds[name.strip()] = max(seconds.get(name.strip(), 0.0), us / 1e6)
        if not name.startswith("  "):  # a top-level import of the command line
            total += us / 1e6
    return {"total": round(total, 3), **{k: round(v, 3) for k, v in seconds.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--python", action="append", help="an interpreter with tx installed")
    args = p.parse_args()
    out = {}
    for python in args.python or [sys.executable]:
        rounds = [one_round(python) for _ in range(args.rounds)]
        names = sorted({k for r in rounds for k in r}, key=lambda k: -rounds[0].get(k, 0))
        medians = {k: statistics.median(r.get(k, 0.0) for r in rounds) for k in names}
        code = "import ml_dtypes, numpy; print(ml_dtypes.__version__, numpy.__version__)"
        done = subprocess.run([python, "-c", code], capture_output=True, text=True)
        version = done.stdout.split()
        out[python] = {"ml_dtypes": version[0], "numpy": version[1], "median_seconds": medians}
        print(f"{python} (ml_dtypes {version[0]}, numpy {version[1]}):")
        for k, v in medians.items():
            print(f"  {k:40s} {v:6.3f} s", flush=True)
    save("startup", {"imports": IMPORTS, "rounds": args.rounds, "interpreters": out})


if __name__ == "__main__":
    main()
