"""`python -m tx COMMAND ...`: the command line lives in tx.cli."""

import os
import sys

# The command names (tx.cli.COMMANDS' keys, which tests/test_cli.py checks against), known
# without importing tx.cli: that imports JAX, 1.5 s that the restart below would pay twice.
COMMAND_NAMES = (
    "info", "train", "translate", "average", "evaluate", "export", "serve",
    "attention", "plot", "demo", "compile", "reproduce", "road", "card",
)  # fmt: skip

# glibc malloc tunables (glibc >= 2.35; older ones ignore them). XLA:CPU allocates a step's
# scratch buffers afresh every step: `hugetlb=1` backs large allocations with transparent huge
# pages, so that touching them is not a page fault per 4 KiB. Training adds `arena_max=1`, one
# arena for all threads, whose freed memory is reused: with an arena per thread, XLA's worker
# threads handed theirs back to the kernel and faulted it in again at each step. On 2 EPYC
# cores configs/small.py's training step took 1.06 s with huge pages alone and 0.85-0.91 s with
# both (minor page faults 7.3M -> 0.9M in 100 steps, kernel time 49 -> 22-25 s). The other
# commands compile more than they run, and XLA's compiler threads contend for one arena:
# two translate and search tests took 87-101 s against 73-81 s (docs/training.md).
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
    return next((a for a in argv if a in COMMAND_NAMES), "")


def main(argv: list[str] | None = None) -> int:
    from tx.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    with_malloc_tunables(command_in(sys.argv[1:]))
    sys.exit(main())
