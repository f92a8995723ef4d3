"""The tokenizers of a run's vocabulary (tx.data.vocabulary owns a run's files): one
SentencePiece model shared by source and target (section 5.1), or, for a model imported from
Hugging Face (Marian, OPUS-MT: tx.infer.huggingface_io), two SentencePiece models mapped
through one vocabulary.

    Tokenizer         spm.model: tx's own. Every vocabulary tx trains reserves the ids of
                      tx.tokens (pad, EOS, unk, BOS); a model given with `data.vocab_path` is
                      checked against them.
    MappedTokenizer   source.spm, target.spm, vocab.json (Marian's own files): source text is
                      cut into pieces by source.spm, target text by target.spm, and each piece
                      is the id vocab.json gives it, renumbered in tx's order (`import_order`);
                      with target_vocab.json (separate vocabularies) target pieces take its ids

Both have one interface: `encode(text, target=False)` (a caller encoding target text, such as
the token cache or a forced reference, says `target=True`), `encode_batch`, `decode` (target
text), `piece(id)`, `vocab_size`, `fingerprint` (the sha256 recorded in vocab.sha256), and they
pickle (the token cache's worker processes receive them).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from tx import storage
from tx.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID


def content(ids: Iterable[int]) -> list[int]:
    """The ids a decoder's output says: up to the first EOS, without padding and BOS."""
    out = []
    for i in map(int, ids):
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            out.append(i)
    return out


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

    def __reduce__(self):
        return Tokenizer, (self.path, self.model_bytes)

    def encode(self, text: str, target: bool = False) -> list[int]:
        """Text -> ids with EOS appended; an empty string gives [EOS]. One model encodes both
        sides (`target` as MappedTokenizer's)."""
        return self.sp.encode(text) + [EOS_ID]

    def encode_batch(self, texts: Sequence[str], target: bool = False) -> list[list[int]]:
        return [ids + [EOS_ID] for ids in self.sp.encode(list(texts))]

    def piece(self, i: int, source: bool = False) -> str:
        """The piece of id `i` as SentencePiece spells it ("▁" starts a word); one vocabulary
        for both sides (`source` as MappedTokenizer's)."""
        return self.sp.id_to_piece(int(i))

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text, stopping at the first EOS and skipping padding and BOS."""
        return self.sp.decode(content(ids))


# An imported Marian run's vocabulary (tx.workdir.VOCABULARY_FILES), as Marian names its files.
SOURCE_SPM, TARGET_SPM, VOCAB_JSON = "source.spm", "target.spm", "vocab.json"
MAPPED_FILES = (SOURCE_SPM, TARGET_SPM, VOCAB_JSON)
# Separate vocabularies (MarianTokenizer's separate_vocabs, the Tatoeba-Challenge models'):
# vocab.json is the source's, this file the target's.
TARGET_VOCAB_JSON = "target_vocab.json"
# The pieces Marian's vocab.json gives its special tokens (MarianTokenizer's defaults).
MARIAN_PAD, MARIAN_EOS, MARIAN_UNK = "<pad>", "</s>", "<unk>"
# tx's start token: OPUS-MT's vocabularies lack it (a row tx adds); a tx run's export has it.
BOS_PIECE = "<s>"


class MappedTokenizer:
    """Two SentencePiece models (source.spm, target.spm) whose pieces are ids through one
    vocabulary (vocab.json: piece -> Marian id), or two (vocab.json the source's,
    target_vocab.json the target's: Marian's separate vocabularies), as transformers'
    MarianTokenizer reads them: text -> pieces (the side's model) -> the side's vocabulary's id
    (<unk>'s for a piece it lacks) -> tx's id (`import_order`: tx's reserved ids first). Ids
    decode to target text through target.spm; <s> is never produced. `vocab_size` is the
    target's; `source_vocab_size` the source's where the two differ (else 0)."""

    def __init__(self, directory: str, files: dict[str, bytes] | None = None):
        """`directory`: a run (local or a bucket's prefix) holding MAPPED_FILES (and
        TARGET_VOCAB_JSON where it has one), read whole, unless `files` ({name: content})
        gives them already read."""
        if files is None:
            files = {}
            for name in MAPPED_FILES:
                path = storage.join(directory, name)
                if not storage.exists(path):
                    raise VocabularyError(f"{path} is missing: the run's vocabulary is incomplete")
                files[name] = storage.read_bytes(path)
            target_vocab = storage.join(directory, TARGET_VOCAB_JSON)
            if storage.exists(target_vocab):
                files[TARGET_VOCAB_JSON] = storage.read_bytes(target_vocab)
        self.path, self.files = directory, files
        self.source_sp = _processor(files[SOURCE_SPM], storage.join(directory, SOURCE_SPM))
        self.target_sp = _processor(files[TARGET_SPM], storage.join(directory, TARGET_SPM))
        source = read_vocab(files[VOCAB_JSON], storage.join(directory, VOCAB_JSON))
        target = source
        if TARGET_VOCAB_JSON in files:
            path = storage.join(directory, TARGET_VOCAB_JSON)
            target = read_vocab(files[TARGET_VOCAB_JSON], path)
        self.order = import_order(target)  # [V] Marian id of each tx id, -1 for <s>
        self.source_order = import_order(source) if target is not source else self.order
        self.pieces = _pieces(target, self.order)
        self.source_pieces = _pieces(source, self.source_order)
        self.ids = {p: t for t, p in enumerate(self.pieces) if self.order[t] >= 0}
        self.source_ids = {
            p: t for t, p in enumerate(self.source_pieces) if self.source_order[t] >= 0
        }

    @property
    def source_vocab_size(self) -> int:
        return len(self.source_order) if TARGET_VOCAB_JSON in self.files else 0

    def __reduce__(self):
        return MappedTokenizer, (self.path, self.files)

    @property
    def vocab_size(self) -> int:
        return len(self.order)

    @property
    def sp(self):
        """The source side's SentencePiece model (what counts an input's pieces)."""
        return self.source_sp

    @property
    def fingerprint(self) -> str:
        """sha256 of the lines "<file> <its sha256>" of MAPPED_FILES (then TARGET_VOCAB_JSON
        where there is one), in that order."""
        names = [n for n in (*MAPPED_FILES, TARGET_VOCAB_JSON) if n in self.files]
        lines = "".join(f"{n} {hashlib.sha256(self.files[n]).hexdigest()}\n" for n in names)
        return hashlib.sha256(lines.encode()).hexdigest()

    def encode(self, text: str, target: bool = False) -> list[int]:
        """Text -> ids with EOS appended; `target`: cut by target.spm, else source.spm."""
        return self.encode_batch([text], target)[0]

    def encode_batch(self, texts: Sequence[str], target: bool = False) -> list[list[int]]:
        sp = self.target_sp if target else self.source_sp
        split = [_language_code(t) for t in texts]
        pieces = sp.encode([text for _, text in split], out_type=str)
        get = (self.ids if target else self.source_ids).get
        return [
            [get(p, UNK_ID) for p in code + ps] + [EOS_ID]
            for (code, _), ps in zip(split, pieces, strict=True)
        ]

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> target text (as MarianTokenizer decodes with target.spm), stopping at the
        first EOS and skipping padding and BOS. A piece target.spm lacks is written as it
        is spelled, "▁" a space."""
        pieces = [self.pieces[i] for i in content(ids)]
        return self.target_sp.decode_pieces(pieces).replace("▁", " ").strip()

    def piece(self, i: int, source: bool = False) -> str:
        """The piece of tx id `i` of the target's vocabulary, or of the source's."""
        return (self.source_pieces if source else self.pieces)[int(i)]


def _pieces(vocab: dict[str, int], order: np.ndarray) -> list[str]:
    """The piece of each tx id (`order`: its Marian id), BOS_PIECE for a row tx added."""
    by_marian = {i: p for p, i in vocab.items()}
    return [by_marian[m] if m >= 0 else BOS_PIECE for m in order]


def _language_code(text: str) -> tuple[list[str], str]:
    """A leading ">>xx<<" (multilingual OPUS-MT models' target language) as a piece of its own,
    and the rest of the text: MarianTokenizer's `remove_language_code`."""
    end = text.find("<<") if text.startswith(">>") else -1
    return ([text[: end + 2]], text[end + 2 :]) if end != -1 else ([], text)


def _processor(model_bytes: bytes, path: str) -> spm.SentencePieceProcessor:
    try:
        return spm.SentencePieceProcessor(model_proto=model_bytes)
    except RuntimeError as e:  # sentencepiece's parse error names neither file nor cause
        raise VocabularyError(
            f"{path} is not a SentencePiece model (damaged or replaced?): "
            f"{str(e).splitlines()[0][:200]}"
        ) from e


def read_vocab(data: bytes, path: str) -> dict[str, int]:
    """vocab.json: {piece: id}, the ids 0 .. N-1 each once, with Marian's special pieces."""
    try:
        vocab = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VocabularyError(f"{path} is not a JSON vocabulary: {e}") from e
    if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
        raise VocabularyError(f"{path} does not give the ids 0 .. N-1 once each to pieces")
    missing = [p for p in (MARIAN_EOS, MARIAN_UNK, MARIAN_PAD) if p not in vocab]
    if missing:
        raise VocabularyError(f"{path} lacks {', '.join(missing)}: not a Marian vocabulary")
    return vocab


def import_order(vocab: dict[str, int]) -> np.ndarray:
    """[V] int: the Marian id (vocab.json's) of each tx id, -1 for tx's <s> where vocab.json
    has no "<s>" (OPUS-MT's: V = N + 1, a row tx adds; a tx run's export has one: V = N, and
    its ids come back as they were). tx's reserved ids come first (PAD_ID, EOS_ID, UNK_ID,
    BOS_ID: tx.tokens), then Marian's other ids in their order."""
    reserved = {
        PAD_ID: vocab[MARIAN_PAD],
        EOS_ID: vocab[MARIAN_EOS],
        UNK_ID: vocab[MARIAN_UNK],
        BOS_ID: vocab.get(BOS_PIECE, -1),
    }
    taken = set(reserved.values())
    rest = [i for i in range(len(vocab)) if i not in taken]
    return np.asarray([reserved[t] for t in range(len(reserved))] + rest, np.int64)


def train_tokenizer(
    sentences: Iterable[str],
    path: str,
    vocab_size: int,
    *,
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
    model is trained in memory and written whole to `path` (a file or a bucket's object), which
    is returned: the same sentences and settings give the same bytes.

    `normalization` is SentencePiece's normalization_rule_name: "identity" keeps every character,
    so `decode(encode(s)) == s` for any line the sources give (stripped, single-spaced) whose
    characters were seen in training; "nmt_nfkc" (SentencePiece's default) rewrites some, such as
    "…" -> "...", which then no decoded hypothesis can match. `split_digits` puts every digit in
    its own piece. Both rules are stored in the model file, so encoding always follows the
    vocabulary's own training.
    """
    reservoir = _reservoir_sample(sentences, sample_size, seed)
    # Written to memory, not to a model_prefix: the model file then records no temporary
    # path, so one corpus and configuration give the same bytes (and sha256) every time.
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(reservoir),
            model_writer=model,
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
            # Strips ends, collapses ASCII space runs (U+00A0 stays a character under
            # "identity"): sources strip lines and BLEU/chrF ignore space runs.
            remove_extra_whitespaces=True,
            split_digits=split_digits,
        )
    except RuntimeError as e:
        raise VocabularyError(
            f"SentencePiece training failed for data.vocab_size={vocab_size}: {e}"
        ) from e
    storage.write_bytes(path, model.getvalue())
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
