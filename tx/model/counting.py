"""Parameter counts and analytic training FLOPs, without allocating parameters.

Every function takes a frozen architecture of any family (tx.model.families): the Transformer's
ModelConfig or the recurrent RNNConfig, each counted from its own equations.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from tx.model.families import build_model
from tx.model.rnn import RNNConfig
from tx.model.transformer import ModelConfig


def abstract_params(config: ModelConfig | RNNConfig):
    """The parameter tree as ShapeDtypeStructs (boxed with logical names), via jax.eval_shape."""
    model = build_model(config)
    tokens = jnp.zeros((1, 8), jnp.int32)
    variables = jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), tokens, tokens, deterministic=True)
    )
    return variables["params"]


def param_counts(config: ModelConfig | RNNConfig) -> dict[str, int]:
    """Counts of the actual parameter tree: total, encoder, decoder, embeddings."""
    params = nn.meta.unbox(abstract_params(config))
    counts = {"params": 0, "encoder": 0, "decoder": 0, "embeddings": 0}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        n = int(np.prod(leaf.shape))
        if path[-1].key == "embedding":  # the rows padding the vocabulary are not parameters
            n = config.vocab_size * leaf.shape[1]
        top = path[0].key
        group = top if top in ("encoder", "decoder") else "embeddings"
        counts[group] += n
        counts["params"] += n
    return counts


def analytic_param_count(c: ModelConfig | RNNConfig) -> dict[str, int]:
    """The paper's architecture counted from its equations (bias-free attention projections,
    feed-forward with biases, two LayerNorms per encoder layer and three per decoder layer);
    a recurrent model from its own (`rnn_param_count`)."""
    if isinstance(c, RNNConfig):
        return rnn_param_count(c)
    m, h = c.d_model, c.num_heads
    attention = m * h * c.d_k * 2 + m * h * c.d_v + h * c.d_v * m
    ffn = 2 * m * c.d_ff + c.d_ff + m
    norm = 2 * m
    final_norm = norm if c.pre_ln else 0
    positions = c.max_len * m if c.positional == "learned" else 0
    encoder = c.num_encoder_layers * (attention + ffn + 2 * norm) + final_norm + positions
    decoder = c.num_decoder_layers * (2 * attention + ffn + 3 * norm) + final_norm + positions
    embeddings = c.vocab_size * m * (1 if c.share_embeddings else 3)
    return {
        "params": encoder + decoder + embeddings,
        "encoder": encoder,
        "decoder": decoder,
        "embeddings": embeddings,
    }


def rnn_param_count(c: RNNConfig) -> dict[str, int]:
    """A recurrent encoder-decoder counted from its equations (tx.model.rnn).

    A cell with g gates on input width i and n units: W [i, g, n], U [n, g, n], b [g, n]
    (GRU: a second bias b_h, which the reset gate multiplies). Every layer's input is d_model
    wide. With attention: the first decoder layer's context kernel [m, g, n], the score
    (additive: W, U [m, m], v [m]; general: W_a [m, m]; dot: none) and the output
    tanh(W_s s + W_c c + b): 2 m^2 + m.
    """
    m, g, layers = c.d_model, c.gates, c.num_layers
    cell = g * m * (m + m + (2 if c.cell == "gru" else 1))
    score = {"none": 0, "dot": 0, "general": m * m, "additive": 2 * m * m + m}[c.attention]
    attention = 0 if c.attention == "none" else g * m * m + score + 2 * m * m + m
    encoder, decoder = layers * cell, layers * cell + attention
    embeddings = c.vocab_size * m * (1 if c.share_embeddings else 3)
    return {
        "params": encoder + decoder + embeddings,
        "encoder": encoder,
        "decoder": decoder,
        "embeddings": embeddings,
    }


def train_flops_per_step(
    c: ModelConfig | RNNConfig,
    src_tokens: float,
    tgt_tokens: float,
    src_len: float,
    tgt_len: float,
) -> float:
    """Model FLOPs of one training step (forward + backward = 3 x forward, 2 per MAC).

    6 x (encoder weights x source tokens + (decoder weights + softmax) x target tokens), plus
    attention scores: 6 x 2 x (h * d_k + h * d_v)/2-style terms over the attended lengths.
    """
    if isinstance(c, RNNConfig):
        return _rnn_train_flops(c, src_tokens, tgt_tokens, src_len)
    counts = analytic_param_count(c)
    softmax = c.vocab_size * c.d_model
    dense = 6 * (counts["encoder"] * src_tokens + (counts["decoder"] + softmax) * tgt_tokens)
    hd = c.num_heads * (c.d_k + c.d_v)
    attn = (
        6
        * hd
        * (
            c.num_encoder_layers * src_tokens * src_len
            + c.num_decoder_layers * tgt_tokens * (tgt_len / 2 + src_len)
        )
    )
    return float(dense + attn)


def _rnn_train_flops(c: RNNConfig, src_tokens: float, tgt_tokens: float, src_len: float):
    """6 x weights x the tokens they multiply (the score's key kernel multiplies source
    tokens, the rest of the decoder and the softmax target tokens), plus, with attention,
    6 x 2m per (target token, source position) pair: the score (m MACs: v . tanh(.) or s . k)
    and the context (m MACs)."""
    counts = rnn_param_count(c)
    m = c.d_model
    keys = {"additive": m * m, "general": m * m}.get(c.attention, 0)
    softmax = c.vocab_size * m
    dense = 6 * (
        (counts["encoder"] + keys) * src_tokens + (counts["decoder"] - keys + softmax) * tgt_tokens
    )
    pairs = 0.0 if c.attention == "none" else 6 * 2 * m * tgt_tokens * src_len
    return float(dense + pairs)
