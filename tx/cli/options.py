"""Option groups that several commands share: the run directory, checkpoints, the config, the
search settings, the inference engine, multi-process start-up. Each command adds the groups it
takes.

Options are spelled with hyphens (`--align-layer`); each also parses with underscores
(`--align_layer`, the spelling of tx before, and of JAX's own flags), not shown in --help
(`Parser.parse_known_args`). --help shows each option's default (tx.compat.DefaultsInHelp)."""

from __future__ import annotations

import argparse
import contextlib
import re
import sys

from tx.compat import DefaultsInHelp


class UsageError(ValueError):
    """Command-line options that do not make a command."""


class Parser(argparse.ArgumentParser):
    """argparse with tx's conventions: a usage error is one line (`UsageError`, which
    tx.cli.main prints as `error: ...` with exit code 2), and underscore spellings."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, formatter_class=DefaultsInHelp, **kwargs)

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}")

    def parse_known_args(self, args=None, namespace=None):
        """Reads `--a_b` as `--a-b` (an abbreviation too: `--num_p`), up to a bare `--`;
        what is left over is returned as it was written."""
        given = list(sys.argv[1:] if args is None else args)
        ends = given.index("--") if "--" in given else len(given)
        spelled = [_hyphens(a) for a in given[:ends]] + given[ends:]
        namespace, rest = super().parse_known_args(spelled, namespace)
        written = dict(zip(spelled, given, strict=True))
        return namespace, [written.get(a, a) for a in rest]


def _hyphens(arg: str) -> str:
    name, eq, value = arg.partition("=")
    return name.replace("_", "-") + eq + value if re.fullmatch(r"--\w+_\w+", name) else arg


def config(p: argparse.ArgumentParser, what: str = "model, data, training, search") -> None:
    """Shown in --help only: tx.cli.main takes --config and --config.KEY=VALUE out of the
    arguments before argparse sees them (they may stand anywhere on the line)."""
    g = p.add_argument_group("config")
    g.add_argument(
        "--config",
        metavar="FILE[:ARG]",
        help=f"a config file, or the name of one of tx's own: base, big, demo, ... ({what})",
    )
    overrides(g, "override one field, e.g. --config.decode.beam_size=8 (any number)")


def overrides(p, help: str) -> None:
    """`--config.SECTION.KEY=VALUE`, in --help only (see `config`)."""
    p.add_argument("--config.SECTION.KEY", metavar="VALUE", dest="config_override", help=help)


def workdir(p: argparse.ArgumentParser, help: str, many: bool = False) -> None:
    """`--workdir`: one run (dest `workdir`), or with `many` several (dest `workdirs`)."""
    if many:
        p.add_argument(
            "--workdir", dest="workdirs", nargs="+", action="extend", metavar="W", help=help
        )
    else:
        p.add_argument("--workdir", metavar="W", help=help)


def take_over_lock(p: argparse.ArgumentParser) -> None:
    """`--take-over-lock`: for the commands that write into a run (tx.train.runlock)."""
    p.add_argument(
        "--take-over-lock",
        action="store_true",
        help="take the workdir's lock from a run known to be gone (e.g. on a machine that "
        "died); a lock whose process is gone on this host is taken without it",
    )


def selector(text: str) -> str:
    """A --checkpoint value, checked here (tx.workdir.which) and read with its run
    (tx.workdir.Selection): a step, "best" (the best dev score: tx.train.best) or
    averaged/STEP."""
    from tx.workdir import which

    try:
        which(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def checkpoint(p: argparse.ArgumentParser, many: bool = False) -> None:
    """`--checkpoint WHICH` (dest `checkpoint`), or with `many` several (dest `checkpoints`):
    which of the run's parameters (`selector`)."""
    help = (
        "STEP (that training step's checkpoint), best (by dev score) or averaged/STEP "
        "(default: the newest average, else the latest checkpoint)"
    )
    if many:
        p.add_argument(
            "--checkpoint",
            dest="checkpoints",
            type=selector,
            nargs="+",
            action="extend",
            metavar="WHICH",
            help=help + "; several: an ensemble of them",
        )
    else:
        p.add_argument("--checkpoint", type=selector, metavar="WHICH", help=help)


