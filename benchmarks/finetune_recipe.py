"""Adapting a model to a new domain, measured: one base model trained on one domain, then each
way of adapting it to a little text of another, every model scored on both domains' test sets.

    python benchmarks/real_corpus.py --out corpora/software --exclude wesnoth   # interface text
    python benchmarks/real_corpus.py --out corpora/wesnoth --only wesnoth       # a game's story
    python benchmarks/finetune_recipe.py --old corpora/software --new corpora/wesnoth \
        --runs runs/finetune --pair en-fr [--base-steps 5000] [--arms base,scratch,...] \
        [--name finetune_recipe]

The arms (ARMS; --arms picks some, in this order; the base comes first, the others start from it
or from its vocabulary):
- base: configs/small.py on the old domain, --base-steps steps (no time budget), its last 5
  checkpoints averaged.
- scratch: configs/small.py on the new domain alone with the base's vocabulary, trained to its
  own early stop (3 dev evaluations without a better dev loss), its best checkpoint.
- naive: the base fine-tuned on the new domain with its own settings (configs/small.py's warm-up
  to its peak rate; `train.init_from`), to the same early stop, its best checkpoint.
- constant, mixed, recipe: configs/finetune.py (a low constant rate; the new domain's dev set
  stops it and chooses the checkpoint, the old one's logged beside it as dev2) on the new domain
  alone (constant), and with the old domain's text mixed in 1 : 1 (mixed); recipe is
  configs/finetune.py as committed, with its own mix (RECIPE_WEIGHTS).

Every arm is scored with `evaluate` (beam 4, sacreBLEU and chrF) on both test sets. The results
file (benchmarks/results/<name>.json) is written by this script after each arm, so that a
sitting that ends keeps what it finished; an arm already in it is skipped when the file's base
is this one (the sha256 of the base's averaged parameters: on the same machine and releases
training is bit for bit the same, so a later sitting that trains the base again finds it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common import RESULTS, environment  # noqa: E402

from tx.train import runcard  # noqa: E402

SMALL = os.path.join(ROOT, "configs", "small.py")
FINETUNE = os.path.join(ROOT, "configs", "finetune.py")
RECIPE_WEIGHTS = "(1, 1)"  # old : new for the recipe arm (configs/finetune.py's Command)
EARLY_STOP = ("--config.train.max_minutes=0", "--config.train.num_steps=20000")


def tx(*args: str) -> str:
    """`python -m tx ARGS`; its standard output (a failure stops the script, with its error)."""
    done = subprocess.run(
        [sys.executable, "-m", "tx", *args], capture_output=True, text=True, cwd=ROOT
    )
    if done.returncode:
        raise SystemExit(f"python -m tx {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def data(train: str, dev: str, pair: tuple[str, str]) -> list[str]:
    """The data overrides: training prefixes (several: comma-separated), dev and test."""
    return [
        "--config.data.source=text",
        f"--config.data.train_prefix={train}",
        f"--config.data.dev_prefix={dev}/dev",
        f"--config.data.test_prefix={dev}/test",
        f"--config.data.src_lang={pair[0]}",
        f"--config.data.tgt_lang={pair[1]}",
    ]


def arms(args) -> dict[str, tuple[str, list[str], str]]:
    """name -> (config, overrides, which checkpoint scores it)."""
    old, new, pair, base = args.old, args.new, args.pair, os.path.join(args.runs, "base")
    vocab = os.path.join(base, "spm.model")
    tuned = f"{FINETUNE}:{base}"
    watch = f"--config.data.dev2_prefix={old}/dev"
    mixed = [*data(f"{old}/train,{new}/train", new, pair), watch]
    return {
        "base": (
            SMALL,
            [*data(f"{old}/train", old, pair), f"--config.train.num_steps={args.base_steps}",
             "--config.train.max_minutes=0", "--config.train.early_stopping_patience=0"],
            "averaged",
        ),
        "scratch": (SMALL, [*data(f"{new}/train", new, pair), f"--config.data.vocab_path={vocab}",
                            *EARLY_STOP], "best"),
        "naive": (SMALL, [*data(f"{new}/train", new, pair), f"--config.train.init_from={base}",
                          *EARLY_STOP], "best"),
        "constant": (tuned, [*data(f"{new}/train", new, pair), watch], "best"),
        "mixed": (tuned, [*mixed, "--config.data.train_weights=(1, 1)"], "best"),
        "recipe": (tuned, [*mixed, f"--config.data.train_weights={RECIPE_WEIGHTS}"], "best"),
    }  # fmt: skip


def train_arm(workdir: str, config: str, overrides: list[str], which: str) -> dict:
    """Trains `workdir` (averaging its last 5 checkpoints for `which` = "averaged"); its steps
    and minutes, and the step the scored checkpoint holds."""
    started = time.time()
    tx("train", "--config", config, "--workdir", workdir, *overrides)
    if which == "averaged":
        tx("average", "--workdir", workdir)
    card = runcard.load(workdir)
    out = {
        "steps": runcard.totals(card)["steps"],
        "minutes": round((time.time() - started) / 60, 1),
    }
    if which == "best":
        out["best_step"] = card.get("early_stop", {}).get("best_step")
    return out


def scores(workdir: str, which: str, corpora: dict[str, str]) -> dict:
    """sacreBLEU and chrF of `workdir`'s `which` checkpoint on each corpus's test split."""
    out = {}
    for name, corpus in corpora.items():
        checkpoint = [] if which == "averaged" else ["--checkpoint", which]
        result = json.loads(
            tx(
                "evaluate", "--workdir", workdir, "--json", *checkpoint,
                f"--config.data.test_prefix={corpus}/test",
            ).strip().splitlines()[-1]
        )  # fmt: skip
        out[name] = {"bleu": round(result["bleu"], 2), "chrf": round(result["chrf"], 2)}
    return out


def base_sha256(base: str) -> str:
    """sha256 over the files of the base's newest average: which base the arms started from."""
    averaged = os.path.join(base, "averaged")
    newest = max(os.listdir(averaged), key=lambda d: int(d.split(".")[0]))
    h = hashlib.sha256()
    for folder, _, files in sorted(os.walk(os.path.join(averaged, newest))):
        for name in sorted(files):
            with open(os.path.join(folder, name), "rb") as f:
                h.update(name.encode() + f.read())
    return h.hexdigest()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="the base's domain: a corpus folder")
    p.add_argument("--new", required=True, help="the new domain's corpus folder")
    p.add_argument("--runs", required=True, help="folder for the arms' runs")
    p.add_argument("--pair", default="en-fr", help="SRC-TGT (default en-fr)")
    p.add_argument("--base-steps", type=int, default=5000)
    p.add_argument("--arms", default=",".join(["base", "scratch", "naive", "constant", "mixed",
                                                 "recipe"]))  # fmt: skip
    p.add_argument("--name", default="finetune_recipe", help="the results file's name")
    args = p.parse_args()
    args.pair = tuple(args.pair.split("-"))
    table, chosen = arms(args), ["base", *[a for a in args.arms.split(",") if a != "base"]]
    unknown = [a for a in chosen if a not in table]
    if unknown:
        raise SystemExit(f"unknown arms {unknown}: choose from {list(table)}")
    path = os.path.join(RESULTS, f"{args.name}.json")
    corpora = {"old domain": args.old, "new domain": args.new}
    result = run_arms(args, table, chosen, corpora, path)
    print(json.dumps(result["arms"], indent=2))


