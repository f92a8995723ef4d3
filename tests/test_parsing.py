"""Parsing (Table 4): PTB reading, the Vinyals et al. linearization and its repairing inverse,
and the EVALB (COLLINS.prm) bracket scorer against hand-worked counts."""

import os
import random
import subprocess

import pytest

from tx.data.sources import text_split
from tx.data.trees import (
    SLOT,
    Tree,
    delinearize,
    linearize,
    normalize,
    parse_trees,
    read_trees,
    tags,
    to_pairs,
    words,
    write_pairs,
)
from tx.eval.evalb import bracket_f1, score_sentence, summarize


def tree(text: str) -> Tree:
    """One tree as written (no normalization)."""
    (only,) = parse_trees(text)
    return only


def norm(text: str) -> Tree:
    return normalize(tree(text))


def assert_valid(t: Tree) -> None:
    """Root is a phrase; every phrase holds at least one node; every word sits under a POS."""
    assert not t.is_preterminal
    stack = [t]
    while stack:
        node = stack.pop()
        assert isinstance(node, Tree) and node.children
        if not node.is_preterminal:
            assert all(isinstance(c, Tree) for c in node.children)
            stack.extend(node.children)


def retag(t: Tree, tag: str) -> Tree:
    """`t` with every POS tag replaced by `tag`."""
    if t.is_preterminal:
        return Tree(tag, t.children)
    return Tree(t.label, tuple(retag(c, tag) for c in t.children))


# ----------------------------------------------------------------------------- reading

MRG = """*x*                                                                  *x*
*x*            Copyright (C) 1990 University of Pennsylvania           *x*

( (S
    (NP-SBJ-1 (DT The) (NN cat) )
    (VP (VBD sat)
      (NP (-NONE- *T*-1) ))
    (. .) ))
( (S (NP-SBJ (PRP He) ) (VP (VBD left) ) (. .) ))
(ROOT (S (NP (NNP John)) (VP (VBZ runs))))
"""


def test_reads_multiline_mrg_and_one_tree_per_line_skipping_headers():
    trees = parse_trees(MRG)
    assert len(trees) == 3
    assert trees[0].label == "" and trees[2].label == "ROOT"
    assert [words(t) for t in trees][1] == ["He", "left", "."]


def test_none_elements_removed_and_emptied_phrases_pruned():
    raw = "(S (NP-SBJ (-NONE- *)) (VP (VBD left) (SBAR (-NONE- 0) (S (-NONE- *T*-1)))) (. .))"
    # SBAR holds only -NONE- (directly and through S), NP-SBJ only one: all three vanish.
    assert str(norm(raw)) == "(S (VP (VBD left)) (. .))"


def test_function_tags_and_indices_stripped_pos_tags_kept():
    raw = (
        "(S-TPC-1 (NP-SBJ-1 (-LRB- -LRB-) (NNP Bo) (-RRB- -RRB-)) (VP=2 (VBD ran) "
        "(ADVP-LOC-CLR (RB here))) (: --))"
    )
    t = norm(raw)
    assert str(t) == (
        "(S (NP (-LRB- -LRB-) (NNP Bo) (-RRB- -RRB-)) (VP (VBD ran) (ADVP (RB here))) (: --))"
    )
    assert tags(t) == ["-LRB-", "NNP", "-RRB-", "VBD", "RB", ":"]


@pytest.mark.parametrize("wrapper", ["( {} )", "(ROOT {})", "(TOP {})", "(TOP (ROOT {}))"])
def test_root_wrappers_removed(wrapper):
    inner = "(S (NP (PRP It)) (VP (VBZ works)))"
    assert normalize(tree(wrapper.format(inner))) == tree(inner)


def test_root_with_several_phrases_or_a_bare_word_becomes_top():
    t = norm("( (NP (NN title)) (. .) (NP (NN subtitle)) )")
    assert t.label == "TOP" and len(t.children) == 3
    assert str(norm("(NN word)")) == str(norm("( (NN word) )")) == "(TOP (NN word))"


