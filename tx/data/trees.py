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

Scoring: tx/eval/evalb.py (EVALB with COLLINS.prm).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Iterator, Sequence

from tx import storage

FORMAT = 1  # version of the linearization: part of a treebank's token-cache key
SLOT = "XX"  # the word slot of a linearized tree (Vinyals et al.'s normalized POS tag)
ROOT_WRAPPERS = frozenset({"", "ROOT", "TOP"})
REPAIR_ROOT = "S"  # root of a repaired output with no single top phrase: WSJ's commonest
UNKNOWN_LABEL = "X"  # PTB's label for an unknown constituent: an opener without a label
EMPTY_ELEMENT = "-NONE-"


_TREE_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_HEADER_LINE = re.compile(r"^\*x\*.*$", re.MULTILINE)  # the copyright box atop some .mrg files
_TARGET_TOKEN = re.compile(r"[()][^\s()]*|[^\s()]+")
_FUNCTION_TAG = re.compile(r"^([^-=]+)[-=].*$")  # a leading - is a name (-LRB-), not a tag
OPEN, LEAF, CLOSE = "open", "leaf", "close"


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
        for kind, node in walk(self):
            if kind == LEAF:
                parts.append(f"({node.label} {node.children[0]})")
            else:
                parts.append(f"({node.label}" if kind == OPEN else ")")
        return " ".join(parts).replace(" )", ")")


def walk(tree: Tree) -> Iterator[tuple[str, Tree]]:
    """Depth first: (open, phrase) ... (close, phrase), (leaf, preterminal). Iterative, so that
    deep model output cannot reach Python's recursion limit."""
    stack: list[tuple[Tree, bool]] = [(tree, False)]
    while stack:
        node, closing = stack.pop()
        if closing:
            yield CLOSE, node
        elif node.is_preterminal:
            yield LEAF, node
        else:
            yield OPEN, node
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.children))


def words(tree: Tree) -> list[str]:
    """The words, left to right."""
    return [node.children[0] for kind, node in walk(tree) if kind == LEAF]


def tags(tree: Tree) -> list[str]:
    """The POS tags, one per word."""
    return [node.label for kind, node in walk(tree) if kind == LEAF]


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
        # Local or in a bucket; line ends as text mode reads them (CRLF and CR become LF).
        text = storage.read_text(path).replace("\r\n", "\n").replace("\r", "\n")
        for i, raw in enumerate(parse_trees(text)):
            tree = normalize(raw)
            if tree is None:  # dropping it would shift every later sentence
                raise ValueError(f"{path}: tree {i} has no words besides -NONE-")
            trees.append(tree)
    return trees


# ----------------------------------------------------------------------------- linearization


def linearize(tree: Tree, keep_tags: bool = False, labelled_closers: bool = True) -> str:
    """The target sequence: `(S (NP XX XX )NP (VP XX )VP XX )S` (see the module docstring)."""
    out = []
    for kind, node in walk(tree):
        if kind == LEAF:
            out.append(node.label if keep_tags else SLOT)
        elif kind == OPEN:
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
