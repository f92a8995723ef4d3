"""CTranslate2 export (tx.infer.export): the exported model computes tx's log-probabilities, configs
CTranslate2 cannot express are refused, and a failed export leaves nothing behind."""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from tx import workdir as wd
from tx.config import load_config, model_config
from tx.infer.export import (
    NEVER_LOGIT,
    ExportError,
    check_exportable,
    export,
    transformer_spec,
)
from tx.infer.search import log_probs
from tx.model.transformer import Transformer
from tx.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

ctranslate2 = pytest.importorskip("ctranslate2")

VOCAB = 300
PIECES = [f"p{i}" for i in range(VOCAB)]


def _random_model(tiny, *overrides):
    """A tiny model with random parameters; norms and biases moved off their initial 1 and 0
    so that a LayerNorm or bias put in the wrong place changes the output."""
    mc = model_config(tiny(*overrides))
    rng = np.random.default_rng(0)
    src = rng.integers(4, VOCAB, (3, 9)).astype(np.int32)
    tgt = rng.integers(4, VOCAB, (3, 7)).astype(np.int32)
    src[:, -1] = tgt[:, -1] = EOS_ID
    model = Transformer(mc)
    # XLA's bit generator (rbg) and NumPy's draws: eager threefry compiles a large program
    # for every parameter shape
    params = nn.unbox(model.init(jax.random.key(1, impl="rbg"), src, tgt)["params"])

    def perturb(path, x):
        name = jax.tree_util.keystr(path)
        moved = "norm" in name or name.endswith("['bi']") or name.endswith("['bo']")
        return x + 0.3 * rng.standard_normal(x.shape, np.float32) if moved else x

    params = jax.tree_util.tree_map_with_path(perturb, params)
    return mc, model, params, src, tgt


def _ct2_log_probs(path, src, tgt):
    """CTranslate2's teacher-forced log-probabilities [b, t] (EOS appended to both sides)."""
    translator = ctranslate2.Translator(path, intra_threads=1)
    results = translator.score_batch(
        [[PIECES[i] for i in s[:-1]] for s in src], [[PIECES[i] for i in t[:-1]] for t in tgt]
    )
    return np.array([r.log_probs for r in results])


VARIANTS = {
    "paper": (),
    "pre_ln_learned": ("model.pre_ln=True", "model.positional=learned"),
    "untied": ("model.share_embeddings=False",),
    "wide_heads": ("model.d_k=16", "model.d_v=16"),  # h * d_k != d_model: head_dim
    "uneven_stacks": ("model.num_encoder_layers=3", "model.num_decoder_layers=1"),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_exported_model_gives_tx_log_probs(tiny, tmp_path, variant):
    mc, model, params, src, tgt = _random_model(tiny, *VARIANTS[variant])
    spec = transformer_spec(mc, jax.tree_util.tree_map(np.asarray, params), PIECES)
    spec.optimize()
    spec.save(str(tmp_path))
    expected = np.asarray(log_probs(model.apply({"params": params}, src, tgt)))
    expected = np.take_along_axis(expected, tgt[..., None], -1)[..., 0]  # [b, t]
    got = _ct2_log_probs(str(tmp_path), src, tgt)
    assert expected.std() > 0.1  # informative: far from a constant (e.g. uniform) output
    # Bound: both sides are float32 with different summation orders; through 2-3 layers of
    # width <= 64 the rounding stays below 1e-5 on log-probabilities of size ~6.
    # Observed: 9.5e-7 (2 ulp), 1.4e-6 for pre_ln_learned.
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_export_writes_a_whole_model(trained, tmp_path):
    cfg = load_config(wd.config_file(trained))
    out = str(tmp_path / "model")
    record = export(cfg, trained, out, quantization="int8")
    # The newest average if another test of the session made one, else the latest checkpoint.
    assert record["quantization"] == "int8"
    assert record["checkpoint"].startswith(("checkpoints/", "averaged/"))
    files = set(os.listdir(out))
    assert {"model.bin", "config.json", "shared_vocabulary.json", "spm.model"} <= files
    assert {"tx_config.json", "tx_export.json"} <= files
    with open(os.path.join(out, "config.json")) as f:
        ct2_config = json.load(f)
    with open(os.path.join(out, "shared_vocabulary.json")) as f:
        vocab = json.load(f)
    # CTranslate2's ids are tx's: pad, eos, unk, bos where tx.tokens puts them.
    assert [vocab[i] for i in (PAD_ID, EOS_ID, UNK_ID, BOS_ID)] == ["<pad>", "</s>", "<unk>", "<s>"]
    assert (ct2_config["eos_token"], ct2_config["unk_token"]) == ("</s>", "<unk>")
    assert (ct2_config["bos_token"], ct2_config["decoder_start_token"]) == ("<s>", "<s>")
    assert ct2_config["add_source_eos"] is True
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".export")]  # no temp left


