"""tx.infer.huggingface against transformers' own MarianMTModel (torch, CPU): a tx Transformer
exported computes the same logits in MarianMTModel, a MarianMTModel imported computes the same
logits in tx, and an imported model exported back has the same weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tx.infer import huggingface as hf
from tx.model.transformer import Transformer
from tx.model.transformer_config import ModelConfig
from tx.tokens import BOS_ID, PAD_ID

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Both sides compute in float32 with the same operations in another order (torch's matmuls
# against XLA's einsums); a logit of these small models is a sum of a few hundred products of
# size < 1, each rounded at 2^-24: <= 1e-4 leaves two orders of magnitude. Observed <= 2.0e-6
# (seeds 0-4, 1 and 2 threads).
LOGITS_ATOL = 1e-4


def _marian(config: dict):
    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    return transformers.MarianMTModel(transformers.MarianConfig(**fields)).eval()


def _tx_model(seed: int, **fields):
    mc = ModelConfig(
        vocab_size=60,
        vocab_multiple=16,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_layers=2,
        **{"layer_norm_epsilon": 1e-5, **fields},  # Marian's LayerNorm: torch's default
    )
    model = Transformer(mc)
    # _batch's shapes: init's eager forward pass compiles the ops the tests then run (the
    # parameters do not depend on them); XLA's bit generator (rbg): eager threefry compiles a
    # large program for every parameter shape
    src, tgt = jnp.ones((2, 6), jnp.int32), jnp.ones((2, 5), jnp.int32)
    params = nn.meta.unbox(model.init(jax.random.key(seed, impl="rbg"), src, tgt)["params"])
    return mc, model, jax.tree_util.tree_map(np.asarray, params)


def _batch(vocab: int, seed: int):
    """Source and target ids [2, 6] / [2, 5], tx's ids, the second row padded."""
    rng = np.random.default_rng(seed)
    src = rng.integers(4, vocab, (2, 6))
    tgt = rng.integers(4, vocab, (2, 5))
    src[:, -1], tgt[:, -1] = 1, 1
    src[1, 3:], tgt[1, 2:] = [1, 0, 0], [1, 0, 0]
    return src, tgt


@pytest.mark.parametrize("start", ["token", "zero"])
@pytest.mark.parametrize("seed", [0, 1])
def test_an_exported_model_computes_tx_logits_in_marian(start, seed):
    mc, model, params = _tx_model(seed, decoder_start=start, activation="relu")
    src, tgt = _batch(mc.vocab_size, seed)
    want = np.asarray(model.apply({"params": params}, src, tgt))
    marian = _marian(hf.marian_config(mc, 64))
    state = {k: torch.tensor(v) for k, v in hf.to_marian(mc, params, max_positions=64).items()}
    missing, unexpected = marian.load_state_dict(state, strict=False)
    assert not unexpected and all(
        k.endswith(("embed_tokens.weight", "lm_head.weight")) for k in missing
    )
    start_ids = torch.full((2, 1), PAD_ID)  # Marian starts from <pad>'s zero row
    decoder_inputs = torch.cat([start_ids, torch.tensor(tgt[:, :-1])], 1)
    with torch.no_grad():
        got = marian(
            input_ids=torch.tensor(src),
            attention_mask=torch.tensor(src != PAD_ID).long(),
            decoder_input_ids=decoder_inputs,
        ).logits.numpy()
    real = tgt != PAD_ID
    emitted = [i for i in range(mc.vocab_size) if i not in (PAD_ID, BOS_ID)]  # the rest: -1e4
    np.testing.assert_allclose(got[real][:, emitted], want[real][:, emitted], atol=LOGITS_ATOL)
    assert np.all(got[real][:, [PAD_ID, BOS_ID]] < -9e3)


