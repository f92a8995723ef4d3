"""Hugging Face directories end to end, through the command line (tx.infer.huggingface_io):
the session's trained run exported (`export --format huggingface`) is read by transformers'
MarianMTModel and MarianTokenizer, and by CTranslate2's converter, and translates as tx does; a
MarianMTModel built here as OPUS-MT's are (swish, a final logits bias, two SentencePiece models
over one vocab.json, pad as the decoder's start) is imported (`import --from-huggingface`) as a
run that translates as transformers does, and that translate, evaluate, export and
train.init_from take. No network: every model and tokenizer is made here."""

import contextlib
import copy
import dataclasses
import functools
import io
import itertools
import json
import os
import sys
from unittest import mock

import jax
import numpy as np
import pytest

from tx import storage
from tx import workdir as wd
from tx.cli.main import main
from tx.config import defaults
from tx.data import demo_corpus
from tx.infer import huggingface as hf
from tx.infer.safeguards import max_output_length
from tx.tokens import BOS_ID, PAD_ID

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors.numpy")

# Both sides compute in float32 with the same operations in another order (torch's matmuls
# against XLA's einsums), each rounded at 2^-24 relative: a logit of these small models (sums of
# a few hundred products, |logit| < 10) is off by ~1e-6 of its size; the trained run's
# LayerNorm epsilon (1e-6 against Marian's 1e-5) adds ~1e-6 (tx.infer.huggingface).
# Observed: 1.9e-6 (the trained run exported), 7.2e-6 (the random model imported).
LOGITS_ATOL = 1e-4
# A hypothesis's log-probability sums its tokens' (up to ~100 here), each off as a logit is.
# Observed: 1.9e-6 (transformers against tx), 6.1e-5 (the two CTranslate2 models, a sum of 80).
SCORE_ATOL = 1e-3
# tx -> Hugging Face -> tx: every weight comes back bit for bit; the logits differ only where
# tx adds the start token and the first position in one sum that the export made beforehand
# (float32 rounding: 2^-24 of |logit| < 10). Observed: 0.
ROUND_TRIP_ATOL = 1e-5
# The imported run's searches: a few rows a batch (its default: 4096 tokens), outputs of at
# most 10 tokens more than the input (its default: 50; a random model often runs to the limit)
SEARCH = {"batch_tokens": 256, "max_extra_len": 10}
PAIRS = list(itertools.islice(demo_corpus.generate("test", 0, 4), 4))
SOURCES = [s for s, _ in PAIRS]
REFERENCES = [t for _, t in PAIRS]


@pytest.fixture(scope="module", autouse=True)
def offline():
    """transformers and its hub never go to the network (HF_HUB_OFFLINE, which they read when
    imported), and keep to warnings that matter."""
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        # One thread: a second one, on cores other processes share, made generate 10x slower
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(threads)


def tx_cli(*args: str, stdin: str = "") -> str:
    """`python -m tx ARGS` in this process (tx.cli.main.main), `stdin` its input; its stdout."""
    out = io.StringIO()
    lines = io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8")
    with mock.patch.object(sys, "stdin", lines), contextlib.redirect_stdout(out):
        code = main(list(args))
    assert code == 0, f"python -m tx {' '.join(args)} exited {code}"
    return out.getvalue()


def tx_cli_fails(capsys, *args: str) -> str:
    """A command refused as a user error: exit 2 and one line on stderr, returned."""
    capsys.readouterr()
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


def _marian_limit(n_input: int, max_extra_len: int) -> int:
    """generate's max_new_tokens for an input of `n_input` tokens (EOS included): tx's output
    limit (tx.infer.safeguards, no decode.max_length_ratio) and the EOS forced after it."""
    return max_output_length(n_input - 1, max_extra_len) + 1


def _generate(model, tokenizer, sentences, max_extra_len, beam: int) -> list[list[tuple]]:
    """transformers' search of each sentence alone (tx's length limit is per sentence), as
    tx's n-best lists: greedy, [(text, None, at the limit)]; a beam of k, its k finished
    hypotheses, best first, with their scores (summed log-probabilities at length_penalty 0)
    and whether they reached the limit (EOS forced in the last place)."""
    out = []
    for s in sentences:
        enc = tokenizer([s], return_tensors="pt")
        limit = _marian_limit(enc["input_ids"].shape[1], max_extra_len)
        with torch.no_grad():
            res = model.generate(
                **enc,
                max_new_tokens=limit,
                max_length=None,
                num_beams=beam,
                length_penalty=0.0,
                num_return_sequences=beam,
                return_dict_in_generate=True,
                output_scores=True,
            )
        # Each up to its EOS, without the decoder's start and the padding after: with separate
        # vocabularies MarianTokenizer knows the source's <pad> as special, not the target's
        eos = model.config.eos_token_id
        rows = [r[1:] for r in res.sequences.tolist()]
        rows = [r[: r.index(eos)] if eos in r else r for r in rows]
        texts = tokenizer.batch_decode(rows, skip_special_tokens=True)
        scores = res.sequences_scores.tolist() if beam > 1 else [None]
        ended = (res.sequences[:, 1:] == model.config.eos_token_id).int().argmax(1) + 1
        out.append(list(zip(texts, scores, (ended == limit).tolist(), strict=True)))
    return out


