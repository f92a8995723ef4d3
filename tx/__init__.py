"""tx: the original Transformer for machine translation in JAX/Flax."""

from tx.config import ConfigError, load_config, model_config
from tx.model import ModelConfig, Transformer, init_cache

__all__ = ["ConfigError", "ModelConfig", "Transformer", "init_cache", "load_config", "model_config"]
__version__ = "0.1.0"
