"""Translating with a trained workdir: parameters only, input order, strategies, n-best."""

import numpy as np
import pytest

from tx import workdir as wd
from tx.config import load_config
from tx.infer.translate import load_model, nbest_lines, translate, translate_ids, translate_nbest

LINES = [
    "The dog sees a cat.",
    "",
    "I know that the man buys two hundred red cars.",
    "   ",
    "We count three small birds.",
]


def test_translate_keeps_order_and_empty_lines(trained_model):
    cfg, loaded = trained_model
    together = translate(loaded, LINES, cfg)
    assert len(together) == len(LINES) and together[1] == "" and together[3] == ""
    for line, out in zip(LINES, together, strict=True):
        if line.strip():
            assert translate(loaded, [line], cfg) == [out]  # batching does not reorder


def test_loading_reads_parameters_without_an_optimizer(trained, monkeypatch):
    import tx.train.optim

    monkeypatch.setattr(tx.train.optim, "make_optimizer", lambda *a: pytest.fail("built Adam"))
    cfg = load_config(wd.config_file(trained))
    loaded = load_model(cfg, trained, 20)
    assert loaded.source == "checkpoints/20"
    assert set(loaded.params) >= {"encoder", "decoder", "shared_embedding"}


def _ids(loaded, lines):
    return [np.asarray(loaded.tokenizer.encode(s), np.int32) for s in lines if s.strip()]


def test_strategies_and_nbest(trained_model):
    cfg, loaded = trained_model
    ids = _ids(loaded, LINES)
    # One bucket (the lines have 9 to 19 sub-words): each strategy compiles one search, not
    # two; the beam's is the one test_translate_keeps_order_and_empty_lines compiled
    buckets = (32,)
    beam = translate_ids(loaded, ids, cfg.decode, buckets, nbest=4)
    assert all(len(h) == 4 and h[0][1] >= h[1][1] >= h[3][1] for h in beam)  # best first
    one = cfg.decode.copy_and_resolve_references()
    one.update(beam_size=1, alpha=0.0)
    greedy = cfg.decode.copy_and_resolve_references()
    greedy.strategy = "greedy"
    beam_one = translate_ids(loaded, ids, one, buckets)
    for a, b in zip(beam_one, translate_ids(loaded, ids, greedy, buckets), strict=True):
        np.testing.assert_array_equal(a[0][0], b[0][0])  # beam 1, alpha 0 = greedy
    sample = cfg.decode.copy_and_resolve_references()
    sample.update(strategy="sample", seed=3)
    first = translate_ids(loaded, ids, sample, buckets)
    again = translate_ids(loaded, ids, sample, buckets)
    assert [h[0][0].tolist() for h in first] == [h[0][0].tolist() for h in again]
    with pytest.raises(ValueError, match="nbest=2"):
        translate_ids(loaded, ids, sample, buckets, nbest=2)


def test_odd_text_translates_line_for_line(trained_model):
    """Control characters, NUL, a BOM inside a line, unseen scripts, a long line: one output
    line per input line, never an exception (unknown pieces decode as the unknown symbol)."""
    cfg, loaded = trained_model
    lines = [
        "\x00",
        "\ufeffThe dog sees a cat.",
        "\x1b[31mred\x1b[0m \u202eevil\u202c",
        "日本語のテキスト 😀",
        "\t \u00a0 \u200b",
        "We count three small birds. " * 12,
        "",
    ]
    out = translate(loaded, lines, cfg)
    assert len(out) == len(lines) and out[-1] == ""
    assert all(isinstance(o, str) for o in out)


def test_nbest_lines_best_first_with_empty_lines(trained_model):
    cfg, loaded = trained_model
    nbest = translate_nbest(loaded, LINES, cfg, 3)
    assert [len(h) for h in nbest] == [3, 1, 3, 1, 3]
    assert nbest[1] == [("", 0.0)] and nbest[3] == [("", 0.0)]  # nothing decoded
    best = translate(loaded, LINES, cfg)
    assert [h[0][0] for h in nbest] == best  # the first of each list is the translation
    lines = nbest_lines(nbest)
    rows = [line.split("\t") for line in lines]
    assert [int(r[0]) for r in rows] == [0, 0, 0, 1, 2, 2, 2, 3, 4, 4, 4]
    assert all(len(r) == 3 for r in rows)
    for i in (0, 2, 4):
        scores = [float(r[1]) for r in rows if int(r[0]) == i]
        assert scores == sorted(scores, reverse=True)
        assert scores[0] == pytest.approx(nbest[i][0][1], abs=1e-6)  # printed to 6 decimals