def test_malformed_gold_raises():
    with pytest.raises(ValueError, match="never closed"):
        parse_trees("(S (NP (DT a))")
    with pytest.raises(ValueError, match="no open bracket"):
        parse_trees("(S (NP (DT a))))")
    with pytest.raises(ValueError, match="one word or phrases"):
        parse_trees("(NP a b)")


def test_read_trees_from_files(tmp_path):
    first, second = tmp_path / "wsj_0001.mrg", tmp_path / "wsj_0002.mrg"
    first.write_text(MRG)
    second.write_text("(TOP (S (NP (PRP We)) (VP (VBD won))))\n")
    trees = read_trees([str(first), str(second)])
    assert len(trees) == 4
    assert str(trees[0]) == "(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))"
    assert read_trees(str(second)) == trees[3:]


# ----------------------------------------------------------------------------- linearization

ROUND_TRIP = [
    "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))",
    "(S (NP (NP (NNP John))) (VP (VBD ran)))",  # unary chain X -> X
    "(S (S (NP (PRP I)) (VP (VBD came))) (, ,) (S (NP (PRP I)) (VP (VBD saw))) (. .))",
    "(FRAG (NP (-LRB- -LRB-) (NN see) (-RRB- -RRB-)) (. .))",
    "(S (VP (VB Go) (PRT (RP away))) (. !))",
    "(NP (NN one))",
    "(TOP (NP (NN title)) (: :) (NP (NN subtitle)))",
    "(S (`` ``) (NP (PRP We)) (VP (VBD won)) ('' ''))",
    "(A (B (C (D (E (F (G (H (NN deep)))))))))",
]


def test_linearize_format():
    t = tree(ROUND_TRIP[0])
    assert linearize(t) == "(S (NP XX XX )NP (VP XX (PP XX (NP XX XX )NP )PP )VP XX )S"
    bare = "(S (NP XX XX ) (VP XX (PP XX (NP XX XX ) ) ) XX )"
    assert linearize(t, labelled_closers=False) == bare
    assert linearize(t, keep_tags=True).startswith("(S (NP DT NN )NP (VP VBD (PP IN")
    assert to_pairs([t]) == [("The cat sat on the mat .", linearize(t))]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(text):
    t = tree(text)
    ws = words(t)
    assert delinearize(ws, linearize(t), tags(t)) == t
    assert delinearize(" ".join(ws), linearize(t, labelled_closers=False), tags(t)) == t
    assert delinearize(ws, linearize(t, keep_tags=True)) == t  # the slots carry the tags
    assert delinearize(ws, linearize(t)) == retag(t, SLOT)  # without tags: XX


def test_write_pairs_feeds_the_text_source(tmp_path):
    trees = [tree(text) for text in ROUND_TRIP]
    src, tgt = write_pairs(trees, str(tmp_path / "wsj" / "train"), "en", "tree")
    assert (src, tgt) == (str(tmp_path / "wsj/train.en"), str(tmp_path / "wsj/train.tree"))
    pairs = list(text_split(str(tmp_path / "wsj" / "train"), "en", "tree").pairs())
    assert pairs == to_pairs(trees)
    assert [delinearize(s, t) for s, t in pairs] == [retag(t, SLOT) for t in trees]


# ----------------------------------------------------------------------------- repair

