"""Where a run's files live: a local directory, `gs://bucket/prefix` or `s3://bucket/prefix`.

Every read and write of a run's files, data and exports goes through this module; nothing else
calls `open`, `os.path` or `os.rename` on them. Local paths use the OS; buckets use fsspec
(gcsfs for GCS, s3fs for S3: the `cloud` extra), the library Orbax and TFDS reach them through
too (etils.epath). What a bucket lacks is done another way everywhere:

    no rename          a whole object is one request (readers see the old or the new one); a
                       directory is complete once a manifest or marker written last says so
    no O_EXCL          `create`: GCS ifGenerationMatch=0, S3 If-None-Match: *
    no flock           `replace_if`: GCS ifGenerationMatch=<generation>, S3 If-Match: <ETag>
    no mmap            `local_copy`: a file in the local cache, named by the object's version

Credentials are each library's own: GCS takes Application Default Credentials (`gcloud auth
application-default login`, or a VM's service account); S3 takes botocore's (AWS_ACCESS_KEY_ID
and AWS_SECRET_ACCESS_KEY, or a profile, with AWS_REGION). An emulator or another endpoint is
named by the standard variables only, STORAGE_EMULATOR_HOST for GCS and AWS_ENDPOINT_URL for S3;
`configure` derives what TensorStore (under Orbax) needs from them.

The local cache is $TX_CACHE_DIR, else $XDG_CACHE_HOME/tx, else ~/.cache/tx: copies of objects,
safe to delete at any time.

The module reads better whole: each operation's local, GCS and S3 forms stand side by side.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import glob as globbing
import hashlib
import io
import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterator

from tx import compat

SCHEMES = ("gs://", "s3://")


class WriteFailed(OSError):
    """A file, object or checkpoint that could not be written whole; the message names it."""


class AlreadyExists(FileExistsError):
    """`create` found the object there already."""


class Changed(RuntimeError):
    """`replace_if` found the object changed (or gone) since its version was read."""


def is_remote(path: str) -> bool:
    return str(path).startswith(SCHEMES)


def join(base: str, *parts: str) -> str:
    if is_remote(base):
        return posixpath.join(base.rstrip("/"), *parts)
    return os.path.join(base, *parts)


def dirname(path: str) -> str:
    return posixpath.dirname(path.rstrip("/")) if is_remote(path) else os.path.dirname(path)


def absolute(path: str) -> str:
    """A local path made absolute; a bucket's as it is."""
    return path if is_remote(path) else os.path.abspath(path)


# -------------------------------------------------------------------------------------------
# Configuration: every library that reaches a bucket, from the standard variables.

_configured = False


def configure() -> None:
    """Sets up fsspec, etils.epath and TensorStore for buckets, once, before the first use.

    etils.epath (Orbax's and TFDS's path layer) would use tf.io.gfile when TensorFlow is
    installed, whose GCS client cannot be pointed at an endpoint and which has no S3: it is
    told to use fsspec (tx.compat.epath_without_tf). Directory listings are not cached
    (another process's writes must be seen). With STORAGE_EMULATOR_HOST, TensorStore's gcs
    driver is pointed at the same server (it reads TENSORSTORE_GCS_HTTP_URL, not that
    variable) with a test token, and Google's libraries do not probe for a metadata server.
    Variables already set are kept.

    A bucket's transient refusals (429, 503 SlowDown) are retried with backoff by the
    library that meets them, with its defaults: gcsfs (6 tries) and s3fs (5, over botocore's
    own) for this module and Orbax's files, TensorStore (32) for the arrays
    (https://google.github.io/tensorstore/kvstore/s3/index.html); tests/test_buckets_flaky.py.
    """
    global _configured
    if _configured:
        return
    compat.epath_without_tf()
    # gcsfs picks its experimental file system at import unless told not to (and says so).
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import fsspec

    with contextlib.suppress(ImportError):  # the cloud extra
        import gcsfs.core

        # gcsfs's default file system (ExtendedGcsFileSystem, experimental) asks the
        # storage-control API over gRPC what kind every bucket is; the JSON API's is enough.
        for proto in ("gs", "gcs"):
            fsspec.register_implementation(proto, gcsfs.core.GCSFileSystem, clobber=True)

    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        url = emulator if "://" in emulator else f"http://{emulator}"
        os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", url)
        os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
        os.environ.setdefault("NO_GCE_CHECK", "true")
        for proto in ("gcs", "gs"):
            fsspec.config.conf.setdefault(proto, {}).setdefault("token", "anon")
    for proto in ("gcs", "gs", "s3"):
        fsspec.config.conf.setdefault(proto, {}).setdefault("use_listings_cache", False)
    _configured = True


