"""English constituency parsing as translation (the paper's Table 4): read Penn Treebank trees,
linearize them into target sequences and back, and score parses as EVALB does with COLLINS.prm.

Pure Python (no JAX). The Penn Treebank is licensed: users bring their own files.

Reading: `parse_trees`, `normalize`, `read_trees`
  Bracketed trees, one per line or multi-line s-expressions as in the .mrg files; the `*x*`
  header lines of some .mrg files and any text outside a bracket are skipped. `normalize`
  removes the root wrapper (`( (S ...) )`, `(ROOT ...)`, `(TOP ...)`; one that holds several
  phrases is kept and named TOP), the -NONE- empty elements and every phrase left without
  words, and strips function tags and indices from phrase labels (NP-SBJ-1 -> NP, NP=2 -> NP).
  POS tags are kept as written (-LRB-, -RRB-, ``).

Linearization: `linearize`, `to_pairs`, `write_pairs`, `delinearize`
  Vinyals et al. 2015 ("Grammar as a Foreign Language", the paper's [37]), depth first:
      (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))  ->  (S (NP XX XX )NP (VP XX )VP XX )S
  A phrase opens with `(LABEL` and closes with `)LABEL`; each word is one `XX` (its POS tag
  normalized away, as Vinyals et al. did). Source = the words space-separated, verbatim PTB
  tokens (-LRB-, ``), so that scores compare them with the gold trees.
  Why this variant: it is the one the paper cites; one slot per word lets `delinearize` put the
  source words back and makes the word count a check on the output; a labelled closer tells the
  decoder which phrase it closes (otherwise it must count its own stack) and lets the repair
  below find a missing closer. `keep_tags=True` writes the POS tag instead of XX (like
  tensor2tensor's wsj_parsing target) and `labelled_closers=False` writes bare `)`;
  `delinearize` reads every variant.

  `delinearize(words, target)` never raises on model output; it returns a valid tree (the root
  is a phrase, each word sits under one POS tag, no phrase is empty) over exactly the words:
  * Tokens: `(L` opens, `)` or `)L` closes, any other token is a word slot; glued tokens are
    split (`XX)NP(VP` -> `XX )NP (VP`); an opener without a label gets X (PTB's "unknown").
  * A closer closes the innermost open phrase or, when its label names one further out, every
    phrase up to that one (the missing closers are implied); with nothing open it is dropped.
  * Slots take the words left to right; slots past the last word are dropped. Words left over
    when the output ends are attached, in order, to the innermost phrase still open (where a
    truncated output would have gone on), or to the last top phrase (the root) when every
    phrase was closed.
  * Phrases still open at the end are closed; phrases that got no word are removed. Unless
    exactly one phrase is left at the top, everything goes under an S (WSJ's commonest root).
  * POS tags: `tags` when given, otherwise the slot token (XX). Evaluation passes the gold tags,
    as Vinyals et al. did: EVALB deletes punctuation by its POS tag, so with XX tags every
    sentence with punctuation would be a length mismatch.

Scoring: `bracket_f1` (EVALB, Sekine & Collins 1997, with COLLINS.prm)
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
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

FORMAT = 1  # version of the linearization: part of a treebank's token-cache key
SLOT = "XX"  # the word slot of a linearized tree (Vinyals et al.'s normalized POS tag)
ROOT_WRAPPERS = frozenset({"", "ROOT", "TOP"})
REPAIR_ROOT = "S"  # root of a repaired output with no single top phrase: WSJ's commonest
UNKNOWN_LABEL = "X"  # PTB's label for an unknown constituent: an opener without a label
EMPTY_ELEMENT = "-NONE-"

# COLLINS.prm
DELETE_LABELS = frozenset({"TOP", "-NONE-", ",", ":", "``", "''", "."})
DELETE_FOR_LENGTH = frozenset({"-NONE-"})
EQUIVALENT_LABELS = {"PRT": "ADVP"}  # EQ_LABEL ADVP PRT, as one canonical name

_TREE_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_HEADER_LINE = re.compile(r"^\*x\*.*$", re.MULTILINE)  # the copyright box atop some .mrg files
_TARGET_TOKEN = re.compile(r"[()][^\s()]*|[^\s()]+")
_FUNCTION_TAG = re.compile(r"^([^-=]+)[-=].*$")  # a leading - is a name (-LRB-), not a tag
_OPEN, _LEAF, _CLOSE = "open", "leaf", "close"


@dataclasses.dataclass(frozen=True)
class Tree:
    """A phrase (children are Trees) or a preterminal (label = POS tag, one child: the word)."""

    label: str
    children: tuple[Tree | str, ...]

    @property
    def is_preterminal(self) -> bool:
        return len(self.children) == 1 and isinstance(self.children[0], str)

    def __str__(self) -> str:
        parts = []
        for kind, node in _walk(self):
            if kind == _LEAF:
                parts.append(f"({node.label} {node.children[0]})")
            else:
                parts.append(f"({node.label}" if kind == _OPEN else ")")
        return " ".join(parts).replace(" )", ")")


def _walk(tree: Tree) -> Iterator[tuple[str, Tree]]:
    """Depth first: (open, phrase) ... (close, phrase), (leaf, preterminal). Iterative, so that
    deep model output cannot reach Python's recursion limit."""
    stack: list[tuple[Tree, bool]] = [(tree, False)]
    while stack:
        node, closing = stack.pop()
        if closing:
            yield _CLOSE, node
        elif node.is_preterminal:
            yield _LEAF, node
        else:
            yield _OPEN, node
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.children))


