"""Parameter counts and analytic training FLOPs, without allocating parameters.

Every function takes a frozen architecture of any family (tx.model.families): the actual
counts come from the family's module (`param_counts`), the analytic ones from the formulas the
family registers (`Family.param_count`, `Family.train_flops`: each counted from its own
equations, beside its config).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from tx.model.families import build_model, family
from tx.model.family_base import ConfigShell


def abstract_params(config: ConfigShell):
    """The parameter tree as ShapeDtypeStructs (boxed with logical names), via jax.eval_shape."""
    model = build_model(config)
    tokens = jnp.zeros((1, 8), jnp.int32)
    variables = jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), tokens, tokens, deterministic=True)
    )
    return variables["params"]


def param_counts(config: ConfigShell) -> dict[str, int]:
    """Counts of the actual parameter tree: total, encoder, decoder, embeddings."""
    params = nn.meta.unbox(abstract_params(config))
    counts = {"params": 0, "encoder": 0, "decoder": 0, "embeddings": 0}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        n = int(np.prod(leaf.shape))
        if path[-1].key == "embedding":  # the rows padding the vocabulary are not parameters
            source = path[0].key == "source_embedding" and getattr(config, "source_vocab_size", 0)
            n = (source or config.vocab_size) * leaf.shape[1]
        top = path[0].key
        group = top if top in ("encoder", "decoder") else "embeddings"
        counts[group] += n
        counts["params"] += n
    return counts


def analytic_param_count(c: ConfigShell) -> dict[str, int]:
    """The architecture counted from its family's equations (tx.model.transformer_config's for
    the paper's: bias-free attention projections, feed-forward with biases, two LayerNorms per
    encoder layer and three per decoder layer), in `param_counts`' groups."""
    return family(c).param_count(c)


def train_flops_per_step(
    c: ConfigShell,
    src_tokens: float,
    tgt_tokens: float,
    src_len: float,
    tgt_len: float,
) -> float:
    """Model FLOPs of one training step (forward + backward = 3 x forward, 2 per MAC), by the
    family's formula: `src_tokens` / `tgt_tokens` real tokens in the step, in sequences of
    `src_len` / `tgt_len` (the attended lengths)."""
    return family(c).train_flops(c, src_tokens, tgt_tokens, src_len, tgt_len)
