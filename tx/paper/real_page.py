"""Table 3 at --scale real as a page (results/table3-real.md, by tx.paper.report): each row's
seeds grouped and judged against the base row's noise band (tx.paper.noise), its mean beside
the paper's figure, and the dev curves the cards keep."""

from __future__ import annotations

import statistics

from tx.paper.markdown import code_lines, pair, title
from tx.paper.noise import BANDS, CLASSES, COLUMNS, judge


def dev_curve(workdir: str) -> dict | None:
    """A run's dev perplexity at each evaluation, from its TensorBoard files (None: none)."""
    from tx.train.events import NoEvents, read_scalars

    try:
        steps, values = read_scalars(workdir).get("dev/perplexity", ((), ()))
    except NoEvents:
        return None
    return {"steps": [int(s) for s in steps], "dev_ppl": [float(v) for v in values]}


# The rows whose dev curves the picture shows: the base, one A row, one C row and big.
CURVES = ("base", "A1", "C3", "big")


def add_noise_and_corpus(data: dict, cards: list[dict]) -> None:
    """data["noise"] (`judged`) and data["corpus"] (the first card's record of it)."""
    data["noise"] = judged(data["rows"])
    corpora = [c["reproduce"]["corpus"] for c in cards if c.get("reproduce", {}).get("corpus")]
    data["corpus"] = corpora[0] if corpora else None


def picture(data: dict, path: str) -> str | None:
    """The dev perplexity curves of CURVES (their first seeds) as a PNG at `path`, where any
    has one; returns the path written."""
    curves = {
        e["row"]: e["dev_curve"]
        for e in data["rows"]
        if e["seed"] is None and e["row"] in CURVES and e.get("dev_curve")
    }
    if not curves:
        return None
    from tx.viz import plots

    fig = plots.new_figure(8, 4.5)
    ax = fig.subplots()
    for row, curve in curves.items():
        ax.plot(curve["steps"], curve["dev_ppl"], marker=".", label=row)
    ax.set(xlabel="step", ylabel="dev perplexity (per piece)", yscale="log")
    ax.set_title("Table 3, real scale: dev perplexity while training")
    ax.legend()
    return plots.save(fig, path)


def judged(entries: list[dict]) -> dict:
    """Table 3 at --scale real: each row's seeds grouped, judged against the base row's
    (tx.paper.noise); each row's first entry gets its classes."""

    groups, paper = {}, {}
    for e in entries:
        paper.setdefault(e["row"], e["paper"])
        values = groups.setdefault(e["row"], {ours: [] for ours, _, _ in COLUMNS.values()})
        if e["measured"].get("status") != "done":
            continue
        for ours, _, _ in COLUMNS.values():
            if e["measured"].get(ours) is not None:
                values[ours].append(e["measured"][ours])
    judged = judge(groups, paper)
    for e in entries:
        if e["seed"] is None:
            e["judged"] = judged["rows"].get(e["row"], {})
    return {"band": judged["band"], "seeds": {r: v for r, v in groups.items()}}


