"""Parameter counts and analytic training FLOPs, without allocating parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from tx.model import ModelConfig, Transformer


def abstract_params(config: ModelConfig):
    """The parameter tree as ShapeDtypeStructs (boxed with logical names), via jax.eval_shape."""
    model = Transformer(config)
    tokens = jnp.zeros((1, 8), jnp.int32)
    variables = jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), tokens, tokens, deterministic=True)
    )
    return variables["params"]


def param_counts(config: ModelConfig) -> dict[str, int]:
    """Counts of the actual parameter tree: total, encoder, decoder, embeddings."""
    params = nn.meta.unbox(abstract_params(config))
    counts = {"params": 0, "encoder": 0, "decoder": 0, "embeddings": 0}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        n = int(np.prod(leaf.shape))
        top = path[0].key
        group = top if top in ("encoder", "decoder") else "embeddings"
        counts[group] += n
        counts["params"] += n
    return counts


def analytic_param_count(c: ModelConfig) -> dict[str, int]:
    """The paper's architecture counted from its equations (bias-free attention projections,
    feed-forward with biases, two LayerNorms per encoder layer and three per decoder layer)."""
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


def train_flops_per_step(
    c: ModelConfig, src_tokens: float, tgt_tokens: float, src_len: float, tgt_len: float
) -> float:
    """Model FLOPs of one training step (forward + backward = 3 x forward, 2 per MAC).

    6 x (encoder weights x source tokens + (decoder weights + softmax) x target tokens), plus
    attention scores: 6 x 2 x (h * d_k + h * d_v)/2-style terms over the attended lengths.
    """
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
