"""A SentencePiece vocabulary shared by source and target (section 5.1).

Every vocabulary tx trains reserves the ids of tx.tokens (pad, EOS, unk, BOS); a model given
with `data.vocab_path` is checked against them.
"""

from __future__ import annotations

import hashlib
import os
import random
import tempfile
from collections.abc import Iterable, Sequence

import sentencepiece as spm

from tx import storage
from tx import workdir as wd
from tx.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID


class VocabularyError(ValueError):
    """A vocabulary that does not fit the run (size or identity)."""


class Tokenizer:
    """Encodes text to ids ending in EOS, and decodes ids back to detokenized text."""

    def __init__(self, model_path: str, model_bytes: bytes | None = None):
        """`model_path`: a local file or a bucket's object, read whole (SentencePiece parses
        the model from bytes), unless `model_bytes` gives its content already read."""
        if model_bytes is None:
            if not storage.exists(model_path):
                raise FileNotFoundError(f"SentencePiece model not found: {model_path}")
            model_bytes = storage.read_bytes(model_path)
        self.model_bytes = model_bytes
        self.path = model_path
        try:
            self.sp = spm.SentencePieceProcessor(model_proto=self.model_bytes)
        except RuntimeError as e:  # sentencepiece's parse error names neither file nor cause
            raise VocabularyError(
                f"{model_path} is not a SentencePiece model (damaged or replaced?): "
                f"{str(e).splitlines()[0][:200]}"
            ) from e
        ids = (self.sp.pad_id(), self.sp.eos_id(), self.sp.unk_id(), self.sp.bos_id())
        if ids != (PAD_ID, EOS_ID, UNK_ID, BOS_ID):
            raise VocabularyError(
                f"{model_path}: reserved ids (pad, eos, unk, bos) are {ids}, "
                f"tx needs {(PAD_ID, EOS_ID, UNK_ID, BOS_ID)}"
            )

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    @property
    def fingerprint(self) -> str:
        """sha256 of the model file: identifies the vocabulary in caches and checkpoints."""
        return hashlib.sha256(self.model_bytes).hexdigest()

    def encode(self, text: str) -> list[int]:
        """Text -> ids with EOS appended; an empty string gives [EOS]."""
        return self.sp.encode(text) + [EOS_ID]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [ids + [EOS_ID] for ids in self.sp.encode(list(texts))]

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text, stopping at the first EOS and skipping padding and BOS."""
        out = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                out.append(i)
        return self.sp.decode(out)


def train_tokenizer(
    sentences: Iterable[str],
    path: str,
    vocab_size: int,
    model_type: str = "bpe",
    sample_size: int = 1_000_000,
    character_coverage: float = 1.0,
    seed: int = 0,
    normalization: str = "identity",
    split_digits: bool = False,
) -> str:
    """Trains one vocabulary on source and target sentences together.

    Sentences are reservoir-sampled down to `sample_size` (the paper's 37k BPE was learned on
    the whole WMT corpus; a few million sentences give the same vocabulary in practice). The
    model is trained in a local temporary directory and written whole to `path` (a file or a
    bucket's object), which is returned.

    `normalization` is SentencePiece's normalization_rule_name: "identity" keeps every character,
    so `decode(encode(s)) == s` for any line the sources give (stripped, single-spaced) whose
    characters were seen in training; "nmt_nfkc" (SentencePiece's default) rewrites some, such as
    "…" -> "...", which then no decoded hypothesis can match. `split_digits` puts every digit in
    its own piece. Both rules are stored in the model file, so encoding always follows the
    vocabulary's own training.
    """
    reservoir = _reservoir_sample(sentences, sample_size, seed)
    with tempfile.TemporaryDirectory(prefix="tx-spm-") as tmp:
        prefix = os.path.join(tmp, "spm")
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(reservoir),
                model_prefix=prefix,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                pad_id=PAD_ID,
                eos_id=EOS_ID,
                unk_id=UNK_ID,
                bos_id=BOS_ID,
                pad_piece="<pad>",
                eos_piece="</s>",
                unk_piece="<unk>",
                bos_piece="<s>",
                input_sentence_size=0,  # already sampled above
                num_threads=max(1, os.cpu_count() or 1),
                minloglevel=2,
                normalization_rule_name=normalization,
                # Strips the ends and collapses runs of ASCII spaces only (with "identity", other
                # spaces such as U+00A0 stay characters): sources already strip lines, and BLEU and
                # chrF ignore space runs, so the model need not learn to write them.
                remove_extra_whitespaces=True,
                split_digits=split_digits,
            )
        except RuntimeError as e:
            raise VocabularyError(
                f"SentencePiece training failed for data.vocab_size={vocab_size}: {e}"
            ) from e
        with open(prefix + ".model", "rb") as f:
            storage.write_bytes(path, f.read())
    return path


def _reservoir_sample(sentences: Iterable[str], k: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = []
    for n, s in enumerate(sentences):
        if not s:
            continue
        if len(out) < k:
            out.append(s)
        else:
            j = rng.randint(0, n)
            if j < k:
                out[j] = s
    return out


def check_vocabulary(workdir: str, tokenizer) -> None:
    """The vocabulary a workdir's checkpoints were trained with must be the one loaded now;
    the first run records it."""
    path = wd.vocab_hash_file(workdir)
    if storage.exists(path):
        saved = storage.read_text(path).strip()
        if saved != tokenizer.fingerprint:
            raise VocabularyError(
                f"{tokenizer.path} (sha256 {tokenizer.fingerprint[:12]}) is not the vocabulary "
                f"the checkpoints in {workdir} were trained with (sha256 {saved[:12]})"
            )
    elif wd.is_main():
        storage.write_text(path, tokenizer.fingerprint + "\n")


def run_tokenizer(workdir: str) -> Tokenizer:
    """The vocabulary of a trained run, `workdir/spm.model`, checked against the sha256 the run
    recorded: the checkpoints only make sense with that exact vocabulary, so a damaged or
    replaced one is refused, naming the file (it cannot be rebuilt)."""
    path, recorded = wd.vocab_file(workdir), wd.vocab_hash_file(workdir)
    if not storage.exists(path):
        raise VocabularyError(f"{path} is missing: the run's vocabulary cannot be rebuilt")
    if storage.exists(recorded):
        want = storage.read_text(recorded).strip()
        have = storage.sha256(path)
        if have != want:
            raise VocabularyError(
                f"{path} is damaged or replaced: its sha256 {have[:12]} is not the {want[:12]} "
                f"this run recorded in {recorded}. The checkpoints need that exact vocabulary: "
                "restore the file from a copy (an export of this run holds it), or train anew "
                "in another --workdir"
            )
    return Tokenizer(path)
