"""Cold against warm: what keeping compiled programs (tx.cli.compile_cache) saves the commands
users wait on, each a process of its own as a user starts it.

    make demo     # runs/demo, once
    python benchmarks/compile_cache.py [--workdir runs/demo] [--rounds 3]

Per command, each round runs it with an empty cache (cold), then again on what that run kept
(warm), and once with the cache off; the medians of the wall times are printed and saved
(benchmarks/results/compile_cache.json). The commands: `translate` of one sentence, `evaluate`
of the test split, and `train` resumed from the run's last checkpoint for one step (on a copy of
the run each time), timed twice: until its first step's progress line (what a user waits for
after a restart) and whole (with the final evaluation and checkpoint). Nothing else should run
on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import os
import re
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


def timed(args: list[str], cache: str, stdin: str = "") -> tuple[float, float | None]:
    """(seconds `python -m tx ARGS` took with TX_COMPILATION_CACHE=`cache`, seconds until its
    first training step's progress line, or None where it prints none)."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["TX_COMPILATION_CACHE"] = cache
    started = time.perf_counter()
    first_step, lines = None, []
    with subprocess.Popen(
        [sys.executable, "-m", "tx", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
    ) as proc:  # fmt: skip
        proc.stdin.write(stdin)
        proc.stdin.close()
        for line in proc.stdout:
            if first_step is None and STEP.match(line):
                first_step = time.perf_counter() - started
            lines.append(line)
    seconds = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"python -m tx {' '.join(args)} failed:\n{''.join(lines)[-3000:]}")
    return seconds, first_step


STEP = re.compile(r"step \d+/\d+ \|")  # a progress line (tx.train.monitor)


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


def summary(name: str, times: dict) -> dict:
    """The seconds of each kind, their medians and warm / cold, printed."""
    medians = {k: statistics.median(v) for k, v in times.items()}
    ratio = round(medians["warm"] / medians["cold"], 3)
    print(
        f"{name}: cold {medians['cold']:.2f} s, warm {medians['warm']:.2f} s ({ratio:.2f}x), "
        f"off {medians['off']:.2f} s",
        flush=True,
    )
    return {"seconds": times, "median": medians, "warm_over_cold": ratio}


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
            to_step = {"cold": [], "warm": [], "off": []}
            for _ in range(args.rounds):
                cache = tempfile.mkdtemp(dir=scratch)
                for kind, where in (("cold", cache), ("warm", cache), ("off", "off")):
                    line, stdin = command()
                    seconds, first_step = timed(line, where, stdin)
                    times[kind].append(round(seconds, 2))
                    if first_step is not None:
                        to_step[kind].append(round(first_step, 2))
            out[name] = summary(name, times)
            if to_step["cold"]:
                out[f"{name}: until its first step"] = summary("  until its first step", to_step)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    save("compile_cache", {"workdir": args.workdir, "rounds": args.rounds, "commands": out})


if __name__ == "__main__":
    main()
