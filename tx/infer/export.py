"""Exporting a trained workdir to CTranslate2, the C++ inference engine translation users deploy
(beam search, int8/int16/float16 weights, batching, CPU and GPU), or to Hugging Face's
MarianMTModel (what transformers and its Hub serve: tx.infer.huggingface_io says what the
directory holds and how the two searches' length penalties map).

    python -m tx export --workdir W --format ctranslate2 --out DIR [--quantization int8]
    python -m tx export --workdir W --format huggingface --out DIR

DIR holds CTranslate2's own files (model.bin, config.json, shared_vocabulary.json) and ours:
  spm.model        the run's SentencePiece model (tokenize before, detokenize after)
  tx_config.json   the run's resolved config: decode settings (beam, alpha, max length)
  tx_export.json   what was exported: checkpoint, quantization, position table size

How tx's Transformer maps onto CTranslate2's TransformerSpec (ctranslate2.specs):
  post-LN / pre-LN          pre_norm=model.pre_ln; pre-LN's final norms -> the stacks' layer_norm
  token embeddings          scale_embeddings=True: x * sqrt(d_model), as tx.model.layers.Embed
  positions                 a table in the file (position_encodings.encodings): tx's interleaved
                            sines (CTranslate2's built-in ones put all sines first) or the learned
                            table; CTranslate2 adds it after the scaling, as tx does
  W^Q, W^K, W^V [m, h, d]   Dense weights [h*d, m], heads major (self-attention fused QKV,
                            cross-attention Q and fused KV); W^O [h, v, m] -> [m, h*v]; no biases
  feed-forward              linear_0 = (wi, bi), linear_1 = (wo, bo), ReLU
  shared embeddings         the same array for source, target and projection (aliased once on disk)
  vocabulary                SentencePiece pieces in tx's id order, so CTranslate2's ids are tx's;
                            unk/bos/eos tokens are the pieces at UNK_ID/BOS_ID/EOS_ID, the
                            decoder starts from BOS, and EOS is appended to the source
                            (add_source_eos), as tx.data.tokenizer.Tokenizer.encode does.
  PAD and BOS never output  tx.infer.search masks them (log_probs); here a projection bias of
                            NEVER_LOGIT on their rows does the same for any CTranslate2 user.
Configs CTranslate2 cannot express are refused (ExportError), never exported approximately;
so are the model options an imported Marian model brings (activation, biases, a zero decoder
start): export those with --format huggingface and convert that with ct2-transformers-converter.
Either format is written to a temporary directory beside DIR and renamed: a failed export leaves
no half model. DIR may be a bucket's prefix (gs://, s3://), which has no renames: the export is
written locally, then uploaded, and it is complete once tx_export.json, uploaded last, is there
(`_upload`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import NamedTuple

import ml_collections
import numpy as np

from tx import storage
from tx.config import model_config
from tx.model.layers import sinusoidal_encoding
from tx.model.transformer_config import TABLES, ModelConfig
from tx.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

QUANTIZATIONS = ("float32", "int8", "int16", "float16")
# Positions the sinusoidal table covers when model.max_len is smaller (sines have no table in
# tx; CTranslate2 needs one). Input tokens and input + max_extra_len output tokens must fit.
MIN_SINUSOID_POSITIONS = 1024
# exp(-1e4) underflows to exactly 0 in float32 and float16 (unlike -1e9, representable in
# float16), so PAD and BOS get probability 0, as tx.infer.search.log_probs gives them.
NEVER_LOGIT = -1.0e4
EXPORT_FILE = "tx_export.json"
CONFIG_FILE = "tx_config.json"
VOCAB_FILE = "spm.model"
# On a bucket: there from the start to the end of an upload, so that an export cut short is
# known as one (and replaced by the next export) rather than refused as someone else's files.
PARTIAL_FILE = "tx_export.partial"


class ExportError(ValueError):
    """A config or destination that cannot be exported: one line saying why."""


def export(
    cfg: ml_collections.ConfigDict,
    workdir: str,
    out: str,
    fmt: str = "ctranslate2",
    quantization: str = "float32",
    checkpoint_step: int | None = None,
) -> dict:
    """Exports `workdir`'s parameters (averaged if any, else the latest; or `checkpoint_step`)
    to `out` in `fmt` (FORMATS) and returns what tx_export.json records."""
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r}: supported formats are {', '.join(FORMATS)}")
    if quantization not in QUANTIZATIONS:
        raise ExportError(f"--quantization {quantization!r}: one of {', '.join(QUANTIZATIONS)}")
    writer = _WRITERS[fmt]
    mc = model_config(cfg)
    writer.check(mc, quantization)
    _check_destination(out)
    from tx.data.vocabulary import run_tokenizer
    from tx.infer.translate import load_model

    tokenizer = run_tokenizer(workdir)
    writer.check_tokenizer(tokenizer, workdir)
    loaded = load_model(cfg, workdir, checkpoint_step)
    params = _to_numpy(loaded.params)
    positions, write = writer.prepare(cfg, mc, params, tokenizer, workdir, quantization)
    record = {
        "format": fmt,
        "quantization": quantization,
        "checkpoint": loaded.source,
        "workdir": storage.absolute(workdir),
        "max_positions": positions,
        "vocab_sha256": tokenizer.fingerprint,
    }
    _write_atomic(out, write, cfg, record)
    return {"out": out, **record}


class _Writer(NamedTuple):
    """One --format, in the order `export` asks it."""

    check: Callable[[ModelConfig, str], None]  # (model, quantization): what it cannot write
    # (cfg, mc, params, tokenizer, workdir, quantization) -> (position rows, write(directory))
    prepare: Callable[..., tuple[int, Callable[[str], None]]]
    check_tokenizer: Callable[[object, str], None] = lambda tokenizer, workdir: None


def _ctranslate2_check(mc: ModelConfig, quantization: str) -> None:
    check_exportable(mc)  # every quantization is CTranslate2's


def _ctranslate2_tokenizer(tokenizer, workdir: str) -> None:
    from tx.data.tokenizer import Tokenizer

    if not isinstance(tokenizer, Tokenizer):
        raise ExportError(
            f"{workdir}'s vocabulary is two SentencePiece models (an imported Marian model's): "
            "export with --format huggingface and convert that with ct2-transformers-converter"
        )


def _ctranslate2_prepare(cfg, mc, params, tokenizer, workdir, quantization):
    """CTranslate2's model.bin, config.json and shared_vocabulary.json, and spm.model."""
    spec = transformer_spec(mc, params, pieces_in_id_order(tokenizer.sp, mc.vocab_size))

    def write(tmp: str) -> None:
        spec.optimize(quantization=None if quantization == "float32" else quantization)
        spec.save(tmp)
        with open(os.path.join(tmp, VOCAB_FILE), "wb") as f:  # the run's may be an object
            f.write(tokenizer.model_bytes)

    return int(spec.encoder.position_encodings.encodings.shape[0]), write


def _huggingface_check(mc: ModelConfig, quantization: str) -> None:
    from tx.infer import huggingface

    if quantization != "float32":
        raise ExportError(
            f"--quantization {quantization}: the Hugging Face export is float32 "
            "(CTranslate2 quantizes: --format ctranslate2)"
        )
    huggingface.check_exportable(mc)


def _huggingface_prepare(cfg, mc, params, tokenizer, workdir, quantization):
    """The MarianMTModel directory (tx.infer.huggingface_io.write_export)."""
    from tx.infer import huggingface_io

    def write(tmp: str) -> None:
        huggingface_io.write_export(tmp, cfg, mc, params, tokenizer, workdir)

    return huggingface_io.max_positions(cfg, workdir), write


_WRITERS = {
    "ctranslate2": _Writer(_ctranslate2_check, _ctranslate2_prepare, _ctranslate2_tokenizer),
    "huggingface": _Writer(_huggingface_check, _huggingface_prepare),
}
FORMATS = tuple(_WRITERS)


# Model options (tx.model.transformer_config) tx's CTranslate2 export does not write, at the
# values that need none (the paper's model); an imported Marian model sets them all.
_PAPER_ONLY = (
    ("activation", "relu"),
    ("attention_bias", False),
    ("logits_bias", False),
    ("decoder_start", "token"),
    ("source_vocab_size", 0),  # separate vocabularies (Marian's): no tx export writes two
)


