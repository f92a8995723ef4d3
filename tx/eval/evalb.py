"""Bracketing scores of parses as EVALB computes them (Sekine & Collins 1997) with the
standard COLLINS.prm settings, in Python: the paper's Table 4 metric.

`bracket_f1(gold_trees, test_trees)` over tx.data.trees Trees:
  * Words whose POS tag is in DELETE_LABEL (TOP -NONE- , : `` '' .) are removed before spans are
    taken, so punctuation never changes a span; the length for the len<=40 summary counts every
    word except -NONE- (DELETE_LABEL_FOR_LENGTH).
  * Each phrase node is a (label, start, end) bracket; POS tags are not brackets. A label is cut
    at its first - or =; brackets left empty or labelled TOP are dropped.
  * Labelled match with EQ_LABEL ADVP PRT. Brackets are a multiset: n gold and m test brackets of
    one span and label match min(n, m) times (EVALB's greedy one-to-one matching gives the same
    count), so a unary chain X -> X counts twice.
  * A sentence whose gold and test differ in word count or words after deletion is an error; one
    whose test has no words is skipped; neither enters the totals (their count is reported).
  * Corpus recall = matched / gold, precision = matched / test, F1 = 2PR / (P + R) from summed
    counts ("Bracketing FMeasure"), all in percent; complete match = sentences with matched ==
    gold == test; tagging accuracy = correct tags / words; crossing = test brackets that cross a
    gold one. `summarize(s for s in score.sentences if s.length <= 40)` is EVALB's len<=40 part.
  Deviations, none of which changes a score on well-formed input: a root wrapper labelled ROOT
  or with no label is ignored like TOP (EVALB would count it, matched in both files, as an extra
  bracket); F1 is 0 when P + R is 0 (EVALB prints nan); no 200-word limit and no MAX_ERROR stop.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable, Sequence

from tx.data.trees import LEAF, OPEN, ROOT_WRAPPERS, Tree, walk

# COLLINS.prm
DELETE_LABELS = frozenset({"TOP", "-NONE-", ",", ":", "``", "''", "."})
DELETE_FOR_LENGTH = frozenset({"-NONE-"})
EQUIVALENT_LABELS = {"PRT": "ADVP"}  # EQ_LABEL ADVP PRT, as one canonical name


class _Brackets:
    """Recall, precision and F1 of `matched` brackets among `gold` and `test` ones. For a
    corpus, EVALB's "Bracketing FMeasure": from the summed counts, not a mean over sentences."""

    matched: int
    gold: int
    test: int

    @property
    def recall(self) -> float:
        return _percent(self.matched, self.gold)

    @property
    def precision(self) -> float:
        return _percent(self.matched, self.test)

    @property
    def f1(self) -> float:
        return _f1(self.precision, self.recall)


@dataclasses.dataclass(frozen=True)
class SentenceScore(_Brackets):
    """EVALB's line for one sentence. Percentages are 0 when there is no bracket, as EVALB
    prints them."""

    index: int  # 0-based
    length: int  # gold words except -NONE- (EVALB's length, for the len<=40 summary)
    status: str  # "ok", "error" (words differ after deletion) or "skip" (test has no words)
    message: str = ""
    matched: int = 0
    gold: int = 0
    test: int = 0
    crossing: int = 0
    words: int = 0  # after deletion
    correct_tags: int = 0


@dataclasses.dataclass(frozen=True)
class CorpusScore(_Brackets):
    """EVALB's summary over the sentences scored ("ok"); counts of the others."""

    sentences: tuple[SentenceScore, ...]
    matched: int
    gold: int
    test: int
    words: int
    correct_tags: int
    complete: int  # sentences with matched == gold == test
    crossing: int

    @property
    def valid(self) -> int:
        return sum(s.status == "ok" for s in self.sentences)

    @property
    def error_count(self) -> int:
        return sum(s.status == "error" for s in self.sentences)

    @property
    def skip_count(self) -> int:
        return sum(s.status == "skip" for s in self.sentences)

    @property
    def errors(self) -> list[str]:
        return [s.message for s in self.sentences if s.status == "error"]

    @property
    def complete_match(self) -> float:
        return _percent(self.complete, self.valid)

    @property
    def tagging_accuracy(self) -> float:
        return _percent(self.correct_tags, self.words)