def _opus_like(seed: int, vocab: int = 40):
    """A random MarianMTModel laid out as OPUS-MT's: </s> 0, <unk> 1, <pad> last (a zero row,
    the decoder's start), swish, biases everywhere, a non-zero final_logits_bias."""
    torch.manual_seed(seed)
    config = dict(
        vocab_size=vocab,
        decoder_vocab_size=vocab,
        d_model=16,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=vocab - 1,
        eos_token_id=0,
        decoder_start_token_id=vocab - 1,
        forced_eos_token_id=0,
        max_position_embeddings=64,
    )
    marian = _marian(config)
    with torch.no_grad():
        marian.final_logits_bias.copy_(torch.randn(1, vocab))
        marian.model.shared.weight[vocab - 1] = 0.0
        for name, p in marian.named_parameters():
            if name.endswith(".bias") and "layer_norm" not in name:
                p.copy_(0.1 * torch.randn_like(p))
    vocab_json = {"</s>": 0, "<unk>": 1, **{f"p{i}": i for i in range(2, vocab - 1)}}
    return marian, config, {**vocab_json, "<pad>": vocab - 1}


@pytest.mark.parametrize("seed", [0, 1])
def test_an_imported_marian_model_computes_its_logits_in_tx(seed):
    marian, config, vocab = _opus_like(seed)
    order = hf.import_order(vocab, config)
    state = {k: v.numpy() for k, v in marian.state_dict().items()}
    mc = ModelConfig(**hf.model_section(config, state, order))
    params = hf.from_marian(mc, state, order)
    to_tx = {int(m): t for t, m in enumerate(order) if m >= 0}
    src, tgt = _batch(config["vocab_size"] - 1, seed)  # Marian's ids below <pad>
    src[src == 1], tgt[tgt == 1] = 0, 0  # </s> is 0 in Marian
    pad = config["pad_token_id"]
    src[1, 4:], tgt[1, 3:] = pad, pad
    got = np.asarray(
        Transformer(mc).apply({"params": params}, *(np.vectorize(to_tx.get)(x) for x in (src, tgt)))
    )
    decoder_inputs = np.concatenate([np.full((2, 1), pad), tgt[:, :-1]], 1)
    with torch.no_grad():
        want = marian(
            input_ids=torch.tensor(src),
            attention_mask=torch.tensor(src != pad).long(),
            decoder_input_ids=torch.tensor(decoder_inputs),
        ).logits.numpy()
    real = tgt != pad
    known = order >= 0  # tx's <s> row is its own
    np.testing.assert_allclose(got[real][:, known], want[real][:, order[known]], atol=LOGITS_ATOL)


def test_an_imported_model_exported_back_has_the_same_weights():
    """Hugging Face -> tx -> Hugging Face: every tensor and the config as they were, the
    position tables those transformers computes (it saves none): tx keeps them as fixed
    tables, bit for bit."""
    marian, config, vocab = _opus_like(2)
    order = hf.import_order(vocab, config)
    state = {k: v.numpy() for k, v in marian.state_dict().items()}
    mc = ModelConfig(**hf.model_section(config, state, order))
    assert (mc.positional, mc.max_len, mc.decoder_start) == ("fixed", 64, "zero")
    back = hf.to_marian(mc, hf.from_marian(mc, state, order), order, max_positions=mc.max_len)
    assert set(back) <= set(state)
    for key in back:
        np.testing.assert_array_equal(back[key], state[key], err_msg=key)
    exported = hf.marian_config(mc, mc.max_len, order)
    for key in ("vocab_size", "pad_token_id", "eos_token_id", "decoder_start_token_id"):
        assert exported[key] == config[key], key
    assert exported["max_position_embeddings"] == config["max_position_embeddings"]


def test_marian_position_table_is_transformers_own():
    """The table an import assumes where a file has none is, bit for bit, the one transformers
    computes; tx's float32 sinusoids differ from it in the last bits (hence learned tables)."""
    for d_model, rows in ((16, 64), (32, 512)):
        theirs = transformers.models.marian.modeling_marian.MarianSinusoidalPositionalEmbedding(
            rows, d_model
        )
        want = theirs.create_weight().numpy()
        np.testing.assert_array_equal(hf.marian_position_table(d_model, rows), want)
        assert not np.array_equal(hf.position_table(d_model, rows), want)


