"""Scores: the paper's tokenized, compound-split BLEU by hand; sacreBLEU; checkpoint mean."""

import math
from collections import Counter

import jax.numpy as jnp
import numpy as np
import pytest

from tx.checkpoint import average_params
from tx.evaluate import score_all, split_compounds, token_bleu, tokenized_bleu


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
    assert expected == pytest.approx(by_hand)
    assert token_bleu([hyp], [ref]).score == pytest.approx(by_hand, abs=1e-6)


def test_paper_bleu_tokenizes_and_splits_compounds():
    hyp = ["Das Max-Planck-Institut liegt in Baden-Baden, sagte er."]
    ref = ["Das Max-Planck-Institut liegt in Baden-Baden, sagt er."]
    head = "Das Max ##AT##-##AT## Planck ##AT##-##AT## Institut liegt in Baden ##AT##-##AT## Baden"
    hyp_tok = head + " , sagte er ."
    ref_tok = head + " , sagt er ."
    assert tokenized_bleu(hyp, ref, "de") == pytest.approx(hand_bleu(hyp_tok, ref_tok), abs=1e-6)


def test_score_all_reports_every_key():
    refs = ["Der Hund sieht die Katze.", "Ich weiß, dass er kommt."]
    out = score_all(refs, refs, "de", bootstrap=50)
    assert out["bleu"] == pytest.approx(100.0) and out["tok_bleu"] == pytest.approx(100.0)
    assert out["num_sentences"] == 2 and out["chrf"] == pytest.approx(100.0)
    assert out["bleu_signature"].startswith("nrefs:1|case:mixed")
    lo, hi = out["bleu_95ci"]
    assert lo <= out["bleu"] <= hi + 1e-9


def test_averaging_two_checkpoints_is_the_arithmetic_mean():
    a = {"w": jnp.array([1.0, 2.0]), "b": {"x": jnp.array([[0.5]], jnp.bfloat16)}}
    b = {"w": jnp.array([3.0, -2.0]), "b": {"x": jnp.array([[1.5]], jnp.bfloat16)}}
    mean = average_params([a, b])
    np.testing.assert_allclose(np.asarray(mean["w"]), [2.0, 0.0])
    assert mean["b"]["x"].dtype == jnp.bfloat16 and float(mean["b"]["x"][0, 0]) == 1.0
