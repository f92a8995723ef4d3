"""configs/small.py on a real corpus at several CPU budgets, from ONE training run.

    python benchmarks/small_recipe.py --corpus /tmp/corpus-enfr-87k --run /tmp/small \
        [--minutes 60] [--budgets 10,30,60] [--src en --tgt fr] [--set KEY=VALUE ...]
    python benchmarks/small_recipe.py --corpus ... --run /tmp/small --log RUN.log   (no training)
    python benchmarks/small_recipe.py --corpus ... --run /tmp/small --steps 2450,3000 (no training)

The corpus is what benchmarks/real_corpus.py writes (<corpus>/{train,dev,test}.{src,tgt}).
Training runs `python -m tx train --config configs/small.py` for --minutes (train.max_minutes)
with every step-spaced checkpoint kept, and time-stamps each line it prints (RUN.log, "EPOCH
line"). The learning-rate schedule does not depend on the number of steps, so the checkpoints a
run of B minutes would have saved are exactly those this run had saved B minutes after its start
(data preparation and compiling included, as train.max_minutes counts). For each budget their
last `decode.average_last` go into a workdir of their own (RUN-B/), and the user's commands run
there: `python -m tx average` and `python -m tx evaluate --split test --json`, each timed.
Printed and saved (benchmarks/results/small_recipe.json, or small_recipe_en-nl.json for a corpus
built with --pair en-nl, and so on): per budget the step reached, the minutes of training,
averaging and evaluating, test sacreBLEU, chrF, the paper's tokenized BLEU, the sentences with a
repetition loop, and the dev scores logged up to then (--name NAME: NAME.json instead, to keep
an earlier run's figures). --steps evaluates a finished run's windows ending at those steps
(by steps, not minutes: no log needed), each the same way.

Measured with nothing else running on the machine: other work on the cores slows the steps and
moves every budget's step back.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import save  # noqa: E402

STEP = re.compile(r"^(\d+) step (\d+)/\d+ \|")
DEV = re.compile(r"^(\d+) step (\d+): (dev loss .*|bleu .*)$")


def train(args) -> str:
    """Runs the training, time-stamping every line of its output into RUN.log; returns it."""
    log = args.run.rstrip("/") + ".log"
    c = args.corpus
    cmd = [
        sys.executable,
        "-m",
        "tx",
        "train",
        "--config",
        os.path.join(ROOT, "configs", "small.py"),
        "--workdir",
        args.run,
        f"--config.data.train_prefix={c}/train",
        f"--config.data.dev_prefix={c}/dev",
        f"--config.data.test_prefix={c}/test",
        f"--config.data.src_lang={args.src}",
        f"--config.data.tgt_lang={args.tgt}",
        f"--config.train.max_minutes={args.minutes}",
        "--config.train.num_steps=1000000",  # the budget stops it
        "--config.train.keep_checkpoints=100000",  # every budget's checkpoints stay
        "--config.train.early_stopping_patience=0",
        *(f"--config.{kv}" for kv in args.set),
    ]
    with open(log, "w") as out:
        out.write(f"{int(time.time())} started {' '.join(cmd)}\n")
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for line in proc.stdout:
            out.write(f"{int(time.time())} {line}")
            out.flush()
            print(line, end="")
        if proc.wait():
            raise SystemExit(f"training failed ({proc.returncode}); see {log}")
    return log


def timeline(log: str) -> tuple[int, list[tuple[int, int]], list[tuple[int, int, str]]]:
    """(start epoch, [(epoch, step) of each progress line], [(epoch, step, dev text)])."""
    with open(log, encoding="utf-8") as f:
        lines = f.read().splitlines()
    start = int(lines[0].split()[0])
    steps = [(int(m[1]), int(m[2])) for m in map(STEP.match, lines) if m]
    devs = [(int(m[1]), int(m[2]), m[3]) for m in map(DEV.match, lines) if m]
    return start, steps, devs


def budget_workdir(run: str, tag, step: int, every: int, last: int) -> str:
    """RUN-tag/ with the vocabulary, config and the `last` checkpoints up to `step`."""
    target = f"{run.rstrip('/')}-{tag}"
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(os.path.join(target, "checkpoints"))
    for name in ("spm.model", "vocab.sha256", "config.json"):
        shutil.copy(os.path.join(run, name), target)
    for k in range(last):
        s = step - k * every
        if s > 0:
            src = os.path.join(run, "checkpoints", str(s))
            shutil.copytree(src, os.path.join(target, "checkpoints", str(s)))
    return target


def tx(*argv) -> tuple[str, float]:
    started = time.time()
    out = subprocess.run(
        [sys.executable, "-m", "tx", *argv], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()[-1], time.time() - started


def evaluate_budget(run: str, minutes: int, start: int, steps, devs) -> dict:
    every = run_config(run)["train"]["checkpoint_every_steps"]
    reached = [s for t, s in steps if t <= start + 60 * minutes]
    if not reached:
        return {"minutes": minutes, "step": 0, "note": "no step within the budget"}
    step = reached[-1] // every * every  # the last step-spaced checkpoint by then
    dev = [f"step {s}: {text}" for t, s, text in devs if t <= start + 60 * minutes]
    return {"minutes": minutes, **evaluate_window(run, minutes, step), "dev": dev}


def dev_losses(run: str, step: int) -> list[str]:
    """The run's dev losses up to `step`, as its log words them, from its TensorBoard events."""
    from tx.train.events import read_scalars

    steps, losses = read_scalars(run)["dev/loss"]
    return [f"step {s}: dev loss {v:.3f}" for s, v in zip(steps, losses, strict=True) if s <= step]


