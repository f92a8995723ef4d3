"""The input pipeline: sources, vocabulary, token cache, batching, bad input."""

import dataclasses
import itertools
import random

import numpy as np
import pytest

from tx.config import load_config
from tx.data import demo_corpus, sources, vocabulary
from tx.data.pipeline import (
    POSITION_KEY,
    BatchSpec,
    TrainStream,
    _pack_rows,
    eval_batches,
    filter_for_training,
    plan_epoch,
    wmt_like,
)
from tx.data.token_cache import TokenizedSplit, tokenized
from tx.data.tokenizer import Tokenizer, VocabularyError, train_tokenizer
from tx.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID


# ---------------------------------------------------------------- demo corpus
def test_demo_corpus_is_deterministic_and_seeded():
    a = list(demo_corpus.generate("train", 0, 300))
    assert a == list(demo_corpus.generate("train", 0, 300))
    assert a != list(demo_corpus.generate("train", 1, 300))
    assert len({en for en, _ in a}) == 300  # distinct pairs


def test_demo_splits_are_disjoint():
    train = {en for en, _ in demo_corpus.generate("train", 0, 20000)}
    dev = {en for en, _ in demo_corpus.generate("dev", 0, 200)}
    test = {en for en, _ in demo_corpus.generate("test", 0, 200)}
    assert not (train & dev) and not (train & test) and not (dev & test)


@pytest.mark.parametrize(
    "det,case,gender,ending",
    [
        ("def", "nom", "m", "e"),  # der kleine Hund
        ("def", "acc", "m", "en"),  # den kleinen Hund
        ("def", "acc", "f", "e"),  # die kleine Katze
        ("def", "dat", "n", "en"),  # dem kleinen Auto
        ("indef", "nom", "m", "er"),  # ein kleiner Hund
        ("indef", "nom", "n", "es"),  # ein kleines Auto
        ("indef", "acc", "m", "en"),  # einen kleinen Hund
        ("indef", "dat", "f", "en"),  # einer kleinen Katze
        ("none", "nom", "pl", "e"),  # drei kleine Hunde
        ("none", "dat", "pl", "en"),  # mit drei kleinen Hunden
        ("def", "nom", "pl", "en"),  # die kleinen Hunde
    ],
)
def test_german_adjective_endings(det, case, gender, ending):
    assert demo_corpus._adjective_ending(det, case, gender) == ending


def test_demo_numbers_put_units_before_tens():
    assert demo_corpus._NUM_DE[242] == "zweihundertzweiundvierzig"
    assert demo_corpus._NUM_EN[242] == "two hundred forty-two"
    assert demo_corpus._YEARS[1994] == ("nineteen ninety-four", "neunzehnhundertvierundneunzig")
    assert demo_corpus._ORD_DE_DAT[3] == "dritten" and demo_corpus._ORD_EN[3] == "third"


def test_demo_sentences_follow_german_word_order():
    pairs = list(demo_corpus.generate("train", 0, 3000))
    reported = [(e, d) for e, d in pairs if ", dass " in d]
    assert reported
    # "that S V O" -> "dass S O V": the German clause ends with the verb (or participle+aux).
    finals = (
        {v[5] for v in demo_corpus.VERBS}
        | {v[6] for v in demo_corpus.VERBS}
        | {v[4] for v in demo_corpus.VERBS}
        | set(demo_corpus.HAVE.values())
    )
    assert all(d.rstrip(".").split()[-1] in finals for _, d in reported)
    fronted = [(e, d) for e, d in pairs if e.startswith("On the ")]
    assert all(d.startswith("Am ") for _, d in fronted)


# ---------------------------------------------------------------- text files
def write(path, text, mode="w"):
    with open(path, mode) as f:
        f.write(text)


def test_text_source_reads_aligned_files_and_accepts_crlf(tmp_path):
    write(tmp_path / "train.en", "Hello world\r\nSecond line\r\n")
    write(tmp_path / "train.de", "Hallo Welt\nZweite Zeile")  # no final newline
    text = sources.text_split(str(tmp_path / "train"), "en", "de")
    assert list(text) == [("Hello world", "Hallo Welt"), ("Second line", "Zweite Zeile")]


