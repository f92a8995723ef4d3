"""What tx needs of other libraries and can reach only through their private code: each such
workaround lives here and nowhere else (tests/test_compat.py lists every use of another
library's private names in tx/ and finds none outside this module), and tests/test_compat.py
fails by the library's name when a release changes what one relies on.

    orbax_s3          orbax-checkpoint 0.12 writes arrays to gs:// and local paths only: s3://
                      through TensorStore's s3 kvstore
    epath_without_tf  etils reads EPATH_USE_TF once per process: the switch, whenever it is set
    commit_threads    the threads still writing a failed Orbax save
    DefaultsInHelp    argparse's help with an option's default only where it has one

Imports nothing of tx: the lowest layer.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterator


def orbax_s3(kvstore: Callable[[str], dict]) -> None:
    """Lets Orbax write s3:// arrays through TensorStore's s3 driver, `kvstore(path)` giving
    an s3:// path's kvstore spec.

    Orbax 0.12 builds a cloud kvstore for gs:// only and takes s3://b/x for a relative local
    path, with no option to name another kvstore (TensorStore's s3 one:
    https://google.github.io/tensorstore/kvstore/s3/index.html). Three of its private
    functions are replaced, once, and only when an s3:// checkpoint is used: `_normalize_path`
    keeps the s3:// scheme, `_use_gcs_driver` takes s3:// for a cloud path, and
    `gcs_utils.get_kvstore_for_gcs` gives an s3:// path `kvstore`'s spec. Raises ImportError
    or AttributeError naming what an Orbax without them lacks.
    """
    from orbax.checkpoint._src.path import gcs_utils
    from orbax.checkpoint._src.serialization import tensorstore_utils as tsu

    if getattr(tsu, "_tx_s3", False):
        return
    # All three looked up before any is replaced: an Orbax without one fails here, unchanged.
    normalize, gcs_kvstore, _ = (
        tsu._normalize_path,
        gcs_utils.get_kvstore_for_gcs,
        tsu._use_gcs_driver,
    )

    def is_s3(path) -> bool:
        return str(path).startswith("s3://")

    # pathlib collapses s3://b to s3:/b; written to be right applied twice, too
    tsu._normalize_path = lambda p: (
        re.sub("^s3:/+", "s3://", normalize(p)) if is_s3(p) else normalize(p)
    )
    tsu._use_gcs_driver = lambda d: str(d).startswith(("gs://", "s3://"))
    gcs_utils.get_kvstore_for_gcs = lambda p: kvstore(str(p)) if is_s3(p) else gcs_kvstore(p)
    tsu._tx_s3 = True


def epath_without_tf() -> None:
    """etils.epath reaches gs:// and s3:// through fsspec, not tf.io.gfile, from now on.

    EPATH_USE_TF=0 is etils' switch, but it is read once per process (gpath._is_tf_installed
    is cached) at the first path used, local ones included (Orbax's on a local checkpoint):
    that answer is forgotten, where this etils keeps one.
    """
    os.environ["EPATH_USE_TF"] = "0"
    with contextlib.suppress(ImportError, AttributeError):
        from etils.epath import gpath

        gpath._is_tf_installed.cache_clear()


def commit_threads() -> Iterator[threading.Thread]:
    """The threads in which Orbax is still committing saves (each one file of a checkpoint).

    Orbax reports a save's first failed write while the others go on, and no public call
    reaches them: wait_until_finished() and close() return at that first failure, and
    orbax.checkpoint.future exports neither CommitFuture nor the thread class it runs in.
    Telling them by name or start time would take in Orbax's long-lived event-loop threads.
    """
    from orbax.checkpoint._src.futures import future

    return (t for t in threading.enumerate() if isinstance(t, future._SignalingThread))


class DefaultsInHelp(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and "(default: X)" after each option that has a default (not
    None, not False) and whose help does not already speak of it. argparse's public
    ArgumentDefaultsHelpFormatter also shows None and False; its hook for that choice,
    `_get_help_string`, is the one this overrides."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            any(action.default is none for none in (None, False, argparse.SUPPRESS))  # not 0
            or not action.option_strings
            or "default" in text
        ):
            return text
        return f"{text} (default: %(default)s)"
