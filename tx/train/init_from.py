"""Starting a run from another run's parameters (`train.init_from`): fine-tuning.

    source = start(cfg, workdir)                  what the run starts from (None: random
                                                  weights, or resuming), checked before any data
    vocabulary_source(cfg, workdir, source)       whose vocabulary tx.data.vocabulary copies in
    state = initial_state(trainer, source, seed)  its parameters; Adam, step, schedule fresh

The source is a run's workdir (its newest average, else its latest checkpoint), one of its
checkpoints (W/checkpoints/STEP) or averages (W/averaged/STEP) (tx.workdir.Selection), or a
model `python -m tx import` wrote (a run whose parameters are its average); local or in a
bucket. An export, or a Hugging Face directory not imported, is no source. The new run
- takes the source's vocabulary: its files (tx.workdir.VOCABULARY_FILES) are copied in before
  the data is prepared (tx.data.vocabulary), so none is trained; a data.vocab_size other than
  the source's, or a data.vocab_path that is not the source's file, is refused;
- starts from the source's parameters, which every process reads itself into the run's sharding,
  with a fresh optimizer (Adam's moments zero), step 0, its own schedule and data order;
- has the source's model: a model config that differs in a key other than FREE_KEYS is refused
  naming the keys, and parameters whose shapes differ are named one by one, unless
  `train.init_from_new_params` lets the parameters the source lacks start from their
  initialisation (the shared ones must still fit);
- once it has checkpoints of its own, resumes from them and never reads the source again;
  `train.init_from` is fixed with the run (tx.workdir.FIXED_KEYS).
"""

from __future__ import annotations

import dataclasses

import ml_collections
import orbax.checkpoint as ocp
from flax import linen as nn
from flax import traverse_util

from tx import storage
from tx import workdir as wd
from tx.config import ConfigError, model_config, read_config
from tx.data import vocabulary
from tx.model import families
from tx.model.counting import abstract_params
from tx.train import trainer as trainer_lib
from tx.train.averaging import averaged_meta, averaged_path, averaged_steps
from tx.train.checkpoint import manager_options, restore_part

# Model keys that may differ from the source's: they leave the parameters' names, shapes and
# meaning as they are (regularisation, how it is computed, an initial value). max_len sizes
# only learned positions, whose table the shape check names if it changes.
FREE_KEYS = (
    "dropout_rate",
    "attention_dropout_rate",
    "relu_dropout_rate",
    "dtype",
    "attention_impl",
    "max_len",
    "forget_bias",
)


@dataclasses.dataclass(frozen=True)
class Source:
    """The parameters a run starts from: `kind` ("checkpoint" or "average") `step` of `run`."""

    given: str  # train.init_from as written
    run: str  # the source run's workdir
    kind: str
    step: int
    config: ml_collections.ConfigDict = dataclasses.field(repr=False)  # its config.json
    new_params: tuple[str, ...] = ()  # this run's parameters the source lacks ("a/b/c")
    differs: tuple[str, ...] = ()  # model keys that differ, allowed by init_from_new_params

    def steps(self) -> list[int]:
        """The training steps behind the parameters: the checkpoint's, or those averaged."""
        if self.kind == "checkpoint":
            return [self.step]
        return list(averaged_meta(self.run, self.step).get("averaged_steps", [self.step]))

    def describe(self) -> str:
        return f"{self.run} ({self.kind} of step {self.step})"


def checkpoint_steps(run: str) -> list[int]:
    """The complete training checkpoints of `run`, read without writing anything there."""
    directory = wd.checkpoints_dir(run)
    if not storage.isdir(directory):
        return []
    options = manager_options(directory, create=False)
    manager = ocp.CheckpointManager(
        storage.absolute(directory), options=options, item_names=("state", "data")
    )
    try:
        return sorted(manager.all_steps())
    finally:
        manager.close()


def find(path: str) -> Source:
    """The source `path` (train.init_from) names (tx.workdir.Selection): a run (its newest
    average, else its latest checkpoint), RUN/checkpoints/STEP or RUN/averaged/STEP. An export
    is none, nor is a Hugging Face directory (`python -m tx import` makes it a run);
    ConfigError saying what `path` is not."""
    try:
        selection = wd.Selection.parse(path)
        chosen = selection.resolve(
            lambda: averaged_steps(selection.run), lambda: checkpoint_steps(selection.run)
        )
    except wd.NotARun as e:
        raise ConfigError(f"train.init_from={e}") from None
    except wd.CheckpointNotFound as e:
        raise ConfigError(f"train.init_from={path}: {e}") from None
    config = read_config(wd.config_file(chosen.run))
    return Source(path, chosen.run, chosen.kind, chosen.step, config)