def _percent(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


def _f1(precision: float, recall: float) -> float:
    total = precision + recall
    return 2.0 * precision * recall / total if total else 0.0


def _evalb_label(label: str) -> str:
    """EVALB's modify_label (cut at the first - or =), then the EQ_LABEL class."""
    label = re.split(r"[-=]", label, maxsplit=1)[0]
    return EQUIVALENT_LABELS.get(label, label)


def _evalb_view(tree: Tree) -> tuple[list[tuple[str, str]], list[tuple[str, int, int]], int]:
    """(word, tag) after deletion, the counted (label, start, end) brackets, EVALB's length."""
    terminals: list[tuple[str, str]] = []
    brackets: list[tuple[str, int, int]] = []
    starts: list[int] = []
    length = 0
    for kind, node in walk(tree):
        if kind == LEAF:
            length += node.label not in DELETE_FOR_LENGTH
            if node.label not in DELETE_LABELS:
                terminals.append((node.children[0], node.label))
        elif kind == OPEN:
            starts.append(len(terminals))
        else:
            start, end, label = starts.pop(), len(terminals), _evalb_label(node.label)
            is_wrapper = node is tree and node.label in ROOT_WRAPPERS
            if end > start and label not in DELETE_LABELS and not is_wrapper:
                brackets.append((label, start, end))
    return terminals, brackets, length


def _crossing(gold: list[tuple[str, int, int]], test: list[tuple[str, int, int]]) -> int:
    """Test brackets that cross at least one gold bracket (EVALB counts on the test side)."""

    def crosses(g: tuple[str, int, int], t: tuple[str, int, int]) -> bool:
        return g[1] < t[1] < g[2] < t[2] or t[1] < g[1] < t[2] < g[2]

    return sum(any(crosses(g, t) for g in gold) for t in test)


def score_sentence(index: int, gold: Tree, test: Tree) -> SentenceScore:
    """One sentence as EVALB scores it (see the module docstring)."""
    gold_terms, gold_brackets, length = _evalb_view(gold)
    test_terms, test_brackets, _ = _evalb_view(test)
    if not test_terms:
        return SentenceScore(index, length, "skip", f"sentence {index}: test has no words")
    gold_words, test_words = [w for w, _ in gold_terms], [w for w, _ in test_terms]
    if len(gold_words) != len(test_words):
        message = f"sentence {index}: length mismatch ({len(gold_words)}|{len(test_words)})"
        return SentenceScore(index, length, "error", message)
    if gold_words != test_words:
        i = next(i for i, (g, t) in enumerate(zip(gold_words, test_words, strict=True)) if g != t)
        message = f"sentence {index}: words differ at {i} ({gold_words[i]}|{test_words[i]})"
        return SentenceScore(index, length, "error", message)
    matched = Counter(gold_brackets) & Counter(test_brackets)
    # POS tags are compared as written (EVALB's label_comp: no cutting at -, so -LRB- stays).
    canonical = EQUIVALENT_LABELS.get
    pairs = zip(gold_terms, test_terms, strict=True)
    correct = sum(canonical(g, g) == canonical(t, t) for (_, g), (_, t) in pairs)
    return SentenceScore(
        index,
        length,
        "ok",
        matched=sum(matched.values()),
        gold=len(gold_brackets),
        test=len(test_brackets),
        crossing=_crossing(gold_brackets, test_brackets),
        words=len(gold_words),
        correct_tags=correct,
    )


def summarize(sentences: Iterable[SentenceScore]) -> CorpusScore:
    """Summed counts over the "ok" sentences, as EVALB's summary (e.g. over len <= 40 only)."""
    sentences = tuple(sentences)
    ok = [s for s in sentences if s.status == "ok"]
    return CorpusScore(
        sentences,
        matched=sum(s.matched for s in ok),
        gold=sum(s.gold for s in ok),
        test=sum(s.test for s in ok),
        words=sum(s.words for s in ok),
        correct_tags=sum(s.correct_tags for s in ok),
        complete=sum(s.matched == s.gold == s.test for s in ok),
        crossing=sum(s.crossing for s in ok),
    )


def bracket_f1(gold_trees: Sequence[Tree], test_trees: Sequence[Tree]) -> CorpusScore:
    """EVALB with COLLINS.prm over aligned gold and test trees (`.f1` is its "Bracketing
    FMeasure"); sentences EVALB would reject are counted in `.error_count` / `.skip_count` and
    named in `.errors`."""
    if len(gold_trees) != len(test_trees):
        raise ValueError(f"{len(gold_trees)} gold trees but {len(test_trees)} test trees")
    pairs = zip(gold_trees, test_trees, strict=True)
    return summarize(score_sentence(i, gold, test) for i, (gold, test) in enumerate(pairs))