REPAIRS = [
    # (words, model output, repaired tree with XX tags)
    ("a b c", "(S (NP XX XX )NP (VP XX", "(S (NP (XX a) (XX b)) (VP (XX c)))"),  # closers missing
    ("a b", "(S XX XX )S )S )NP", "(S (XX a) (XX b))"),  # surplus closers dropped
    # )VP names a phrase further out: NP and VP close together.
    ("a b c", "(S (VP XX (NP XX XX )VP )S", "(S (VP (XX a) (NP (XX b) (XX c))))"),
    ("a b", "(S (NP XX )PP XX )S", "(S (NP (XX a)) (XX b))"),  # )PP names nothing: innermost
    # Too many slots: the last ones are dropped, and the VP left without words with them.
    ("a b", "(S (NP XX XX )NP (VP XX XX )VP )S", "(S (NP (XX a) (XX b)))"),
    # Too few slots, balanced output: leftover words go into the root phrase.
    ("a b c d", "(S (NP XX )NP (VP XX )VP )S", "(S (NP (XX a)) (VP (XX b)) (XX c) (XX d))"),
    # Too few slots, truncated output: leftover words go into the innermost open phrase.
    ("a b c", "(S (NP XX (PP", "(S (NP (XX a) (PP (XX b) (XX c))))"),
    ("a b", "XX XX", "(S (XX a) (XX b))"),  # no brackets at all
    ("a b", "", "(S (XX a) (XX b))"),  # empty output
    ("a b", ")) XX", "(S (XX a) (XX b))"),
    ("a b", "(S(NP XX)NP XX)S", "(S (NP (XX a)) (XX b))"),  # glued tokens split
    ("a", "( XX )", "(X (XX a))"),  # opener without a label
    ("a b", "(NP XX )NP (VP XX )VP", "(S (NP (XX a)) (VP (XX b)))"),  # two top phrases
    ("a", "(S (NP (PP )PP )NP XX )S", "(S (XX a))"),  # nested empty phrases removed
    ("a b", "(S foo XX )S", "(S (foo a) (XX b))"),  # any bare token is a slot
    ("a b", "XX (S XX )S", "(S (XX a) (S (XX b)))"),  # a word beside the tree
]


@pytest.mark.parametrize(("source", "output", "expected"), REPAIRS)
def test_repair(source, output, expected):
    repaired = delinearize(source, output)
    assert_valid(repaired)
    assert words(repaired) == source.split()
    assert str(repaired) == expected


def test_repair_takes_gold_tags_and_token_lists():
    repaired = delinearize(["Hi", "."], ["(S XX", "XX"], tags=["UH", "."])
    assert str(repaired) == "(S (UH Hi) (. .))"
    with pytest.raises(ValueError, match="1 tags for 2 words"):
        delinearize(["Hi", "."], "(S XX XX )S", tags=["UH"])


def test_no_words_gives_an_empty_root():
    assert delinearize("", "(S XX )S") == Tree("S", ())


def test_random_outputs_always_give_a_valid_tree_over_the_words():
    vocab = ["(S", "(NP", "(VP", "(", ")", ")S", ")NP", ")VP", ")PP", "XX", "XX", "XX", "zz"]
    rng = random.Random(0)
    for _ in range(2000):
        source = [f"w{i}" for i in range(rng.randint(1, 8))]
        output = " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 25)))
        repaired = delinearize(source, output)
        assert_valid(repaired)
        assert words(repaired) == source, output


def test_deep_output_does_not_hit_the_recursion_limit():
    repaired = delinearize("a", "(NP " * 5000 + "XX")
    assert words(repaired) == ["a"]
    assert linearize(repaired).count("(NP") == 5000
    assert bracket_f1([repaired], [repaired]).matched == 5000


# ----------------------------------------------------------------------------- EVALB scoring
# Brackets are written label[start,end) over the words left after punctuation is deleted.

PERFECT = "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))"
UNARY_GOLD = "(S (NP (NP (NNP John))) (VP (VBD ran)))"
UNARY_TEST = "(S (NP (NNP John)) (VP (VBD ran)))"
WRONG_GOLD = "(S (NP (DT the) (NN dog)) (VP (VBD barked)))"
WRONG_TEST = "(FRAG (X (DT the)) (Y (NN dog) (VBD barked)))"


def score(gold: str, test: str):
    return score_sentence(0, tree(gold), tree(test))


def test_perfect_match():
    # Words (the . deleted): The cat sat on the mat = 6.
    # Brackets: S[0,6] NP[0,2] VP[2,6] PP[3,6] NP[4,6] = 5 in each; all 5 match.
    s = score(PERFECT, PERFECT)
    assert (s.matched, s.gold, s.test, s.words, s.correct_tags) == (5, 5, 5, 6, 6)
    assert (s.recall, s.precision, s.f1, s.crossing, s.length) == (100, 100, 100, 0, 7)