def start(cfg: ml_collections.ConfigDict, workdir: str) -> Source | None:
    """What `workdir` starts from: None without train.init_from, and once the run has
    checkpoints of its own (they win: a resume never reads the source). Else the source,
    checked against this run before any data is prepared: its vocabulary
    (tx.data.vocabulary.taken) and its model (`check_model`)."""
    if not cfg.train.init_from or checkpoint_steps(workdir):
        return None
    source = find(cfg.train.init_from)
    vocabulary.taken(cfg.data, source)
    return check_model(cfg, source)


def vocabulary_source(
    cfg: ml_collections.ConfigDict, workdir: str, source: Source | None = None
) -> Source | None:
    """The run whose vocabulary `workdir` takes (tx.data.vocabulary.obtain copies its files in):
    `source`, or the one train.init_from names, until the run has recorded its own
    vocabulary (then the source is never read again); None without train.init_from."""
    if not cfg.train.init_from or vocabulary.recorded(workdir):
        return None
    return source or find(cfg.train.init_from)


def _leaves(config) -> dict:
    """{"encoder/layer_0/ffn/wi": ShapeDtypeStruct} of a model config's parameters."""
    return traverse_util.flatten_dict(nn.meta.unbox(abstract_params(config)), sep="/")


def _fields(config) -> dict:
    return {"family": config.family, **dataclasses.asdict(config)}


def check_model(cfg: ml_collections.ConfigDict, source: Source) -> Source:
    """`source` with the parameters this run has and it lacks (`new_params`), once its model
    fits: the same config but for FREE_KEYS (or train.init_from_new_params), the same shape
    for every parameter both have, none of its parameters left out. Else one ConfigError
    naming every differing key and parameter."""
    mine, theirs = model_config(cfg), families.model_config(source.config.model.to_dict())
    new_params = cfg.train.init_from_new_params
    a, b = _fields(theirs), _fields(mine)
    differs = [k for k in {**a, **b} if k not in FREE_KEYS and a.get(k) != b.get(k)]
    here, there = _leaves(mine), _leaves(theirs)
    problems = []
    if differs and not new_params:
        keys = "; ".join(f"model.{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in differs)
        problems.append(
            f"this run's model differs from the source's ({keys}); only model."
            f"{', model.'.join(FREE_KEYS)} may (train.init_from_new_params=True lets the "
            "parameters the source lacks start from their initialisation)"
        )
    shapes = [
        f"{k}: source {list(there[k].shape)}, this run {list(here[k].shape)}"
        for k in sorted(here.keys() & there.keys())
        if here[k].shape != there[k].shape
    ]
    if shapes:
        problems.append("parameters whose shapes differ: " + "; ".join(shapes))
    if lacking := sorted(there.keys() - here.keys()):
        problems.append("parameters of the source this run has no place for: " + ", ".join(lacking))
    new = sorted(here.keys() - there.keys())
    if new and not new_params and not differs:
        problems.append("parameters the source lacks: " + ", ".join(new))
    if problems:
        raise ConfigError(f"train.init_from={source.given}: " + "; ".join(problems))
    return dataclasses.replace(source, new_params=tuple(new), differs=tuple(differs))


def initial_state(trainer: trainer_lib.Trainer, source: Source, seed: int):
    """A new train state (step 0, Adam's moments zero, the rng of `seed`) whose parameters are
    the source's, read into this run's sharding (every process reads its own shards); those
    in `source.new_params` keep their initialisation."""
    state = trainer_lib.create_train_state(trainer, seed)
    want = traverse_util.flatten_dict(trainer.abstract_state.params, sep="/")
    tree = traverse_util.unflatten_dict(
        {k: v for k, v in want.items() if k not in source.new_params}, sep="/"
    )
    if source.kind == "checkpoint":
        path = storage.join(wd.checkpoints_dir(source.run), str(source.step))
        loaded = restore_part(path, "state", {"params": tree})["params"]
    else:
        loaded = restore_part(averaged_path(source.run, source.step), "params", tree)
    params = traverse_util.flatten_dict(state.params, sep="/")
    params |= traverse_util.flatten_dict(loaded, sep="/")
    return state.replace(params=traverse_util.unflatten_dict(params, sep="/"))


def record(source: Source, workdir: str, tokenizer) -> dict:
    """The run card's `init_from`: where the parameters came from, and the vocabulary taken."""
    return {
        "path": source.given,
        "run": source.run,
        "parameters": source.kind,
        "step": source.step,
        "steps": source.steps(),
        **vocabulary.described(workdir, tokenizer),
        **({"new_params": list(source.new_params)} if source.new_params else {}),
        **({"model_differs": list(source.differs)} if source.differs else {}),
    }
