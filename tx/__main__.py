"""`python -m tx COMMAND ...` and the `tx COMMAND ...` script (pyproject.toml's
[project.scripts]), both through `entry`: starts itself again with glibc's malloc tuned for
the command, then runs the command line (tx.cli.main)."""

import os
import sys

from tx.cli import COMMANDS  # imports nothing: the restart below comes before JAX is imported

# glibc malloc tunables (glibc >= 2.35; older ones ignore them). XLA:CPU allocates a step's
# scratch buffers afresh every step: `hugetlb=1` backs them with huge pages, not a page fault
# per 4 KiB; training adds `arena_max=1`, one arena whose freed memory the next step reuses.
# The other commands compile more than they run, and XLA's compiler threads are slower on one
# arena. Figures: docs/training.md#on-a-cpu-huge-pages-and-to-train-one-malloc-arena
HUGE_PAGES = "glibc.malloc.hugetlb=1"
TRAINING = HUGE_PAGES + ":glibc.malloc.arena_max=1"


def with_malloc_tunables(command: str) -> None:
    """Starts this same command line again with the tunables for `command` (TRAINING for
    "train", else HUGE_PAGES) in the environment, once: glibc reads its tunables only at
    start-up. Any GLIBC_TUNABLES of your own (an empty one too) is kept, and nothing happens
    off Linux or below glibc 2.35."""
    if sys.platform != "linux" or "GLIBC_TUNABLES" in os.environ:
        return
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        if name != "glibc" or tuple(map(int, version.split(".")[:2])) < (2, 35):
            return
    except (ValueError, OSError, AttributeError):  # musl and other C libraries: not glibc
        return
    os.environ["GLIBC_TUNABLES"] = TRAINING if command == "train" else HUGE_PAGES
    sys.stdout.flush()
    os.execv(sys.executable, sys.orig_argv)  # the interpreter's options too (-X, -W, -u)


def command_in(argv: list[str]) -> str:
    """The command an argument list names: the first argument that is one (--workdir and
    --config may come before it); "" when none is."""
    return next((a for a in argv if a in COMMANDS), "")


def main(argv: list[str] | None = None) -> int:
    """The command line in this process, as it is (no restart): for train.py and tests."""
    from tx.cli.main import main as cli_main

    return cli_main(argv)


def entry() -> int:
    """`python -m tx` and the `tx` script: the malloc restart, then the command line."""
    with_malloc_tunables(command_in(sys.argv[1:]))
    return main()


if __name__ == "__main__":
    sys.exit(entry())
