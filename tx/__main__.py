"""`python -m tx COMMAND ...`: the command line lives in tx.cli."""

import os
import sys

from tx.cli import main

# glibc backs large allocations with transparent huge pages when this tunable is set (glibc >=
# 2.35; older ones ignore it). XLA:CPU allocates a step's scratch buffers afresh every step,
# and touching them one 4 KiB page at a time cost configs/small.py's step on 2 EPYC cores a
# quarter of its time (1.4 s against 1.06 s) and the base step 0.4 s of 5 s (docs/training.md).
HUGE_PAGES = "glibc.malloc.hugetlb=1"


def with_huge_pages() -> None:
    """Starts this same command line again with HUGE_PAGES in the environment, once: glibc reads
    its tunables only at start-up. Any GLIBC_TUNABLES of your own (an empty one too) is kept,
    and nothing happens off Linux or below glibc 2.35."""
    if sys.platform != "linux" or "GLIBC_TUNABLES" in os.environ:
        return
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        if name != "glibc" or tuple(map(int, version.split(".")[:2])) < (2, 35):
            return
    except (ValueError, OSError, AttributeError):  # musl and other C libraries: not glibc
        return
    os.environ["GLIBC_TUNABLES"] = HUGE_PAGES
    sys.stdout.flush()
    os.execv(sys.executable, sys.orig_argv)  # the interpreter's options too (-X, -W, -u)


if __name__ == "__main__":
    with_huge_pages()
    sys.exit(main())