def test_text_source_line_count_mismatch_names_both_files(tmp_path):
    write(tmp_path / "x.en", "a\nb\nc\n")
    write(tmp_path / "x.de", "a\nb\n")
    with pytest.raises(sources.DataError) as e:
        sources.text_split(str(tmp_path / "x"), "en", "de")
    msg = str(e.value)
    assert "x.en has 3 lines" in msg and "x.de has 2" in msg


def test_text_source_invalid_utf8_names_file_and_line(tmp_path):
    write(tmp_path / "y.en", "ok\nfine\n")
    write(tmp_path / "y.de", b"gut\n\xff\xfe kaputt\n", mode="wb")
    with pytest.raises(sources.DataError, match=r"y\.de:2: invalid UTF-8"):
        list(sources.text_split(str(tmp_path / "y"), "en", "de"))


def test_invalid_utf8_error_names_line_and_byte_offset_of_the_file(tmp_path):
    write(tmp_path / "y.en", "ok\nfine\nthird\n")
    write(tmp_path / "y.de", b"gut\nsch\xc3\xb6n \xff\nok\n", mode="wb")
    with pytest.raises(sources.DataError) as e:
        list(sources.text_split(str(tmp_path / "y"), "en", "de"))
    # Byte 4 starts line 2; "schön " is 7 bytes, so the 0xff is at offset 11.
    assert str(e.value).startswith(f"{tmp_path}/y.de:2: invalid UTF-8 at byte offset 11 ")
    assert "\\xff" in str(e.value) and "data.on_bad_line=skip" in str(e.value)
    assert open(tmp_path / "y.de", "rb").read()[11:12] == b"\xff"


def test_on_bad_line_skip_leaves_out_the_pair_and_counts_it(tmp_path, caplog):
    write(tmp_path / "s.en", b"one\ntw\xe9o\nthree\nfour\n", mode="wb")  # Latin-1 \xe9
    write(tmp_path / "s.de", b"eins\nzwei\ndrei\nvi\x80er\n", mode="wb")
    strict = sources.text_split(str(tmp_path / "s"), "en", "de")
    skip = sources.text_split(str(tmp_path / "s"), "en", "de", on_bad_line="skip")
    with caplog.at_level("WARNING"):
        assert list(skip) == [("one", "eins"), ("three", "drei")]  # both sides stay aligned
    assert "left out 2 pair(s) with invalid UTF-8 (lines 2, 4)" in caplog.text
    assert "s.en:2: invalid UTF-8" in caplog.text  # the first one, in full
    assert skip.fingerprint != strict.fingerprint  # their token caches never mix


def test_dev_and_test_text_never_skip_bad_lines(tmp_path, tiny):
    write(tmp_path / "d.en", b"a\n\xff\n", mode="wb")
    write(tmp_path / "d.de", "a\nb\n")
    data = tiny(
        "data.source=text",
        f"data.train_prefix={tmp_path}/d",
        f"data.dev_prefix={tmp_path}/d",
        "data.on_bad_line=skip",
    ).data
    assert list(sources.load_split(data, "train")) == [("a", "a")]
    with pytest.raises(sources.DataError, match=r"d\.en:2: invalid UTF-8") as e:
        list(sources.load_split(data, "dev"))
    assert "on_bad_line" not in str(e.value)  # not offered: a test set is scored whole


def test_bom_and_crlf_are_not_text_anywhere_else_they_are(tmp_path):
    write(tmp_path / "b.en", b"\xef\xbb\xbfHello\r\nWorld\r\n", mode="wb")
    write(tmp_path / "b.de", b"Hallo\n\xef\xbb\xbfWelt\rx\n", mode="wb")
    pairs = list(sources.text_split(str(tmp_path / "b"), "en", "de"))
    assert pairs == [("Hello", "Hallo"), ("World", "\ufeffWelt\rx")]
    lines = sources.read_lines([b"\xef\xbb\xbfa\r\n", b"\r\n", b"b\r\r\n", b"c"], "<stdin>")
    assert lines == ["a", "", "b\r", "c"]  # one CR before LF is the line end, no more


