"""A run's directory: every path in it is named here, with the checks that keep it whole.

    W/config.json           the resolved config of the run (written by train)
    W/spm.model             the shared SentencePiece vocabulary (an imported Marian model:
                            source.spm, target.spm and vocab.json instead)
    W/vocab.sha256          its fingerprint when training began: the checkpoints' vocabulary
    W/data/<key>/           token-id caches, keyed by data and vocabulary (tx.data.token_cache)
    W/data/sources/         a bucket's source files' sha256 and lines, by object version
    W/checkpoints/<step>/   training checkpoints: state + data position (tx.train.checkpoint)
    W/averaged/<step>/      parameters averaged over the last N checkpoints
    W/tensorboard/          scalars (tx.train.monitor)
    W/<split>.hyp.<lang>    hypotheses written by evaluate
    W/run_card.json, .md    what the run was and scored (tx.train.runcard)
    W/plots/                pictures (tx.viz.plots): curves, attention maps, BLEU by length
    W/lock.json             the run that writes to W now (tx.train.runlock)

W is a local directory or a bucket's prefix (gs://, s3://): tx.storage reads and writes it.
Which of its parameters a reader takes (a checkpoint, the best, an average) is one value,
`Selection`, parsed here from a path or --checkpoint.
A workdir belongs to one model and one vocabulary: resuming it with another is refused.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable

import jax
import ml_collections

from tx import storage
from tx.config import ConfigError
from tx.model import families

# Keys that must not change when a workdir is resumed (they change the model or its data).
FIXED_KEYS = (
    "model",
    "data.source",
    "data.vocab_size",
    "data.tfds_name",
    "data.src_lang",
    "data.tgt_lang",
    "data.train_prefix",
    "data.train_weights",  # the epoch's plan: a resumed position means another batch otherwise
    "data.spm_model_type",
    "data.spm_normalization",
    "data.spm_split_digits",
    "train.init_from",  # the parameters and vocabulary a run starts from (tx.train.init_from)
)


def is_main() -> bool:
    """Whether this is the process that writes a run's shared files: process 0."""
    return jax.process_index() == 0


class NotARun(FileNotFoundError):
    """A path given as a run (--workdir, a Selection) that no training has written."""


def _in_run(name: str):
    """The path of `name` in a workdir, as a function of the workdir."""
    return lambda workdir: storage.join(workdir, name)


# A run's vocabulary: one SentencePiece model for source and target (spm.model, tx's own), or
# two mapped through one list of pieces, or through two (an imported Marian model's:
# tx.data.tokenizer).
VOCABULARY_FILES = ("spm.model", "source.spm", "target.spm", "vocab.json", "target_vocab.json")

config_file = _in_run("config.json")
vocab_file = _in_run("spm.model")
vocab_hash_file = _in_run("vocab.sha256")
data_dir = _in_run("data")
checkpoints_dir = _in_run("checkpoints")
averaged_dir = _in_run("averaged")
tensorboard_dir = _in_run("tensorboard")
run_card_file = _in_run("run_card.json")
run_card_markdown = _in_run("run_card.md")
plots_dir = _in_run("plots")
lock_file = _in_run("lock.json")


def hypotheses_file(workdir: str, split: str, lang: str) -> str:
    return storage.join(workdir, f"{split}.hyp.{lang}")


def require_run(workdir: str) -> str:
    """The run's config.json; NotARun (naming the directory) if training never wrote one."""
    path = config_file(workdir)
    if not storage.isdir(workdir):  # a bucket's prefix is one once something is under it
        raise NotARun(f"--workdir {workdir} does not exist")
    if not storage.exists(path):
        raise NotARun(
            f"{workdir} is not a tx run (it has no config.json): train into it with "
            "`python -m tx train --config FILE --workdir DIR`, or pass --config FILE"
        )
    return path


class CheckpointNotFound(FileNotFoundError):
    """A Selection of parameters its run does not have."""


CHECKPOINT, AVERAGE = "checkpoint", "average"  # the two kinds of a run's parameters
# What follows a run in a path (RUN/checkpoints/15), or given apart (tx.load's checkpoint=,
# --checkpoint): STEP.1 is the other name an average of STEP takes on a bucket
# (tx.train.averaging).
_IN_PATH = re.compile(r"(?P<run>.+)/(?P<which>checkpoints/\d+|averaged/\d+(?:\.1)?)")
_WHICH = re.compile(
    r"(?P<best>best)|(?:checkpoints/)?(?P<checkpoint>\d+)|averaged/(?P<average>\d+)(?:\.1)?"
)
# What is not a run though it may look like one, by a file of its own (tx_export.json:
# tx.infer.export; a Hugging Face directory's weights, which `import` reads).
_NOT_A_RUN = {
    "tx_export.json": "an export (`python -m tx export`), not a tx run: name the run it came from",
    **dict.fromkeys(
        ("model.safetensors", "pytorch_model.bin"),
        "a Hugging Face model, not a tx run: `python -m tx import --from-huggingface {} "
        "--workdir W` makes it one",
    ),
}


