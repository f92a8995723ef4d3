"""tx: the original Transformer for machine translation in JAX/Flax."""

from tx.config import ConfigError, load_config, model_config
from tx.families import build_model
from tx.model import ModelConfig, Transformer, init_cache
from tx.rnn import RNNConfig, RNNSeq2Seq

__all__ = [
    "ConfigError",
    "ModelConfig",
    "RNNConfig",
    "RNNSeq2Seq",
    "Transformer",
    "build_model",
    "init_cache",
    "load_config",
    "model_config",
]
__version__ = "0.1.0"
