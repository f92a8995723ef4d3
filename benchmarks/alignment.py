"""Which decoder layer's cross-attention aligns words best: measured on the demo test set.

    python benchmarks/alignment.py --workdir runs/demo     (a trained demo workdir)

The reference translations are force-decoded (teacher forcing), so every layer is judged on
the same target words. Gold links come from the demo corpus's own lexicon (tx.data.demo_corpus:
nouns, adjective stems with their endings, verb forms, pronouns, months, numbers, ordinals and
years as words, prepositions, time words): a German word is linked right when the English word
it is aligned to is one the lexicon gives for it. Articles (der/die/das/ein/mein..., "the", "a",
"my") are left out: a sentence often has two "the" and the lexicon cannot say which is meant.
Two readings of a decoder row are scored: row t (the position that produces target piece t, as
tx.infer.alignment uses) and row t + 1 (the position that reads piece t as its input).
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import save  # noqa: E402

from tx import workdir as wd  # noqa: E402
from tx.config import load_config  # noqa: E402
from tx.data import demo_corpus as dc  # noqa: E402
from tx.data.dataset import split_text  # noqa: E402
from tx.infer.alignment import (  # noqa: E402
    align_pair,
    batch_pieces,
    padded_batches,
    pharaoh,
)
from tx.infer.attention_maps import attention_weights  # noqa: E402
from tx.infer.translate import load_model, translate_ids  # noqa: E402

EXAMPLE = ("Today, she needs the boat.", "Heute braucht sie das Boot.")


def _clean(word: str) -> str:
    return word.strip(".,").lower()


def lexicon() -> dict[str, set[str]]:
    """German word (lower case, no punctuation) -> the English words it translates."""
    lex: dict[str, set[str]] = {}

    def add(de, *en):
        lex.setdefault(_clean(de), set()).update(_clean(e) for e in en)

    for en_sg, en_pl, de_sg, de_pl, _ in dc.NOUNS:
        add(de_sg, en_sg)
        add(de_pl, en_pl)
        add(de_pl + "n", en_pl)
    for en, stem in dc.ADJECTIVES:
        for ending in ("e", "en", "er", "es"):
            add(stem + ending, en)
    pasts = set()
    for verb in dc.VERBS:
        for de in verb[4:]:
            add(de, *verb[:4])
        pasts.update(verb[2:4])
    for de in dc.HAVE.values():
        add(de, *pasts)  # "hat ... gesehen": the auxiliary belongs to "saw" too
    for en, de, _ in dc.PRONOUNS:
        add(de, en)
    for en, de in dc.REPORTERS:
        for e, d in zip(en.split(), de.split(), strict=True):
            add(d, e)
    lex["weiß"] = {"know"}  # "ich weiß": attributive "white" always has an ending
    for en, de in dc.MONTHS:
        add(de, en)
    for n in dc._COUNTS:
        add(dc._NUM_DE[n], *dc._NUM_EN[n].split())
    for en, de in dc._YEARS.values():
        add(de, *en.split())
    for d in dc._ORD_EN:
        add(dc._ORD_DE_DAT[d], dc._ORD_EN[d])
    for de, en in (("heute", "today"), ("morgen", "tomorrow"), ("jetzt", "now")):
        add(de, en)
    for de, en in (("gestern", "yesterday"), ("dass", "that"), ("mit", "with"), ("von", "from")):
        add(de, en)
    add("am", "on")
    add("im", "in")
    return lex


def gold(lex, source: str, target: str) -> dict[int, set[int]]:
    """Target word index -> the source word indices that are right for it."""
    src = [_clean(w) for w in source.split()]
    out = {}
    for j, word in enumerate(target.split()):
        w = _clean(word)
        right = lex.get(w, set()) | ({w} if any(c.isdigit() for c in w) else set())
        ok = {i for i, s in enumerate(src) if s in right}
        if ok:
            out[j] = ok
    return out


def diagonal(pairs, golds) -> float:
    """The baseline of no attention at all: target word j -> source word j * S / T."""
    right = 0
    for (s, t), g in zip(pairs, golds, strict=True):
        n_s, n_t = len(s.split()), len(t.split())
        right += sum(min(n_s - 1, round(j * n_s / n_t)) in ok for j, ok in g.items())
    return round(right / sum(len(g) for g in golds), 4)


def score_layers(loaded, pairs, lex):
    """{"row t": [accuracy per layer], "row t+1": [...]} and the number of gold words."""
    tok = loaded.tokenizer
    ids = [(tok.encode(s)[:-1], tok.encode(t)[:-1]) for s, t in pairs]
    golds = [gold(lex, s, t) for s, t in pairs]
    layers = loaded.model.config.num_decoder_layers
    right = {"row t": np.zeros(layers), "row t+1": np.zeros(layers)}
    total = sum(len(g) for g in golds)
    for idx, inputs, targets in padded_batches(ids):
        _, _, cross = attention_weights(loaded.model, loaded.params, inputs, targets)
        src_p, tgt_p = batch_pieces(tok, inputs), batch_pieces(tok, targets)
        for r, i in enumerate(idx):
            s, t = len(src_p[r]), len(tgt_p[r])
            for layer in range(layers):
                rows = cross[r, layer].mean(0)[:t, :s]  # [t, s]
                shifted = np.concatenate([rows[1:], rows[-1:]])  # the EOS row is dropped anyway
                for name, att in (("row t", rows), ("row t+1", shifted)):
                    links = align_pair(att, src_p[r], tgt_p[r])
                    right[name][layer] += sum(i_ in golds[i].get(j, ()) for i_, j in links)
    accuracy = {k: [round(float(v / total), 4) for v in vals] for k, vals in right.items()}
    accuracy["diagonal baseline"] = diagonal(pairs, golds)
    return accuracy, total


def example(loaded, cfg):
    """The issue's sentence: its translation and each layer's links, force-decoded and not."""
    tok = loaded.tokenizer
    src_ids = tok.encode(EXAMPLE[0])
    hyp = translate_ids(loaded, [np.asarray(src_ids, np.int32)], cfg.decode, (16, 32, 48))
    hyp_ids = hyp[0][0][0].tolist()
    out = {"source": EXAMPLE[0], "reference": EXAMPLE[1], "translation": tok.decode(hyp_ids)}
    for name, tgt_ids in (("forced", tok.encode(EXAMPLE[1])[:-1]), ("translated", hyp_ids)):
        [(_, inputs, targets)] = padded_batches([(src_ids[:-1], tgt_ids)])
        _, _, cross = attention_weights(loaded.model, loaded.params, inputs, targets)
        src_p, tgt_p = batch_pieces(tok, inputs)[0], batch_pieces(tok, targets)[0]
        out[name] = [
            pharaoh(align_pair(cross[0, k].mean(0)[: len(tgt_p), : len(src_p)], src_p, tgt_p))
            for k in range(cross.shape[1])
        ]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default="runs/demo")
    args = p.parse_args()
    cfg = load_config(wd.config_file(args.workdir))
    loaded = load_model(cfg, args.workdir)
    pairs = split_text(cfg.data, "test")
    accuracy, words = score_layers(loaded, pairs, lex := lexicon())
    covered = words / sum(len(t.split()) for _, t in pairs)
    save(
        "alignment",
        {
            "workdir": args.workdir,
            "checkpoint": loaded.source,
            "sentences": len(pairs),
            "gold_words": words,
            "gold_coverage_of_target_words": round(covered, 4),
            "accuracy_by_layer": accuracy,
            "example": example(loaded, cfg),
            "lexicon_entries": len(lex),
        },
    )


if __name__ == "__main__":
    main()