def markdown(data: dict) -> str:
    """Table 3 at --scale real: each row's mean over its seeds, its difference from the base
    row beside the paper's, and its class against the base row's seed-to-seed band."""

    noise, main = data["noise"], [e for e in data["rows"] if e["seed"] is None]
    band = noise["band"]
    base = noise["seeds"].get("base", {})
    lines = title(data, "variations of the base model (dev set), real scale")
    corpus = data.get("corpus") or {}
    lines += [
        "Real scale (configs/real.py): the paper's base divided evenly (d_model 128, d_ff 512, "
        "8 heads, 3+3 layers, post-LN, dropout 0.1, label smoothing 0.1, the paper's Adam and "
        "warm-up), each row's change kept in proportion, every row trained the same number of "
        "steps (big 3x), the last checkpoint evaluated as the paper's Table 3 does. Corpus: "
        + (
            f"{corpus.get('pair', '?')} from Debian's message catalogues, "
            f"{corpus.get('splits', {}).get('train', '?'):,} training pairs, "
            f"{corpus.get('splits', {}).get('dev', '?')} dev "
            f"(`{corpus.get('built_by', '?')}`; its SOURCES.json names every package)."
            if corpus
            else "not recorded."
        ),
        "",
    ]
    if band.get("ppl") is None or band.get("bleu") is None:
        lines += ["The band needs the base row under at least 2 seeds: not measured yet.", ""]
    else:
        lines += [
            f"Noise: the base row under {len(base['dev_ppl'])} seeds gave dev PPL "
            + ", ".join(f"{v:.3f}" for v in base["dev_ppl"])
            + " and BLEU "
            + ", ".join(f"{v:.2f}" for v in base["tok_bleu"])
            + f"; the band ({BANDS:g} standard deviations) is {band['ppl']:.3f} PPL and "
            f"{band['bleu']:.2f} BLEU. A row inside the band is within noise; one whose first "
            "seed fell inside 2 bands ran again under a second seed and is judged on its mean.",
            "",
        ]
        for column, what in (("ppl", "Dev PPL"), ("bleu", "Dev BLEU")):
            counts = {c: [] for c in CLASSES}
            for e in main:
                judged = e.get("judged", {}).get(column)
                if judged:
                    counts[judged["class"]].append(e["row"])
            lines.append(
                f"{what}: "
                + "; ".join(
                    f"{len(rows)} {c}" + (f" ({', '.join(rows)})" if rows and c != "agrees" else "")
                    for c, rows in counts.items()
                )
                + "."
            )
        lines.append("")
    header = (
        "| Row | Params (M) ours / paper | Seeds | Dev PPL ours / paper | dPPL ours / paper "
        "| PPL | Dev BLEU ours / paper | dBLEU ours / paper | BLEU | Steps | Status |"
    )
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    seeds = noise["seeds"]
    for e in main:
        lines.append(_row(e, seeds.get(e["row"], {}), data["rows"]))
    lines += [
        "",
        "Dev BLEU is tokenized (the paper's way); sacreBLEU and its signature are in the JSON. "
        "Dev PPL is per piece of the run's 4,000-piece vocabulary, the paper's per piece of its "
        "37k: compare differences from base, not values.",
        "",
        "† The paper leaves this row's params blank (the base model's size): 65 is inferred.",
    ]
    return "\n".join(lines + code_lines(data)) + "\n"


def _row(e: dict, seeds: dict, entries: list[dict]) -> str:

    m, p, j = e["measured"], e["paper"], e.get("judged", {})
    params = m.get("params")
    inferred = "†" if p.get("params_m_inferred") else ""
    ppl, bleu = seeds.get("dev_ppl", []), seeds.get("tok_bleu", [])
    mean = {k: statistics.fmean(v) if v else None for k, v in (("ppl", ppl), ("bleu", bleu))}
    if e["row"] == "base" and len(ppl) > 1:
        ppl_text = f"{mean['ppl']:.3f} ± {statistics.stdev(ppl):.3f} / {p.get('dev_ppl')}"
        bleu_text = f"{mean['bleu']:.2f} ± {statistics.stdev(bleu):.2f} / {p.get('dev_bleu')}"
    else:
        ppl_text = pair(mean["ppl"], p.get("dev_ppl"), ".3f")
        bleu_text = pair(mean["bleu"], p.get("dev_bleu"), ".2f")

    def diff(column, fmt):
        d = j.get(column)
        return "-" if not d else f"{d['difference']:+{fmt}} / {d['paper_difference']:+{fmt}}"

    runs = [x for x in entries if x["row"] == e["row"]]
    status = "; ".join(
        f"seed {x['seed'] or 0}: {x['measured']['status']}"
        for x in runs
        if x["measured"]["status"] != "done"
    )
    return (
        f"| {e['row']} | {pair(params and params / 1e6, p.get('params_m'), '.2f')}{inferred} "
        f"| {len(ppl)} | {ppl_text} | {diff('ppl', '.3f')} "
        f"| {j.get('ppl', {}).get('class', '-')} | {bleu_text} | {diff('bleu', '.2f')} "
        f"| {j.get('bleu', {}).get('class', '-')} | {m.get('steps', '-')} "
        f"| {status or 'done'} |"
    )
