"""The CTranslate2 engine (tx.infer.ct2): an exported float32 model translates as tx does, with tx's
input/output contract, search settings and n-best scores."""

import contextlib
import io
import json
import sys
from unittest import mock

import pytest

from tx import workdir as wd
from tx.cli.main import main
from tx.config import apply_override, load_config
from tx.data.dataset import split_text
from tx.infer import ct2
from tx.infer.export import export
from tx.infer.translate import load_model, translate, translate_nbest

pytest.importorskip("ctranslate2")

LINES = ["The dog sees a cat.", "", "I know that the man buys two hundred red cars.", "  "]


@pytest.fixture(scope="module")
def engines(trained, tmp_path_factory):
    cfg = load_config(wd.config_file(trained))
    out = str(tmp_path_factory.mktemp("ct2") / "model")
    export(cfg, trained, out)
    # tx's searches here in one bucket: one compiled search per setting, not one per bucket
    # (source padding moves tx's logits by rounding alone: tests/test_model.py); CTranslate2
    # batches inputs by their length and reads no buckets
    one_bucket = _with(cfg, "data.bucket_lengths=(48,)")
    return one_bucket, load_model(cfg, trained), ct2.load(out, threads=1), out


def _tx(*args: str, stdin: str = "") -> str:
    """`python -m tx ARGS` in this process (tx.cli.main: the command's options and output,
    without a new process's imports), `stdin` its input; its stdout."""
    out = io.StringIO()
    lines = io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8")
    with mock.patch.object(sys, "stdin", lines), contextlib.redirect_stdout(out):
        assert main(list(args)) == 0, f"python -m tx {' '.join(args)}"
    return out.getvalue()


def _with(cfg, *overrides):
    cfg = cfg.copy_and_resolve_references()
    for o in overrides:
        apply_override(cfg, o)
    return cfg


@pytest.mark.parametrize(
    "overrides",
    [
        (),
        # 13-16 s each on 2 cores: two of the option mappings are checked in the slow suite only
        pytest.param(("decode.alpha=0.0",), marks=pytest.mark.slow),
        ("decode.strategy=greedy",),
        pytest.param(("decode.max_extra_len=3",), marks=pytest.mark.slow),
        pytest.param(("decode.max_length_ratio=0.5",), id="ratio"),
        pytest.param(("decode.strategy=greedy", "decode.no_repeat_ngram_size=2"), id="ngram"),
    ],
)
def test_nbest_lists_equal_tx(engines, overrides):
    """Same hypotheses in the same order, same scores: 40 test sentences, beam 4 (alpha 0.6
    re-ranked, alpha 0 CTranslate2's own stop rule), greedy, a short maximum length where
    hypotheses are cut and get tx's forced EOS (by max_extra_len, or by the length ratio), and
    greedy decoding without repeated bigrams (scored again: see tx.infer.ct2). The tiny run
    repeats itself up to its maximum length: the ratio and the bigram rule changed all 40
    outputs (observed)."""
    cfg, loaded, engine, _ = engines
    cfg = _with(cfg, *overrides)
    sources = [s for s, _ in split_text(cfg.data, "test")][:40]
    n = 1 if cfg.decode.strategy == "greedy" else cfg.decode.beam_size
    ours, theirs = (
        translate_nbest(loaded, sources, cfg, n),
        translate_nbest(engine, sources, cfg, n),
    )
    assert [[t for t, _ in h] for h in theirs] == [[t for t, _ in h] for h in ours]
    assert any(t for h in ours for t, _ in h)  # not only empty translations
    longest = max(len(loaded.tokenizer.encode(s)) - 1 for s in sources) + cfg.decode.max_extra_len
    pairs = zip(ours, theirs, strict=True)
    errors = [abs(a - b) for x, y in pairs for (_, a), (_, b) in zip(x, y, strict=True)]
    # Bound: each token's log-probability agrees to 1e-5 (tests/test_export.py; observed
    # 1e-6) and a score sums at most `longest` + 1 of them (EOS); the GNMT divisor is >= 1.
    # Observed: 8e-5 for hypotheses of 80 tokens.
    assert max(errors) <= 1e-5 * (longest + 1)


def test_contract_order_and_empty_lines(engines):
    cfg, loaded, engine, _ = engines
    together = translate(engine, LINES, cfg)
    assert together == translate(loaded, LINES, cfg)
    assert together[1] == "" and together[3] == ""
    assert [translate(engine, [line], cfg)[0] for line in LINES] == together


def test_refusals(engines, tmp_path):
    cfg, _, engine, _ = engines
    with pytest.raises(ct2.EngineError, match="beam or greedy"):
        translate(engine, LINES, _with(cfg, "decode.strategy=sample"))
    with pytest.raises(ValueError, match="positions of the exported table"):
        translate(engine, LINES, _with(cfg, "decode.max_extra_len=5000"))
    with pytest.raises(ct2.EngineError, match="not a tx export"):
        ct2.load(str(tmp_path))


def test_cli_translate_nbest(engines):
    cfg, loaded, _, out = engines
    text = "".join(line + "\n" for line in LINES)
    args = ("--engine", "ctranslate2", "--model", out, "--threads", "1", "--nbest", "2")
    lines = _tx("translate", *args, stdin=text)
    rows = [line.split("\t") for line in lines.splitlines()]
    expected = translate_nbest(loaded, LINES, cfg, 2)
    assert [r[0] for r in rows] == ["0", "0", "1", "2", "2", "3"]  # empty lines: one entry
    assert [r[2] for r in rows] == [t for h in expected for t, _ in h]
    scores = [float(r[1]) for r in rows]
    assert scores[0] >= scores[1] and scores[3] >= scores[4]


def test_cli_evaluate(engines, tmp_path):
    out = engines[3]
    result = json.loads(
        _tx(
            "evaluate",
            "--engine",
            "ctranslate2",
            "--model",
            out,
            "--threads",  # one: OpenMP threads spin-wait on cores that other jobs hold
            "1",
            "--json",
            "--output",
            str(tmp_path / "hyp.txt"),
        ).splitlines()[-1]
    )
    assert result["engine"] == "ctranslate2" and result["num_sentences"] == 50
    assert result["checkpoint"].startswith("ctranslate2:")
    assert len((tmp_path / "hyp.txt").read_text().splitlines()) == 50
