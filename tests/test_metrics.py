"""Scores: the paper's tokenized BLEU by hand (compound-split for German only); sacreBLEU;
checkpoint mean."""

import math
from collections import Counter

import pytest

from tx.eval.metrics import (
    bleu_by_length,
    repetition_loops,
    score_all,
    split_compounds,
    tok_bleu_recipe,
    token_bleu,
    tokenized_bleu,
)


def test_compound_split_matches_get_ende_bleu_perl():
    assert (
        split_compounds("Max-Planck-Institut in Baden-Baden")
        == "Max ##AT##-##AT## Planck ##AT##-##AT## Institut in Baden ##AT##-##AT## Baden"
    )
    # Perl's s///g resumes after each match, so single letters between hyphens keep one.
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"
    assert split_compounds("a - b") == "a - b"  # free-standing hyphens stay


def hand_bleu(hyp, ref, max_n=4):
    """multi-bleu.perl on one sentence pair of space-separated tokens."""
    h, r = hyp.split(), ref.split()
    logs = []
    for n in range(1, max_n + 1):
        hc = Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
        rc = Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1))
        match = sum(min(c, rc[g]) for g, c in hc.items())
        logs.append(math.log(match / max(len(h) - n + 1, 1)))
    bp = min(1.0, math.exp(1 - len(r) / len(h)))
    return 100 * bp * math.exp(sum(logs) / max_n)


def test_token_bleu_by_hand():
    hyp = "der kleine Hund sieht die große Katze im Garten"
    ref = "der kleine Hund sieht eine große Katze im Garten ."
    expected = hand_bleu(hyp, ref)
    # 1-grams 8/9, 2-grams 6/8, 3-grams 4/7, 4-grams 2/6, brevity exp(1 - 10/9)
    by_hand = 100 * math.exp(1 - 10 / 9) * (8 / 9 * 6 / 8 * 4 / 7 * 2 / 6) ** 0.25
    # BLEU in float64 three ways: ~10 roundings, logs and exps to 1 ulp, log-precision sums of
    # magnitude <= 18 inside exp: <= 1e-14 relative, 1e-12 absolute on scores <= 100.
    # Observed: 0 and 7.1e-15.
    assert expected == pytest.approx(by_hand, rel=1e-13)
    assert token_bleu([hyp], [ref]).score == pytest.approx(by_hand, abs=1e-12)


def test_paper_bleu_tokenizes_and_splits_compounds():
    hyp = ["Das Max-Planck-Institut liegt in Baden-Baden, sagte er."]
    ref = ["Das Max-Planck-Institut liegt in Baden-Baden, sagt er."]
    head = "Das Max ##AT##-##AT## Planck ##AT##-##AT## Institut liegt in Baden ##AT##-##AT## Baden"
    hyp_tok = head + " , sagte er ."
    ref_tok = head + " , sagt er ."
    # float64, as in test_token_bleu_by_hand: bound 1e-12; observed 2.8e-14
    assert tokenized_bleu(hyp, ref, "de") == pytest.approx(hand_bleu(hyp_tok, ref_tok), abs=1e-12)


def test_compounds_are_split_for_german_targets_only():
    hyp = ["Le porte-parole du ministère viendra demain à Paris."]
    ref = ["Le porte-avions du ministère viendra demain à Paris."]
    tail = " du ministère viendra demain à Paris ."
    # EN-DE (get_ende_bleu.sh): three tokens where other targets have one hyphenated word.
    de = hand_bleu("Le porte ##AT##-##AT## parole" + tail, "Le porte ##AT##-##AT## avions" + tail)
    # Any other target: Moses tokens and multi-bleu only; the hyphenated words simply differ.
    fr = hand_bleu("Le porte-parole" + tail, "Le porte-avions" + tail)
    assert abs(de - fr) > 1  # 70.2 vs 75.1
    # float64, as in test_token_bleu_by_hand: bound 1e-12; observed 1.4e-14 for both
    assert tokenized_bleu(hyp, ref, "de") == pytest.approx(de, abs=1e-12)
    assert tokenized_bleu(hyp, ref, "fr") == pytest.approx(fr, abs=1e-12)