def _fs(path: str):
    """(fsspec file system, path within it) of a bucket path."""
    configure()
    import fsspec

    try:
        return fsspec.core.url_to_fs(path)
    except ImportError as e:
        raise ImportError(
            f"{path}: reading and writing buckets needs the cloud extra "
            "(pip install 'tx-transformer[cloud]': gcsfs, s3fs)"
        ) from e


def s3_kvstore(path: str) -> dict:
    """TensorStore's kvstore spec of an s3:// path, with the endpoint and region of the
    standard variables (TensorStore's s3 driver does not read AWS_ENDPOINT_URL itself)."""
    bucket, _, key = path[len("s3://") :].partition("/")
    spec = {"driver": "s3", "bucket": bucket, "path": key}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        spec["endpoint"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        spec["aws_region"] = region
    if os.environ.get("AWS_ACCESS_KEY_ID"):  # else TensorStore also looks in ~/.aws, and says so
        spec["aws_credentials"] = {"type": "environment"}
    return spec


# -------------------------------------------------------------------------------------------
# Reading.


def exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.exists(path)
    fs, p = _fs(path)
    return fs.exists(p)


def isdir(path: str) -> bool:
    """A local directory, or a bucket prefix with at least one object under it."""
    if not is_remote(path):
        return os.path.isdir(path)
    fs, p = _fs(path)
    return fs.isdir(p)


def isfile(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    fs, p = _fs(path)
    return fs.isfile(p)


def listdir(path: str) -> list[str]:
    """The names directly under `path` (on a bucket, a "directory" is a common prefix),
    sorted; [] if there is nothing there."""
    if not is_remote(path):
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    fs, p = _fs(path)
    try:
        return sorted({posixpath.basename(x.rstrip("/")) for x in fs.ls(p, detail=False)} - {""})
    except FileNotFoundError:
        return []


def walk_files(path: str) -> list[str]:
    """Every file under `path`, as paths relative to it (sorted)."""
    if not is_remote(path):
        out = []
        for root, _, files in os.walk(path):
            out += [os.path.relpath(os.path.join(root, f), path) for f in files]
        return sorted(out)
    fs, p = _fs(path)
    base = p.rstrip("/") + "/"
    return sorted(x[len(base) :] for x in fs.find(p) if x.startswith(base))


def glob_files(pattern: str) -> list[str]:
    """The files a glob pattern (`*`, `?`, `[...]`) matches, sorted; on a bucket through
    fsspec's glob (a listing under the pattern's fixed prefix), as URLs."""
    if not is_remote(pattern):
        return sorted(p for p in globbing.glob(pattern) if os.path.isfile(p))
    fs, p = _fs(pattern)
    scheme = pattern[: pattern.index("://") + 3]
    found = fs.glob(p, detail=True)
    return sorted(scheme + name for name, info in found.items() if info.get("type") == "file")


def read_bytes(path: str) -> bytes:
    if not is_remote(path):
        with open(path, "rb") as f:
            return f.read()
    fs, p = _fs(path)
    return fs.cat_file(p)


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def open_read(path: str):
    """A binary file object for reading (a bucket's object is read in blocks of 4 MiB, behind
    a buffer: iterating lines on fsspec's own file copies a whole block per line)."""
    if not is_remote(path):
        return open(path, "rb")
    fs, p = _fs(path)
    return io.BufferedReader(fs.open(p, "rb"), 1 << 22)


def mtime(path: str) -> float:
    """When the file or object was last written, in seconds since the epoch (on a bucket the
    server's clock)."""
    if not is_remote(path):
        return os.stat(path).st_mtime
    fs, p = _fs(path)
    when = fs.modified(p)
    return when.timestamp() if isinstance(when, datetime.datetime) else float(when)


def size(path: str) -> int:
    if not is_remote(path):
        return os.path.getsize(path)
    fs, p = _fs(path)
    return int(fs.size(p))


def sha256(path: str) -> str:
    """sha256 of a file's or object's bytes, read in blocks."""
    h = hashlib.sha256()
    with open_read(path) as f:
        while block := f.read(1 << 23):
            h.update(block)
    return h.hexdigest()


def version(path: str) -> str:
    """What `replace_if` compares: the object's GCS generation or S3 ETag; a local file's
    inode and modification time (a replace is a rename: a new inode)."""
    if not is_remote(path):
        st = os.stat(path)
        return f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"
    fs, p = _fs(path)
    info = fs.info(p)
    return str(info["generation"] if path.startswith("gs://") else info["ETag"])


# -------------------------------------------------------------------------------------------
# Writing: whole files and objects only.


def makedirs(path: str) -> None:
    """A local directory and its parents; nothing on a bucket (prefixes need no creating)."""
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)


@contextlib.contextmanager
def _writing(path: str) -> Iterator[None]:
    """Any failure to write `path` becomes WriteFailed naming it."""
    try:
        yield
    except (AlreadyExists, Changed, WriteFailed):
        raise
    except OSError as e:
        raise WriteFailed(f"{path} was not written ({e.strerror or e}); nothing was changed") from e


def _local_temp(path: str, data: bytes) -> str:
    """`data` in a new file beside `path`, flushed to the disk (a full disk may only show at
    fsync: delayed allocation, NFS); the caller moves or links it into place."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return tmp


def write_bytes(path: str, data: bytes) -> None:
    """Writes the whole file or object: never half-written. Locally under a temporary name,
    then renamed; on a bucket in one request. A failure raises WriteFailed naming `path` and
    leaves an earlier file or object there as it was."""
    with _writing(path):
        if is_remote(path):
            fs, p = _fs(path)
            fs.pipe_file(p, data)
            return
        tmp = _local_temp(path, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def create(path: str, data: bytes) -> None:
    """Writes `path` only if nothing is there (atomically: of two creators one wins);
    AlreadyExists if something is. Locally a hard link of a whole temporary file (O_EXCL's
    guarantee, never a half-written file); GCS ifGenerationMatch=0; S3 If-None-Match: *."""
    with _writing(path):
        if is_remote(path):
            fs, p = _fs(path)
            try:
                fs.pipe_file(p, data, mode="create")
            except FileExistsError as e:  # a 412 from either service
                raise AlreadyExists(path) from e
            return
        tmp = _local_temp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError as e:
            raise AlreadyExists(path) from e
        except OSError as e:  # no hard links here (some FUSE mounts): O_EXCL instead
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            _create_exclusive(path, data)
        finally:
            os.remove(tmp)


def _create_exclusive(path: str, data: bytes) -> None:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError as e:
        raise AlreadyExists(path) from e
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace_if(path: str, data: bytes, expected: str) -> None:
    """Replaces `path` with `data` only if it is still at `version` `expected`; Changed if it
    was replaced or removed since (of two replacers holding the same version one wins).
    GCS: ifGenerationMatch; S3: If-Match (objects up to 100 MiB, one request); locally under
    an exclusive flock of the directory, which every replace_if of it takes."""
    with _writing(path):
        if path.startswith("s3://"):
            fs, p = _fs(path)
            try:
                fs.pipe_file(p, data, IfMatch=expected)
            except FileNotFoundError as e:
                raise Changed(f"{path} is gone") from e
            except OSError as e:  # s3fs: a 412 becomes EINVAL
                if e.errno == errno.EINVAL:
                    raise Changed(f"{path} changed") from e
                raise
        elif path.startswith("gs://"):
            fs, p = _fs(path)
            bucket, key, _ = fs.split_path(p)
            # gcsfs has no call for a generation precondition on replace: the JSON API's upload
            # (https://cloud.google.com/storage/docs/json_api/v1/objects/insert), through gcsfs.
            upload = fs.base.removesuffix("storage/v1/") + f"upload/storage/v1/b/{bucket}/o"
            try:
                fs.call(
                    "POST",
                    upload,
                    uploadType="media",
                    name=key,
                    ifGenerationMatch=str(expected),
                    data=data,
                    json_out=True,
                    headers={"Content-Type": "application/octet-stream"},
                )
            except FileExistsError as e:  # gcsfs maps a 412 to FileExistsError
                raise Changed(f"{path} changed") from e
            finally:
                fs.invalidate_cache(p)
        else:
            fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    current = version(path)
                except FileNotFoundError as e:
                    raise Changed(f"{path} is gone") from e
                if current != expected:
                    raise Changed(f"{path} changed")
                write_bytes(path, data)
            finally:
                os.close(fd)  # releases the flock


def remove(path: str) -> None:
    """Removes a file or object; nothing if it is not there."""
    if not is_remote(path):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        return
    fs, p = _fs(path)
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(p)


def rmtree(path: str) -> None:
    """Removes a directory (a bucket prefix) and all under it; nothing if it is not there."""
    if not is_remote(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    fs, p = _fs(path)
    with contextlib.suppress(FileNotFoundError):
        fs.rm(p, recursive=True)


def move_tree(src: str, dst: str) -> None:
    """Moves a directory: a rename locally; on a bucket each object copied (within the
    service) and then the originals removed, so `dst` is whole before `src` goes."""
    if not is_remote(src):
        os.rename(src, dst)
        return
    fs, p = _fs(src)
    _, q = _fs(dst)
    for rel in walk_files(src):
        fs.copy(posixpath.join(p, rel), posixpath.join(q, rel))
    fs.rm(p, recursive=True)


def upload_tree(local_dir: str, path: str) -> None:
    """Copies a local directory's files to `path` (another local directory or a prefix)."""
    for rel in walk_files(local_dir):
        with open(os.path.join(local_dir, rel), "rb") as f:
            write_bytes(join(path, *rel.split(os.sep)), f.read())


class Appender:
    """A file that grows, readable whole after each `flush` (TensorBoard's event files).

    Locally the file itself, appended to: a reader that follows it as it grows (TensorBoard)
    sees each flush. A bucket has no append and an object is written whole: the bytes so far
    are kept in memory and the whole object is written again at each flush (readers see the
    previous flush or this one). `size` is the bytes written so far.
    """

    def __init__(self, path: str):
        self.path, self.size, self._flushed = path, 0, 0
        self._pending = bytearray()  # written since the last flush (locally) or at all (bucket)

    def write(self, data: bytes) -> None:
        self._pending += data
        self.size += len(data)

    def flush(self) -> None:
        if self._flushed == self.size:
            return
        if is_remote(self.path):
            write_bytes(self.path, bytes(self._pending))
        else:
            with _writing(self.path):
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                with open(self.path, "ab") as f:
                    f.write(self._pending)
            self._pending.clear()
        self._flushed = self.size


# -------------------------------------------------------------------------------------------
# The local cache: what must be a local file (memory-mapped arrays, libraries that read paths).


def cache_dir(*parts: str) -> str:
    base = os.environ.get("TX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tx"
    )
    return os.path.join(base, *parts)


def local_copy(path: str) -> str:
    """A local file with the content of `path`: `path` itself when local, else a copy in the
    cache named by the object's version, so that a newer object is a new file and a file
    that is memory-mapped is never rewritten."""
    if not is_remote(path):
        return path
    fs, p = _fs(path)
    key = hashlib.sha256(f"{path}\0{version(path)}".encode()).hexdigest()[:32]
    local = cache_dir("objects", f"{key}-{posixpath.basename(p)}")
    if not os.path.exists(local):
        os.makedirs(os.path.dirname(local), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(local), prefix=".tmp-")
        os.close(fd)
        try:
            fs.get_file(p, tmp)
            os.replace(tmp, local)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
    return local


def local_tree(path: str) -> str:
    """A local directory with the files under `path`: `path` itself when local, else a copy
    in the cache named by the objects' versions (one listing), so that a tree with any object
    rewritten (a new export of the same size, say) is a new copy. A copy appears whole: it is
    fetched under a temporary name and renamed."""
    if not is_remote(path):
        return path
    fs, p = _fs(path)
    base = p.rstrip("/") + "/"
    found = sorted((k[len(base) :], v) for k, v in fs.find(p, detail=True).items())
    versions = [(rel, str(info.get("generation") or info.get("ETag"))) for rel, info in found]
    key = hashlib.sha256(repr((path, versions)).encode()).hexdigest()[:32]
    local = cache_dir("trees", key)
    if os.path.isdir(local):
        return local
    os.makedirs(os.path.dirname(local), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(local), prefix=".tmp-")
    try:
        for rel, _ in versions:
            target = os.path.join(tmp, *rel.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            fs.get_file(base + rel, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.rename(tmp, local)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(local):  # else another process put the same copy there first
            raise
    return local