def test_utf16_and_empty_files_are_named(tmp_path):
    write(tmp_path / "u.en", "hello\n".encode("utf-16"), mode="wb")
    write(tmp_path / "u.de", "hallo\n")
    with pytest.raises(sources.DataError, match=r"u\.en starts with a UTF-16 byte order mark"):
        list(sources.text_split(str(tmp_path / "u"), "en", "de"))
    write(tmp_path / "e.en", "")
    write(tmp_path / "e.de", "")
    with pytest.raises(sources.DataError, match=r"e\.en and .*e\.de are empty"):
        sources.text_split(str(tmp_path / "e"), "en", "de")


def test_text_source_missing_file(tmp_path):
    write(tmp_path / "z.en", "a\n")
    with pytest.raises(sources.DataError, match=r"not found: .*z\.de"):
        sources.text_split(str(tmp_path / "z"), "en", "de")


def test_text_source_fingerprint_follows_content(tmp_path):
    write(tmp_path / "f.en", "a\n")
    write(tmp_path / "f.de", "b\n")
    before = sources.text_split(str(tmp_path / "f"), "en", "de").fingerprint
    write(tmp_path / "f.de", "c\n")
    assert sources.text_split(str(tmp_path / "f"), "en", "de").fingerprint != before


# ---------------------------------------------------------------- TFDS
def test_tfds_wmt14_path_under_mock_data():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=7):
        text = sources.tfds_split("wmt14_translate/de-en", "dev", "en", "de")
        pairs = list(text)
    assert len(pairs) == 7
    assert all(isinstance(s, str) and isinstance(t, str) for s, t in pairs)
    assert sources.TFDS_SPLITS["dev"] == "validation" and sources.TFDS_SPLITS["test"] == "test"


def test_tfds_direction_must_match_the_pair():
    with pytest.raises(sources.DataError, match="language pair"):
        sources.tfds_split("wmt14_translate/fr-en", "train", "en", "de")


# ---------------------------------------------------------------- vocabulary and cache
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny):
    cfg = tiny()
    workdir = str(tmp_path_factory.mktemp("tiny"))
    tok = vocabulary.obtain(cfg.data, workdir)
    return cfg, workdir, tok


def test_vocabulary_reserved_ids_and_round_trip(tiny_run):
    _, _, tok = tiny_run
    assert (tok.sp.pad_id(), tok.sp.eos_id(), tok.sp.unk_id(), tok.sp.bos_id()) == (
        PAD_ID,
        EOS_ID,
        UNK_ID,
        BOS_ID,
    )
    ids = tok.encode("The dog sees a cat.")
    assert ids[-1] == EOS_ID and PAD_ID not in ids
    assert tok.decode(ids) == "The dog sees a cat."
    assert tok.encode("") == [EOS_ID]


def test_vocabulary_is_reused_never_retrained(tiny_run, monkeypatch):
    cfg, workdir, tok = tiny_run
    monkeypatch.setattr(vocabulary, "train_tokenizer", lambda *a, **k: pytest.fail("retrained"))
    assert vocabulary.obtain(cfg.data, workdir).fingerprint == tok.fingerprint
    cfg2 = cfg.copy_and_resolve_references()
    cfg2.data.vocab_size = 500
    with pytest.raises(VocabularyError, match="300 pieces but data.vocab_size=500"):
        vocabulary.obtain(cfg2.data, workdir)


def test_token_cache_is_written_once(tiny_run, monkeypatch, tmp_path):
    cfg, workdir, tok = tiny_run
    text = sources.demo_split(cfg.data, "dev")
    first = tokenized(text, tok, str(tmp_path), num_workers=1)
    monkeypatch.setattr(Tokenizer, "encode_batch", lambda *a: pytest.fail("re-tokenized"))
    again = tokenized(text, tok, str(tmp_path), num_workers=1)
    np.testing.assert_array_equal(first.src_ids, again.src_ids)
    assert len(first) == cfg.data.demo_eval_size
    src, _ = next(iter(text))
    assert list(first.src(0)) == Tokenizer(tok.path).encode(src)