def _assert_same_search(tx_model, marian, tokenizer, sentences, beams=(1, 4), **search):
    """tx's greedy and beam search (alpha 0) and `generate` (num_beams 1 and 4,
    length_penalty 0) give the same translations and n-best lists, the scores of the
    hypotheses that end before the length limit the same. At the limit both force EOS, which
    tx scores with its log-probability and transformers with 0 (tx.infer.huggingface_io):
    there tx's scores are lower, and the n-best lists may list those hypotheses in another
    order."""
    decode = tx_model.config.decode
    assert decode.max_length_ratio == 0
    for beam in beams:
        want = tx_model.translate(sentences, beam=beam, alpha=0.0, nbest=beam, **search)
        extra = search.get("max_extra_len", decode.max_extra_len)
        got = _generate(marian, tokenizer, sentences, extra, beam)
        assert [n[0][0] for n in got] == [n[0][0] for n in want], f"beam {beam}"
        for theirs, ours in zip(got, want, strict=True):
            theirs_by_text, ours_by_text = _by_text(theirs), _by_text(ours)
            assert theirs_by_text.keys() == ours_by_text.keys()
            if beam == 1:
                continue
            at_limit = {text for text, _, cut in theirs if cut}
            for text, scores in theirs_by_text.items():
                mine = ours_by_text[text]
                if text in at_limit:  # each lower, so each one's rank among them too
                    assert all(a < b for a, b in zip(mine, scores, strict=True)), text
                else:
                    np.testing.assert_allclose(mine, scores, atol=SCORE_ATOL, err_msg=text)


def _by_text(hypotheses) -> dict[str, list]:
    """{text: its hypotheses' scores, sorted} of an n-best list ((text, score, ...) each)."""
    out = {}
    for text, score, *_ in hypotheses:
        out.setdefault(text, []).append(score)
    return {text: sorted(scores) for text, scores in out.items()}  # greedy's: one None


# -------------------------------------------------------------------------------------------
# tx -> Hugging Face: the session's trained run (configs/tiny.py, post-LN, 20 steps)


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    """(the run's Hugging Face export, the run as tx.load gives it). Its search is decode.alpha
    0, so that generation_config.json (num_beams 4, length_penalty 0) is tx's beam search."""
    import tx

    out = str(tmp_path_factory.mktemp("hf") / "export")
    args = ["--workdir", trained, "--checkpoint", "20", "--out", out]
    record = json.loads(
        tx_cli("export", *args, "--format", "huggingface", "--config.decode.alpha=0")
    )
    assert record["format"] == "huggingface" and record["checkpoint"] == "checkpoints/20"
    model = tx.load(trained, checkpoint=20)
    assert model.config.decode.alpha == 0.6 and model.config.decode.beam_size == 4
    return out, model


@pytest.fixture(scope="module")
def marian_export(exported):
    """transformers' MarianMTModel and MarianTokenizer of the export."""
    out, _ = exported
    model = transformers.MarianMTModel.from_pretrained(out).eval()
    return model, transformers.MarianTokenizer.from_pretrained(out)


def test_the_export_holds_what_transformers_reads(exported, marian_export):
    out, model = exported
    marian, _ = marian_export
    names = {"config.json", "generation_config.json", "model.safetensors", "source.spm"}
    names |= {"target.spm", "vocab.json", "tokenizer_config.json", "special_tokens_map.json"}
    assert names <= set(os.listdir(out))
    with open(os.path.join(out, "generation_config.json")) as f:
        generation = json.load(f)
    assert generation["num_beams"] == 4 and generation["length_penalty"] == 0.0
    vocab = model.engine.tokenizer.vocab_size
    assert marian.config.decoder_start_token_id == marian.config.pad_token_id == vocab - 1
    assert marian.config.eos_token_id == 0  # tx's pad moved last, every other id one down
    # Only the tied copies of the embedding are not in the file (nothing is initialised).
    with safetensors.safe_open(os.path.join(out, "model.safetensors"), "np") as f:
        saved = set(f.keys())
    assert set(marian.state_dict()) - saved <= {
        "model.encoder.embed_tokens.weight",
        "model.decoder.embed_tokens.weight",
        "lm_head.weight",
    }


def test_marian_tokenizer_gives_tx_ids(exported, marian_export):
    _, model = exported
    _, tokenizer = marian_export
    tok = model.engine.tokenizer
    order = hf.export_order(tok.vocab_size)
    want = [[int(order[t]) for t in tok.encode(s)] for s in SOURCES]
    assert tokenizer(SOURCES)["input_ids"] == want
    labels = [[int(order[t]) for t in tok.encode(s, target=True)] for s in REFERENCES]
    assert tokenizer(text_target=REFERENCES)["input_ids"] == labels
    assert tokenizer.batch_decode(labels, skip_special_tokens=True) == REFERENCES