def _tx_vocab(vocab_size: int) -> dict[str, int]:
    """vocab.json of a tx run's export: tx's pieces (made up here) at Marian's ids."""
    order = hf.export_order(vocab_size)
    names = {PAD_ID: "<pad>", 1: "</s>", 2: "<unk>", BOS_ID: "<s>"}
    return {names.get(t, f"p{t}"): int(order[t]) for t in range(vocab_size)}


def _round_trip(mc, params):
    """tx -> Marian (marian_config, to_marian at a tx run's export ids) -> tx (import_order,
    model_section, from_marian)."""
    order = hf.export_order(mc.vocab_size)
    positions = mc.max_len if mc.position_table else 64
    config = hf.marian_config(mc, positions, order)
    state = hf.to_marian(mc, params, order, positions)
    back_order = hf.import_order(_tx_vocab(mc.vocab_size), config)
    np.testing.assert_array_equal(back_order, order)  # every id back where it was
    tx_config = {"model": {"layer_norm_epsilon": mc.layer_norm_epsilon}}  # tx_config.json's
    tx_config["model"]["positional"] = mc.positional
    back = ModelConfig(**hf.model_section(config, state, back_order, tx_config))
    return back, hf.from_marian(back, state, back_order)


# tx -> Hugging Face -> tx: the paper's model (start token, no biases), with biases, with zeros
# for a start, with learned positions (Table 3's row E). Every weight comes back bit for bit,
# the start token's fold too (sinusoid + <s>'s row, the same float32 sum both ways); tx then
# adds the start and the position in one sum where the export made one: the logits may differ
# by float32 rounding alone (a few 2^-24 of |logit| < 10). Observed: 0 (seeds 0-2, every case).
ROUND_TRIP_ATOL = 1e-5