def test_token_cache_with_two_workers_matches_one(tiny_run, tmp_path):
    cfg, _, tok = tiny_run
    text = sources.demo_split(cfg.data, "train")
    one = tokenized(text, tok, str(tmp_path / "a"), num_workers=1)
    two = tokenized(text, tok, str(tmp_path / "b"), num_workers=2)
    np.testing.assert_array_equal(one.tgt_ids, two.tgt_ids)
    np.testing.assert_array_equal(one.src_offsets, two.src_offsets)


# ---------------------------------------------------------------- sub-words that round-trip
# Real-looking pairs with typographic quotes, dashes, ellipses, no-break spaces (U+00A0, and the
# narrow U+202F of French typography) and accents. The vocabulary is shared, so the target file
# mixes German and French. Every character of ROUND_TRIP occurs here, so none becomes <unk>.
TYPOGRAPHIC_PAIRS = [
    ("“It’s over,” she said – and left…", "„Es ist vorbei“, sagte sie – und ging…"),
    ("‘Wait’, he wrote — nobody came.", "« Attendez\u202f! », écrivit-il — personne ne vint."),
    (
        "Mr\u00a0Müller paid 2014\u00a0euros in 2014.",
        "Herr\u00a0Müller zahlte 2014\u00a0Euro im Jahr 2014.",
    ),
    (
        "Señor Núñez met Dr\u00a0Ångström in Málaga…",
        "Señor Núñez traf Dr.\u00a0Ångström in der ‚Straße‘…",
    ),
    (
        "Café Tortoni’s “naïve” menu – 10\u202f000 dishes.",
        "Le menu «\u202fnaïf\u202f» du café – 10\u202f000 plats.",
    ),
    ("In 2014 the Élysée said: “No.”", "2014 sagte der Élysée: „Nein.“"),
]
ROUND_TRIP = [s for pair in TYPOGRAPHIC_PAIRS for s in pair] + [
    "„Straße“ – nicht ‚Strasse‘… sagte Åsa in Málaga.",
    "“Café\u00a0Müller”, 2014 — ‘señor’ Núñez\u202f!",
]


def typographic_vocabulary(tmp_path, **data):
    """`vocabulary.obtain` from base.py's data section on TYPOGRAPHIC_PAIRS (text source)."""
    cfg = load_config_base()
    tmp_path.mkdir(exist_ok=True)
    prefix = tmp_path / "train"
    write(f"{prefix}.en", "".join(f"{en}\n" for en, _ in TYPOGRAPHIC_PAIRS * 20))
    write(f"{prefix}.de", "".join(f"{de}\n" for _, de in TYPOGRAPHIC_PAIRS * 20))
    cfg.data.update(source="text", train_prefix=str(prefix), vocab_size=200, **data)
    return vocabulary.obtain(cfg.data, str(tmp_path))


def test_vocabulary_round_trips_typographic_text(tmp_path):
    tok = typographic_vocabulary(tmp_path)
    assert set("".join(ROUND_TRIP)) <= set("".join(en + de for en, de in TYPOGRAPHIC_PAIRS))
    for s in ROUND_TRIP:
        ids = tok.encode(s)
        assert UNK_ID not in ids and tok.decode(ids) == s


def test_digits_are_split_only_when_configured(tmp_path):
    # "2014" is frequent in the training text: BPE makes it one piece unless digits are split.
    whole = typographic_vocabulary(tmp_path / "default")
    assert whole.sp.encode("2014", out_type=str) == ["▁2014"]
    split = typographic_vocabulary(tmp_path / "split", spm_split_digits=True)
    assert split.sp.encode("2014", out_type=str) == ["▁", "2", "0", "1", "4"]
    pieces = [split.sp.id_to_piece(i) for i in range(split.vocab_size)]
    assert all(sum(c.isdigit() for c in p) <= 1 for p in pieces)
    assert all(split.decode(split.encode(s)) == s for s in ROUND_TRIP)


