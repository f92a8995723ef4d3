"""A synthetic treebank for tests: trees of a small English grammar, in Penn Treebank brackets.

The Penn Treebank is licensed, so tests of the parsing path (Table 4) make their own."""

import random

GRAMMAR = {
    "S": [["NP", "VP", "."]],
    "NP": [["DT", "NN"], ["DT", "JJ", "NN"], ["NNP"]],
    "VP": [["VBD", "NP"], ["VBD", "PP"], ["VBD", "NP", "PP"], ["VBD"]],
    "PP": [["IN", "NP"]],
}
WORDS = {
    "DT": ["the", "a"],
    "NN": ["cat", "dog", "mat", "park", "ball"],
    "JJ": ["big", "small", "red"],
    "NNP": ["Anna", "Bob"],
    "VBD": ["saw", "liked", "sat"],
    "IN": ["on", "in", "near"],
    ".": ["."],
}


def tree(rng: random.Random, label: str = "S") -> str:
    if label in WORDS:
        return f"({label} {rng.choice(WORDS[label])})"
    return f"({label} " + " ".join(tree(rng, c) for c in rng.choice(GRAMMAR[label])) + ")"


def write(path, n: int, seed: int) -> str:
    """`n` trees, one per line with PTB's empty outer bracket; returns the path."""
    rng = random.Random(seed)
    path.write_text("".join(f"( {tree(rng)} )\n" for _ in range(n)))
    return str(path)