def search(p: argparse.ArgumentParser) -> None:
    """The everyday search settings, over the config's decode section (`search_settings`)."""
    g = p.add_argument_group("search (default: the run's config, decode section)")
    g.add_argument(
        "--beam",
        type=positive_int,
        metavar="N",
        help="beam search with N hypotheses (decode.strategy=beam, decode.beam_size=N)",
    )
    g.add_argument(
        "--alpha",
        type=float,
        metavar="A",
        help="length penalty ((5 + length) / 6)^A of a beam search (decode.alpha; 0: none)",
    )
    g.add_argument(
        "--batch-tokens",
        "--max-tokens",
        dest="batch_tokens",
        type=positive_int,
        metavar="N",
        help="source tokens per decoding batch (decode.batch_tokens)",
    )


def search_settings(args: argparse.Namespace) -> dict:
    """tx.infer.engines.with_search's keyword arguments from `search`'s options."""
    return {"beam": args.beam, "alpha": args.alpha, "batch_tokens": args.batch_tokens}


# CTranslate2's compute types (ctranslate2.Translator's compute_type).
COMPUTE_TYPES = (
    *("default", "auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16"),
    *("float16", "bfloat16", "float32"),
)


def engine(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument(
        "--engine",
        default="jax",
        choices=("jax", "ctranslate2"),
        help="tx's own search over a run (--workdir), or a CTranslate2 export (--model)",
    )
    g.add_argument(
        "--model", metavar="DIR", help="--engine ctranslate2: the directory `export` wrote"
    )
    # Not defaults here: the JAX engine refuses them (tx.infer.engines.load_engine).
    g.add_argument(
        "--device",
        choices=("cpu", "cuda", "auto"),
        help="--engine ctranslate2: where it runs (default: cpu)",
    )
    g.add_argument(
        "--compute-type",
        choices=COMPUTE_TYPES,
        metavar="TYPE",
        help="--engine ctranslate2: default (as exported), auto, int8, float32, ... "
        f"(one of {', '.join(COMPUTE_TYPES)}; default: default)",
    )
    g.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="--engine ctranslate2: threads per translation (default: 0, one per core)",
    )


@contextlib.contextmanager
def translating(p: argparse.ArgumentParser):
    """translate's and serve's options around the command's own, added in the body (usage and
    --help keep this order): config, runs and checkpoints before; search settings, engine,
    multi-process after."""
    config(p)
    workdir(p, "the run (several: an ensemble)", many=True)
    checkpoint(p, many=True)
    yield
    search(p)
    engine(p)
    distributed(p)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """tx.infer.engines.load_engine's keyword arguments."""
    if hasattr(args, "workdirs"):  # a command that takes several (tx.cli.main merged them)
        workdirs = args.workdirs
    else:
        workdirs = [args.workdir] if args.workdir else []
    if hasattr(args, "checkpoints"):
        checkpoints = args.checkpoints or []
    else:
        checkpoints = [] if args.checkpoint is None else [args.checkpoint]
    return {
        "engine": args.engine,
        "workdirs": workdirs,
        "checkpoints": checkpoints,
        "model": args.model,
        "device": args.device,
        "compute_type": args.compute_type,
        "threads": args.threads,
    }


def distributed(p: argparse.ArgumentParser, dest_prefix: str = "") -> None:
    """Every process of a multi-process run gets these (a TPU pod or SLURM needs none)."""
    g = p.add_argument_group("multi-process (a TPU pod or SLURM needs none)")
    g.add_argument(
        "--coordinator-address",
        dest=f"{dest_prefix}coordinator_address",
        metavar="HOST:PORT",
        help="process 0's address",
    )
    g.add_argument(
        "--num-processes",
        dest=f"{dest_prefix}num_processes",
        type=int,
        metavar="N",
        help="number of processes",
    )
    g.add_argument(
        "--process-id",
        dest=f"{dest_prefix}process_id",
        type=int,
        metavar="I",
        help="this process's index",
    )