def test_punctuation_is_deleted_before_spans():
    # Gold: S[0,2] NP[0,1] VP[1,2] over "John smiled" (the , and . deleted).
    gold = "(S (NP (NNP John)) (, ,) (VP (VBD smiled)) (. .))"
    # The test attaches the comma to NP and the period to VP: the spans are the same.
    s = score(gold, "(S (NP (NNP John) (, ,)) (VP (VBD smiled) (. .)))")
    assert (s.matched, s.gold, s.test, s.f1) == (3, 3, 3, 100)
    # A phrase over punctuation only spans nothing and is not a bracket: still 3 | 3 | 3.
    s = score(gold, "(S (NP (NNP John)) (VP (VBD smiled)) (X (, ,) (. .)))")
    assert (s.matched, s.gold, s.test, s.f1) == (3, 3, 3, 100)
    assert (s.words, s.length) == (2, 4)  # EVALB's length keeps punctuation (only -NONE- out)


def test_unary_chain_counts_each_bracket():
    # Gold: S[0,2] NP[0,1] NP[0,1] VP[1,2] = 4. Test: S[0,2] NP[0,1] VP[1,2] = 3.
    # Matched: S 1 + NP min(2, 1) = 1 + VP 1 = 3. R = 3/4 = 75, P = 3/3 = 100,
    # F = 2 * 100 * 75 / 175 = 85.714.
    s = score(UNARY_GOLD, UNARY_TEST)
    assert (s.matched, s.gold, s.test) == (3, 4, 3)
    assert (s.recall, s.precision) == (75, 100)
    assert s.f1 == pytest.approx(600 / 7)


def test_advp_and_prt_are_one_label():
    gold = "(S (NP (PRP He)) (VP (VBD gave) (PRT (RP up))))"
    # Gold: S[0,3] NP[0,1] VP[1,3] PRT[2,3]; test: the same with ADVP[2,3]: 4 of 4 match.
    # Tags: PRP VBD agree, RP vs RB does not: 2 of 3 = 66.667.
    s = score(gold, "(S (NP (PRP He)) (VP (VBD gave) (ADVP (RB up))))")
    assert (s.matched, s.gold, s.test, s.f1) == (4, 4, 4, 100)
    assert s.correct_tags == 2 and s.words == 3
    # PP[2,3] is not ADVP: 3 of 4 match, R = P = F = 75.
    s = score(gold, "(S (NP (PRP He)) (VP (VBD gave) (PP (IN up))))")
    assert (s.matched, s.recall, s.precision, s.f1) == (3, 75, 75, 75)


def test_duplicate_brackets_are_a_multiset():
    gold = "(S (NP (NN a)) (VP (VB b)))"  # S[0,2] NP[0,1] VP[1,2] = 3
    doubled = "(S (S (NP (NN a)) (VP (VB b))))"  # S[0,2] S[0,2] NP[0,1] VP[1,2] = 4
    # Matched: S min(1, 2) = 1 + NP 1 + VP 1 = 3. P = 3/4 = 75, R = 3/3 = 100, F = 85.714.
    s = score(gold, doubled)
    assert (s.matched, s.gold, s.test, s.precision, s.recall) == (3, 3, 4, 75, 100)
    assert s.f1 == pytest.approx(600 / 7)
    # The other way round: R = 75, P = 100.
    s = score(doubled, gold)
    assert (s.matched, s.gold, s.test, s.precision, s.recall) == (3, 4, 3, 100, 75)


def test_completely_wrong():
    # Gold: S[0,3] NP[0,2] VP[2,3]. Test: FRAG[0,3] X[0,1] Y[1,3]. No span and label agree:
    # R = P = F = 0. Crossing: Y[1,3] crosses NP[0,2] (0 < 1 < 2 < 3); X and FRAG cross
    # nothing: 1. The tags all agree: 3 of 3.
    s = score(WRONG_GOLD, WRONG_TEST)
    assert (s.matched, s.gold, s.test, s.recall, s.precision, s.f1) == (0, 3, 3, 0, 0, 0)
    assert (s.crossing, s.correct_tags) == (1, 3)


def test_top_none_and_function_tags_in_the_scorer():
    # Gold as written: TOP is deleted; NP-SBJ-1 -> NP[0,2]; the NP over -NONE- spans [3,3)
    # (nothing) and is dropped: S[0,3] NP[0,2] VP[2,3] = 3. Test: the same 3: F = 100.
    # Length: The cat sat . = 4 (-NONE- not counted).
    gold = "(TOP (S (NP-SBJ-1 (DT The) (NN cat)) (VP (VBD sat) (NP (-NONE- *T*-1))) (. .)))"
    test = "(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))"
    s = score(gold, test)
    assert (s.matched, s.gold, s.test, s.f1, s.length, s.words) == (3, 3, 3, 100, 4, 3)
    s = score("( " + test + " )", test)  # the .mrg wrapper with no label is not a bracket
    assert (s.matched, s.gold, s.test) == (3, 3, 3)


def test_corpus_scores_sum_counts():
    gold = [tree(PERFECT), tree(UNARY_GOLD), tree(WRONG_GOLD)]
    test = [tree(PERFECT), tree(UNARY_TEST), tree(WRONG_TEST)]
    # Matched 5 + 3 + 0 = 8, gold 5 + 4 + 3 = 12, test 5 + 3 + 3 = 11.
    # R = 8/12 = 66.667, P = 8/11 = 72.727, F = 2 * 8 / (12 + 11) = 69.565
    # (the mean of the sentence F1s would be (100 + 85.714 + 0) / 3 = 61.9).
    total = bracket_f1(gold, test)
    assert (total.matched, total.gold, total.test) == (8, 12, 11)
    assert total.recall == pytest.approx(200 / 3)
    assert total.precision == pytest.approx(800 / 11)
    assert total.f1 == pytest.approx(1600 / 23)
    # Complete match: only the first, 1 of 3. Tags: 6 + 2 + 3 = 11 of 11. Crossing: 1.
    assert total.complete_match == pytest.approx(100 / 3)
    assert (total.tagging_accuracy, total.crossing, total.valid) == (100, 1, 3)
    # EVALB's len<=40 part, here len<=6: lengths 7, 2, 3 keep the last two:
    # F = 2 * 3 / (7 + 6) = 46.154.
    short = summarize(s for s in total.sentences if s.length <= 6)
    assert short.f1 == pytest.approx(600 / 13)


def test_length_and_word_mismatches_are_counted_errors():
    gold = [PERFECT, WRONG_GOLD, "(S (NP (PRP He)) (VP (VBD left)) (. .))", WRONG_GOLD, PERFECT]
    test = [
        PERFECT,
        "(S (NP (NN dog)) (VP (VBD barked)))",  # 2 words for 3
        # The period tagged NN is not deleted: 3 words for 2 (EVALB's "length unmatch").
        "(S (NP (PRP He)) (VP (VBD left) (NN .)))",
        "(S (NP (DT the) (NN cat)) (VP (VBD barked)))",  # dog | cat
        "(S (. .))",  # no words after deletion: skipped
    ]
    total = bracket_f1([tree(t) for t in gold], [tree(t) for t in test])
    assert (total.valid, total.error_count, total.skip_count) == (1, 3, 1)
    assert total.errors == [
        "sentence 1: length mismatch (3|2)",
        "sentence 2: length mismatch (2|3)",
        "sentence 3: words differ at 1 (dog|cat)",
    ]
    assert (total.matched, total.gold, total.test, total.f1) == (5, 5, 5, 100)
    with pytest.raises(ValueError, match="2 gold trees but 1 test trees"):
        bracket_f1([tree(PERFECT)] * 2, [tree(PERFECT)])