def words(tree: Tree) -> list[str]:
    """The words, left to right."""
    return [node.children[0] for kind, node in _walk(tree) if kind == _LEAF]


def tags(tree: Tree) -> list[str]:
    """The POS tags, one per word."""
    return [node.label for kind, node in _walk(tree) if kind == _LEAF]


# ----------------------------------------------------------------------------- reading


def parse_trees(text: str) -> list[Tree]:
    """Every bracketed tree in `text`, as written. Raises ValueError on malformed gold input."""
    trees: list[Tree] = []
    stack: list[list] = []  # [label or None, children] per open bracket
    text = _HEADER_LINE.sub("", text)  # its "Copyright (C)" would read as a bracket
    for token in _TREE_TOKEN.findall(text):
        if token == "(":
            stack.append([None, []])
        elif token == ")":
            if not stack:
                raise ValueError(f"tree {len(trees)}: ')' with no open bracket")
            node = _make_node(*stack.pop(), index=len(trees))
            (stack[-1][1] if stack else trees).append(node)
        elif stack:
            if stack[-1][0] is None and not stack[-1][1]:
                stack[-1][0] = token
            else:
                stack[-1][1].append(token)
    if stack:
        raise ValueError(f"tree {len(trees)}: {len(stack)} bracket(s) never closed")
    return trees


def _make_node(label: str | None, children: list, index: int) -> Tree:
    words_here = [c for c in children if isinstance(c, str)]
    if not children or (words_here and len(children) > 1):
        raise ValueError(f"tree {index}: ({label or ''} ...) must hold one word or phrases")
    return Tree(label or "", tuple(children))


def strip_function_tags(label: str) -> str:
    """NP-SBJ-1 -> NP, NP=2 -> NP; names that start with - (-LRB-, -NONE-) are kept."""
    return _FUNCTION_TAG.sub(r"\1", label)


def normalize(tree: Tree) -> Tree | None:
    """The tree as the model sees it (see the module docstring); None if no word is left."""
    tree = _clean(tree)
    while (
        tree is not None
        and tree.label in ROOT_WRAPPERS
        and len(tree.children) == 1
        and not tree.is_preterminal
        and not tree.children[0].is_preterminal
    ):
        tree = tree.children[0]
    if tree is not None and tree.is_preterminal:
        tree = Tree("TOP", (tree,))  # the root must be a phrase
    elif tree is not None and tree.label in ROOT_WRAPPERS:
        tree = Tree("TOP", tree.children)  # several phrases under the root: EVALB drops TOP
    return tree


def _clean(tree: Tree) -> Tree | None:
    """-NONE- removed, emptied phrases pruned, function tags stripped (recursive: gold trees
    are shallow)."""
    if tree.is_preterminal:
        return None if tree.label == EMPTY_ELEMENT else tree
    children = tuple(c for c in map(_clean, tree.children) if c is not None)
    return Tree(strip_function_tags(tree.label), children) if children else None


def read_trees(paths: str | Iterable[str]) -> list[Tree]:
    """Normalized trees from one file or several (e.g. the .mrg files of WSJ sections 02-21)."""
    trees: list[Tree] = []
    for path in [paths] if isinstance(paths, str) else paths:
        with open(path, encoding="utf-8") as f:
            for i, raw in enumerate(parse_trees(f.read())):
                tree = normalize(raw)
                if tree is None:  # dropping it would shift every later sentence
                    raise ValueError(f"{path}: tree {i} has no words besides -NONE-")
                trees.append(tree)
    return trees


# ----------------------------------------------------------------------------- linearization


def linearize(tree: Tree, keep_tags: bool = False, labelled_closers: bool = True) -> str:
    """The target sequence: `(S (NP XX XX )NP (VP XX )VP XX )S` (see the module docstring)."""
    out = []
    for kind, node in _walk(tree):
        if kind == _LEAF:
            out.append(node.label if keep_tags else SLOT)
        elif kind == _OPEN:
            out.append("(" + node.label)
        else:
            out.append(")" + node.label if labelled_closers else ")")
    return " ".join(out)


