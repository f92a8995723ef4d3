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
# size < 1, each rounded at 2^-24: <= 1e-4 leaves two orders of magnitude. Observed <= 1.2e-6
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
        layer_norm_epsilon=1e-5,  # Marian's LayerNorm: torch's default epsilon
        **fields,
    )
    model = Transformer(mc)
    src, tgt = jnp.ones((1, 4), jnp.int32), jnp.ones((1, 3), jnp.int32)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(seed), src, tgt)["params"])
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
    mc = ModelConfig(**hf.model_section(config))
    order = hf.import_order(vocab, config)
    state = {k: v.numpy() for k, v in marian.state_dict().items()}
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
    marian, config, vocab = _opus_like(2)
    mc = ModelConfig(**hf.model_section(config))
    order = hf.import_order(vocab, config)
    state = {k: v.numpy() for k, v in marian.state_dict().items()}
    back = hf.to_marian(mc, hf.from_marian(mc, state, order), order)
    compared = [k for k in back if "embed_positions" not in k]
    assert set(compared) <= set(state)
    for key in compared:
        np.testing.assert_array_equal(back[key], state[key], err_msg=key)
    exported = hf.marian_config(mc, 64, order)
    for key in ("vocab_size", "pad_token_id", "eos_token_id", "decoder_start_token_id"):
        assert exported[key] == config[key], key


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"pre_ln": True}, "post-LN only"),
        ({"share_embeddings": False}, "three matrices"),
        ({"positional": "learned"}, "Marian's are sinusoids"),
    ],
)
def test_what_marian_cannot_express_is_refused_naming_ctranslate2(fields, says):
    mc = ModelConfig(vocab_size=60, d_model=16, num_heads=2, d_ff=32, num_layers=1, **fields)
    with pytest.raises(hf.HuggingFaceError, match=says) as e:
        hf.check_exportable(mc)
    assert "--format ctranslate2" in str(e.value)