def run_arms(args, table, chosen, corpora, path) -> dict:
    """Trains and scores each chosen arm (the base first), keeping an arm the results file
    holds for this same base; the file is rewritten after each arm."""
    found = json.load(open(path)) if os.path.exists(path) else {"arms": {}}
    result = {
        "command": " ".join(["python", "benchmarks/finetune_recipe.py", *sys.argv[1:]]),
        "corpora": {k: _sources(v) for k, v in corpora.items()},
        "arms": {},
    }
    for name in chosen:
        config, overrides, which = table[name]
        same_base = found.get("base_sha256") == result.get("base_sha256", "")
        if name != "base" and same_base and name in found["arms"]:
            print(f"{name}: kept from {path} (the same base)", flush=True)
            result["arms"][name] = found["arms"][name]
            continue
        workdir = os.path.join(args.runs, name)
        entry = train_arm(workdir, config, overrides, which)  # a finished run: returns at once
        if name == "base":
            result["base_sha256"] = base_sha256(workdir)
            if found.get("base_sha256") == result["base_sha256"] and "base" in found["arms"]:
                result["arms"]["base"] = found["arms"]["base"]  # its first sitting's minutes
                continue
        entry.update(config=os.path.relpath(config.split(":")[0], ROOT), overrides=overrides)
        entry.update(scored=which, test=scores(workdir, which, corpora))
        print(name, json.dumps(entry["test"]), flush=True)
        result["arms"][name] = entry
        result["environment"] = environment()
        with open(path + ".tmp", "w") as f:
            json.dump(result, f, indent=2)
        os.replace(path + ".tmp", path)
    return result


def _sources(corpus: str) -> dict:
    """The corpus's SOURCES.json summary: how it was built and its split sizes."""
    with open(os.path.join(corpus, "SOURCES.json")) as f:
        s = json.load(f)
    return {"built_by": s.get("built_by"), "splits": s.get("splits")}


if __name__ == "__main__":
    main()