def run_config(run: str) -> dict:
    with open(os.path.join(run, "config.json")) as f:
        return json.load(f)


def evaluate_window(run: str, tag, step: int) -> dict:
    """The user's `average` and `evaluate` on the last checkpoints up to `step`, in RUN-tag/."""
    cfg = run_config(run)
    every, last = cfg["train"]["checkpoint_every_steps"], cfg["decode"]["average_last"]
    workdir = budget_workdir(run, tag, step, every, last)
    averaged, avg_secs = tx("average", "--workdir", workdir)
    scores, eval_secs = tx("evaluate", "--workdir", workdir, "--split", "test", "--json")
    scores = json.loads(scores)
    return {
        "step": step,
        "averaged": json.loads(averaged)["steps"],
        "average_secs": round(avg_secs, 1),
        "evaluate_secs": round(eval_secs, 1),
        "test_bleu": round(scores["bleu"], 2),
        "test_chrf": round(scores["chrf"], 2),
        "test_tok_bleu": round(scores["tok_bleu"], 2),
        "repetition_loops": scores["repetition_loops"],
        "sentences": scores["num_sentences"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", required=True, help="benchmarks/real_corpus.py's --out")
    p.add_argument("--run", required=True, help="the training workdir")
    p.add_argument("--minutes", type=float, default=60, help="training budget of the run")
    p.add_argument("--budgets", default="10,30,60", help="minutes, comma-separated")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="fr")
    p.add_argument("--log", help="evaluate an earlier run from its time-stamped log")
    p.add_argument("--steps", help="evaluate an earlier run at these steps, comma-separated")
    p.add_argument(
        "--name", help="the results file's name (default small_recipe, or small_recipe_<pair>)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for the training run (repeatable), e.g. data.tokens_per_step=1024",
    )
    args = p.parse_args()
    rows = []
    if args.steps:  # each row with the dev losses up to its step, from the run's TensorBoard
        log, command = None, f"an earlier run: {args.run}/config.json"
        for step in (int(s) for s in args.steps.split(",")):
            rows.append(
                {**evaluate_window(args.run, f"s{step}", step), "dev": dev_losses(args.run, step)}
            )
            print(json.dumps(rows[-1]))
    else:
        log = args.log or train(args)
        start, steps, devs = timeline(log)
        for minutes in (int(b) for b in args.budgets.split(",")):
            rows.append(evaluate_budget(args.run, minutes, start, steps, devs))
            print(json.dumps(rows[-1]))
        with open(log, encoding="utf-8") as f:  # "EPOCH started COMMAND": its overrides
            command = f.readline().split(" started ", 1)[-1].strip()
    with open(os.path.join(args.corpus, "SOURCES.json")) as f:
        corpus = {k: v for k, v in json.load(f).items() if k in ("pair", "built_by", "splits")}
    corpus["copy_source_test_bleu"] = round(copy_bleu(args.run), 2)
    name = args.name or (
        "small_recipe" if corpus["pair"] == "en-fr" else f"small_recipe_{corpus['pair']}"
    )
    trained = run_config(args.run)["train"]  # what the run trained with, overrides included
    save(
        name, {"corpus": corpus, "log": log, "command": command, "train": trained, "budgets": rows}
    )


def copy_bleu(run: str) -> float:
    """sacreBLEU of "translating" the test set by copying its source: the floor to beat
    (tx.eval.evaluate.copy_baseline, on the run's own config)."""
    from tx.config import load_config
    from tx.eval.evaluate import copy_baseline

    return copy_baseline(load_config(os.path.join(run, "config.json")), "test")["bleu"]


if __name__ == "__main__":
    main()