def which(value: int | str | None) -> tuple[str | None, int | str | None]:
    """(kind, step) of what follows a run: None (its default), STEP or checkpoints/STEP (a
    training checkpoint), "best" (the checkpoint with the best dev score) or averaged/STEP (an
    average; STEP.1 too). ConfigError naming any other value."""
    if value is None:
        return None, None
    found = _WHICH.fullmatch(str(value))
    if found is None:
        raise ConfigError(f"{value!r} is not a step number, 'best' or averaged/STEP")
    if found["average"]:
        return AVERAGE, int(found["average"])
    return CHECKPOINT, "best" if found["best"] else int(found["checkpoint"])


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which parameters of a run: the one value that tx.load, tx.infer.translate.load_model,
    train.init_from and the commands' --workdir RUN --checkpoint make (`parse`) and read.

        RUN                   the newest average, else the latest training checkpoint
        RUN/checkpoints/STEP  the training checkpoint of STEP (apart: STEP)
        RUN/averaged/STEP     the average written at STEP (STEP.1 too; apart: averaged/STEP)
        RUN with "best"       the training checkpoint with the best dev score (tx.train.best)

    RUN is a local directory or a bucket's prefix (gs://, s3://). An export (`python -m tx
    export`) or a Hugging Face directory is no run: `parse` says so by name.
    """

    run: str
    kind: str | None = None  # CHECKPOINT or AVERAGE; None: the newest average, else the latest
    step: int | str | None = None  # a step, or "best" (a checkpoint); None: the newest

    @classmethod
    def parse(cls, text: str, checkpoint: int | str | None = None) -> Selection:
        """What `text` (a run, or a path into one: above) and `checkpoint` (with a run only:
        `which`) name. NotARun or ConfigError in one line naming the text."""
        path = str(text).rstrip("/")
        names = storage.listdir(path)
        for name, what in _NOT_A_RUN.items():
            if name in names:
                raise NotARun(f"{text} is " + what.format(text))
        if "config.json" in names:
            return cls(path, *which(checkpoint))
        found = _IN_PATH.fullmatch(path)
        if found is None or not storage.exists(config_file(found["run"])):
            raise NotARun(
                f"{text} is neither a tx run (it has no config.json) nor one of a run's "
                "checkpoints (RUN/checkpoints/STEP) or averages (RUN/averaged/STEP)"
            )
        if checkpoint is not None:
            raise ConfigError(f"{text} is one checkpoint already: no checkpoint= to choose")
        return cls(found["run"], *which(found["which"]))

    def resolve(
        self, averages: Callable[[], list[int]], checkpoints: Callable[[], list[int]]
    ) -> Selection:
        """This selection with its kind and step, which the run has: `averages()` and
        `checkpoints()` list the run's complete ones (tx.train reads them; each called only if
        needed). "best" is the reader's to find first, from the scores. CheckpointNotFound
        names what the run has."""
        if self.kind is None:
            have = averages()
            kind, have = (AVERAGE, have) if have else (CHECKPOINT, checkpoints())
            if not have:
                raise CheckpointNotFound(f"{self.run} has no averages or checkpoints")
            return dataclasses.replace(self, kind=kind, step=have[-1])
        average = self.kind == AVERAGE
        have = averages() if average else checkpoints()
        step = have[-1] if self.step is None and have else self.step
        if step not in have:
            what = "averaged checkpoint" if average else "checkpoint"
            if step is not None:
                what += f" {step}" if average else f" at step {step}"
            where = averaged_dir(self.run) if average else checkpoints_dir(self.run)
            raise CheckpointNotFound(f"no {what} in {where} (available: {have})")
        return dataclasses.replace(self, step=step)


def check_config(cfg: ml_collections.ConfigDict, workdir: str) -> None:
    """Refuses a workdir whose saved config differs in a FIXED_KEYS entry; else saves cfg."""
    storage.makedirs(workdir)
    path = config_file(workdir)
    current = json.loads(cfg.to_json_best_effort())
    if storage.exists(path):
        saved = _read_saved(path)
        old, new = _fixed(saved), _fixed(current)
        # A key the saved config lacks came after that run started: nothing to compare.
        diffs = [k for k in old if old[k] is not _MISSING and old[k] != new[k]]
        if diffs:
            details = "; ".join(f"{k}: {old[k]!r} -> {new[k]!r}" for k in diffs)
            raise ConfigError(
                f"{workdir} was trained with another configuration ({details}); use a new --workdir"
            )
    if is_main():
        storage.write_text(path, json.dumps(current, indent=2, sort_keys=True))


def _read_saved(path: str) -> dict:
    try:
        saved = json.loads(storage.read_text(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(
            f"{path} is damaged ({e}); restore it, or move it away and pass --config FILE "
            "(the config the run started with) to write it again"
        ) from e
    if not isinstance(saved, dict):
        raise ConfigError(f"{path} holds a JSON {type(saved).__name__}, not a tx config object")
    return saved


_MISSING = object()


def _fixed(tree: dict) -> dict:
    """FIXED_KEYS' values in a config tree; the model section field by field, with its
    family's defaults for the fields a config written before them lacks (a model is the same
    model if only such a field was added since)."""
    values = {k: _lookup(tree, k) for k in FIXED_KEYS if k != "model"}
    section = tree.get("model")
    if isinstance(section, dict):
        try:
            fields = dataclasses.asdict(families.model_config(section))
        except (ValueError, TypeError):  # a config that does not build: compare it as written
            fields = section
        values |= {f"model.{k}": v for k, v in fields.items()}
    return values


def _lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree
