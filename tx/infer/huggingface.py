"""Hugging Face's MarianMTModel, both ways: a tx Transformer as the weights of a MarianMTModel,
and a MarianMTModel's weights (OPUS-MT's, Helsinki-NLP/opus-mt-*) as a tx Transformer.

The paper's post-LN model is, weight for weight, Marian's: embeddings x sqrt(d_model), sinusoidal
positions, shared embeddings tied to the softmax, post-LN sub-layers, no final norm. What
differs is written down here once, in both directions:

    channels     tx interleaves its sinusoids (sin, cos, sin, ...), Marian puts every sine first:
                 a fixed permutation of the d_model channels (`channel_order`) applied to every
                 weight on that axis gives the same function (LayerNorm and the residual stream
                 are indifferent to the channels' order)
    positions    a sinusoidal tx model's float32 sinusoids are written as Marian's position
                 tables, so both add the same numbers (transformers computes its own, in
                 float64 rounded to float32, only where a file has none); a learned one's
                 tables are written as they are. Imported, tables equal to tx's sinusoids bit
                 for bit are sinusoids again; any others (transformers' own, a fold below
                 that is not tx's) become learned tables holding them exactly (`import_fields`)
    start        Marian's decoder starts from its start token's (<pad>'s) row. A tx run's
                 vocabulary has its own <s>: the export zeroes <pad>'s row and folds the start
                 (<s>'s embedding, "token", or zeros) into the decoder table's row 0, as
                 CTranslate2's converter (which starts every Marian decoder from zeros) needs;
                 the import finds that fold again (sinusoids with row 0 = sinusoid + <s>'s
                 embedding) or keeps it in learned tables. An OPUS-MT vocabulary has no <s>:
                 tx's <s> row is Marian's <pad> row (decoder_start "zero" where that is zero,
                 "token" otherwise), and goes back there
    projections  tx's [m, h, d] kernels are torch's [h*d, m] Linear weights; biases where
                 model.attention_bias (Marian always has them: zero otherwise)
    feed-forward wi [m, f] / wo [f, m] are fc1 / fc2 transposed; model.activation
    logits       model.logits_bias is final_logits_bias; a model without one gets -1e4 on PAD
                 and BOS, which tx's search never emits (exp(-1e4) is 0 in float32)
    vocabulary   Marian's ids are OPUS-MT's order: </s> 0, <unk> 1, <pad> last, no <s>. A tx
                 run exported keeps its pieces in its order but moves <pad> (tx's 0) to the
                 end (`export_order`: id t is Marian's t - 1), as CTranslate2's converter
                 expects (it drops the last row as <pad>'s); its <s> stays a piece whose
                 logit is -1e4. Imported, Marian's rows are reordered to tx's
                 (`import_order`): a vocabulary with "<s>" (a tx run's export) gives it tx's
                 <s> id, so the run's ids come back as they were; one without (OPUS-MT's)
                 gets a row for <s> holding <pad>'s (see "start"). An imported run exports
                 back with its own ids. Separate vocabularies (share_encoder_decoder_
                 embeddings=False): the encoder's matrix over vocab.json's ids, the decoder's
                 over target_vocab.json's, each reordered so (model.source_vocab_size)
    LayerNorm    Marian's epsilon is torch's default, 1e-5 (model.layer_norm_epsilon on import);
                 a tx run with another (1e-6 by default) is exported as it is: each norm then
                 differs by a relative (1e-5 - 1e-6) / (2 var) of its input's variance, ~1e-6
                 of the logits of the demo's model (tests/test_huggingface.py). Imported back
                 (tx_config.json beside the weights), the run's own epsilon returns

Shape letters: m d_model, h heads, d head width, f d_ff, V vocabulary.

The module reads better whole: each direction mirrors the other line for line (to_marian and
from_marian, marian_config and model_section), so a change to one is checked against the other
in the same sitting.
"""

from __future__ import annotations

import numpy as np

from tx.config import ConfigError
from tx.data import tokenizer as tokenizers
from tx.model.layers import ACTIVATIONS, padded_rows, sinusoidal_encoding
from tx.model.transformer_config import ModelConfig
from tx.tokens import BOS_ID, EOS_ID, PAD_ID

NEVER_LOGIT = -1.0e4  # as tx.infer.export's: PAD and BOS get probability 0
MARIAN_LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which Marian keeps
MIN_POSITIONS = 1024  # rows of the position tables written (Marian's default is 512)
# transformers' ACT2FN names of the activations tx has (tx.model.layers.ACTIVATIONS) -> tx's;
# tx's own names are ACT2FN's too, so an export writes model.activation as it is
FROM_ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}


class HuggingFaceError(ConfigError):
    """A model one side cannot express: one line saying what and what serves it instead."""


def check_exportable(mc: ModelConfig) -> None:
    """Raises HuggingFaceError naming what MarianMTModel cannot express."""
    family = getattr(mc, "family", "transformer")
    serve = "export it with --format ctranslate2 instead (CTranslate2 serves it)"
    if family != "transformer":
        raise HuggingFaceError(f"model.family={family!r}: MarianMTModel is a Transformer; {serve}")
    if mc.pre_ln:
        raise HuggingFaceError(f"model.pre_ln=True: MarianMTModel is post-LN only; {serve}")
    if not mc.share_embeddings:
        raise HuggingFaceError(
            f"model.share_embeddings=False: tx's three matrices are not Marian's; {serve}"
        )
    if mc.d_k != mc.d_v or mc.d_k * mc.num_heads != mc.d_model:
        raise HuggingFaceError(
            f"model.d_k={mc.d_k}, d_v={mc.d_v} with {mc.num_heads} heads: Marian's heads are "
            f"d_model / heads wide; {serve}"
        )


def channel_order(d_model: int) -> np.ndarray:
    """[m] int: Marian's channel j is tx's channel order[j] (tx's sines at even channels,
    cosines at odd ones; Marian's sines in the first half, cosines in the second)."""
    half = np.arange(d_model // 2)
    return np.concatenate([2 * half, 2 * half + 1])


def position_table(d_model: int, rows: int) -> np.ndarray:
    """[rows, m] tx's sinusoids (float32, as tx computes them) in Marian's channel order."""
    table = np.asarray(sinusoidal_encoding(np.arange(rows), d_model), np.float32)
    return table[:, channel_order(d_model)]


def marian_position_table(d_model: int, rows: int) -> np.ndarray:
    """[rows, m] the table transformers' MarianSinusoidalPositionalEmbedding computes where a
    file has none: its float64 sinusoids (the same expressions, in the same order, for the
    same bits) rounded to float32, sines first."""
    angles = np.array(
        [
            [pos / np.power(10000, 2 * (j // 2) / d_model) for j in range(d_model)]
            for pos in range(rows)
        ]
    ).reshape(rows, d_model)
    half = (d_model + 1) // 2
    out = np.empty((rows, d_model), np.float32)
    out[:, :half] = np.sin(angles[:, 0::2])
    out[:, half:] = np.cos(angles[:, 1::2])
    return out


def marian_config(
    mc: ModelConfig,
    max_positions: int,
    order: np.ndarray | None = None,
    source_order: np.ndarray | None = None,
) -> dict:
    """transformers' MarianConfig fields for `mc` (its config.json). `order`: an imported
    model's `import_order` (its own ids back); None: tx's ids are the Marian ids.
    `source_order`: the source vocabulary's, for separate vocabularies (model.source_vocab_size)."""
    pad, eos = (PAD_ID, EOS_ID) if order is None else (int(order[PAD_ID]), int(order[EOS_ID]))
    size = mc.vocab_size if order is None else mc.vocab_size - int(np.sum(order < 0))
    source_size = size
    if mc.source_vocab_size:
        source_size = mc.source_vocab_size - int(np.sum(source_order < 0))
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": source_size,
        "decoder_vocab_size": size,
        "d_model": mc.d_model,
        "encoder_layers": mc.num_encoder_layers,
        "decoder_layers": mc.num_decoder_layers,
        "encoder_attention_heads": mc.num_heads,
        "decoder_attention_heads": mc.num_heads,
        "encoder_ffn_dim": mc.d_ff,
        "decoder_ffn_dim": mc.d_ff,
        "activation_function": mc.activation,
        "max_position_embeddings": max_positions,
        "scale_embedding": True,
        "share_encoder_decoder_embeddings": not mc.source_vocab_size,
        "tie_word_embeddings": True,
        "dropout": mc.dropout_rate,
        "attention_dropout": mc.attention_dropout_rate,
        "activation_dropout": mc.relu_dropout_rate,
        "pad_token_id": pad,
        "eos_token_id": eos,
        "forced_eos_token_id": eos,
        "decoder_start_token_id": pad,  # carries tx's start: see the module docstring
        "bos_token_id": None,
        "is_encoder_decoder": True,
    }


def to_marian(
    mc: ModelConfig,
    params: dict,
    vocab_order: np.ndarray | None = None,
    max_positions: int = MIN_POSITIONS,
    source_order: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """tx parameters (numpy) -> MarianMTModel's state dict (float32, torch's layouts; tied
    weights once, as model.shared.weight, or model.encoder.embed_tokens.weight and
    model.decoder.embed_tokens.weight for separate vocabularies), its position tables
    `max_positions` long (as `marian_config`'s). `vocab_order`, `source_order`: as for
    `marian_config`."""
    check_exportable(mc)
    order = channel_order(mc.d_model)
    state = {}
    target = "target_embedding" if mc.source_vocab_size else "shared_embedding"
    shared = np.array(params[target]["embedding"][: mc.vocab_size], np.float32)
    encoder_table, decoder_table = _tables_out(mc, params, max_positions)
    if vocab_order is not None and vocab_order[BOS_ID] < 0:
        # OPUS-MT's vocabulary has no <s>: Marian's start token, <pad>, carries tx's start
        shared[PAD_ID] = shared[BOS_ID] if mc.decoder_start == "token" else 0.0
    else:
        if mc.decoder_start == "token":  # at the only place it is read: see the docstring
            decoder_table[0] += shared[BOS_ID] * np.float32(np.sqrt(mc.d_model))
        shared[PAD_ID] = 0.0  # padding's row is read by nothing in tx
    if mc.source_vocab_size:
        source = np.array(params["source_embedding"]["embedding"], np.float32)
        source = _marian_rows(source[: mc.source_vocab_size], source_order)
        state["model.encoder.embed_tokens.weight"] = source[:, order]
        state["model.decoder.embed_tokens.weight"] = _marian_rows(shared, vocab_order)[:, order]
    else:
        state["model.shared.weight"] = _marian_rows(shared, vocab_order)[:, order]
    state["model.encoder.embed_positions.weight"] = encoder_table[:, order]
    state["model.decoder.embed_positions.weight"] = decoder_table[:, order]
    for stack, blocks in (("encoder", _ENCODER), ("decoder", _DECODER)):
        layers = mc.num_encoder_layers if stack == "encoder" else mc.num_decoder_layers
        for i in range(layers):
            p, prefix = params[stack][f"layer_{i}"], f"model.{stack}.layers.{i}"
            for tx_name, marian in blocks:
                if marian.endswith("_layer_norm"):
                    _norm_out(state, f"{prefix}.{marian}", p[tx_name]["norm"], order)
                elif marian == "ffn":
                    _ffn_out(state, prefix, p["ffn"], order)
                else:
                    _attention_out(state, f"{prefix}.{marian}", p[tx_name], mc, order)
    if mc.logits_bias:
        bias = np.asarray(params["final_logits_bias"], np.float32)
    else:
        bias = np.zeros(mc.vocab_size, np.float32)
        bias[[PAD_ID, BOS_ID]] = NEVER_LOGIT
    state["final_logits_bias"] = _marian_rows(bias, vocab_order)[None, :]
    return state


def _tables_out(mc: ModelConfig, params: dict, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The encoder's and the decoder's position tables [rows, m] in tx's channel order (copies):
    tx's float32 sinusoids, or a learned model's own tables (`rows` must be model.max_len)."""
    if mc.positional == "sinusoidal":
        table = np.asarray(sinusoidal_encoding(np.arange(rows), mc.d_model), np.float32)
        return table, table.copy()
    if rows != mc.max_len:
        raise HuggingFaceError(
            f"model.max_len={mc.max_len} learned positions: the tables have that many rows, "
            f"not {rows}"
        )
    return tuple(
        np.array(params[stack]["position"]["pos_embedding"], np.float32)
        for stack in ("encoder", "decoder")
    )


def _marian_rows(x: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    """Rows in tx's id order -> in Marian's: as they are (order None), or each row t at its
    Marian id order[t], the rows tx added (order -1) left out."""
    if order is None:
        return x
    out = np.zeros((int(np.sum(order >= 0)), *x.shape[1:]), x.dtype)
    out[order[order >= 0]] = x[order >= 0]
    return out


# (tx name, Marian name) of each layer's parts; a block's norm is `<tx name>/norm`.
_ENCODER = (
    ("self_attention", "self_attn"),
    ("attention_block", "self_attn_layer_norm"),
    ("ffn", "ffn"),
    ("ffn_block", "final_layer_norm"),
)
_DECODER = (
    ("self_attention", "self_attn"),
    ("self_attention_block", "self_attn_layer_norm"),
    ("cross_attention", "encoder_attn"),
    ("cross_attention_block", "encoder_attn_layer_norm"),
    ("ffn", "ffn"),
    ("ffn_block", "final_layer_norm"),
)


def _norm_out(state, prefix, p, order):
    state[f"{prefix}.weight"] = np.asarray(p["scale"], np.float32)[order]
    state[f"{prefix}.bias"] = np.asarray(p["bias"], np.float32)[order]


def _ffn_out(state, prefix, p, order):
    state[f"{prefix}.fc1.weight"] = np.asarray(p["wi"], np.float32)[order].T.copy()  # [f, m]
    state[f"{prefix}.fc1.bias"] = np.asarray(p["bi"], np.float32)
    state[f"{prefix}.fc2.weight"] = np.asarray(p["wo"], np.float32)[:, order].T.copy()  # [m, f]
    state[f"{prefix}.fc2.bias"] = np.asarray(p["bo"], np.float32)[order]


def _attention_out(state, prefix, p, mc, order):
    m = mc.d_model
    for tx_name, marian in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
        kernel = np.asarray(p[tx_name], np.float32)  # [m, h, d]
        state[f"{prefix}.{marian}.weight"] = kernel.reshape(m, -1)[order].T.copy()  # [h*d, m]
        bias = p.get(f"{tx_name}_bias")
        state[f"{prefix}.{marian}.bias"] = (
            np.zeros(kernel.shape[1] * kernel.shape[2], np.float32)
            if bias is None
            else np.asarray(bias, np.float32).reshape(-1)
        )
    out = np.asarray(p["out"], np.float32)  # [h, d, m]
    state[f"{prefix}.out_proj.weight"] = out.reshape(-1, m)[:, order].T.copy()  # [m, h*d]
    bias = p.get("out_bias")
    state[f"{prefix}.out_proj.bias"] = (
        np.zeros(m, np.float32) if bias is None else np.asarray(bias, np.float32)[order]
    )


# -------------------------------------------------------------------------------------------
# Marian -> tx


def check_importable(config: dict) -> None:
    """Raises HuggingFaceError naming what of a MarianConfig (its config.json) tx cannot
    express."""
    unsupported = []
    if not config.get("scale_embedding", False):
        unsupported.append("scale_embedding=False (tx scales embeddings by sqrt(d_model))")
    if config.get("normalize_before", False) or config.get("normalize_embedding", False):
        unsupported.append("normalize_before / normalize_embedding (tx's Marian is post-LN)")
    if config.get("encoder_attention_heads") != config.get("decoder_attention_heads"):
        unsupported.append("different head counts in the encoder and the decoder")
    if config.get("encoder_ffn_dim") != config.get("decoder_ffn_dim"):
        unsupported.append("different feed-forward widths in the encoder and the decoder")
    if not config.get("tie_word_embeddings", True):
        unsupported.append("tie_word_embeddings=False (tx's softmax is the target embedding)")
    for key in ("encoder_layerdrop", "decoder_layerdrop"):
        if config.get(key):  # training only, but a fine-tuned import would train without it
            unsupported.append(f"{key}={config[key]} (tx trains every layer at every step)")
    if isinstance(config.get("eos_token_id"), list):
        unsupported.append("eos_token_id as a list (tx has one end-of-sentence token)")
    if int(config.get("d_model", 0)) % 2:
        unsupported.append(f"d_model={config.get('d_model')} (odd: tx's channels come in pairs)")
    shared = config.get("share_encoder_decoder_embeddings", True)
    if shared and config.get("decoder_vocab_size") not in (None, config.get("vocab_size")):
        unsupported.append(
            f"decoder_vocab_size={config.get('decoder_vocab_size')} != vocab_size="
            f"{config.get('vocab_size')} with shared embeddings"
        )
    activation = config.get("activation_function", "gelu")
    if activation not in FROM_ACTIVATIONS:
        unsupported.append(f"activation_function={activation!r} (tx has {sorted(ACTIVATIONS)})")
    if unsupported:
        raise HuggingFaceError("this MarianMTModel cannot be imported: " + "; ".join(unsupported))


def model_section(
    config: dict,
    state: dict,
    order: np.ndarray,
    tx_config: dict | None = None,
    source_order: np.ndarray | None = None,
) -> dict:
    """tx's `model` config section for a MarianConfig (its config.json), its state dict
    (`read_weights`'s) and its vocabulary's `import_order` (the target's; `source_order` the
    source's, for separate vocabularies); HuggingFaceError for what tx cannot express.
    `tx_config`: a tx run's export's tx_config.json, whose LayerNorm epsilon comes back
    (MarianConfig has no field for it: transformers uses torch's 1e-5)."""
    check_importable(config)
    activation = config.get("activation_function", "gelu")
    separate = not config.get("share_encoder_decoder_embeddings", True)
    tx_model = (tx_config or {}).get("model") or {}  # a tx run's export: what Marian lacks
    if tx_model.get("positional") == "sinusoidal":
        tx_model = {**tx_model, "positional": None}  # tables other than tx's: fixed
    return {
        "vocab_size": len(order),  # with a row for <s> where vocab.json has none
        "source_vocab_size": len(source_order) if separate else 0,
        "d_model": int(config["d_model"]),
        "num_heads": int(config["encoder_attention_heads"]),
        "d_ff": int(config["encoder_ffn_dim"]),
        "num_layers": int(config["encoder_layers"]),
        "num_encoder_layers": int(config["encoder_layers"]),
        "num_decoder_layers": int(config["decoder_layers"]),
        "dropout_rate": float(config.get("dropout", 0.1)),
        "attention_dropout_rate": float(config.get("attention_dropout", 0.0)),
        "relu_dropout_rate": float(config.get("activation_dropout", 0.0)),
        "share_embeddings": True,
        "pre_ln": False,
        "layer_norm_epsilon": float(tx_model.get("layer_norm_epsilon", MARIAN_LAYER_NORM_EPSILON)),
        "activation": FROM_ACTIVATIONS[activation],
        "attention_bias": True,
        "logits_bias": True,
        **import_fields(config, state, order, tx_model.get("positional") or "fixed"),
    }


def marian_tables(config: dict, state: dict) -> tuple[np.ndarray, np.ndarray]:
    """The encoder's and the decoder's position tables [P, m] (Marian's channel order) that
    transformers adds: the file's, else those it computes (`marian_position_table`)."""
    rows, m = int(config.get("max_position_embeddings", 1024)), int(config["d_model"])
    computed = None
    out = []
    for stack in ("encoder", "decoder"):
        table = state.get(f"model.{stack}.embed_positions.weight")
        if table is None:
            computed = marian_position_table(m, rows) if computed is None else computed
            table = computed
        if table.shape != (rows, m):
            raise HuggingFaceError(
                f"model.{stack}.embed_positions.weight is {list(table.shape)}, not "
                f"[max_position_embeddings={rows}, d_model={m}]"
            )
        out.append(np.asarray(table, np.float32))
    return out[0], out[1]


def import_fields(config: dict, state: dict, order: np.ndarray, positional: str = "fixed") -> dict:
    """The model fields (positional, max_len, decoder_start) under which tx adds exactly what
    transformers adds to the first layers' inputs (the module's docstring, "positions" and
    "start"): tx's sinusoids where the tables are tx's bit for bit, else tables holding them
    (`positional`: "fixed", never trained, as Marian's; "learned" for a tx run's learned
    ones); the start from <s>'s row or zeros."""
    m = int(config["d_model"])
    encoder, decoder = marian_tables(config, state)
    sinusoids = position_table(m, encoder.shape[0])
    shared = target_embedding(state, config)
    pad_row = shared[int(config["pad_token_id"])]
    same_rest = np.array_equal(encoder, sinusoids) and np.array_equal(decoder[1:], sinusoids[1:])
    learned = {"positional": positional, "max_len": int(encoder.shape[0])}
    if order[BOS_ID] < 0:  # no <s> in vocab.json: tx's <s> row is <pad>'s (from_marian)
        start = "token" if np.any(pad_row != 0) else "zero"
        if same_rest and np.array_equal(decoder[0], sinusoids[0]):
            return {"positional": "sinusoidal", "decoder_start": start}
        return {**learned, "decoder_start": start}
    if np.any(pad_row != 0):
        raise HuggingFaceError(
            "the decoder starts from <pad>, whose embedding is not zero, and vocab.json has its "
            "own <s>: tx starts from one row, <s>'s or zeros"
        )
    folded = sinusoids[0] + shared[order[BOS_ID]] * np.float32(np.sqrt(m))  # as to_marian
    if same_rest and np.array_equal(decoder[0], folded):  # a tx run's export
        return {"positional": "sinusoidal", "decoder_start": "token"}
    if same_rest and np.array_equal(decoder[0], sinusoids[0]):
        return {"positional": "sinusoidal", "decoder_start": "zero"}
    return {**learned, "decoder_start": "zero"}  # whatever row 0 holds, the table keeps


def import_order(
    vocab: dict[str, int], config: dict, target_vocab: dict[str, int] | None = None
) -> np.ndarray:
    """[V] int: the Marian id of each tx id of the target's vocabulary (vocab.json, or
    `target_vocab`: target_vocab.json of separate vocabularies), -1 for tx's <s> where it has
    none (a row of its own): the order of tx.data.tokenizer.import_order, for a model whose
    config.json agrees with its vocabularies."""
    separate = not config.get("share_encoder_decoder_embeddings", True)
    if separate and target_vocab is None:
        raise HuggingFaceError(
            "share_encoder_decoder_embeddings=False (separate vocabularies) needs the target's "
            f"vocabulary, {tokenizers.TARGET_VOCAB_JSON} (MarianTokenizer's separate_vocabs)"
        )
    target = target_vocab if separate else vocab
    where = tokenizers.TARGET_VOCAB_JSON if separate else tokenizers.VOCAB_JSON
    pad, eos = int(config["pad_token_id"]), int(config["eos_token_id"])
    if int(config.get("decoder_start_token_id", pad)) != pad:
        raise HuggingFaceError(
            "decoder_start_token_id is not pad_token_id: tx imports Marian models whose "
            "decoder starts from <pad>, as OPUS-MT's"
        )
    have = {
        "vocab_size": (int(config["vocab_size"]), len(vocab), tokenizers.VOCAB_JSON),
        "pad_token_id": (pad, target.get(tokenizers.MARIAN_PAD), where),
        "eos_token_id": (eos, target.get(tokenizers.MARIAN_EOS), where),
    }
    if separate:
        have["decoder_vocab_size"] = (int(config["decoder_vocab_size"]), len(target), where)
    differ = [f"{k} {a} ({f}: {b})" for k, (a, b, f) in have.items() if a != b]
    if differ:
        raise HuggingFaceError(
            "config.json and the vocabulary disagree: " + "; ".join(differ) + " (tx reads the "
            "special tokens as MarianTokenizer names them: <pad>, </s>, <unk>)"
        )
    return tokenizers.import_order(target)


def target_embedding(state: dict, config: dict) -> np.ndarray:
    """The decoder's embedding [V, m] (Marian's ids and channels) of a state dict."""
    if not config.get("share_encoder_decoder_embeddings", True):
        return state["model.decoder.embed_tokens.weight"]
    return state["model.shared.weight"]


def export_order(vocab_size: int) -> np.ndarray:
    """[V] int: the Marian id of each of a tx run's ids, t - 1 and <pad> (0) last."""
    return (np.arange(vocab_size) - 1) % vocab_size


def from_marian(
    mc: ModelConfig, state: dict, order: np.ndarray, source_order: np.ndarray | None = None
) -> dict:
    """MarianMTModel's state dict (numpy, float32) -> tx parameters for `mc` (from
    `model_section`), the vocabulary in tx's order (`import_order`; `source_order` the
    source's, for separate vocabularies)."""
    perm = channel_order(mc.d_model)
    inverse = np.argsort(perm)  # tx channel i is Marian's channel inverse[i]

    def rows(x):  # Marian's vocabulary rows -> tx's; <s> (order -1) a zero row
        x = np.asarray(x, np.float32)
        out = x[np.maximum(order, 0)]
        out[order < 0] = 0.0
        return out

    separate = {"share_encoder_decoder_embeddings": not mc.source_vocab_size}
    marian_target = np.asarray(target_embedding(state, separate), np.float32)
    shared = rows(marian_target)
    if order[BOS_ID] < 0:  # Marian's start token's row: the start (import_fields)
        shared[BOS_ID] = marian_target[order[PAD_ID]]
    params = {
        **_embeddings_in(mc, state, shared[:, inverse], source_order, inverse),
        "final_logits_bias": rows(state["final_logits_bias"].reshape(-1)),
        "encoder": {},
        "decoder": {},
    }
    if mc.position_table:
        config = {"max_position_embeddings": mc.max_len, "d_model": mc.d_model}
        for stack, table in zip(("encoder", "decoder"), marian_tables(config, state), strict=True):
            params[stack]["position"] = {"pos_embedding": table[:, inverse].copy()}
    params["final_logits_bias"][order < 0] = NEVER_LOGIT  # <s>: never emitted
    for stack, blocks in (("encoder", _ENCODER), ("decoder", _DECODER)):
        layers = mc.num_encoder_layers if stack == "encoder" else mc.num_decoder_layers
        for i in range(layers):
            prefix, layer = f"model.{stack}.layers.{i}", {}
            for tx_name, marian in blocks:
                if marian.endswith("_layer_norm"):
                    layer[tx_name] = {"norm": _norm_in(state, f"{prefix}.{marian}", inverse)}
                elif marian == "ffn":
                    layer["ffn"] = _ffn_in(state, prefix, inverse)
                else:
                    layer[tx_name] = _attention_in(state, f"{prefix}.{marian}", mc, inverse)
            params[stack][f"layer_{i}"] = layer
    return params


def _embeddings_in(mc, state, target, source_order, inverse) -> dict:
    """The embedding parameters: one shared matrix, or (separate vocabularies) the encoder's
    over the source's ids and the decoder's; rows padded to model.vocab_multiple."""

    def padded(x, rows):
        return {"embedding": np.pad(x, ((0, rows - x.shape[0]), (0, 0)))}

    if not mc.source_vocab_size:
        return {"shared_embedding": padded(target, mc.vocab_rows)}
    source = np.asarray(state["model.encoder.embed_tokens.weight"], np.float32)
    source = source[np.maximum(source_order, 0)]
    source[source_order < 0] = 0.0  # tx's <s> row: no source token is <s>
    rows = padded_rows(mc.source_vocab_size, mc.vocab_multiple)
    return {
        "source_embedding": padded(source[:, inverse], rows),
        "target_embedding": padded(target, mc.vocab_rows),
    }


def _norm_in(state, prefix, inverse):
    return {
        "scale": np.asarray(state[f"{prefix}.weight"], np.float32)[inverse],
        "bias": np.asarray(state[f"{prefix}.bias"], np.float32)[inverse],
    }


def _ffn_in(state, prefix, inverse):
    return {
        "wi": np.asarray(state[f"{prefix}.fc1.weight"], np.float32).T[inverse].copy(),
        "bi": np.asarray(state[f"{prefix}.fc1.bias"], np.float32),
        "wo": np.asarray(state[f"{prefix}.fc2.weight"], np.float32).T[:, inverse].copy(),
        "bo": np.asarray(state[f"{prefix}.fc2.bias"], np.float32)[inverse],
    }


def _attention_in(state, prefix, mc, inverse):
    h, d, m = mc.num_heads, mc.d_k, mc.d_model
    out = {}
    for tx_name, marian in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
        weight = np.asarray(state[f"{prefix}.{marian}.weight"], np.float32)  # [h*d, m]
        out[tx_name] = weight.T[inverse].reshape(m, h, d).copy()
        out[f"{tx_name}_bias"] = np.asarray(state[f"{prefix}.{marian}.bias"], np.float32).reshape(
            h, d
        )
    weight = np.asarray(state[f"{prefix}.out_proj.weight"], np.float32)  # [m, h*d]
    out["out"] = weight.T[:, inverse].reshape(h, d, m).copy()
    out["out_bias"] = np.asarray(state[f"{prefix}.out_proj.bias"], np.float32)[inverse]
    return out
