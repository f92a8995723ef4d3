"""tx from Python (tx.api): `tx.load` of a run, a checkpoint, an averaged model or a CTranslate2
export, then translate, score and align; the module's docstring examples run as written."""

import doctest
import json
import os
import shutil

import numpy as np
import pytest

import tx
import tx.api
from tx import workdir as wd
from tx.config import ConfigError, load_config
from tx.infer import engines, scoring
from tx.infer import translate as translate_lib
from tx.tokens import EOS_ID

SENTENCES = ["The dog sees a cat.", "We count three small birds.", "", "I know two red cars."]
# CTranslate2 and XLA evaluate the same float32 network in different orders: a log-probability
# differs by about u = 2^-24 per term of the longest sum (d_ff = 64) relative to its size, and a
# sentence's score (same-sign terms) by that plus u per token summed (<= 64 tokens here).
# Observed: 1e-7 relative.
CT2_RTOL = (64 + 64) * 2.0**-24


@pytest.fixture(scope="module")
def run(trained, tmp_path_factory):
    """A copy of the session's run (checkpoints 5 to 20) with checkpoints 15 and 20 averaged."""
    from tx.train.averaging import average

    path = str(tmp_path_factory.mktemp("api") / "run")
    skip = shutil.ignore_patterns("averaged", "data", "plots", "*.hyp.*", "lock.json")
    shutil.copytree(trained, path, ignore=skip)
    average(load_config(wd.config_file(path)), path, last=2)
    return path


@pytest.fixture(scope="module")
def model(run):
    return tx.load(run)


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
    """The run's CTranslate2 export (of its averaged model)."""
    pytest.importorskip("ctranslate2")
    from tx.infer.export import export

    out = str(tmp_path_factory.mktemp("api_export") / "ct2")
    export(load_config(wd.config_file(run)), run, out)
    return out


def test_the_docstring_examples_run(run, tmp_path, monkeypatch, capsys):
    """tx/api.py's examples, as written: `tx.load("runs/demo")` finds the run there."""
    (tmp_path / "runs").mkdir()
    os.symlink(run, tmp_path / "runs" / "demo")
    monkeypatch.chdir(tmp_path)
    failed, attempted = doctest.testmod(tx.api, optionflags=doctest.ELLIPSIS)
    assert failed == 0, capsys.readouterr().out
    assert attempted >= 10


def test_load_takes_a_run_a_checkpoint_an_average_or_an_export(run, model, exported):
    # nbest lists: the scores tell the parameters apart (the tiny run's best is often "").
    def nbest(m):
        return m.translate(SENTENCES, nbest=2)

    assert model.source == "averaged/20 (steps [15, 20])"
    assert nbest(model) == nbest(tx.load(f"{run}/averaged/20/"))
    fifteen = tx.load(f"{run}/checkpoints/15")
    assert fifteen.source == "checkpoints/15" == tx.load(run, 15).source
    assert nbest(fifteen) == nbest(tx.load(run, checkpoint=15)) != nbest(model)
    assert tx.load(f"{run}/checkpoints/20").source == "checkpoints/20"

    ct2 = tx.load(exported, threads=1)
    assert ct2.source.startswith(f"ctranslate2:{exported} (float32, averaged/20")
    assert ct2.translate(SENTENCES) == model.translate(SENTENCES)
    assert ct2.config.decode == model.config.decode  # the run's config travels with it
    for ours, theirs in zip(nbest(model), nbest(ct2), strict=True):
        assert [t for t, _ in ours] == [t for t, _ in theirs]
        np.testing.assert_allclose([s for _, s in theirs], [s for _, s in ours], rtol=CT2_RTOL)


def test_load_refuses_what_it_cannot_load(run, exported, tmp_path):
    with pytest.raises(wd.NotARun, match="is neither a tx run"):
        tx.load(str(tmp_path))
    with pytest.raises(ConfigError, match="for a CTranslate2 export"):
        tx.load(run, device="cuda")
    with pytest.raises(ConfigError, match="is one checkpoint already"):
        tx.load(f"{run}/checkpoints/15", checkpoint=20)
    with pytest.raises(ConfigError, match="is an export of one checkpoint"):
        tx.load(exported, checkpoint=15)
    with pytest.raises(wd.CheckpointNotFound, match="no averaged checkpoint 7 in"):
        tx.load(f"{run}/averaged/7")
    with pytest.raises(wd.CheckpointNotFound, match="no checkpoint at step 7"):
        tx.load(run, checkpoint=7)
    hf = tmp_path / "hf"  # a Hugging Face export carries tx's record too
    hf.mkdir()
    (hf / "tx_export.json").write_text(json.dumps({"format": "huggingface"}))
    with pytest.raises(ConfigError, match="is a Hugging Face export"):
        tx.load(str(hf))


