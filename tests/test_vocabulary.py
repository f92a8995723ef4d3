"""A run's vocabulary (tx.data.vocabulary): recorded once, never rebuilt once recorded, and the
model's source embedding checked against it."""

import os

import pytest

from tx.data import vocabulary
from tx.data.tokenizer import VocabularyError


def test_a_recorded_vocabulary_is_never_rebuilt(vocab, tiny, tmp_path, monkeypatch):
    data, workdir = tiny(f"data.vocab_path={vocab}").data, str(tmp_path)
    tokenizer = vocabulary.obtain(data, workdir)
    assert not vocabulary.recorded(workdir)
    vocabulary.record(workdir, tokenizer)
    vocabulary.record(workdir, tokenizer)  # once: the first record stays
    assert (tmp_path / "vocab.sha256").read_text() == tokenizer.fingerprint + "\n"
    os.remove(tmp_path / "spm.model")
    monkeypatch.setattr(vocabulary, "train_tokenizer", lambda *a, **k: pytest.fail("rebuilt"))
    path = tmp_path / "spm.model"
    with pytest.raises(VocabularyError, match=f"{path} is missing: the run's vocabulary cannot"):
        vocabulary.obtain(data, workdir)


def test_the_source_embedding_is_checked_against_the_vocabulary(vocab, tiny, tmp_path):
    cfg = tiny(f"data.vocab_path={vocab}", "model.source_vocab_size=400")
    with pytest.raises(VocabularyError) as e:
        vocabulary.obtain(cfg.data, str(tmp_path), model=cfg.model)
    assert str(e.value) == (
        f"{tmp_path} has one vocabulary but model.source_vocab_size=400; set "
        "model.source_vocab_size=0"
    )
