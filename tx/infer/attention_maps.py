"""The attention weights of a trained model for one sentence pair, as the model computed them.

One teacher-forced pass of the real model in deterministic mode (no dropout) over the source
and a target (the model's own translation, or a given one) collects the softmax weights that
every MultiHeadAttention sows into the "intermediates" collection (tx.model.attention). Because the
decoder is causal, the weights of position t are those it had when it produced target token t
during search: the pass reads what decoding did, without touching the search code.

Shape letters: L layers, h heads, s source length, t target length (both with their EOS).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np

from tx.model.transformer import Transformer
from tx.tokens import BOS_ID, EOS_ID


@dataclasses.dataclass
class AttentionMaps:
    """Weights of one sentence pair; every row of every map sums to 1.

    encoder: [L, h, s, s] encoder self-attention (query: source token, key: source token).
    decoder: [L, h, t, t] decoder self-attention (query: the position producing target token
      i; key: the decoder input at position j, which is target token j - 1, BOS at j = 0).
    cross: [L, h, t, s] encoder-decoder attention (query: the position producing target token
      i; key: source token j).
    source / target: the sub-word pieces of the source and target (EOS included), and
    decoder_inputs: the pieces the decoder read (BOS, then the target without its EOS).
    """

    encoder: np.ndarray
    decoder: np.ndarray
    cross: np.ndarray
    source: list[str]
    target: list[str]
    decoder_inputs: list[str]


@functools.partial(jax.jit, static_argnames=("model",))
def _collect(model: Transformer, params, inputs, targets):
    """inputs [b, s], targets [b, t] -> the "intermediates" collection of one forward pass."""
    _, state = model.apply(
        {"params": params}, inputs, targets, deterministic=True, mutable=["intermediates"]
    )
    return state["intermediates"]


def _stack(tree, stack: str, block: str, layers: int) -> np.ndarray:
    """[b, L, h, q, k]: the weights sown by `stack`/layer_i/`block` for every layer i."""
    sown = [tree[stack][f"layer_{i}"][block]["attention_weights"][0] for i in range(layers)]
    return np.stack([np.asarray(w) for w in sown], axis=1)


def attention_weights(model: Transformer, params, inputs: np.ndarray, targets: np.ndarray):
    """The weights of a teacher-forced pass over a batch of padded id arrays.

    Args:
      inputs: int [b, s] source ids (EOS included, 0-padded); targets: int [b, t] likewise.

    Returns:
      (encoder [b, L, h, s, s], decoder [b, L, h, t, t], cross [b, L, h, t, s]) float32.
    """
    c = model.config
    tree = _collect(model, params, inputs, targets)
    return (
        _stack(tree, "encoder", "self_attention", c.num_encoder_layers),
        _stack(tree, "decoder", "self_attention", c.num_decoder_layers),
        _stack(tree, "decoder", "cross_attention", c.num_decoder_layers),
    )


def sentence_maps(loaded, source_ids, target_ids) -> AttentionMaps:
    """The maps of one pair. source_ids / target_ids: int sequences, each ending in EOS."""
    inputs = np.asarray(source_ids, np.int32)[None]
    targets = np.asarray(target_ids, np.int32)[None]
    encoder, decoder, cross = attention_weights(loaded.model, loaded.params, inputs, targets)
    target = pieces(loaded.tokenizer, target_ids)
    return AttentionMaps(
        encoder[0],
        decoder[0],
        cross[0],
        pieces(loaded.tokenizer, source_ids, source=True),
        target,
        ["<s>", *target[:-1]],
    )


def pieces(tokenizer, ids, source: bool = False) -> list[str]:
    """Sub-word pieces of `ids` (the source's vocabulary's with `source`) as SentencePiece
    spells them ("▁" starts a word), EOS as </s>."""
    special = {EOS_ID: "</s>", BOS_ID: "<s>"}
    return [special.get(int(i)) or tokenizer.piece(int(i), source) for i in ids]