def check_exportable(mc: ModelConfig) -> None:
    """Raises ExportError naming the first thing CTranslate2's Transformer cannot express."""
    family = getattr(mc, "family", "transformer")
    if family != "transformer":
        raise ExportError(f"model.family={family!r}: only the Transformer exports to CTranslate2")
    if mc.d_k != mc.d_v:
        raise ExportError(
            f"model.d_k={mc.d_k} != model.d_v={mc.d_v}: CTranslate2 has one head width "
            "(head_dim) for queries, keys and values"
        )
    options = [f"model.{k}={getattr(mc, k)!r}" for k, v in _PAPER_ONLY if getattr(mc, k) != v]
    if options:
        raise ExportError(
            f"{', '.join(options)}: tx's CTranslate2 export writes the paper's Transformer; "
            "export with --format huggingface and convert that with ct2-transformers-converter"
        )


def pieces_in_id_order(sp, vocab_size: int) -> list[str]:
    """SentencePiece pieces in id order: CTranslate2's token ids are then tx's ids."""
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    if len(pieces) != vocab_size:
        raise ExportError(
            f"the vocabulary has {len(pieces)} pieces but model.vocab_size={vocab_size}"
        )
    if len(set(pieces)) != len(pieces):
        raise ExportError("the vocabulary has repeated pieces: CTranslate2 maps tokens by text")
    return pieces


def transformer_spec(mc: ModelConfig, params: dict, pieces: list[str]):
    """The ctranslate2.specs.TransformerSpec of tx parameters (numpy, float32)."""
    from ctranslate2.specs import transformer_spec as ts

    head_dim = None if mc.d_k * mc.num_heads == mc.d_model else mc.d_k
    spec = ts.TransformerSpec(
        ts.TransformerEncoderSpec(
            mc.num_encoder_layers, mc.num_heads, pre_norm=mc.pre_ln, head_dim=head_dim
        ),
        ts.TransformerDecoderSpec(
            mc.num_decoder_layers, mc.num_heads, pre_norm=mc.pre_ln, head_dim=head_dim
        ),
    )
    src, tgt, out = _embeddings(mc, params)
    positions = _positions(mc, params)
    _set_stack(spec.encoder, params["encoder"], mc, "encoder")
    _set_stack(spec.decoder, params["decoder"], mc, "decoder")
    spec.encoder.embeddings[0].weight = src
    spec.decoder.embeddings.weight = tgt
    spec.encoder.position_encodings.encodings = positions["encoder"]
    spec.decoder.position_encodings.encodings = positions["decoder"]
    spec.decoder.projection.weight = out  # [V, m]: the embedding's own layout
    bias = np.zeros(mc.vocab_size, np.float32)
    bias[[PAD_ID, BOS_ID]] = NEVER_LOGIT
    spec.decoder.projection.bias = bias
    spec.config.layer_norm_epsilon = mc.layer_norm_epsilon
    spec.config.unk_token, spec.config.bos_token = pieces[UNK_ID], pieces[BOS_ID]
    spec.config.eos_token = pieces[EOS_ID]
    spec.config.decoder_start_token = pieces[BOS_ID]
    spec.config.add_source_eos = True
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.validate()
    return spec


def _embeddings(mc: ModelConfig, params: dict):
    """(source, target, pre-softmax) matrices [V, m], without the rows padding the vocabulary."""
    if mc.share_embeddings:
        e = _own(params["shared_embedding"]["embedding"][: mc.vocab_size])
        return e, e, e  # one array: CTranslate2 stores it once and aliases the others
    names = ("source_embedding", "target_embedding", "softmax")
    return tuple(_own(params[n]["embedding"][: mc.vocab_size]) for n in names)


def _positions(mc: ModelConfig, params: dict) -> dict:
    """Per stack, the table [positions, m] added after the embedding scale."""
    if mc.positional in TABLES:
        return {s: _own(params[s]["position"]["pos_embedding"]) for s in ("encoder", "decoder")}
    n = max(mc.max_len, MIN_SINUSOID_POSITIONS)
    table = np.asarray(sinusoidal_encoding(np.arange(n), mc.d_model), np.float32)
    return {"encoder": table, "decoder": table}


def _set_stack(spec, stack: dict, mc: ModelConfig, name: str) -> None:
    """One encoder or decoder: its layers and (pre-LN) its final norm."""
    num = mc.num_encoder_layers if name == "encoder" else mc.num_decoder_layers
    for i in range(num):
        p, layer = stack[f"layer_{i}"], spec.layer[i]
        if name == "encoder":
            _set_attention(layer.self_attention, p["self_attention"], p["attention_block"], True)
        else:
            _set_attention(
                layer.self_attention, p["self_attention"], p["self_attention_block"], True
            )
            _set_attention(layer.attention, p["cross_attention"], p["cross_attention_block"], False)
        _set_norm(layer.ffn.layer_norm, p["ffn_block"]["norm"])
        f = p["ffn"]
        layer.ffn.linear_0.weight, layer.ffn.linear_0.bias = _own(f["wi"].T), _own(f["bi"])
        layer.ffn.linear_1.weight, layer.ffn.linear_1.bias = _own(f["wo"].T), _own(f["bo"])
    if mc.pre_ln:
        _set_norm(spec.layer_norm, stack["final_norm"])


def _set_attention(spec, p: dict, block: dict, self_attention: bool) -> None:
    """tx kernels [m, h, d] -> Dense weights [h*d, m] (CTranslate2 splits heads major)."""

    def dense(kernel):  # [m, h, d] -> [h*d, m]
        return _own(kernel.reshape(kernel.shape[0], -1).T)

    q, k, v = (dense(p[n]) for n in ("query", "key", "value"))
    if self_attention:
        spec.linear[0].weight = np.concatenate([q, k, v])
    else:
        spec.linear[0].weight = q
        spec.linear[1].weight = np.concatenate([k, v])
    out = p["out"]  # [h, v, m]
    spec.linear[-1].weight = _own(out.reshape(-1, out.shape[-1]).T)  # [m, h*v]
    _set_norm(spec.layer_norm, block["norm"])


def _set_norm(spec, p: dict) -> None:
    spec.gamma, spec.beta = _own(p["scale"]), _own(p["bias"])


def _own(x: np.ndarray) -> np.ndarray:
    """A contiguous float32 copy: CTranslate2's quantizer scales its arrays in place."""
    return np.array(x, np.float32, order="C")


def _to_numpy(params) -> dict:
    import jax

    return jax.tree_util.tree_map(lambda x: np.array(x, np.float32), params)


def is_export(path: str) -> bool:
    return storage.isfile(storage.join(path, EXPORT_FILE))


def _check_destination(out: str) -> None:
    """An earlier export (or one cut short) is replaced; anything else at `out` is refused."""
    partial = storage.exists(storage.join(out, PARTIAL_FILE))
    if storage.exists(out) and not is_export(out) and not partial:
        raise ExportError(f"--out {out} exists and is not a tx export: choose a new directory")


def _write_atomic(out, write, cfg, record) -> None:
    """Everything goes into a local temporary directory (beside a local `out`): the format's
    files (`write(directory)`), the run's config and, last, the record. The directory is
    renamed to `out` at the end, or uploaded to a bucket's `out` (`_upload`)."""
    remote = storage.is_remote(out)
    parent = None if remote else os.path.dirname(os.path.abspath(out))
    if parent:
        os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".export-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would hide the model from its server
    try:
        write(tmp)
        with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
            f.write(cfg.to_json_best_effort(indent=2, sort_keys=True))
        if remote:
            _upload(tmp, out, json.dumps(record, indent=2))
        else:
            with open(os.path.join(tmp, EXPORT_FILE), "w") as f:
                json.dump(record, f, indent=2)
            _replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing there once renamed to `out`


def _upload(local: str, out: str, record: str) -> None:
    """Puts the export in `local` at a bucket's `out`, where no directory can be renamed: the
    export is complete once EXPORT_FILE, written last, is there. An earlier export loses its
    EXPORT_FILE before any of its files is replaced or removed, so no reader takes a mix of
    two; PARTIAL_FILE stays from the first write to the last (see _check_destination)."""
    storage.write_text(storage.join(out, PARTIAL_FILE), "")
    storage.remove(storage.join(out, EXPORT_FILE))
    for rel in storage.walk_files(out):  # an earlier export's files
        if rel != PARTIAL_FILE:
            storage.remove(storage.join(out, rel))
    storage.upload_tree(local, out)
    storage.write_text(storage.join(out, EXPORT_FILE), record)
    storage.remove(storage.join(out, PARTIAL_FILE))


def _replace_dir(new: str, out: str) -> None:
    """Renames `new` to `out`; an earlier export at `out` is moved aside first and removed
    after, so `out` is never half a model: the old one, for an instant none, or the new one."""
    if not os.path.exists(out):
        os.rename(new, out)
        return
    old = tempfile.mkdtemp(prefix=".export-old-", dir=os.path.dirname(os.path.abspath(out)))
    os.rename(out, os.path.join(old, "model"))
    os.rename(new, out)
    shutil.rmtree(old, ignore_errors=True)
