"""Option groups that several commands share: the run directory, checkpoints, the config, the
inference engine, multi-process start-up. Each command adds the groups it takes."""

from __future__ import annotations

import argparse
import contextlib


def config(p: argparse.ArgumentParser, what: str = "model, data, training, search") -> None:
    """Shown in --help only: tx.cli.main takes --config and --config.KEY=VALUE out of the
    arguments before argparse sees them (they may stand anywhere on the line)."""
    g = p.add_argument_group("config")
    g.add_argument("--config", metavar="FILE[:ARG]", help=f"a config of configs/ ({what})")
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


def step_or_best(text: str) -> int | str:
    """A --checkpoint value: a step, or "best" (the best dev score: tx.train.best)."""
    if text == "best":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a step number or 'best', not {text!r}") from None


def checkpoint(p: argparse.ArgumentParser, many: bool = False) -> None:
    """`--checkpoint STEP` (dest `checkpoint`), or with `many` several (dest `checkpoints`);
    STEP may be `best`."""
    if many:
        p.add_argument(
            "--checkpoint",
            dest="checkpoints",
            type=step_or_best,
            nargs="+",
            action="extend",
            metavar="STEP",
            help="this training step's checkpoint, or 'best' by dev score (default: the "
            "averaged one, else the latest); several: an ensemble of them",
        )
    else:
        p.add_argument(
            "--checkpoint",
            type=step_or_best,
            metavar="STEP",
            help="this training step's checkpoint, or 'best' by dev score (default: the "
            "averaged one, else the latest)",
        )


def engine(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument(
        "--engine",
        default="jax",
        choices=("jax", "ctranslate2"),
        help="tx's own search, or a CTranslate2 export (--model)",
    )
    g.add_argument(
        "--model", metavar="DIR", help="--engine ctranslate2: the directory `export` wrote"
    )
    g.add_argument("--device", default="cpu", help="--engine ctranslate2: cpu, cuda or auto")
    g.add_argument(
        "--compute_type",
        default="default",
        help="--engine ctranslate2: default (as exported), int8, float32, ...",
    )
    g.add_argument("--threads", type=int, default=0, help="--engine ctranslate2: 0 = one per core")


@contextlib.contextmanager
def translating(p: argparse.ArgumentParser):
    """translate's and serve's options around the command's own, added in the body (usage and
    --help keep this order): config, runs and checkpoints before; engine, multi-process after."""
    config(p)
    workdir(p, "the run (several: an ensemble)", many=True)
    checkpoint(p, many=True)
    yield
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
    g = p.add_argument_group("multi-process")
    g.add_argument(
        "--coordinator_address",
        dest=f"{dest_prefix}coordinator_address",
        metavar="HOST:PORT",
        help="process 0's address",
    )
    g.add_argument(
        "--num_processes",
        dest=f"{dest_prefix}num_processes",
        type=int,
        metavar="N",
        help="number of processes",
    )
    g.add_argument(
        "--process_id",
        dest=f"{dest_prefix}process_id",
        type=int,
        metavar="I",
        help="this process's index",
    )