def test_tok_bleu_recipe_names_the_split_only_for_german():
    assert tok_bleu_recipe("de") == (
        "sacremoses tokenizer.perl -l de (escape)"
        r" | compound split s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"
        " | multi-bleu (case-sensitive, no smoothing)"
    )
    assert tok_bleu_recipe("fr") == (
        "sacremoses tokenizer.perl -l fr (escape) | multi-bleu (case-sensitive, no smoothing)"
    )
    refs = ["Le chat dort.", "Il pleut."]
    assert score_all(refs, refs, "de")["tok_bleu_recipe"] == tok_bleu_recipe("de")
    fr = score_all(refs, refs, "fr")["tok_bleu_recipe"]
    assert fr == tok_bleu_recipe("fr") and "##AT##" not in fr and "split" not in fr


def test_score_all_reports_every_key():
    refs = ["Der Hund sieht die Katze.", "Ich weiß, dass er kommt."]
    out = score_all(refs, refs, "de", bootstrap=50)
    # exp(mean of four log(100.0)) in float64: logs to 1 ulp, three additions, exp to 1 ulp:
    # within 2e-13 of 100; observed 100.00000000000004 (bleu, tok_bleu) and 100.0 (chrF)
    assert out["bleu"] == pytest.approx(100.0, abs=1e-12)
    assert out["tok_bleu"] == pytest.approx(100.0, abs=1e-12)
    assert out["num_sentences"] == 2 and out["chrf"] == pytest.approx(100.0, abs=1e-12)
    assert out["bleu_signature"].startswith("nrefs:1|case:mixed")
    lo, hi = out["bleu_95ci"]
    # Exact: every resample of identical pairs has precisions exactly 100.0 and brevity 1, so
    # sacreBLEU computes the same float as for the whole set (observed: lo == bleu == hi).
    assert lo <= out["bleu"] <= hi


def test_bleu_by_length_buckets_by_source_words():
    sources = [" ".join(["w"] * n) for n in (3, 10, 11, 25, 61, 90)]
    refs = [
        "the cat sat on the mat today",
        "a b c d e f",
        "x y z w v u",
        "p q r s t u",
        "1 2 3 4 5",
        "k l m n o p",
    ]
    hyps = list(refs)
    hyps[2] = "completely different words here now ok"  # the 11-20 bucket scores 0
    got = bleu_by_length(sources, hyps, refs)
    assert [b["bucket"] for b in got] == ["1-10", "11-20", "21-30", "61+"]
    assert [b["sentences"] for b in got] == [2, 1, 1, 2]
    assert [b["max_words"] for b in got] == [10, 20, 30, None]
    assert [round(b["bleu"], 6) for b in got] == [100.0, 0.0, 100.0, 100.0]
    assert [b["bucket"] for b in bleu_by_length(sources, hyps, refs, width=7)] == [
        "1-7",
        "8-14",
        "22-28",
        "57-63",  # 61 words: the open bucket starts at the first bucket past 60
        "64+",
    ]
    with pytest.raises(ValueError, match="width"):
        bleu_by_length(sources, hyps, refs, width=0)


def test_repetition_loops_are_caught_in_words_and_inside_words():
    hyps = [
        "Supprimer --remove-remove-remove-remove-",  # inside a word
        "zu automatisch zu automatisch zu automatisch",  # words, the last one ending the line
        "Les lignes lignes sont",  # twice is not a loop
        "Patientez...",  # no letter in the stretch
        "1111 2222",
        "Mississippi",  # "ss" and "issi" come twice, not three times in a row
        "Ha ha ha !",  # the source says it too
        "Très très très bien",
    ]
    sources = ["Remove", "automatic", "The lines", "Wait...", "x", "y", "Ha ha ha!", "Very good"]
    assert repetition_loops(hyps, sources) == [0, 1, 7]


def test_score_all_counts_loops_only_with_sources():
    hyps, refs = ["a b a b a b", "c d"], ["a b", "c d"]
    assert "repetition_loops" not in score_all(hyps, refs, "en")
    assert score_all(hyps, refs, "en", sources=["a b", "c d"])["repetition_loops"] == 1