def _tx_logits(model, sources, targets):
    """tx's logits [b, t, V] of `targets` (tx ids, each ending in EOS) given `sources`."""
    src, tgt = _padded(sources, PAD_ID), _padded(targets, PAD_ID)
    logits = _apply(model.engine.model, model.engine.params, src, tgt)
    return np.asarray(logits)[..., : model.engine.tokenizer.vocab_size], tgt != PAD_ID


# Compiled without LLVM's optimisations (a forward pass of these models: 3.0 s of CPU at the
# default level, about half at level 0), which change the logits by float32 rounding at most:
# the tolerances above allow for another order of the same operations.
@functools.partial(
    jax.jit, static_argnums=0, compiler_options={"xla_backend_optimization_level": 0}
)
def _apply(module, params, src, tgt):
    """module.apply, compiled once per module and shapes (the parameters are an argument)."""
    return module.apply({"params": params}, src, tgt)


def _marian_logits(marian, sources, targets, pad: int, source_pad: int | None = None):
    """MarianMTModel's logits of `targets` (Marian ids) given `sources` (padded with
    `source_pad`, default `pad`), started from `pad`."""
    source_pad = pad if source_pad is None else source_pad
    src, tgt = _padded(sources, source_pad), _padded(targets, pad)
    start = np.concatenate([np.full((len(tgt), 1), pad), tgt[:, :-1]], 1)
    with torch.no_grad():
        out = marian(
            input_ids=torch.tensor(src),
            attention_mask=torch.tensor(src != source_pad).long(),
            decoder_input_ids=torch.tensor(start),
        )
    return out.logits.numpy()


