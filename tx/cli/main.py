"""The command line: `python -m tx COMMAND ...` or `tx COMMAND ...` (tx/__main__.py).

Each command is a module of this package (tx.cli.MODULE_NAMES): its options (`add_options`),
how it finds its config (CONFIG), and `run(args, cfg)`, which turns the options into keyword
arguments of library functions. This module holds what they share: the parser (tx.cli.options:
hyphenated options with underscore aliases, defaults in --help, one-line usage errors), the
config (--config and --config.KEY=VALUE stand anywhere on the line; a name finds one of tx's
own configs, `find_config`; the commands that read a run reuse its config.json), --workdir and
the multi-process options also before the command, multi-process start-up, and errors a user
can fix as one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow is imported anywhere
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from tx import storage, workdir
from tx.cli import COMMANDS, MODULE_NAMES, compile_cache, options
from tx.cli.options import UsageError
from tx.config import ConfigError, configs_dir, load_config, split_config_args
from tx.train.distributed import LaunchError, ProcessLost, exit_now, initialize, process_lost

# name -> its module (tx.cli.COMMANDS names them). The modules import what they need when they
# run: `info` and `--help` need not pay seconds for TensorFlow and Orbax.
MODULES = {n: importlib.import_module(f"tx.cli.{MODULE_NAMES.get(n, n)}") for n in COMMANDS}
GLOBAL = "global_"  # the dest prefix of options given before the command
PROCESS_OPTIONS = ("coordinator_address", "num_processes", "process_id")

# What `python -m tx --help` says before and after the list of commands.
ABOUT = "Train, translate with, evaluate and serve Transformer translation models."
USAGE_NOTES = """\
Every command takes --config FILE[:ARG], a config file or the name of one of tx's own (base,
big, demo, small, tiny, table3.py:B1, ...; `--config base` is configs/base.py), and any number
of --config.SECTION.KEY=VALUE overrides, anywhere on the line. A command that reads a run
(--workdir W) uses the config the run was trained with. `python -m tx COMMAND --help` lists a
command's options; `tx COMMAND` is the same as `python -m tx COMMAND`."""


def parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser (the options that may come before the command) and each
    command's own."""
    p = options.Parser(prog="python -m tx", description=_description())
    p.add_argument(
        "--workdir",
        dest=GLOBAL + "workdir",
        nargs="+",
        action="extend",
        metavar="W",
        help="the run directory (or gs://bucket/prefix, s3://bucket/prefix), for a command "
        "that takes one (also after the command)",
    )
    options.distributed(p, dest_prefix=GLOBAL)
    commands = p.add_subparsers(
        dest="command",
        metavar="COMMAND",
        required=True,
        help="one of the commands above; python -m tx COMMAND --help lists its options",
    )
    subparsers = {}
    for name, module in MODULES.items():
        subparsers[name] = commands.add_parser(name, description=module.__doc__)
        module.add_options(subparsers[name])
    return p, subparsers


