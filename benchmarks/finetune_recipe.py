"""Fine-tuning measured: a model trained on one domain, then trained on a little text of
another from its parameters (`train.init_from`), against a model trained on that little text
alone for the same steps; every model scored on both domains' test sets.

    python benchmarks/real_corpus.py --out corpora/software --exclude wesnoth   # interface text
    python benchmarks/real_corpus.py --out corpora/wesnoth --only wesnoth       # a game's story
    python benchmarks/finetune_recipe.py --base corpora/software --new corpora/wesnoth \
        --runs runs/finetune [--config small] [--base-steps 2000] [--steps 400] \
        [--set KEY=VALUE ...]

Each model is --config (configs/small.py) by steps (no time budget: train.max_minutes=0), its last 5
checkpoints averaged, and scored with `evaluate` (beam 4, sacreBLEU and chrF) on the test split
of each corpus. Results: benchmarks/results/finetune_recipe.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common import RESULTS, environment  # noqa: E402


def tx(*args: str) -> str:
    """`python -m tx ARGS`; its standard output (a failure stops the script, with its error)."""
    done = subprocess.run(
        [sys.executable, "-m", "tx", *args], capture_output=True, text=True, cwd=ROOT
    )
    if done.returncode:
        raise SystemExit(f"python -m tx {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def data(corpus: str, src: str, tgt: str) -> list[str]:
    return [
        "--config.data.source=text",
        f"--config.data.train_prefix={corpus}/train",
        f"--config.data.dev_prefix={corpus}/dev",
        f"--config.data.test_prefix={corpus}/test",
        f"--config.data.src_lang={src}",
        f"--config.data.tgt_lang={tgt}",
    ]


def train(workdir: str, corpus: str, steps: int, args, *extra: str) -> float:
    """Trains `workdir` for `steps` steps and averages its last 5 checkpoints; seconds."""
    started = time.time()
    tx(
        "train", "--config", args.config, "--workdir", workdir,
        *data(corpus, args.src, args.tgt),
        f"--config.train.num_steps={steps}", "--config.train.max_minutes=0",
        "--config.train.early_stopping_patience=0",
        *(f"--config.{s}" for s in args.set), *extra,
    )  # fmt: skip
    tx("average", "--workdir", workdir)
    return round(time.time() - started, 1)


def scores(workdir: str, corpora: dict[str, str]) -> dict:
    """sacreBLEU and chrF of `workdir` on each corpus's test split."""
    out = {}
    for name, corpus in corpora.items():
        result = json.loads(
            tx(
                "evaluate", "--workdir", workdir, "--json",
                f"--config.data.test_prefix={corpus}/test",
            ).strip().splitlines()[-1]
        )  # fmt: skip
        out[name] = {"bleu": round(result["bleu"], 2), "chrf": round(result["chrf"], 2)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the first domain's corpus (prefix folder)")
    p.add_argument("--new", required=True, help="the second domain's corpus")
    p.add_argument("--runs", required=True, help="folder for the three runs")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="fr")
    p.add_argument("--config", default="small", help="the recipe every model is trained with")
    p.add_argument("--base-steps", type=int, default=2000)
    p.add_argument("--steps", type=int, default=400, help="steps on the second domain")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    corpora = {"base domain": args.base, "new domain": args.new}
    base, tuned, alone = (os.path.join(args.runs, n) for n in ("base", "finetuned", "new_only"))
    result = {"command": " ".join(["python", "benchmarks/finetune_recipe.py", *sys.argv[1:]])}
    result["config"] = args.config
    result["base"] = {
        "steps": args.base_steps,
        "seconds": train(base, args.base, args.base_steps, args),
    }
    result["base"]["test"] = scores(base, corpora)
    print("base", result["base"], flush=True)
    seconds = train(tuned, args.new, args.steps, args, f"--config.train.init_from={base}")
    result["finetuned"] = {"steps": args.steps, "seconds": seconds, "test": scores(tuned, corpora)}
    print("finetuned", result["finetuned"], flush=True)
    # From scratch the vocabulary is the base model's as well, so only the start differs.
    vocab = os.path.join(base, "spm.model")
    seconds = train(alone, args.new, args.steps, args, f"--config.data.vocab_path={vocab}")
    result["new_only"] = {"steps": args.steps, "seconds": seconds, "test": scores(alone, corpora)}
    print("new only", result["new_only"], flush=True)
    result["environment"] = environment()
    with open(os.path.join(RESULTS, "finetune_recipe.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