def _padded(rows, pad: int) -> np.ndarray:
    out = np.full((len(rows), max(map(len, rows))), pad, np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def test_marian_computes_the_runs_logits(exported, marian_export):
    _, model = exported
    marian, _ = marian_export
    tok = model.engine.tokenizer
    order = hf.export_order(tok.vocab_size)
    sources = [tok.encode(s) for s in SOURCES]
    targets = [tok.encode(t, target=True) for t in REFERENCES]
    want, real = _tx_logits(model, sources, targets)
    got = _marian_logits(
        marian, [order[s] for s in sources], [order[t] for t in targets], int(order[PAD_ID])
    )
    emitted = [t for t in range(tok.vocab_size) if t not in (PAD_ID, BOS_ID)]  # the rest: -1e4
    np.testing.assert_allclose(
        got[real][:, order[emitted]], want[real][:, emitted], atol=LOGITS_ATOL
    )
    assert np.all(got[real][:, order[[PAD_ID, BOS_ID]]] < -9e3)


def test_generate_searches_as_txs_beam(exported, marian_export):
    """`generate` with generation_config.json's search alone (what `pipeline("translation")`
    ran before transformers 5 removed that task) gives tx's beam search's translations; with
    tx's length limit per sentence, its n-best lists and scores. (The 20-step run's greedy
    output is a piece repeated to the limit: greedy search is tested on the imported model.)"""
    _, model = exported
    marian, tokenizer = marian_export
    with torch.no_grad():
        out = marian.generate(**tokenizer(SOURCES, return_tensors="pt", padding=True))
    want = model.translate(SOURCES, beam=4, alpha=0.0)
    assert tokenizer.batch_decode(out, skip_special_tokens=True) == want
    _assert_same_search(model, marian, tokenizer, SOURCES, beams=(4,))


def test_ctranslate2_converter_gives_txs_ctranslate2_model(trained, exported, tmp_path):
    """`ct2-transformers-converter --model DIR` (its converter class, in this process) gives
    the n-best lists and scores of tx's own `--format ctranslate2` export: the same model."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from ctranslate2.converters import TransformersConverter

    out, model = exported
    converted = str(tmp_path / "converted")
    TransformersConverter(out).convert(converted)
    own = str(tmp_path / "own")
    tx_cli("export", "--workdir", trained, "--checkpoint", "20", "--out", own)
    tokenizer = transformers.MarianTokenizer.from_pretrained(out)
    tok = model.engine.tokenizer
    # tx's export adds the source's EOS itself; the converted model reads MarianTokenizer's
    ours = [[tok.piece(t) for t in tok.encode(s)[:-1]] for s in SOURCES]
    theirs = [tokenizer.convert_ids_to_tokens(tokenizer(s)["input_ids"]) for s in SOURCES]
    assert [t[:-1] for t in theirs] == ours and {t[-1] for t in theirs} == {"</s>"}
    search = dict(beam_size=4, num_hypotheses=4, return_scores=True, min_decoding_length=0)
    models = [
        (ctranslate2.Translator(p, intra_threads=1), s)
        for p, s in ((own, ours), (converted, theirs))
    ]
    for length_penalty in (0.0, 1.0):
        results = [
            m.translate_batch(s, length_penalty=length_penalty, max_decoding_length=60, **search)
            for m, s in models
        ]
        for a, b in zip(*results, strict=True):
            assert a.hypotheses == b.hypotheses
            np.testing.assert_allclose(a.scores, b.scores, atol=SCORE_ATOL)


def test_a_run_sent_to_hugging_face_and_back_is_the_run(exported, tmp_path):
    """tx -> Hugging Face -> tx: the same ids, logits (the start token's fold found again, the
    run's LayerNorm epsilon from tx_config.json), greedy and beam translations; exported again,
    the same tensors and config as the first export."""
    import tx

    out, model = exported
    workdir = str(tmp_path / "back")
    record = json.loads(tx_cli("import", "--from-huggingface", out, "--workdir", workdir))
    assert record["model"]["decoder_start"] == "token"
    assert record["model"]["positional"] == "sinusoidal"
    assert record["vocab_size"] == model.engine.tokenizer.vocab_size  # its <s> is tx's again
    back = tx.load(workdir)
    tok, back_tok = model.engine.tokenizer, back.engine.tokenizer
    sources = [tok.encode(s) for s in SOURCES]
    targets = [tok.encode(t, target=True) for t in REFERENCES]
    assert [back_tok.encode(s) for s in SOURCES] == sources
    assert [back_tok.encode(t, target=True) for t in REFERENCES] == targets
    want, real = _tx_logits(model, sources, targets)
    got, _ = _tx_logits(back, sources, targets)
    # <pad>'s and <s>'s columns aside: the export gives them -1e4 (tx's search never emits
    # them; Marian's and CTranslate2's then never do either)
    emitted = [t for t in range(tok.vocab_size) if t not in (PAD_ID, BOS_ID)]
    np.testing.assert_allclose(got[real][:, emitted], want[real][:, emitted], atol=ROUND_TRIP_ATOL)
    assert np.all(got[real][:, [PAD_ID, BOS_ID]] < -9e3)
    # Searched in the trained run's buckets, batches and output lengths (its own: tx's defaults,
    # 17 buckets of 4096 tokens, +50), all of SOURCES in one: one compiled search per beam
    cfg, data = back.config.copy_and_resolve_references(), model.config.data
    cfg.data.update(bucket_lengths=data.bucket_lengths, max_len=data.max_len)
    cfg.decode.batch_tokens = model.config.decode.batch_tokens
    cfg.decode.max_extra_len = model.config.decode.max_extra_len
    back = dataclasses.replace(back, config=cfg)
    for beam in (1, 4):
        ours = model.translate(SOURCES, beam=beam, alpha=0.0)
        assert back.translate(SOURCES, beam=beam, alpha=0.0) == ours, f"beam {beam}"
    again = str(tmp_path / "again")
    tx_cli("export", "--workdir", workdir, "--format", "huggingface", "--out", again)
    first, second = (
        safetensors.load_file(os.path.join(d, "model.safetensors")) for d in (out, again)
    )
    assert first.keys() == second.keys()
    for key in first:
        np.testing.assert_array_equal(second[key], first[key], err_msg=key)
    for name in ("config.json", "generation_config.json", "source.spm", "vocab.json"):
        assert _read(out, name) == _read(again, name), name


def test_what_marian_cannot_express_is_refused_in_one_line(trained, tmp_path, capsys):
    out = str(tmp_path / "hf")
    err = tx_cli_fails(
        capsys, "export", "--workdir", trained, "--format", "huggingface", "--out", out,
        "--config.model.pre_ln=True",
    )  # fmt: skip
    assert "post-LN only" in err and "CTranslate2" in err
    assert not os.path.exists(out)


# -------------------------------------------------------------------------------------------
# Hugging Face -> tx: a random MarianMTModel laid out as OPUS-MT's


def _spm_model(sentences, vocab_size: int = 80) -> bytes:
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=out,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        minloglevel=2,
    )
    return out.getvalue()


@dataclasses.dataclass
class Opus:
    directory: str  # what save_pretrained wrote
    model: object  # the MarianMTModel
    tokenizer: object  # its MarianTokenizer
    sources: list[str]  # test sentences of one length bucket of tx's (one compiled search)
    references: list[str]


@pytest.fixture(scope="module")
def opus(tmp_path_factory) -> Opus:
    """A MarianMTModel of tiny.py's sizes, as save_pretrained writes it, its vocabulary
    OPUS-MT's: a SentencePiece model per language, vocab.json the pieces of both with </s> 0,
    <unk> 1, <pad> last (a zero row, the decoder's start). Its weights are drawn with std 0.3
    and a logit bias of EOS +3, which make its outputs change words, end early or run to the
    limit: a search harder to match than the trained run's. (Std 1 saturates attention, which
    amplifies float32's rounding to ~1e-2 of the logits on either side.)"""
    import sentencepiece as spm

    root = tmp_path_factory.mktemp("opus")
    pairs = list(itertools.islice(demo_corpus.generate("train", 1, 1000), 1000))
    files = {"source.spm": _spm_model(s for s, _ in pairs)}
    files["target.spm"] = _spm_model(t for _, t in pairs)
    pieces = []
    for data in files.values():
        sp = spm.SentencePieceProcessor(model_proto=data)
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i) or sp.id_to_piece(i) in pieces):
                pieces.append(sp.id_to_piece(i))
    vocab = {"</s>": 0, "<unk>": 1, **{p: i for i, p in enumerate(pieces, 2)}}
    pad = vocab["<pad>"] = len(vocab)
    files["vocab.json"] = json.dumps(vocab).encode()
    for name, data in files.items():
        (root / name).write_bytes(data)
    tokenizer = transformers.MarianTokenizer(
        *(str(root / n) for n in files), source_lang="en", target_lang="de"
    )
    torch.manual_seed(0)
    config = transformers.MarianConfig(
        vocab_size=pad + 1,
        decoder_vocab_size=pad + 1,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
        max_position_embeddings=128,
        init_std=0.3,
    )
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.copy_(0.3 * torch.randn(1, pad + 1))
        model.final_logits_bias[0, 0] = 3.0
        model.model.shared.weight[pad] = 0.0
        for name, p in model.named_parameters():
            if name.endswith(".bias") and "layer_norm" not in name:
                p.copy_(0.1 * torch.randn_like(p))
    directory = str(root / "model")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    test = list(itertools.islice(demo_corpus.generate("test", 0, 40), 40))
    buckets = defaults().data.bucket_lengths  # the imported run's
    bucket = [min(b for b in buckets if b >= len(tokenizer(s)["input_ids"])) for s, _ in test]
    most = max(bucket, key=bucket.count)
    chosen = [p for p, b in zip(test, bucket, strict=True) if b == most][:4]
    return Opus(directory, model, tokenizer, [s for s, _ in chosen], [t for _, t in chosen])


@pytest.fixture(scope="module")
def imported(opus, tmp_path_factory):
    """(the run `import --from-huggingface` made, what it printed, the run as tx.load gives
    it)."""
    import tx

    workdir = str(tmp_path_factory.mktemp("imported") / "run")
    record = json.loads(
        tx_cli("import", "--from-huggingface", opus.directory, "--workdir", workdir)
    )
    return workdir, record, tx.load(workdir)


def test_the_import_is_a_run_of_the_models_config(opus, imported):
    workdir, record, model = imported
    mc = record["model"]
    assert mc["activation"] == "swish" and mc["decoder_start"] == "zero"
    assert mc["positional"] == "fixed" and mc["max_len"] == 128  # transformers' own tables
    assert mc["logits_bias"] and mc["attention_bias"] and not mc["pre_ln"]
    assert mc["vocab_size"] == opus.model.config.vocab_size + 1  # and tx's <s>
    assert model.config.data.vocab_size == mc["vocab_size"]
    assert "imported from" in model.source
    card = json.loads(storage.read_text(wd.run_card_file(workdir)))
    assert card["imported"]["vocabulary_sha256"] == model.engine.tokenizer.fingerprint


def test_tx_tokenizes_as_marian_tokenizer(opus, imported):
    tok, tokenizer = imported[2].engine.tokenizer, opus.tokenizer
    sources = [[int(tok.order[t]) for t in tok.encode(s)] for s in opus.sources]
    assert sources == tokenizer(opus.sources)["input_ids"]
    labels = tokenizer(text_target=opus.references)["input_ids"]
    targets = [[int(tok.order[t]) for t in tok.encode(s, target=True)] for s in opus.references]
    assert targets == labels
    texts = [tok.decode(tok.encode(s, target=True)) for s in opus.references]
    assert texts == tokenizer.batch_decode(labels, skip_special_tokens=True)


def test_tx_computes_the_imported_models_logits(opus, imported):
    model = imported[2]
    tok = model.engine.tokenizer
    sources = [tok.encode(s) for s in opus.sources]
    targets = [tok.encode(t, target=True) for t in opus.references]
    got, real = _tx_logits(model, sources, targets)
    order = tok.order
    want = _marian_logits(
        opus.model, [order[s] for s in sources], [order[t] for t in targets], int(order[PAD_ID])
    )
    known = order >= 0  # tx's <s> is a row of its own, never emitted
    np.testing.assert_allclose(got[real][:, known], want[real][:, order[known]], atol=LOGITS_ATOL)
    assert np.all(got[real][:, ~known] < -9e3)


def test_tx_searches_the_imported_model_as_generate(opus, imported):
    """Greedy and beam alike. transformers 5's beam search takes its log-softmax over <pad>
    too (the ban of bad_words_ids comes after it), where tx, Marian and CTranslate2 have no
    <pad> to emit (tx.infer.huggingface_io): with the model's own <pad> logit its scores are
    lower, the texts here the same; with that logit at -1e4 (as tx's exports have it) the
    n-best lists and scores are tx's."""
    model = imported[2]
    want = model.translate(opus.sources, beam=4, alpha=0.0, nbest=4, **SEARCH)
    got = _generate(opus.model, opus.tokenizer, opus.sources, SEARCH["max_extra_len"], 4)
    assert [n[0][0] for n in got] == [n[0][0] for n in want]
    masked = copy.deepcopy(opus.model)
    with torch.no_grad():
        masked.final_logits_bias[0, masked.config.pad_token_id] = hf.NEVER_LOGIT
    _assert_same_search(model, masked, opus.tokenizer, opus.sources, **SEARCH)


def test_translate_and_evaluate_take_the_imported_run(opus, imported, tmp_path):
    """stdin lines (an empty one too) and files, at the search the other tests compiled."""
    workdir, _, model = imported
    search = ["--beam", "4", "--alpha", "0", "--batch-tokens", str(SEARCH["batch_tokens"])]
    search.append(f"--config.decode.max_extra_len={SEARCH['max_extra_len']}")
    want = model.translate(opus.sources, beam=4, alpha=0.0, **SEARCH)
    lines = "".join(f"{s}\n" for s in [*opus.sources, ""])
    out = tx_cli("translate", "--workdir", workdir, *search, stdin=lines)
    assert out.splitlines() == [*want, ""]
    src, ref = tmp_path / "test.en", tmp_path / "test.de"
    src.write_text("".join(s + "\n" for s in opus.sources))
    ref.write_text("".join(t + "\n" for t in opus.references))
    hyp = str(tmp_path / "test.hyp")
    args = ["--workdir", workdir, "--src", str(src), "--ref", str(ref), "--output", hyp]
    result = json.loads(tx_cli("evaluate", *args, *search, "--json"))
    with open(hyp) as f:
        assert f.read().splitlines() == want
    assert result["search"] == {
        "strategy": "beam",
        "beam_size": 4,
        "alpha": 0.0,
        "max_extra_len": 10,
    }
    assert "imported from" in result["checkpoint"]


def test_the_imported_run_exports_back_as_it_came(opus, imported, tmp_path):
    out = str(tmp_path / "back")
    tx_cli("export", "--workdir", imported[0], "--format", "huggingface", "--out", out)
    original = safetensors.load_file(os.path.join(opus.directory, "model.safetensors"))
    back = safetensors.load_file(os.path.join(out, "model.safetensors"))
    # transformers 5 saves no position tables (it computes them); the export writes tx's
    assert set(back) - set(original) == {
        "model.encoder.embed_positions.weight",
        "model.decoder.embed_positions.weight",
    }
    for key in original:
        np.testing.assert_array_equal(back[key], original[key], err_msg=key)
    for name in ("source.spm", "target.spm", "vocab.json"):
        assert _read(opus.directory, name) == _read(out, name), name
    before, after = (json.loads(_read(d, "config.json")) for d in (opus.directory, out))
    differ = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert differ <= {"transformers_version"}, {k: (before.get(k), after.get(k)) for k in differ}
    marian = transformers.MarianMTModel.from_pretrained(out)
    positions = marian.model.decoder.embed_positions.weight.detach().numpy()
    # transformers' own sinusoids, bit for bit: tx keeps them as fixed tables
    np.testing.assert_array_equal(positions, hf.marian_position_table(32, 128))


def _read(directory: str, name: str) -> bytes:
    with open(os.path.join(directory, name), "rb") as f:
        return f.read()


# Under -m slow (20-50 s): an import is a run whose parameters are its average, and
# tests/test_init_from.py starts runs from averages by default.
@pytest.mark.slow
def test_train_starts_from_the_imported_run(imported, tmp_path):
    """`train --config W/config.json`: the imported model's own config (another model would be
    refused), a text corpus named by --config.data.train_prefix, two steps."""
    import tx

    source, _, model = imported
    prefix = tmp_path / "train"
    pairs = list(itertools.islice(demo_corpus.generate("train", 2, 40), 40))
    (tmp_path / "train.en").write_text("".join(s + "\n" for s, _ in pairs))
    (tmp_path / "train.de").write_text("".join(t + "\n" for _, t in pairs))
    workdir = str(tmp_path / "tuned")
    tx_cli(
        "train", "--config", wd.config_file(source), "--workdir", workdir,
        f"--config.train.init_from={source}", f"--config.data.train_prefix={prefix}",
        "--config.train.num_steps=2", "--config.train.checkpoint_every_steps=2",
        "--config.train.eval_every_steps=0", "--config.data.tokens_per_step=512",
        "--config.data.max_len=64", "--config.data.bucket_lengths=(64,)",
        "--config.data.num_workers=1",
    )  # fmt: skip
    card = json.loads(storage.read_text(wd.run_card_file(workdir)))
    assert card["init_from"]["run"] == source and card["init_from"]["parameters"] == "average"
    for name in ("source.spm", "target.spm", "vocab.json"):
        assert _read(workdir, name) == _read(source, name), name
    tuned = tx.load(workdir, checkpoint=2)
    # Two of Adam's steps at the warm-up's start move a weight by ~1e-6: the run is the
    # imported model, not a fresh one (whose weights differ from it by ~0.3).
    a, b = (np.asarray(m.engine.params["decoder"]["layer_0"]["ffn"]["wi"]) for m in (model, tuned))
    assert np.max(np.abs(a - b)) < 1e-3


# -------------------------------------------------------------------------------------------
# Hugging Face -> tx: separate vocabularies (share_encoder_decoder_embeddings=False, the
# Tatoeba-Challenge models): the encoder's matrix over the source's vocabulary, the decoder's
# over the target's, tied to the softmax


def _vocab(sp_model: bytes) -> dict[str, int]:
    """A Marian vocabulary of one SentencePiece model's pieces: </s> 0, <unk> 1, <pad> last."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=sp_model)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    pieces = [p for i, p in enumerate(pieces) if not (sp.is_control(i) or sp.is_unknown(i))]
    vocab = {"</s>": 0, "<unk>": 1, **{p: i for i, p in enumerate(pieces, 2)}}
    vocab["<pad>"] = len(vocab)
    return vocab


@pytest.fixture(scope="module")
def untied(tmp_path_factory) -> Opus:
    """A MarianMTModel with separate vocabularies, as save_pretrained writes it: vocab.json the
    source's (English pieces), target_vocab.json the target's (German pieces, of another
    size), each with its own <pad>; the decoder starts from the target's."""
    root = tmp_path_factory.mktemp("untied")
    pairs = list(itertools.islice(demo_corpus.generate("train", 3, 1000), 1000))
    files = {"source.spm": _spm_model((s for s, _ in pairs), vocab_size=96)}  # another size
    files["target.spm"] = _spm_model(t for _, t in pairs)
    source, target = _vocab(files["source.spm"]), _vocab(files["target.spm"])
    files["vocab.json"] = json.dumps(source).encode()
    files["target_vocab.json"] = json.dumps(target).encode()
    for name, data in files.items():
        (root / name).write_bytes(data)
    tokenizer = transformers.MarianTokenizer(
        str(root / "source.spm"), str(root / "target.spm"), str(root / "vocab.json"),
        target_vocab_file=str(root / "target_vocab.json"), separate_vocabs=True,
        source_lang="en", target_lang="de",
    )  # fmt: skip
    torch.manual_seed(1)
    pad = target["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(source),
        decoder_vocab_size=len(target),
        share_encoder_decoder_embeddings=False,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
        max_position_embeddings=128,
        init_std=0.3,
    )
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.copy_(0.3 * torch.randn(1, len(target)))
        model.final_logits_bias[0, 0] = 3.0
        model.model.decoder.embed_tokens.weight[pad] = 0.0
        for name, p in model.named_parameters():
            if name.endswith(".bias") and "layer_norm" not in name:
                p.copy_(0.1 * torch.randn_like(p))
    directory = str(root / "model")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    assert os.path.exists(os.path.join(directory, "target_vocab.json"))
    test = list(itertools.islice(demo_corpus.generate("test", 0, 40), 40))
    buckets = defaults().data.bucket_lengths
    bucket = [min(b for b in buckets if b >= len(tokenizer(s)["input_ids"])) for s, _ in test]
    most = max(bucket, key=bucket.count)
    chosen = [p for p, b in zip(test, bucket, strict=True) if b == most][:4]
    return Opus(directory, model, tokenizer, [s for s, _ in chosen], [t for _, t in chosen])


@pytest.fixture(scope="module")
def untied_run(untied, tmp_path_factory):
    import tx

    workdir = str(tmp_path_factory.mktemp("untied_run") / "run")
    record = json.loads(
        tx_cli("import", "--from-huggingface", untied.directory, "--workdir", workdir)
    )
    return workdir, record, tx.load(workdir)


def test_separate_vocabularies_import_with_a_matrix_each(untied, untied_run):
    _, record, model = untied_run
    mc = record["model"]
    source = json.loads(_read(untied.directory, "vocab.json"))
    target = json.loads(_read(untied.directory, "target_vocab.json"))
    assert mc["source_vocab_size"] == len(source) + 1 and mc["vocab_size"] == len(target) + 1
    params = model.engine.params
    assert set(params) >= {"source_embedding", "target_embedding"}
    assert "shared_embedding" not in params and "softmax" not in params
    tok, tokenizer = model.engine.tokenizer, untied.tokenizer
    ids = [[int(tok.source_order[t]) for t in tok.encode(s)] for s in untied.sources]
    assert ids == tokenizer(untied.sources)["input_ids"]
    labels = tokenizer(text_target=untied.references)["input_ids"]
    targets = [[int(tok.order[t]) for t in tok.encode(s, target=True)] for s in untied.references]
    assert targets == labels
    assert [tok.decode(tok.encode(s, target=True)) for s in untied.references] == (
        tokenizer.batch_decode(labels, skip_special_tokens=True)
    )


# Per-token log-probabilities over the target's vocabulary without <pad> (tx has none to emit;
# its <s> has -1e4), both sides in float32: each is off by a few 2^-24 of the logits it sums
# (LOGITS_ATOL's reasoning), so relative to its size: 1e-5 of it, and 1e-6 for those near 0.
# Observed: 1.7e-6 relative (1.1e-5 absolute at log p = -6.8).
LOG_PROB_RTOL, LOG_PROB_ATOL = 1e-5, 1e-6


def test_separate_vocabularies_score_as_transformers(untied, untied_run):
    model = untied_run[2]
    tok = model.engine.tokenizer
    sources = [tok.encode(s) for s in untied.sources]
    targets = [tok.encode(t, target=True) for t in untied.references]
    got, real = _tx_logits(model, sources, targets)
    want = _marian_logits(
        untied.model,
        [tok.source_order[s] for s in sources],
        [tok.order[t] for t in targets],
        int(tok.order[PAD_ID]),
        int(tok.source_order[PAD_ID]),
    )
    pad = int(tok.order[PAD_ID])
    got, want = np.array(got), np.array(want)
    want[..., pad] = got[..., PAD_ID] = -np.inf  # <pad> out of both softmaxes
    theirs = torch.log_softmax(torch.tensor(want), -1).numpy()
    ours = torch.log_softmax(torch.tensor(got), -1).numpy()
    tgt = _padded(targets, PAD_ID)
    got_lp = np.take_along_axis(ours, tgt[..., None], -1)[..., 0][real]
    want_lp = np.take_along_axis(theirs, tok.order[tgt][..., None], -1)[..., 0][real]
    np.testing.assert_allclose(got_lp, want_lp, rtol=LOG_PROB_RTOL, atol=LOG_PROB_ATOL)


def test_separate_vocabularies_search_as_generate(untied, untied_run):
    masked = copy.deepcopy(untied.model)
    with torch.no_grad():
        masked.final_logits_bias[0, masked.config.pad_token_id] = hf.NEVER_LOGIT
    _assert_same_search(untied_run[2], masked, untied.tokenizer, untied.sources, **SEARCH)


def test_separate_vocabularies_export_back_as_they_came(untied, untied_run, tmp_path):
    out = str(tmp_path / "back")
    tx_cli("export", "--workdir", untied_run[0], "--format", "huggingface", "--out", out)
    original = safetensors.load_file(os.path.join(untied.directory, "model.safetensors"))
    back = safetensors.load_file(os.path.join(out, "model.safetensors"))
    for key in original:
        np.testing.assert_array_equal(back[key], original[key], err_msg=key)
    for name in ("source.spm", "target.spm", "vocab.json", "target_vocab.json"):
        assert _read(untied.directory, name) == _read(out, name), name
    before, after = (json.loads(_read(d, "config.json")) for d in (untied.directory, out))
    differ = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert differ <= {"transformers_version"}, {k: (before.get(k), after.get(k)) for k in differ}
    again = transformers.MarianTokenizer.from_pretrained(out)
    assert again(untied.sources)["input_ids"] == untied.tokenizer(untied.sources)["input_ids"]


@pytest.mark.slow  # as test_train_starts_from_the_imported_run
def test_separate_vocabularies_fine_tune(untied_run, tmp_path):
    """train.init_from on the untied import: each side's corpus text through its own
    vocabulary, the two matrices trained, the files copied, and the run translates."""
    import tx

    source, _, model = untied_run
    pairs = list(itertools.islice(demo_corpus.generate("train", 2, 40), 40))
    (tmp_path / "train.en").write_text("".join(s + "\n" for s, _ in pairs))
    (tmp_path / "train.de").write_text("".join(t + "\n" for _, t in pairs))
    workdir = str(tmp_path / "tuned")
    tx_cli(
        "train", "--config", wd.config_file(source), "--workdir", workdir,
        f"--config.train.init_from={source}", f"--config.data.train_prefix={tmp_path}/train",
        "--config.train.num_steps=2", "--config.train.checkpoint_every_steps=2",
        "--config.train.eval_every_steps=0", "--config.data.tokens_per_step=512",
        "--config.data.max_len=64", "--config.data.bucket_lengths=(64,)",
        "--config.data.num_workers=1",
    )  # fmt: skip
    for name in ("source.spm", "target.spm", "vocab.json", "target_vocab.json"):
        assert _read(workdir, name) == _read(source, name), name
    tuned = tx.load(workdir, checkpoint=2)
    for name in ("source_embedding", "target_embedding"):
        a, b = (np.asarray(m.engine.params[name]["embedding"]) for m in (model, tuned))
        assert a.shape == b.shape and 0 < np.max(np.abs(a - b)) < 1e-3, name
    assert len(tuned.translate(["The dog sees a cat."], beam=1)) == 1


def test_a_model_tx_cannot_express_is_refused_in_one_line(opus, tmp_path, capsys):
    directory = tmp_path / "pre_ln"
    directory.mkdir()
    config = json.loads(_read(opus.directory, "config.json"))
    (directory / "config.json").write_text(json.dumps({**config, "normalize_before": True}))
    workdir = str(tmp_path / "w")
    err = tx_cli_fails(capsys, "import", "--from-huggingface", str(directory), "--workdir", workdir)
    assert "normalize_before" in err
    assert not os.path.exists(workdir)