def _description() -> str:
    """ABOUT, the commands (tx.cli.COMMANDS), then USAGE_NOTES."""
    rows = [
        textwrap.fill(text, 100, initial_indent=f"  {name:<10} ", subsequent_indent=" " * 13)
        for name, text in COMMANDS.items()
    ]
    return "\n".join([ABOUT, "", "Commands:", *rows, "", USAGE_NOTES])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _quiet_libraries()
    rest, config_path, overrides = split_config_args(argv)
    top, subparsers = parsers()
    try:
        args, unknown = top.parse_known_args(rest)
        if unknown:  # said with the command's name, not the top level's
            subparsers[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    except UsageError as e:
        print(f"error: {e} (--help lists the options)", file=sys.stderr)
        return 2
    args.overrides = overrides  # reproduce and road apply them to every run's config
    command = MODULES[args.command]
    try:
        _merge_global_options(args)
        cfg = _config(command, args, config_path, overrides)
        # After the config (it sets the heartbeat timeout), before anything touches a device.
        initialize(
            args.coordinator_address,
            args.num_processes,
            args.process_id,
            cfg.mesh.heartbeat_timeout_secs if cfg is not None else None,
        )
        compile_cache.enable()  # before anything compiles (tx.cli.compile_cache)
    except (ConfigError, workdir.NotARun, UsageError, LaunchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return _run(command, args, cfg)
    except _user_errors() as e:  # bad input: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        if isinstance(e, ProcessLost):
            exit_now(2)
        return 2


def _merge_global_options(args: argparse.Namespace) -> None:
    """Options given before the command join the command's own; a command refuses those it
    does not take. Sets `workdir` (the first of `workdirs` where a command takes several)."""
    given = getattr(args, GLOBAL + "workdir") or []
    if hasattr(args, "workdirs"):
        args.workdirs = given + (args.workdirs or [])
        args.workdir = args.workdirs[0] if args.workdirs else None
    elif hasattr(args, "workdir"):
        both = given + ([args.workdir] if args.workdir else [])
        if len(both) > 1:
            raise UsageError(f"{args.command} takes one --workdir")
        args.workdir = both[0] if both else None
    elif given:
        raise UsageError(f"{args.command} takes no --workdir")
    else:
        args.workdir = None
    for name in PROCESS_OPTIONS:
        before, after = getattr(args, GLOBAL + name), getattr(args, name, None)
        option = "--" + name.replace("_", "-")
        if before is not None and not hasattr(args, name):
            raise UsageError(f"{args.command} takes no {option}")
        if before is not None and after is not None:
            raise UsageError(f"{option} given twice")
        setattr(args, name, after if after is not None else before)


def _config(command, args: argparse.Namespace, path: str | None, overrides: list[str]):
    """The command's config (its module's CONFIG says how it finds one): "run" commands read
    what `train` wrote in --workdir, so they reuse its config.json (or the one a CTranslate2
    export carries, --model DIR) unless --config is given; "new run" (train) needs --config and
    --workdir; "file" needs --config or the module's DEFAULT_CONFIG; None needs none. A
    command's `needs_run(args)`, where it has one, says whether these options read a run."""
    if command.CONFIG is None:
        return None
    path = find_config(path) if path else None
    if not getattr(command, "needs_run", lambda args: True)(args):
        return load_config(path or find_config(DEFAULT_CONFIG), overrides)
    model = getattr(args, "model", None)  # the commands with an --engine
    if command.CONFIG in ("run", "new run") and not args.workdir and not model:
        raise UsageError(f"{args.command} needs --workdir DIR")
    if command.CONFIG == "run" and args.workdir:
        # Every run given (even with --config: a run is needed); the first one's config.
        runs = [workdir.require_run(w) for w in getattr(args, "workdirs", None) or [args.workdir]]
        path = path or runs[0]
    elif model:
        path = path or _export_config(model)
    elif (
        command.CONFIG == "new run"
        and not path
        and storage.exists(workdir.config_file(args.workdir))
    ):
        path = workdir.config_file(args.workdir)  # resume a run with its own config
    default = getattr(command, "DEFAULT_CONFIG", None)
    path = path or (find_config(default) if default else None)
    if path is None:
        raise UsageError("--config FILE is required")
    return load_config(path, overrides)


DEFAULT_CONFIG = "base"  # a command's config where it reads no run and none is given


def find_config(spec: str) -> str:
    """--config's value as a file, with its `:ARG`: a path that exists (or a bucket's), else
    one of tx's own configs by name: `base`, `base.py`, `table3.py:B1`, or `configs/base.py`
    run outside the repository."""
    path, sep, arg = spec.partition(":") if not storage.is_remote(spec) else (spec, "", "")
    if storage.is_remote(spec) or os.path.exists(path):
        return spec
    name = path.removeprefix("configs/")
    if "/" in name or os.sep in name:  # a path: read_config says it is not found
        return spec
    own = os.path.join(configs_dir(), name if name.endswith(".py") else f"{name}.py")
    if not os.path.isfile(own):
        names = sorted(f[:-3] for f in os.listdir(configs_dir()) if f.endswith(".py"))
        raise ConfigError(f"config file not found: {path} (tx's own configs: {', '.join(names)})")
    return own + sep + arg


def _export_config(model_dir: str) -> str:
    """The run's config an export carries (an export's directory may be a bucket's prefix)."""
    from tx.infer.export import CONFIG_FILE

    path = storage.join(model_dir, CONFIG_FILE)
    if not storage.isfile(path):
        raise ConfigError(f"--model {model_dir} is not a tx export (no {CONFIG_FILE})")
    return path


def _run(command, args: argparse.Namespace, cfg) -> int:
    """Runs the command; a collective that failed because another process died becomes
    ProcessLost (see tx.train.distributed)."""
    try:
        return command.run(args, cfg)
    except Exception as e:
        lost = process_lost(e)
        if lost is None:
            raise
        raise lost from e


def _user_errors() -> tuple:
    from tx.data.sources import DataError
    from tx.data.tokenizer import VocabularyError
    from tx.infer.ct2 import EngineError
    from tx.infer.export import ExportError
    from tx.infer.translate import StaleAverage
    from tx.paper.end_to_end import Stopped
    from tx.train.checkpoint import UnreadableCheckpoint
    from tx.train.monitor import Diverged
    from tx.train.runlock import WorkdirBusy
    from tx.train.sharding import MeshError
    from tx.viz.pictures import PictureError

    return (
        ConfigError,
        DataError,
        VocabularyError,
        MeshError,
        Diverged,
        StaleAverage,
        Stopped,
        PictureError,
        UnreadableCheckpoint,
        storage.WriteFailed,
        ProcessLost,
        ExportError,
        EngineError,
        FileNotFoundError,
        WorkdirBusy,
    )


def _quiet_libraries() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for noisy in ("absl", "jax._src", "orbax", "tensorflow"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
        logging.getLogger(noisy).addFilter(_without_traceback)
    # tx runs no event loop of its own: asyncio's reports come from Orbax's tasks, whose
    # failures Orbax has raised already (dozens of "never retrieved" lines after a full disk).
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    sys.unraisablehook = _unraisable


def _without_traceback(record: logging.LogRecord) -> bool:
    """Libraries' errors keep their message, not their traceback: Orbax logs a failed
    background save with one per thread, and the command's own one-line error says what
    failed and what is intact."""
    record.exc_info, record.exc_text = None, None
    return True


def _unraisable(unraisable) -> None:
    """Drops one harmless report: after a failed save, TensorStore's callbacks still arrive for
    Orbax's event loop, which is closed by then. Anything else is reported as usual."""
    error = unraisable.exc_value
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
        return
    sys.__unraisablehook__(unraisable)
