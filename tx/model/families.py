"""Which model a config names: `model.family` -> its frozen config, its module, its decoder,
its counts.

    mc = model_config(cfg.model)   # ModelConfig ("transformer", the default) or RNNConfig ("rnn")
    model = build_model(mc)  # Transformer or RNNSeq2Seq: the same teacher-forced __call__
    family(mc).incremental_decoder  # what tx.infer.decoders turns into a search Decoder
    family(mc).train_flops  # what tx.model.counting reads (and param_count)

Every place that needs a model (trainer, checkpoints, translate, evaluate, counting) builds it
here, so data, training, checkpoints, search and scoring are shared by all families. A config
without `model.family` is a Transformer: the configs and runs written before families existed
keep their meaning (and a resumed workdir its saved `model` section).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from flax import linen as nn

from tx.model import rnn, rnn_config, transformer, transformer_config, transformer_decoding


@dataclasses.dataclass(frozen=True, kw_only=True)
class Family:
    config: type  # frozen dataclass with from_dict(section)
    module: type  # flax module taking that config
    # (model, params, inputs, width, max_len) -> (tokens_to_logits, cache, reorder_cache)
    incremental_decoder: Callable
    # Decoder.rows_independent: the RNN's step closes over its encoder memory repeated per row
    rows_independent: bool
    # Decoder.resize_cache: a cache with a position axis can be grown window by window
    resize_cache: Callable | None
    # config -> {"params", "encoder", "decoder", "embeddings"}: counted from the equations
    param_count: Callable
    # (config, src_tokens, tgt_tokens, src_len, tgt_len) -> model FLOPs of one training step
    train_flops: Callable


FAMILIES = {
    "transformer": Family(
        config=transformer_config.ModelConfig,
        module=transformer.Transformer,
        incremental_decoder=transformer_decoding.incremental_decoder,
        rows_independent=True,
        resize_cache=transformer_decoding.resize_cache,
        param_count=transformer_config.param_count,
        train_flops=transformer_config.train_flops,
    ),
    "rnn": Family(
        config=rnn_config.RNNConfig,
        module=rnn.RNNSeq2Seq,
        incremental_decoder=rnn.incremental_decoder,
        rows_independent=False,
        resize_cache=None,
        param_count=rnn_config.param_count,
        train_flops=rnn_config.train_flops,
    ),
}
DEFAULT = "transformer"


def model_config(section: Mapping[str, Any]):
    """The frozen architecture of a `model` config section (a dict); errors name the key."""
    section = dict(section)
    name = section.pop("family", DEFAULT)
    if name not in FAMILIES:
        raise ValueError(f"model.family must be one of {sorted(FAMILIES)}, got {name!r}")
    return FAMILIES[name].config.from_dict(section)


def family(config) -> Family:
    return FAMILIES[config.family]


def build_model(config) -> nn.Module:
    """The flax module of a frozen architecture from `model_config`."""
    return family(config).module(config)