def to_pairs(trees: Iterable[Tree], **linearize_options) -> list[tuple[str, str]]:
    """(source, target) per tree: the words space-separated, and `linearize(tree)`."""
    return [(" ".join(words(t)), linearize(t, **linearize_options)) for t in trees]


def write_pairs(
    trees: Iterable[Tree], prefix: str, src_lang: str, tgt_lang: str, **linearize_options
) -> tuple[str, str]:
    """`<prefix>.<src_lang>` (words) and `<prefix>.<tgt_lang>` (linearized trees), one
    sentence per line, as the text data source reads them. Returns the two paths."""
    pairs = to_pairs(trees, **linearize_options)
    paths = (f"{prefix}.{src_lang}", f"{prefix}.{tgt_lang}")
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    for side, path in enumerate(paths):
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(pair[side] + "\n" for pair in pairs)
    return paths


def delinearize(
    source_words: str | Sequence[str],
    target: str | Sequence[str],
    tags: Sequence[str] | None = None,
) -> Tree:
    """The tree a (possibly ill-formed) target sequence describes, over exactly `source_words`,
    repaired as the module docstring says. `tags` (one per word, e.g. the gold POS tags for
    scoring) replace the slot tokens. Never raises on model output."""
    word_list = source_words.split() if isinstance(source_words, str) else list(source_words)
    if tags is not None and len(tags) != len(word_list):
        raise ValueError(f"{len(tags)} tags for {len(word_list)} words")
    pieces = [target] if isinstance(target, str) else target
    builder = _TreeBuilder(word_list, tags)
    for piece in pieces:
        for token in _TARGET_TOKEN.findall(piece):
            builder.feed(token)
    return builder.finish()


class _TreeBuilder:
    """Reads target tokens left to right over a stack of open phrases, repairing as it goes."""

    def __init__(self, word_list: list[str], tags: Sequence[str] | None):
        self.words, self.tags = word_list, tags
        self.used = 0  # words placed so far
        self.stack: list[tuple[str, list[Tree]]] = []  # open phrases: (label, children)
        self.top: list[Tree] = []  # what was closed with nothing open around it

    def feed(self, token: str) -> None:
        if token[0] == "(":
            self.stack.append((token[1:] or UNKNOWN_LABEL, []))
        elif token[0] == ")":
            self._close(token[1:])
        elif self.used < len(self.words):  # a slot past the last word is dropped
            self._place(token)

    def finish(self) -> Tree:
        if self.used < len(self.words) and not self.stack and self.top:
            self._reopen_last()
        while self.used < len(self.words):
            self._place(SLOT)
        while self.stack:
            self._pop()
        if len(self.top) == 1 and not self.top[0].is_preterminal:
            return self.top[0]
        return Tree(REPAIR_ROOT, tuple(self.top))

    def _reopen_last(self) -> None:
        """Leftover words after a closed tree go inside its last phrase, not beside it."""
        if not self.top[-1].is_preterminal:
            last = self.top.pop()
            self.stack.append((last.label, list(last.children)))

    def _place(self, slot_token: str) -> None:
        tag = self.tags[self.used] if self.tags is not None else slot_token
        self._children().append(Tree(tag, (self.words[self.used],)))
        self.used += 1

    def _children(self) -> list[Tree]:
        return self.stack[-1][1] if self.stack else self.top

    def _close(self, label: str) -> None:
        if not self.stack:
            return  # a surplus closer
        labels = [open_label for open_label, _ in self.stack]
        depth = len(labels) - 1
        if label and label in labels:  # close up to the innermost phrase it names
            depth = len(labels) - 1 - labels[::-1].index(label)
        while len(self.stack) > depth:
            self._pop()

    def _pop(self) -> None:
        label, children = self.stack.pop()
        if children:  # a phrase that got no word is removed
            self._children().append(Tree(label, tuple(children)))


# ----------------------------------------------------------------------------- scoring


@dataclasses.dataclass(frozen=True)
class SentenceScore:
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
class CorpusScore:
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
    def recall(self) -> float:
        return _percent(self.matched, self.gold)

    @property
    def precision(self) -> float:
        return _percent(self.matched, self.test)

    @property
    def f1(self) -> float:
        """EVALB's "Bracketing FMeasure": from the summed counts, not a mean over sentences."""
        return _f1(self.precision, self.recall)

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
    for kind, node in _walk(tree):
        if kind == _LEAF:
            length += node.label not in DELETE_FOR_LENGTH
            if node.label not in DELETE_LABELS:
                terminals.append((node.children[0], node.label))
        elif kind == _OPEN:
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
