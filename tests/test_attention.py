"""Attention weights collected from the real model: rows sum to 1, they are the weights
incremental decoding used, padding does not change them, and collecting changes nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.infer.attention_maps import attention_weights, sentence_maps
from tx.infer.translate import translate_pairs
from tx.model.transformer import Transformer
from tx.model.transformer_decoding import init_cache
from tx.tokens import BOS_ID, EOS_ID


@pytest.fixture(scope="module")
def run(trained_model):
    return trained_model


@pytest.fixture(scope="module")
def maps(run):
    cfg, loaded = run
    [(src, out)] = translate_pairs(loaded, ["We count three small birds."], cfg)
    return sentence_maps(loaded, [*src, EOS_ID], [*out, EOS_ID])


def test_every_row_sums_to_one(run, maps):
    c = run[1].model.config
    s, t = len(maps.source), len(maps.target)
    assert maps.encoder.shape == (c.num_encoder_layers, c.num_heads, s, s)
    assert maps.decoder.shape == (c.num_decoder_layers, c.num_heads, t, t)
    assert maps.cross.shape == (c.num_decoder_layers, c.num_heads, t, s)
    for m in (maps.encoder, maps.decoder, maps.cross):
        assert (m >= 0).all()
        # float32 softmax: a sum of at most 48 terms in [0, 1] rounds by < 48 u = 3e-6.
        np.testing.assert_allclose(m.sum(-1), 1.0, atol=1e-5)


def test_labels_are_the_pieces_and_the_decoder_is_causal(maps):
    assert maps.source[-1] == maps.target[-1] == "</s>"
    assert maps.decoder_inputs == ["<s>", *maps.target[:-1]]
    future = np.triu(np.ones(maps.decoder.shape[-2:], bool), k=1)
    assert (maps.decoder[..., future] == 0).all()


def test_teacher_forced_weights_are_the_ones_incremental_decoding_used(run):
    """Row t of the teacher-forced pass = the weights of search step t (same prefix)."""
    _, loaded = run
    model, params = loaded.model, loaded.params
    inputs = jnp.asarray([loaded.tokenizer.encode("The dog sees a cat.")], jnp.int32)
    targets = jnp.asarray([loaded.tokenizer.encode("Der Hund sieht eine Katze.")], jnp.int32)
    _, forced_decoder, forced_cross = attention_weights(model, params, inputs, targets)
    encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
    cache = init_cache(model, params, encoded, inputs, targets.shape[1])
    previous = jnp.concatenate([jnp.array([[BOS_ID]]), targets[:, :-1]], axis=1)
    for step in range(targets.shape[1]):
        _, state = model.apply(
            {"params": params, "cache": cache},
            encoded,
            inputs,
            previous[:, step : step + 1],
            method=Transformer.step,
            mutable=["cache", "intermediates"],
        )
        cache, sown = state["cache"], state["intermediates"]["decoder"]
        for i in range(model.config.num_decoder_layers):
            layer = sown[f"layer_{i}"]
            cross = np.asarray(layer["cross_attention"]["attention_weights"][0])  # [1, h, 1, s]
            own = np.asarray(layer["self_attention"]["attention_weights"][0])  # [1, h, 1, L]
            # Same products in another order (one row vs all rows): float32 rounding only.
            np.testing.assert_allclose(cross[0, :, 0], forced_cross[0, i, :, step], atol=1e-5)
            np.testing.assert_allclose(
                own[0, :, 0, : step + 1], forced_decoder[0, i, :, step, : step + 1], atol=1e-5
            )


def test_padding_changes_no_weight_of_a_real_position(run):
    _, loaded = run
    src = loaded.tokenizer.encode("We count three small birds.")
    tgt = loaded.tokenizer.encode("Wir zählen drei kleine Vögel.")
    exact = attention_weights(loaded.model, loaded.params, np.array([src]), np.array([tgt]))
    inputs = np.zeros((2, len(src) + 5), np.int32)
    targets = np.zeros((2, len(tgt) + 3), np.int32)
    inputs[1, : len(src)], targets[1, : len(tgt)] = src, tgt
    padded = attention_weights(loaded.model, loaded.params, inputs, targets)
    s, t = len(src), len(tgt)
    for e, p, (q, k) in zip(exact, padded, ((s, s), (t, t), (t, s)), strict=True):
        np.testing.assert_allclose(p[1, ..., :q, :k], e[0], atol=1e-6)
        assert (p[1, ..., :q, k:] == 0).all()  # padding keys get exactly nothing


def test_collecting_changes_no_logit(run):
    _, loaded = run
    inputs = jnp.asarray([loaded.tokenizer.encode("The dog sees a cat.")], jnp.int32)
    targets = jnp.asarray([loaded.tokenizer.encode("Der Hund sieht eine Katze.")], jnp.int32)
    plain = loaded.model.apply({"params": loaded.params}, inputs, targets)
    collected, state = loaded.model.apply(
        {"params": loaded.params}, inputs, targets, mutable=["intermediates"]
    )
    # Keeping the weights takes another attention path (the weights as an array of their
    # own), so the two are float32 evaluations of one function in another order: equal on jax
    # 0.10.2, 9.5e-7 apart on jax 0.12.1. Bound: test_model.py's first-order rounding bound
    # (<= 1.8e-3 on logits for a model half this width) grows with the reduction widths, which
    # are twice as wide here: <= 4e-3. A real change of the function (a mask, a lost scale)
    # moves logits by >= 0.84 (test_model.py).
    np.testing.assert_allclose(np.asarray(plain), np.asarray(collected), rtol=0, atol=4e-3)
    assert jax.tree_util.tree_leaves(state)  # and there was something to collect