@pytest.mark.parametrize(
    "fields, back_fields",
    [
        ({}, {"positional": "sinusoidal", "decoder_start": "token"}),
        (
            {"attention_bias": True, "logits_bias": True},
            {"positional": "sinusoidal", "decoder_start": "token"},
        ),
        ({"decoder_start": "zero"}, {"positional": "sinusoidal", "decoder_start": "zero"}),
        (  # Marian-shaped: OPUS-MT's options
            {"attention_bias": True, "logits_bias": True, "activation": "swish"}
            | {"decoder_start": "zero"},
            {"positional": "sinusoidal", "decoder_start": "zero", "activation": "swish"},
        ),
        ({"positional": "learned", "max_len": 32}, {"positional": "learned", "max_len": 32}),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_a_tx_model_sent_to_marian_and_back_computes_the_same_logits(fields, back_fields, seed):
    mc, model, params = _tx_model(seed, layer_norm_epsilon=1e-6, **fields)
    if mc.attention_bias or mc.logits_bias:  # biases that are not zero
        rng = np.random.default_rng(seed)
        params = jax.tree_util.tree_map_with_path(
            lambda path, x: (
                x + 0.1 * rng.standard_normal(x.shape).astype(x.dtype)
                if "bias" in jax.tree_util.keystr(path) and "norm" not in jax.tree_util.keystr(path)
                else x
            ),
            params,
        )
    back, back_params = _round_trip(mc, params)
    for key, value in back_fields.items():
        assert getattr(back, key) == value, key
    assert back.vocab_size == mc.vocab_size
    src, tgt = _batch(mc.vocab_size, seed)
    want = np.asarray(model.apply({"params": params}, src, tgt))
    got = np.asarray(Transformer(back).apply({"params": back_params}, src, tgt))
    real = tgt != PAD_ID
    if mc.logits_bias:  # its own bias on every id; <pad>'s row (read by nothing) is zeroed
        np.testing.assert_allclose(got[real][:, 1:], want[real][:, 1:], atol=ROUND_TRIP_ATOL)
        return
    emitted = [i for i in range(mc.vocab_size) if i not in (PAD_ID, BOS_ID)]
    np.testing.assert_allclose(got[real][:, emitted], want[real][:, emitted], atol=ROUND_TRIP_ATOL)
    assert np.all(got[real][:, [PAD_ID, BOS_ID]] < -9e3)  # the export's: never emitted


def test_a_start_row_that_is_not_zero_comes_in_and_goes_back():
    """A Marian model whose <pad> row (its decoder's start) is not zero: tx's <s> row holds
    it (decoder_start "token"), the logits are transformers', and the export puts it back."""
    marian, config, vocab = _opus_like(3)
    with torch.no_grad():
        marian.model.shared.weight[config["pad_token_id"]] = 0.5 * torch.randn(16)
    order = hf.import_order(vocab, config)
    state = {k: v.numpy() for k, v in marian.state_dict().items()}
    mc = ModelConfig(**hf.model_section(config, state, order))
    assert mc.decoder_start == "token"
    params = hf.from_marian(mc, state, order)
    to_tx = {int(m): t for t, m in enumerate(order) if m >= 0}
    src, tgt = _batch(config["vocab_size"] - 1, 3)
    src[src == 1], tgt[tgt == 1] = 0, 0
    pad = config["pad_token_id"]
    src[1, 4:], tgt[1, 3:] = pad, pad
    got = np.asarray(
        Transformer(mc).apply({"params": params}, *(np.vectorize(to_tx.get)(x) for x in (src, tgt)))
    )
    decoder_inputs = np.concatenate([np.full((2, 1), pad), tgt[:, :-1]], 1)
    with torch.no_grad():
        want = marian(
            input_ids=torch.tensor(src),
            attention_mask=torch.tensor(src != pad).long(),
            decoder_input_ids=torch.tensor(decoder_inputs),
        ).logits.numpy()
    real, known = tgt != pad, order >= 0
    np.testing.assert_allclose(got[real][:, known], want[real][:, order[known]], atol=LOGITS_ATOL)
    back = hf.to_marian(mc, params, order, max_positions=mc.max_len)
    for key in back:
        np.testing.assert_array_equal(back[key], state[key], err_msg=key)


def test_a_fixed_table_never_trains():
    """model.positional "fixed" (an import's own sinusoids): the table's gradient is zero,
    a learned one's is not."""
    for kind, trains in (("fixed", False), ("learned", True)):
        mc, model, params = _tx_model(0, positional=kind, max_len=16)
        src, _ = _batch(mc.vocab_size, 0)

        def loss(p, model=model, src=src):  # the encoder's table reaches the logits through it
            return jnp.sum(model.apply({"params": p}, src, method=Transformer.encode) ** 2)

        grads = jax.grad(loss)(params)
        norm = float(jnp.abs(grads["encoder"]["position"]["pos_embedding"]).max())
        assert (norm > 0) == trains, kind


def test_a_decoder_start_tx_cannot_express_is_refused_by_name():
    """A vocabulary with its own <s> whose decoder starts from a <pad> row that is not zero:
    tx starts from one row."""
    mc, _, params = _tx_model(0)
    order = hf.export_order(mc.vocab_size)
    config = hf.marian_config(mc, 64, order)
    state = hf.to_marian(mc, params, order, 64)
    state["model.shared.weight"] = state["model.shared.weight"].copy()
    state["model.shared.weight"][config["pad_token_id"]] = 1.0
    with pytest.raises(hf.HuggingFaceError, match="<pad>, whose embedding is not zero"):
        hf.model_section(config, state, hf.import_order(_tx_vocab(mc.vocab_size), config))


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"pre_ln": True}, "post-LN only"),
        ({"share_embeddings": False}, "three matrices"),
    ],
)
def test_what_marian_cannot_express_is_refused_naming_ctranslate2(fields, says):
    mc = ModelConfig(vocab_size=60, d_model=16, num_heads=2, d_ff=32, num_layers=1, **fields)
    with pytest.raises(hf.HuggingFaceError, match=says) as e:
        hf.check_exportable(mc)
    assert "--format ctranslate2" in str(e.value)