def test_evaluation_needs_the_gold_tags_back():
    gold = norm("( (S (NP-SBJ (PRP He)) (VP (VBD left)) (. .)) )")
    output = linearize(gold)
    # With the gold tags the period is deleted on both sides: a perfect score.
    assert bracket_f1([gold], [delinearize(words(gold), output, tags(gold))]).f1 == 100
    # With XX tags it is kept in the test tree only: a length mismatch, as EVALB would say.
    assert bracket_f1([gold], [delinearize(words(gold), output)]).error_count == 1


# ----------------------------------------------------------------------------- EVALB itself
# The scorer was checked against evalb.c (compiled from nikitakit/self-attentive-parser's
# EVALB/) with COLLINS.prm: every per-sentence count agreed on 3000 random pairs and on EVALB's
# sample files. The test reruns that check wherever TX_EVALB (the binary) and TX_EVALB_PRM
# (COLLINS.prm) are set; EVALB is not vendored.

_LABELS = ["S", "NP", "VP", "PP", "ADVP", "PRT", "SBAR", "NP-SBJ-1", "PP=2", "TOP"]
_TAGS = ["NN", "DT", "VB", "RB", "RP", ",", ".", ":", "``", "''", "-NONE-", "-LRB-"]


def _random_tree(rng: random.Random, leaves: list[str]) -> str:
    """A random bracketing over `leaves` ("(TAG word)" strings), unary chains included."""
    if len(leaves) == 1 and rng.random() < 0.6:
        return leaves[0]
    cuts = sorted(rng.sample(range(1, len(leaves)), rng.randint(0, len(leaves) - 1)))
    parts = [leaves[i:j] for i, j in zip([0, *cuts], [*cuts, len(leaves)], strict=True)]
    inner = " ".join(_random_tree(rng, part) for part in parts)
    return f"({rng.choice(_LABELS)} {inner})"


def _leaves(rng: random.Random, tag_of: list[str]) -> list[str]:
    """`(TAG wI)` per word; a tag is replaced 5% of the time (EVALB's length mismatches)."""
    tags_now = [t if rng.random() < 0.95 else rng.choice(_TAGS) for t in tag_of]
    return [f"({t} w{i})" for i, t in enumerate(tags_now)]


def _evalb_rows(binary: str, prm: str, gold: list[str], test: list[str], tmp_path) -> list:
    (tmp_path / "gold").write_text("\n".join(gold) + "\n")
    (tmp_path / "test").write_text("\n".join(test) + "\n")
    command = [binary, "-p", prm, "-e", "1000000", str(tmp_path / "gold"), str(tmp_path / "test")]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines()]
    rows = [row for row in rows if len(row) == 12 and row[0].isdigit()]  # one per sentence
    # ID Len Stat Recall Prec Matched Gold Test Cross Words Tags Acc -> the integer counts.
    return [tuple(int(row[k]) for k in (1, 2, 5, 6, 7, 8, 9, 10)) for row in rows]


@pytest.mark.skipif(not os.environ.get("TX_EVALB"), reason="set TX_EVALB and TX_EVALB_PRM")
def test_matches_the_evalb_binary(tmp_path):
    rng = random.Random(1)
    gold, test = [], []
    for _ in range(3000):
        tag_of = [rng.choice(_TAGS) for _ in range(rng.randint(1, 9))]
        gold.append(f"(TOP {_random_tree(rng, _leaves(rng, tag_of))})")
        test.append(_random_tree(rng, _leaves(rng, tag_of)))
    rows = _evalb_rows(os.environ["TX_EVALB"], os.environ["TX_EVALB_PRM"], gold, test, tmp_path)
    status = {"ok": 0, "error": 1, "skip": 2}
    ours = [
        (s.length, status[s.status], s.matched, s.gold, s.test, s.crossing, s.words, s.correct_tags)
        for s in bracket_f1([tree(t) for t in gold], [tree(t) for t in test]).sentences
    ]
    assert ours == rows
    assert {row[1] for row in rows} == {0, 1, 2}  # scored, error and skipped sentences all seen
