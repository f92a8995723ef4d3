"""tx: the original Transformer for machine translation in JAX/Flax.

The package in layers, lowest first: five modules every wing shares, eight wings (packages)
and the Python API (tx.api; `tx.load` below). A module imports only from its own layer and
the layers before it in this list (tests/test_layout.py checks it, and that no module imports
in a circle):

    tx.compat    the one place tx reaches other libraries' private code (tests/test_compat.py)
    tx.tokens    the special token ids
    tx.storage   local paths and buckets (gs://, s3://): every read and write of a run's files
    tx.model     layers, the Transformer, the RNN family, the families registry, counting
    tx.config    loading, overriding and validating configs (the model section against tx.model)
    tx.workdir   every path of a run, the checks that keep it whole
    tx.data    sources, SentencePiece, the token cache, batches, the demo corpus, treebanks
    tx.train   sharding, the step, the loop, optimizer, losses, checkpoints, averaging, run cards
    tx.infer   search, a model's decoders and ensembles, translate, export, CTranslate2, serving
    tx.eval    BLEU and chrF, EVALB, evaluating a run
    tx.viz     learning curves, attention maps and other pictures
    tx.paper   whole runs: train -> average -> evaluate, the demo, the paper's tables, the road
    tx.api     tx from Python: `tx.load(run)`, then translate, score and align (see tx/api.py)
    tx.cli     the command line (`python -m tx`, `tx`): one module per command, no logic of its own

A config section belongs to the wing that reads it: tx/data/settings.py (`data`),
tx/train/settings.py (`optim`, `train`, `mesh`) and tx/infer/settings.py (`decode`) hold its
fields, defaults and checks, and the names the wing's code reads; `model` is tx.model's frozen
dataclasses. A settings module sits at tx.config's layer, not its wing's: tx.config composes
the sections (and hands their checks a checker), so a settings module imports nothing of tx
above tx.model, and no module outside the wing defines the section (tests/test_layout.py).
"""

import importlib

# The package's names, each imported from its module when first asked for (PEP 562): `import
# tx` stays light, so that `python -m tx` starts itself again (tx/__main__.py) before JAX and
# Flax are imported, not after (1.5 s a command).
_EXPORTS = {
    "load": "tx.api",
    "Model": "tx.api",
    "ConfigError": "tx.config",
    "load_config": "tx.config",
    "model_config": "tx.config",
    "build_model": "tx.model.families",
    "RNNSeq2Seq": "tx.model.rnn",
    "RNNConfig": "tx.model.rnn_config",
    "Transformer": "tx.model.transformer",
    "ModelConfig": "tx.model.transformer_config",
    "init_cache": "tx.model.transformer_decoding",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tx' has no attribute {name!r}")


def __dir__() -> list[str]:  # tab completion and help() see the lazy names too
    return sorted(set(globals()) | set(_EXPORTS))


# The layers above, in order, and the wings among them (tests/test_layout.py reads both).
LAYERS = [
    "tx.compat",
    "tx.tokens",
    "tx.storage",
    "tx.model",
    "tx.config",
    "tx.workdir",
    "tx.data",
    "tx.train",
    "tx.infer",
    "tx.eval",
    "tx.viz",
    "tx.paper",
    "tx.api",
    "tx.cli",
]
WINGS = ["model", "data", "train", "infer", "eval", "viz", "paper", "cli"]

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"
