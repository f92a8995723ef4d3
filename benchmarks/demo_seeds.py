"""Does the demo land the same everywhere? `python -m tx demo` under several seeds and thread
counts: each run's test sacreBLEU, its dev perplexity and its training loss around the warm-up's
peak (where a loss spike would show), into benchmarks/results/demo_seeds.json.

    python benchmarks/demo_seeds.py [--seeds 0,1,2,3,4] [--threads 1,2] [--set KEY=VALUE ...]

A seed sets train.seed (the initial parameters and dropout) and data.shuffle_seed (the order
of the batches); 1 thread is `taskset -c 0` (XLA then computes with one thread, its sums in
another order than with two). Each run is the demo as `make demo` runs it, in a fresh
workdir; --set adds a config override to every run (to try a change of the recipe).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common import RESULTS, environment  # noqa: E402

from tx.train.events import read_scalars  # noqa: E402


def run(seed: int, threads: int, overrides: list[str]) -> dict:
    workdir = tempfile.mkdtemp(prefix=f"demo-seed{seed}-t{threads}-")
    command = [sys.executable, "-m", "tx", "demo", "--workdir", workdir]
    command += [f"--config.train.seed={seed}", f"--config.data.shuffle_seed={seed}"]
    command += [f"--config.{o}" for o in overrides]
    cpus = ",".join(str(i) for i in range(threads))
    started = time.time()
    out = subprocess.run(
        ["taskset", "-c", cpus, *command], capture_output=True, text=True, cwd=ROOT
    )
    if out.returncode:
        raise SystemExit(f"seed {seed}, {threads} thread(s) failed:\n{out.stderr[-3000:]}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    steps, losses = read_scalars(workdir)["train/loss"]
    return {
        "seed": seed,
        "threads": threads,
        "test_bleu": summary["test_bleu"],
        "test_chrf": summary["test_chrf"],
        "dev_perplexity": summary["dev_perplexity"],
        # the training loss reported every 50 steps: a spike at the warm-up's peak shows here
        "train_loss": {int(s): round(float(v), 4) for s, v in zip(steps, losses, strict=True)},
        "seconds": round(time.time() - started, 1),
        "workdir": workdir,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--name", default="demo_seeds", help="results file name (without .json)")
    args = p.parse_args()
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for threads in (int(t) for t in args.threads.split(",")):
            runs.append(run(seed, threads, args.set))
            r = runs[-1]
            print(
                f"seed {seed}, {threads} thread(s): sacreBLEU {r['test_bleu']}, dev perplexity "
                f"{r['dev_perplexity']}, {r['seconds']} s",
                flush=True,
            )
    bleu = [r["test_bleu"] for r in runs]
    result = {
        "command": " ".join(["python", "benchmarks/demo_seeds.py", *sys.argv[1:]]),
        "overrides": args.set,
        "environment": environment(),
        "runs": runs,
        "test_bleu_min": min(bleu),
        "test_bleu_max": max(bleu),
    }
    path = os.path.join(RESULTS, f"{args.name}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"sacreBLEU {min(bleu)}-{max(bleu)} over {len(runs)} runs -> {path}")


if __name__ == "__main__":
    main()