def test_score_with_alpha_0_is_the_beam_searchs_own_score(model):
    """With alpha 0 a beam search's score is its output's log-probability: score() of the
    same sub-words gives it, up to float32 rounding."""
    # long outputs too: the tiny config's own outputs stop 4 sub-words past their sources
    search = dict(beam=4, alpha=0.0, max_extra_len=50)
    cfg = engines.with_search(model.config, **search)
    todo, sources, hyps = translate_lib._search_lines(model.engine, SENTENCES, cfg, 4)
    pairs = [
        (x, np.append(ids, EOS_ID).astype(np.int32))
        for x, h in zip(sources, hyps, strict=True)
        for ids, _ in h
    ]
    expected = [score for h in hyps for _, score in h]
    assert len(pairs) == 4 * len(todo) and max(len(t) for _, t in pairs) > 40  # long ones too

    def close(got: np.ndarray, score: float) -> bool:
        # The search sums len(got) float32 log-probabilities (each rounding by at most u =
        # 2^-24 of the sum of magnitudes), computed incrementally: the teacher-forced pass
        # reorders their float32 arithmetic, a few u more. Observed: at most 2.3 u.
        tol = (len(got) + 4) * 2.0**-24 * float(np.sum(np.abs(got)))
        return abs(float(np.sum(got, dtype=np.float64)) - score) <= tol

    got = scoring._score_ids(model.engine, pairs)
    assert all(close(g, s) for g, s in zip(got, expected, strict=True))

    # Through the API: the translations whose text encodes back to the sub-words searched
    # (an untrained model's output need not: "e" searched as the piece "e" encodes as "▁e").
    texts = model.translate([SENTENCES[i] for i in todo], nbest=4, **search)
    checked = 0
    for i, h, outputs in zip(todo, hyps, texts, strict=True):
        for (ids, score), (text, api_score) in zip(h, outputs, strict=True):
            assert api_score == score
            target = model.engine.tokenizer.encode(text, target=True)
            if list(target[:-1]) == list(ids):
                scored = model.score([SENTENCES[i]], [text])[0]
                assert close(np.asarray(scored.token_log_probs), score)
                checked += 1
    assert checked >= len(todo)


def test_score_gives_each_subword_and_the_end(model, exported):
    src, tgt = ["The dog sees a cat.", ""], ["Der Hund sieht eine Katze.", ""]
    scored = model.score(src, tgt)
    pieces = model.engine.tokenizer.sp.encode(tgt[0], out_type=str)
    assert scored[0].tokens == [*pieces, "</s>"] and scored[1].tokens == ["</s>"]
    for s in scored:
        assert len(s.token_log_probs) == len(s.tokens) and all(p < 0 for p in s.token_log_probs)
        assert s.log_prob == pytest.approx(sum(s.token_log_probs), rel=1e-12)
    # CTranslate2 scores the same sub-words: its softmax gives PAD and BOS probability 0
    # (tx.infer.export.NEVER_LOGIT), as tx's log_probs do.
    ct2 = tx.load(exported, threads=1).score(src, tgt)
    for a, b in zip(scored, ct2, strict=True):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(b.token_log_probs, a.token_log_probs, rtol=CT2_RTOL)
    with pytest.raises(ValueError, match="2 sources for 1 targets"):
        model.score(src, tgt[:1])


def test_nbest_and_alignments(model, exported):
    best = model.translate(SENTENCES, nbest=3)
    assert [len(b) for b in best] == [3, 3, 1, 3]  # an empty line: ("", 0.0) alone
    assert all(b[0][1] >= b[1][1] >= b[2][1] for b in best if len(b) == 3)
    assert [b[0][0] for b in best] == model.translate(SENTENCES)
    aligned = model.translate(SENTENCES, alignments=True)
    assert [text for text, _ in aligned] == model.translate(SENTENCES)
    # As `translate --alignments` prints them.
    lines = engines.aligned_lines(model.engine, SENTENCES, model.config, layer=None)
    assert lines == [f"{t} ||| {' '.join(f'{i}-{j}' for i, j in a)}" for t, a in aligned]
    links = model.align(["The dog sees a cat."], ["Der Hund sieht eine Katze."], layer=0)[0]
    assert sorted(j for _, j in links) == [0, 1, 2, 3, 4]
    assert model.align(["", "A dog."], ["Ein Hund.", ""]) == [[], []]
    with pytest.raises(ValueError, match="nbest or alignments"):
        model.translate(SENTENCES, nbest=2, alignments=True)
    with pytest.raises(ConfigError, match="--nbest 5: decode.beam keeps 4"):
        model.translate(SENTENCES, nbest=5)
    with pytest.raises(ConfigError, match="--align-layer 2: the model has 2 decoder layers"):
        model.align(["A dog."], ["Ein Hund."], layer=2)
    with pytest.raises(ConfigError, match="--alignments needs one model and --engine jax"):
        tx.load(exported, threads=1).translate("A dog.", alignments=True)
    with pytest.raises(ConfigError, match="no search setting 'beam_width'"):
        model.translate("A dog.", beam_width=2)
