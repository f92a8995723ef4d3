"""Word alignments from cross-attention: sub-word -> word merging on hand-built matrices, the
batched extraction against one pair at a time, and the translate --alignments command."""

import contextlib
import io
import sys
from unittest import mock

import numpy as np

from tx.cli.main import main
from tx.infer.alignment import (
    align,
    align_pair,
    hard_alignment,
    pharaoh,
    word_attention,
    word_ids,
)
from tx.infer.attention_maps import attention_weights, pieces
from tx.tokens import EOS_ID

# "Today, she needs the boat." -> "Heute braucht sie das Boot." as a BPE might cut them.
SOURCE = ["▁Today", ",", "▁she", "▁ne", "eds", "▁the", "▁bo", "at", ".", "</s>"]
TARGET = ["▁Heute", "▁brau", "cht", "▁sie", "▁das", "▁Bo", "ot", ".", "</s>"]


def hand_built() -> np.ndarray:
    """[t, s] rows that sum to 1, built so that only word-level merging gets every link right:
    "▁brau" gives its largest single weight to "▁she" but more to the two pieces of "needs";
    "▁das" gives half to EOS; "▁Bo" leans to "the" but "ot" and "." pull "Boot" to "boat"."""
    a = np.zeros((len(TARGET), len(SOURCE)))
    rows = {
        0: {0: 0.7, 1: 0.2, 9: 0.1},  # Heute -> Today,
        1: {2: 0.4, 3: 0.3, 4: 0.3},  # brau -> needs (0.6) over she (0.4)
        2: {4: 0.9, 9: 0.1},  # cht -> needs
        3: {2: 0.8, 5: 0.2},  # sie -> she
        4: {9: 0.5, 5: 0.3, 6: 0.2},  # das -> the, once EOS is left out
        5: {5: 0.5, 6: 0.3, 7: 0.2},  # Bo -> the (0.5) or boat (0.5): tied on its own
        6: {6: 0.6, 7: 0.4},  # ot -> boat
        7: {8: 0.7, 9: 0.3},  # . -> boat.
        8: {9: 1.0},  # EOS row: left out
    }
    for t, cells in rows.items():
        for s, w in cells.items():
            a[t, s] = w
    return a


def test_word_ids_follow_word_starts_and_drop_eos():
    np.testing.assert_array_equal(word_ids(SOURCE), [0, 0, 1, 2, 2, 3, 4, 4, 4, -1])
    np.testing.assert_array_equal(word_ids(TARGET), [0, 1, 1, 2, 3, 4, 4, 4, -1])
    np.testing.assert_array_equal(word_ids(["ab", "▁c", "d"]), [0, 1, 1])  # no "▁" at first


def test_hand_built_attention_gives_the_expected_word_pairs():
    links = align_pair(hand_built(), SOURCE, TARGET)
    assert sorted(links) == [(0, 0), (1, 2), (2, 1), (3, 3), (4, 4)]
    assert pharaoh(links) == "0-0 1-2 2-1 3-3 4-4"


def test_word_attention_merges_pieces():
    w = word_attention(hand_built(), word_ids(SOURCE), word_ids(TARGET))  # [T=5, S=5]
    assert w.shape == (5, 5)
    np.testing.assert_allclose(w.sum(-1), 1.0)  # EOS's share is given back to the words
    np.testing.assert_allclose(w[1], [0, 0.2, 0.8, 0, 0])  # mean of brau and cht rows
    np.testing.assert_allclose(w[3], [0, 0, 0, 0.6, 0.4])  # das without EOS
    # Sub-word argmax instead would take "▁she" for "▁brau": the merging is what fixes it.
    assert word_ids(SOURCE)[hand_built()[1].argmax()] == 1


def test_hard_alignment_links_every_target_word_once():
    assert hard_alignment(np.array([[0.1, 0.9], [0.6, 0.4], [0.5, 0.5]])) == [
        (1, 0),
        (0, 1),
        (0, 2),
    ]


def test_an_empty_side_has_no_links():
    assert align_pair(np.ones((1, 3)) / 3, ["▁a", "▁b", "</s>"], ["</s>"]) == []


def test_batched_alignment_equals_one_pair_at_a_time(trained_model):
    _, loaded = trained_model
    tok = loaded.tokenizer
    # Sentence pairs, not the run's translations: its beam search (20 steps) gives empty
    # ones, which have no links to compare. Both pairs in one padded shape: one batch.
    texts = [
        ("The dog sees a cat.", "Der Hund sieht eine Katze."),
        ("", ""),
        ("We count three small birds.", "Wir sehen drei kleine Vögel."),
    ]
    pairs = [(tok.encode(s)[:-1], tok.encode(t, target=True)[:-1]) for s, t in texts]
    got = align(loaded, pairs, layer=0)
    assert got[1] == ""
    for (line, _), (src, out), links in zip(texts, pairs, got, strict=True):
        if not line:
            continue
        inputs = np.array([[*src, EOS_ID]], np.int32)  # exact size: no padding at all
        targets = np.array([[*out, EOS_ID]], np.int32)
        _, _, cross = attention_weights(loaded.model, loaded.params, inputs, targets)
        src_p, tgt_p = pieces(loaded.tokenizer, inputs[0]), pieces(loaded.tokenizer, targets[0])
        assert links == pharaoh(align_pair(cross[0, 0].mean(0), src_p, tgt_p))
        n_tgt = len(loaded.tokenizer.decode(out).split())
        assert sorted(int(p.split("-")[1]) for p in links.split()) == list(range(n_tgt))
        assert all(0 <= int(p.split("-")[0]) < len(line.split()) for p in links.split())


def test_translate_alignments_command(trained):
    """`python -m tx translate --alignments` (tx.cli.main in this process: the command's
    options and output, not a new process)."""
    out = io.StringIO()
    stdin = io.TextIOWrapper(io.BytesIO(b"The dog sees a cat.\n\n"), encoding="utf-8")
    with mock.patch.object(sys, "stdin", stdin), contextlib.redirect_stdout(out):
        assert main(["translate", "--workdir", trained, "--alignments"]) == 0
    first, empty = out.getvalue().splitlines()
    text, links = first.split(" ||| ")
    targets = {int(p.split("-")[1]) for p in links.split()}
    assert targets == set(range(len(text.split())))  # every target word linked, once
    assert empty == " ||| "
