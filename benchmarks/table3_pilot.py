"""The pilot of Table 3 at --scale real: one warm-up chosen on the base row, then one long base
run whose dev-perplexity curve says how many steps every row trains.

    python benchmarks/real_corpus.py --out R/corpus --pair en-nl --train-pairs 15000
    python benchmarks/table3_pilot.py --root R [--warmups 200,400,800] [--arm-steps 800] \
        [--pilot-steps 6000]

1. Warm-up: the base row (configs/real.py) trained --arm-steps steps with each of --warmups;
   the one with the lowest dev perplexity at the end is chosen (configs/real.py's WARMUP must
   then say so: the script prints whether it does).
2. Pilot: the base row with that warm-up, --pilot-steps steps, dev perplexity 20 times.
   "Flattened" is the first evaluated step s whose dev perplexity differs by under 2% from the
   one at 0.8 s (its last fifth): every row of a 100k-step budget trains that many steps, big 3x.
   If the curve never flattens the script says so: run it again with more --pilot-steps (the
   pilot resumes, its schedule does not depend on its length).

Runs go to R/table3-real-pilot/ and resume when the script is run again. Writes
tx/paper/table3_real_pilot.json (package data: `reproduce --plan` reads it) and
docs/table3_real_pilot.png (the curve). Never run
it beside the test suite or another benchmark: its step times are the plan's.
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

RESULTS = os.path.join(ROOT, "tx", "paper", "table3_real_pilot.json")
PICTURE = os.path.join(ROOT, "docs", "table3_real_pilot.png")
FLAT = 0.02  # dev perplexity's change over the curve's last fifth, at most
TAG = "dev/perplexity"


def spec(corpus: str, steps: int) -> str:
    return f"configs/real.py:table3.py:base,corpus={corpus},steps={steps}"


def train(workdir: str, corpus: str, steps: int, warmup: int) -> dict:
    """Trains (or resumes) one base run to `steps`; returns its run card."""
    from tx.train import runcard

    card = runcard.load(workdir) or {}
    if card.get("totals", {}).get("steps") != steps:
        cmd = [sys.executable, "-m", "tx", "train", "--config", spec(corpus, steps)]
        cmd += ["--workdir", workdir, f"--config.optim.warmup_steps={warmup}"]
        print("$", " ".join(cmd), flush=True)
        env = {**os.environ, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
        subprocess.run(cmd, cwd=ROOT, env=env, check=True)
        card = runcard.load(workdir)
    return card


def curve(workdir: str) -> tuple[list[int], list[float]]:
    from tx.train.events import read_scalars

    steps, values = read_scalars(workdir)[TAG]
    return [int(s) for s in steps], [float(v) for v in values]


def seconds_per_step(card: dict) -> float:
    """Wall seconds of training (dev evaluations and checkpoints included) per step."""
    segs = [s for s in card["segments"] if s["end_step"] > s["start_step"]]
    return sum(s["wall_secs"] for s in segs) / sum(s["end_step"] - s["start_step"] for s in segs)


def flattened(steps: list[int], ppl: list[float]) -> int | None:
    """The first evaluated step s whose perplexity is within FLAT of the one at 0.8 s (the
    evaluation at or before it); None if none is."""
    for i, s in enumerate(steps):
        earlier = [j for j in range(i) if steps[j] <= 0.8 * s]
        if earlier and abs(ppl[i] - ppl[earlier[-1]]) / ppl[earlier[-1]] < FLAT:
            return s
    return None


def picture(arms: dict, pilot: dict, flat: int | None) -> str:
    from tx.viz import plots

    fig = plots.new_figure(8, 4.5)
    ax = fig.subplots()
    ax.plot(pilot["steps"], pilot["dev_ppl"], "o-", label=f"pilot (warm-up {pilot['warmup']})")
    for w, arm in arms.items():
        ax.plot(arm["steps"], arm["dev_ppl"], "--", alpha=0.6, label=f"warm-up {w}")
    if flat:
        ax.axvline(flat, color="grey", linestyle=":", label=f"flattened: step {flat}")
    ax.set(xlabel="step", ylabel="dev perplexity (per piece)", yscale="log")
    ax.set_title("Table 3, real scale: the base row's pilot (EN-NL)")
    ax.legend()
    return plots.save(fig, PICTURE)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", required=True, help="holds corpus/; the runs go under it")
    p.add_argument("--warmups", default="200,400,800")
    p.add_argument("--arm-steps", type=int, default=800)
    p.add_argument("--pilot-steps", type=int, default=6000)
    args = p.parse_args(argv)
    corpus = os.path.join(os.path.abspath(args.root), "corpus")
    if not os.path.exists(os.path.join(corpus, "SOURCES.json")):
        p.error(f"{corpus}/SOURCES.json is missing: build the corpus first (the docstring)")
    runs = os.path.join(os.path.abspath(args.root), "table3-real-pilot")
    start = time.time()
    arms = {}
    for w in (int(x) for x in args.warmups.split(",")):
        workdir = os.path.join(runs, f"warmup-{w}")
        card = train(workdir, corpus, args.arm_steps, w)
        steps, ppl = curve(workdir)
        arms[w] = dict(workdir=workdir, steps=steps, dev_ppl=ppl, final_dev_ppl=ppl[-1])
        arms[w]["seconds_per_step"] = seconds_per_step(card)
        print(f"warm-up {w}: dev perplexity {ppl[-1]:.2f} at step {steps[-1]}", flush=True)
    chosen = min(arms, key=lambda w: arms[w]["final_dev_ppl"])
    workdir = os.path.join(runs, "pilot")
    card = train(workdir, corpus, args.pilot_steps, chosen)
    steps, ppl = curve(workdir)
    flat = flattened(steps, ppl)
    from configs import real

    with open(os.path.join(corpus, "SOURCES.json"), encoding="utf-8") as f:
        sources = json.load(f)
    pilot = dict(workdir=workdir, warmup=chosen, steps=steps, dev_ppl=ppl)
    pilot["seconds_per_step"] = seconds_per_step(card)
    result = {
        "what": "Table 3 at --scale real: warm-up chosen on the base row, then the pilot",
        "command": "python benchmarks/table3_pilot.py " + " ".join(argv or sys.argv[1:]),
        "corpus": {"built_by": sources["built_by"], "splits": sources["splits"]},
        "train_pairs_kept": card["data"]["splits"]["train"],
        "vocab_size": card["config"]["data"]["vocab_size"],
        "tokens_per_step": card["config"]["data"]["tokens_per_step"],
        "warmup_arms": {str(w): a for w, a in arms.items()},
        "chosen_warmup": chosen,
        "configs_real_warmup": real.WARMUP,
        "pilot": pilot,
        "flat_rule": f"first step s with |ppl(s) - ppl(<=0.8 s)| / ppl(<=0.8 s) < {FLAT}",
        "flattened_at": flat,
        "configs_real_steps": real.STEPS,
        "hardware": card["segments"][-1]["hardware"],
        "commit": card["segments"][-1].get("commit"),
        "script_seconds": round(time.time() - start, 1),
    }
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS + ".tmp", "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    os.replace(RESULTS + ".tmp", RESULTS)
    print(f"wrote {RESULTS} and {picture(arms, pilot, flat)}")
    print(f"warm-up chosen: {chosen} (configs/real.py WARMUP = {real.WARMUP})")
    if flat is None:
        print(f"not flattened in {steps[-1]} steps: run again with a larger --pilot-steps")
        return 1
    print(f"flattened at step {flat} (configs/real.py STEPS = {real.STEPS})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