def test_pad_and_bos_are_never_generated(tiny, tmp_path):
    """The projection bias makes their probability 0, as tx.infer.search.log_probs does."""
    mc, _, params, src, _ = _random_model(tiny)
    spec = transformer_spec(mc, jax.tree_util.tree_map(np.asarray, params), PIECES)
    bias = spec.decoder.projection.bias.numpy()
    assert (
        bias[PAD_ID] == bias[BOS_ID] == NEVER_LOGIT and not np.delete(bias, [PAD_ID, BOS_ID]).any()
    )
    assert np.exp(np.float32(NEVER_LOGIT)) == 0.0 and np.exp(np.float16(NEVER_LOGIT)) == 0.0
    spec.optimize()
    spec.save(str(tmp_path))
    translator = ctranslate2.Translator(str(tmp_path), intra_threads=1)
    results = translator.translate_batch(
        [[PIECES[i] for i in s[:-1]] for s in src],
        beam_size=4,
        num_hypotheses=4,
        max_decoding_length=20,
        min_decoding_length=0,
    )
    produced = {t for r in results for h in r.hypotheses for t in h}
    assert not produced & {PIECES[PAD_ID], PIECES[BOS_ID]}


def test_unsupported_configs_are_refused(tiny):
    mc = model_config(tiny("model.d_k=8", "model.d_v=16"))
    with pytest.raises(ExportError, match="d_k=8 != model.d_v=16"):
        check_exportable(mc)

    @dataclasses.dataclass(frozen=True)
    class Recurrent:  # a future model family
        family: str = "rnn"
        d_k: int = 8
        d_v: int = 8

    with pytest.raises(ExportError, match="only the Transformer"):
        check_exportable(Recurrent())


def test_refusals_leave_the_destination_alone(trained, tmp_path):
    cfg = load_config(wd.config_file(trained))
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not a tx export"):
        export(cfg, trained, str(other))
    assert os.listdir(other) == ["keep.txt"]
    with pytest.raises(ExportError, match="--format"):
        export(cfg, trained, str(tmp_path / "x"), fmt="onnx")
    with pytest.raises(ExportError, match="--quantization"):
        export(cfg, trained, str(tmp_path / "x"), quantization="int4")
    assert not (tmp_path / "x").exists()


def test_export_is_atomic(trained, tmp_path, monkeypatch):
    """A failure after CTranslate2 wrote its files leaves no model and no temporary directory;
    a later export replaces an earlier one whole."""
    import tx.infer.export

    cfg = load_config(wd.config_file(trained))
    out = tmp_path / "model"

    def broken_write(*args, **kwargs):  # the last file of the export
        raise OSError("disk full")

    monkeypatch.setattr(tx.infer.export.json, "dump", broken_write)
    with pytest.raises(OSError, match="disk full"):
        export(cfg, trained, str(out))
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    export(cfg, trained, str(out), quantization="int8")
    export(cfg, trained, str(out), checkpoint_step=10)  # replaces it
    with open(out / "tx_export.json") as f:
        record = json.load(f)
    assert record["quantization"] == "float32" and record["checkpoint"] == "checkpoints/10"
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_learned_positions_table_is_the_models(tiny):
    mc, _, params, _, _ = _random_model(tiny, "model.positional=learned")
    spec = transformer_spec(mc, jax.tree_util.tree_map(np.asarray, params), PIECES)
    for stack in ("encoder", "decoder"):  # each stack has its own table
        table = np.asarray(params[stack]["position"]["pos_embedding"])
        assert table.shape == (mc.max_len, mc.d_model)
        exported = getattr(spec, stack).position_encodings.encodings.numpy()
        np.testing.assert_array_equal(exported, table)
