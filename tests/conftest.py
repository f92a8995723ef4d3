"""Shared fixtures. Tests run on the CPU with a single device unless a test spawns its own
process with more (see tests/multidevice_worker.py)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib
import shutil
import tempfile

import pytest

# Many tests compile the same programs (the tiny config's train step, its search), in this
# process, in the other xdist worker and in the subprocesses tests start. JAX's persistent
# compilation cache (keyed on the program, the XLA flags and the devices) lets them compile
# once per run ([measured](docs/performance.md#the-test-suite)). A fresh directory per run,
# made by the xdist controller (or the lone process) before jax is imported, inherited by
# workers and subprocesses, and removed at the end; a reader that meets an entry another
# process is still writing gets a warning and compiles (jax._src.compiler._cache_read).
_OWN_CACHE = None
if "PYTEST_XDIST_WORKER" not in os.environ and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_CACHE = tempfile.mkdtemp(prefix="tx-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

# Commands keep their programs traced (tx.train.kept) where a compilation cache is on, as the
# suite's is: every training in one process would then compile the exported train step, and
# the tests that build a trainer themselves the jitted one, two programs where one serves.
# Off for the suite; tests/test_kept.py and tests/test_compile_cache.py turn it on and prove
# the kept programs give the jitted programs' results, bit for bit.
os.environ.setdefault("TX_KEPT_PROGRAMS", "off")

# Most of the suite's CPU goes to XLA compiling tiny programs that then run for milliseconds.
# LLVM's level 1 compiles them faster than XLA's default level 3 and runs them about as fast;
# level 0's code runs too slowly (figures: docs/development.md#how-long-the-suite-takes).
# Every test and the processes it starts compile the same way, so what a test compares stays
# comparable; an XLA_FLAGS that already names a level is left as it is.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=1"
    ).strip()

from tx.config import load_config  # noqa: E402 (after the cache directory is set)

ROOT = pathlib.Path(__file__).resolve().parents[1]


class Tiny:
    """configs/tiny.py: `tiny("train.num_steps=5", ...)` loads it with overrides; `tiny.path`
    is the file (for command lines)."""

    path = str(ROOT / "configs" / "tiny.py")

    def __call__(self, *overrides: str):
        return load_config(self.path, list(overrides))


@pytest.fixture(scope="session")
def root():
    return ROOT


@pytest.fixture(scope="session")
def tiny():
    return Tiny()


@pytest.fixture(scope="session")
def trained(tmp_path_factory, tiny):
    """A tiny workdir trained for 20 steps, a checkpoint every 5 (shared: tests that change
    it only add averaged checkpoints, hypotheses files or plots/)."""
    from tx.train.loop import train

    path = str(tmp_path_factory.mktemp("trained"))
    train(tiny("train.num_steps=20", "train.checkpoint_every_steps=5"), path)
    return path


@pytest.fixture(scope="module")
def trained_model(trained):
    """(config, LoadedModel) of the shared run's newest checkpoint (not an average)."""
    from tx import workdir as wd
    from tx.infer.translate import load_model

    cfg = load_config(wd.config_file(trained))
    return cfg, load_model(cfg, wd.Selection(trained, wd.CHECKPOINT))


@pytest.fixture(scope="session")
def vocab(tmp_path_factory, tiny):
    """The tiny config's vocabulary, trained once: runs given it (`data.vocab_path`) skip
    training one and are comparable bit for bit."""
    from tx.data import vocabulary

    workdir = str(tmp_path_factory.mktemp("vocab"))
    vocabulary.obtain(tiny().data, workdir)
    return os.path.join(workdir, "spm.model")


def multiprocess_env(env: dict) -> dict:
    """`env` for the processes of one jax.distributed job, without the suite's compilation
    cache on jax >= 0.11, where two CPU processes starting from a warm cache hang before their
    first step (docs/development.md#python-and-jax-releases); tx's own multi-process runs keep
    the cache off by default for the same reason (tx/cli/compile_cache.py)."""
    from importlib.metadata import version

    major, minor = (int(x) for x in version("jax").split(".")[:2])
    if (major, minor) < (0, 11):
        return env
    return {k: v for k, v in env.items() if k != "JAX_COMPILATION_CACHE_DIR"}


def pytest_unconfigure(config):
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def gcs_env():
    """A GCS server for the session (tests/object_store.py) and the variables naming it."""
    from object_store import gcs_server

    with gcs_server() as env:
        yield env


@pytest.fixture(scope="session")
def s3_env():
    """An S3 server (moto) for the session and the variables naming it."""
    from object_store import s3_server

    with s3_server() as env:
        yield env


@pytest.fixture(params=["gs", "s3"])
def bucket(request, monkeypatch):
    """A prefix of a bucket no other test uses (gs://... or s3://...), with this process's
    environment (and so its subprocesses') pointed at that scheme's server."""
    from object_store import point_at

    return point_at(request, monkeypatch, request.param)


def fail_orbax_writes(monkeypatch, fragment: str, code: int, message: str) -> None:
    """Orbax's file writes (JSON items, metadata; through etils.epath, so local files and
    gcsfs / s3fs objects alike) under any path containing `fragment` fail with OSError(code):
    a full disk, or a bucket refusing them. The array data is written before them."""
    from etils import epath

    real = epath.Path.write_text

    def write_text(self, *args, **kwargs):
        if fragment in str(self):
            raise OSError(code, message, str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(epath.Path, "write_text", write_text)