def test_vocabularies_trained_before_load_with_their_own_rules(tmp_path):
    # train_tokenizer's settings before data.spm_normalization and data.spm_split_digits existed.
    sentences = [s for pair in TYPOGRAPHIC_PAIRS * 20 for s in pair]
    tok = Tokenizer(
        train_tokenizer(
            sentences, str(tmp_path / "spm.model"), 200, normalization="nmt_nfkc", split_digits=True
        )
    )
    assert (tok.sp.pad_id(), tok.sp.eos_id(), tok.sp.unk_id(), tok.sp.bos_id()) == (
        PAD_ID,
        EOS_ID,
        UNK_ID,
        BOS_ID,
    )
    # The rules live in the model file: still digit-split, still rewriting "…" and U+00A0.
    assert tok.sp.encode("2014", out_type=str) == ["▁", "2", "0", "1", "4"]
    assert tok.decode(tok.encode("Herr\u00a0Müller ging…")) == "Herr Müller ging..."


def test_a_vocabulary_trained_twice_is_the_same_file(tmp_path):
    """The model file records no temporary path of its training: its sha256 (the run card's
    vocabulary_sha256, the token caches' key) depends on the sentences and settings only."""
    sentences = [s for pair in TYPOGRAPHIC_PAIRS * 20 for s in pair]
    a, b = (train_tokenizer(sentences, str(tmp_path / f"{n}.model"), 200) for n in "ab")
    assert Tokenizer(a).fingerprint == Tokenizer(b).fingerprint
    assert open(a, "rb").read() == open(b, "rb").read()


# ---------------------------------------------------------------- batching
def synthetic_split(n=500, seed=0, max_len=60):
    rng = np.random.default_rng(seed)
    src_len = rng.integers(1, max_len, n)
    tgt_len = np.clip(src_len + rng.integers(-5, 6, n), 1, max_len)

    def pack(lengths, base):
        ids = [np.arange(base, base + k, dtype=np.int32) % 1000 + 4 for k in lengths]
        ids = [np.append(x[:-1], EOS_ID) for x in ids]
        return np.concatenate(ids), np.concatenate([[0], np.cumsum(lengths)])

    s_ids, s_off = pack(src_len, 0)
    t_ids, t_off = pack(tgt_len, 7)
    return TokenizedSplit(s_ids, s_off, t_ids, t_off)


def test_filter_counts_empty_and_too_long():
    split = synthetic_split()
    keep, counts = filter_for_training(split, max_len=40)
    src, tgt = split.src_lengths, split.tgt_lengths
    assert counts["dropped_empty"] == int(((src <= 1) | (tgt <= 1)).sum())
    assert counts["kept"] + counts["dropped_empty"] + counts["dropped_too_long"] == len(src)
    assert (src[keep] <= 40).all() and (tgt[keep] <= 40).all() and (src[keep] > 1).all()


@pytest.mark.parametrize("pack", [False, True])
def test_batches_respect_budget_and_cover_each_pair_once(pack):
    split = synthetic_split()
    keep, _ = filter_for_training(split, 48)
    spec = BatchSpec(
        (8, 16, 24, 32, 48), tokens_per_step=256, max_len=48, row_multiple=4, seed=3, pack=pack
    )
    plan = plan_epoch(split.src_lengths, split.tgt_lengths, keep, spec, epoch=0)
    seen = []
    for b in plan:
        # Real rows hold at most twice the real-token budget in padded tokens (memory); the
        # batch is padded with empty rows to a multiple of the 4 shards.
        real = [row for row in b.rows if row]
        assert len(real) * b.length <= 2 * 256 and len(b.rows) % 4 == 0
        for row in b.rows:
            assert split.src_lengths[row].sum() <= b.length
            assert split.tgt_lengths[row].sum() <= b.length
            seen.extend(row)
    assert sorted(seen) == sorted(keep.tolist())
    other = plan_epoch(split.src_lengths, split.tgt_lengths, keep, spec, epoch=1)
    assert [b.rows for b in other] != [b.rows for b in plan]  # reshuffled each epoch


def test_packing_puts_each_pair_in_the_first_open_row_with_room():
    """First fit over a window of open rows (here 2): a pair that fits no open row opens one,
    closing the oldest when the window is full; the plan's bits depend on this order."""
    src = np.array([6, 5, 4, 3, 5, 1])
    tgt = np.array([6, 5, 4, 3, 2, 1])
    spec = BatchSpec((10,), tokens_per_step=20, max_len=10, pack=True)
    rows = _pack_rows(np.arange(6), src, tgt, spec, open_rows=2)
    # 0 opens a row; 1 does not fit it; 2 fills it; 3 joins 1; 4 fits neither (src 5 > 2
    # left): the full row [0, 2] closes; 5 joins [1, 3].
    assert rows == [[0, 2], [1, 3, 5], [4]]
    order = np.array([5, 4, 3, 2, 1, 0])
    assert _pack_rows(order, src, tgt, spec, open_rows=2) == [[5, 4, 3], [2, 1], [0]]


@pytest.mark.parametrize("pack", [False, True])
def test_two_processes_split_each_global_batch(pack):
    split = synthetic_split()
    keep, _ = filter_for_training(split, 48)
    base = BatchSpec(
        (8, 16, 24, 32, 48),
        tokens_per_step=256,
        max_len=48,
        row_multiple=4,
        pack=pack,
    )
    # Process p holding the even (p = 0) or odd (p = 1) rows, as an interleaved mesh would.
    halves = [lambda n, p=p: np.arange(p, n, 2) for p in range(2)]
    streams = [TrainStream(split, keep, dataclasses.replace(base, local_rows=h)) for h in halves]
    n_batches = len(streams[0].epoch_plan())
    seen = []
    for b in range(n_batches):
        global_rows = len(streams[0].epoch_plan()[b].rows)
        halves = [next(s) for s in streams]
        for h in halves:
            assert h["inputs"].shape[0] * 2 == global_rows  # each process: its half
            seen.extend(_pairs_in(h, pack))
    expected = sorted((tuple(split.src(i)), tuple(split.tgt(i))) for i in keep)
    assert sorted(seen) == expected


def _pairs_in(batch, pack):
    out = []
    for r in range(batch["inputs"].shape[0]):
        if pack:
            segs = set(batch["inputs_segments"][r]) - {0}
            for s in segs:
                src = batch["inputs"][r][batch["inputs_segments"][r] == s]
                tgt = batch["targets"][r][batch["targets_segments"][r] == s]
                out.append((tuple(src), tuple(tgt)))
        elif batch["inputs"][r].any():
            src, tgt = batch["inputs"][r], batch["targets"][r]
            out.append((tuple(src[src != 0]), tuple(tgt[tgt != 0])))
    return out


def test_restoring_position_gives_the_same_next_batch():
    split = synthetic_split()
    keep, _ = filter_for_training(split, 48)
    spec = BatchSpec((8, 16, 24, 32, 48), tokens_per_step=256, max_len=48, seed=5)
    stream = TrainStream(split, keep, spec)
    n = len(stream.epoch_plan())
    for _ in range(n + 3):  # into the second epoch
        batch = next(stream)
    position = {"epoch": int(batch[POSITION_KEY][0, 0]), "batch": int(batch[POSITION_KEY][0, 1])}
    expected = next(stream)
    resumed = next(TrainStream(split, keep, spec, position))
    for k in expected:
        np.testing.assert_array_equal(expected[k], resumed[k])


def test_eval_batches_keep_every_sentence_untruncated():
    lengths = np.array([3, 70, 12, 5, 200, 9, 9, 33])
    batches = eval_batches(lengths, batch_tokens=64, bucket_lengths=(8, 16, 32, 64))
    seen = [i for _, idx in batches for i in idx if i >= 0]
    assert sorted(seen) == list(range(len(lengths)))
    for length, idx in batches:
        assert all(lengths[i] <= length for i in idx if i >= 0)


def test_padding_efficiency_on_wmt_like_lengths():
    from tx.data.pipeline import padding_efficiency

    base = load_config_base()
    spec = BatchSpec(tuple(base.data.bucket_lengths), 25000, 256, row_multiple=8)
    # At WMT scale (millions of pairs) the part-filled last batch of each bucket is negligible.
    split = wmt_like(1_000_000)
    keep, _ = filter_for_training(split, 256)
    buckets = padding_efficiency(split, keep, spec)
    assert buckets["efficiency"] > 0.85 and len(buckets["shapes"]) == len(spec.bucket_lengths)
    _assert_paper_budget(buckets, mean_within=0.01, side_within=0.05)
    split = wmt_like(100_000)
    keep, _ = filter_for_training(split, 256)
    packed = padding_efficiency(split, keep, dataclasses.replace(spec, pack=True))
    # 102 real rows fill a packed step; 8 shards need 104 rows, and 104 real rows would be 2%
    # over the budget (more than pipeline.ROW_TOLERANCE), so 2 rows are empty: 2% of the
    # compute for the budget within 1%. Measured efficiency 0.928 (0.947 on one shard).
    assert packed["efficiency"] > 0.92 and len(packed["shapes"]) == 1
    # One shape of ~102 real rows: the rounding to a whole row (0.5%) plus the error of the
    # mean fill, estimated on a sample of packed rows; observed 1.1% under the budget.
    _assert_paper_budget(packed, mean_within=0.02, side_within=0.06)


def test_tokens_per_step_do_not_depend_on_the_device_count():
    """Base config on 1, 8, 64 and 512 data shards (no devices needed): real rows, hence real
    tokens per step, within 1% (pipeline.ROW_TOLERANCE) in every bucket; the empty rows that
    give every shard a row grow instead (issue 17: once rows were rounded down to the shards,
    the L=256 bucket got 64 rows instead of 127 on 64 shards)."""
    from tx.data.pipeline import padding_efficiency

    base = load_config_base()
    split = wmt_like(300_000)
    keep, _ = filter_for_training(split, 256)
    reports = {
        shards: padding_efficiency(
            split, keep, BatchSpec(tuple(base.data.bucket_lengths), 25000, 256, shards)
        )
        for shards in (1, 8, 64, 512)
    }
    one = reports[1]
    for shards, r in reports.items():
        for side in ("real_src_tokens_per_step", "real_tgt_tokens_per_step"):
            assert abs(r[side] - one[side]) <= 0.01 * one[side], (shards, side)
        for length, b in r["by_length"].items():
            assert abs(b["rows"] - one["by_length"][length]["rows"]) <= 0.01 * b["rows"]
            assert b["padded_rows"] % shards == 0 and b["padded_rows"] - b["rows"] < shards


def _assert_paper_budget(report, mean_within, side_within):
    """About 25,000 real tokens per side per step. The budget holds for the mean of the two
    sides; WMT-like targets are ~10% longer than sources, so each side is ~5% off that."""
    src, tgt = report["real_src_tokens_per_step"], report["real_tgt_tokens_per_step"]
    assert abs((src + tgt) / 2 - 25000) <= mean_within * 25000, report
    assert max(abs(src - 25000), abs(tgt - 25000)) <= side_within * 25000, report


def load_config_base():
    import pathlib

    return load_config(str(pathlib.Path(__file__).parents[1] / "configs" / "base.py"))


def test_chunks_helper():
    from tx.data.token_cache import _chunked

    assert [len(c) for c in _chunked(iter(range(5)), 2)] == [2, 2, 1]
    assert list(itertools.islice(_chunked(iter([]), 3), 1)) == []


# ---------------------------------------------------------------- fuzzing text and tokens
# Seeded loops (no new dependency; the same cases every run). Pieces that make up the inputs.
PIECES = (
    "a", "Hallo Welt", " ", "\t", "\r", "\r\n", "\n", "\n\n", "\x00", "\x0b", "\x1b[0m", "é",
    "ß", "€", "\u00a0", "\u200b", "\ufeff", "\ufffd", "\u202e", "e\u0301", "日本語", "😀",
    "\U0010ffff",
)  # fmt: skip
BAD_BYTES = (b"\xff", b"\xfe", b"\x80", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80")


def _random_bytes(rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))  # noise
    data = "".join(rng.choice(PIECES) for _ in range(rng.randrange(40))).encode()
    if kind < 0.3:
        data = b"\xef\xbb\xbf" + data  # a BOM
    if kind > 0.6:  # one invalid sequence somewhere
        at = rng.randrange(len(data) + 1)
        data = data[:at] + rng.choice(BAD_BYTES) + data[at:]
    return data


def _expected_lines(data: bytes) -> list[str]:
    """The reader's contract, written independently: UTF-8, one BOM dropped at the start,
    lines end at LF, one CR before it dropped."""
    text = data.decode("utf-8").removeprefix("\ufeff")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # text ending in LF has no further line
    return [line.removesuffix("\r") for line in lines]


def _check_read(data: bytes, path) -> list[str] | None:
    """Reads `data` from `path`: the lines, or None after checking the error is the right one."""
    path.write_bytes(data)
    try:
        with open(path, "rb") as f:
            lines = sources.read_lines(f, str(path))
    except sources.DataError as e:
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            assert str(e).startswith(f"{path} starts with a UTF-16 byte order mark"), str(e)
            return None
        with pytest.raises(UnicodeDecodeError) as bad:
            data.decode("utf-8")
        at = bad.value.start  # the first invalid byte: its line and offset must be named
        line = data[:at].count(b"\n") + 1
        assert str(e).startswith(f"{path}:{line}: invalid UTF-8 at byte offset {at} ("), str(e)
        assert "\n" not in str(e)
        return None
    assert lines == _expected_lines(data), data
    return lines


def test_random_bytes_read_as_written_or_name_the_first_bad_byte(tmp_path):
    rng = random.Random(16)
    read = sum(_check_read(_random_bytes(rng), tmp_path / "f") is not None for _ in range(2000))
    assert 500 < read < 1900  # both outcomes exercised
    assert _check_read(b"", tmp_path / "f") == []
    huge = ("wort " * 400_000).encode()  # a 2 MB line, then one with a bad byte at its end
    assert _check_read(b"\xef\xbb\xbf" + huge + b"\r\nx", tmp_path / "f") == [huge.decode(), "x"]
    assert _check_read(huge + b"\xff\n", tmp_path / "f") is None


def test_random_text_files_pair_up_or_fail_clearly(tmp_path):
    rng = random.Random(17)
    for _ in range(300):
        src, tgt = _random_bytes(rng), _random_bytes(rng)
        (tmp_path / "r.en").write_bytes(src)
        (tmp_path / "r.de").write_bytes(tgt)
        try:
            pairs = list(sources.text_split(str(tmp_path / "r"), "en", "de"))
        except sources.DataError as e:
            assert "\n" not in str(e) and str(tmp_path) in str(e), str(e)
            continue
        expected = zip(_expected_lines(src), _expected_lines(tgt), strict=True)
        assert pairs == [(s.strip(), t.strip()) for s, t in expected]


def test_tokenizer_takes_any_text_and_round_trips_its_own_alphabet(vocab):
    tok = Tokenizer(vocab)
    rng = random.Random(18)
    texts = ["", " ", "\ufeff", "\x00" * 3, "a" * 100_000]
    texts += ["".join(rng.choice(PIECES) for _ in range(rng.randrange(30))) for _ in range(300)]
    for text, batched in zip(texts, tok.encode_batch(texts), strict=True):
        ids = tok.encode(text)
        assert ids == batched and ids[-1] == EOS_ID and EOS_ID not in ids[:-1], text
        assert all(0 <= i < tok.vocab_size for i in ids), text
        assert isinstance(tok.decode(ids), str)
    # Text made of the training corpus' own characters, single-spaced: back exactly.
    alphabet = sorted(
        {c for pair in demo_corpus.generate("train", 0, 2000) for s in pair for c in s}
    )
    for _ in range(300):
        words = ["".join(rng.choices(alphabet, k=rng.randint(1, 12))).strip() for _ in range(9)]
        text = " ".join(w for w in " ".join(words).split(" ") if w)
        assert tok.decode(tok.encode(text)) == text, text
