"""Cold against warm: what keeping compiled programs (tx.cli.compile_cache) saves the commands
users wait on, each a process of its own as a user starts it.

    make demo     # runs/demo, once
    python benchmarks/compile_cache.py [--workdir runs/demo] [--rounds 3]

Per command, each round runs it with an empty cache (cold), then again on what that run kept
(warm), and once with the cache off; the medians of the wall times are printed and saved
(benchmarks/results/compile_cache.json). The commands: `translate` of one sentence, `evaluate`
of the test split, and `train` resumed from the run's last checkpoint for one step (on a copy of
the run each time). Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common import save  # noqa: E402

from tx.train import runcard  # noqa: E402

SENTENCE = "Today, she needs the boat.\n"


def timed(args: list[str], cache: str, stdin: str = "") -> tuple[float, str]:
    """Seconds `python -m tx ARGS` took with TX_COMPILATION_CACHE=`cache`, and its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["TX_COMPILATION_CACHE"] = cache
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "tx", *args], input=stdin, capture_output=True, text=True,
        cwd=ROOT, env=env,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"python -m tx {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def commands(workdir: str, scratch: str) -> dict:
    """name -> a function () -> (args, stdin): each call a fresh command line (train: a fresh
    copy of the run, resumed for one step)."""
    steps = runcard.totals(runcard.load(workdir))["steps"]

    def train():
        copy = tempfile.mkdtemp(dir=scratch)
        shutil.rmtree(copy)
        shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns("lock.json"))
        return ["train", "--workdir", copy, f"--config.train.num_steps={steps + 1}"], ""

    evaluate = ["evaluate", "--workdir", workdir, "--split", "test"]
    return {
        "translate one sentence": lambda: (["translate", "--workdir", workdir], SENTENCE),
        "evaluate the test split": lambda: (evaluate, ""),
        "train resumed, one step": train,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default=os.path.join(ROOT, "runs", "demo"))
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if runcard.load(args.workdir) is None:
        raise SystemExit(f"{args.workdir} is not a trained run: make demo first")
    scratch = tempfile.mkdtemp(prefix="tx-compile-cache-")
    out = {}
    try:
        for name, command in commands(args.workdir, scratch).items():
            times = {"cold": [], "warm": [], "off": []}
            for _ in range(args.rounds):
                cache = tempfile.mkdtemp(dir=scratch)
                for kind, where in (("cold", cache), ("warm", cache), ("off", "off")):
                    line, stdin = command()
                    times[kind].append(round(timed(line, where, stdin)[0], 2))
            medians = {k: statistics.median(v) for k, v in times.items()}
            out[name] = {
                "seconds": times,
                "median": medians,
                "warm_over_cold": round(medians["warm"] / medians["cold"], 3),
            }
            ratio = out[name]["warm_over_cold"]
            print(
                f"{name}: cold {medians['cold']:.2f} s, warm {medians['warm']:.2f} s "
                f"({ratio:.2f}x), off {medians['off']:.2f} s",
                flush=True,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    save("compile_cache", {"workdir": args.workdir, "rounds": args.rounds, "commands": out})


if __name__ == "__main__":
    main()
