"""tx.eval.evaluate's parsing path: parses scored against gold trees with EVALB's rules."""

import treebank

from tx.data import trees as parsing
from tx.eval.evaluate import parse_scores


def test_perfect_parses_score_100_and_broken_ones_are_repaired(tmp_path):
    gold = parsing.read_trees(treebank.write(tmp_path / "t.mrg", 40, seed=1))
    perfect = [parsing.linearize(t) for t in gold]
    scores = parse_scores(gold, perfect)
    assert scores["f1"] == 100.0 and scores["complete_match"] == 100.0
    assert scores["scored_sentences"] == scores["num_sentences"] == 40
    # Every closer dropped: the repair closes them at the end, so the words stay and the
    # bracket spans become nested to the right: some brackets are wrong, none is lost.
    broken = [" ".join(tok for tok in p.split() if not tok.startswith(")")) for p in perfect]
    repaired = parse_scores(gold, broken)
    assert repaired["scored_sentences"] == 40 and repaired["errors"] == 0
    assert 0 < repaired["f1"] < 100
