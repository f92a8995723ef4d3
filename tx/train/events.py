"""A run's TensorBoard event files: the scalars training writes (`Summaries`) and reading them
back (`read_scalars`, for curves and reports).

Written with TensorBoard's own pieces, its scalar summary (`scalar_pb`, what `tf.summary.scalar`
stores) and its record framing (`RecordWriter`, which its EventFileWriter uses), onto tx.storage:
a workdir in a bucket gets its events through tx's one path layer, with its endpoints and
retries. Writers with a file layer of their own reach fewer places: `tf.summary` (and clu's
writers, built on it) and TensorBoard's `DirectoryOutput` write through TensorFlow's, which has
no s3:// (https://github.com/tensorflow/io); tensorboardX would be a new dependency with S3 and
GCS clients of its own. Read back with TensorBoard's `EventFileLoader` (CRCs checked), which
reads through TensorFlow: reading imports it (seconds).
"""

from __future__ import annotations

import itertools
import os
import socket
import time

import numpy as np

from tx import storage
from tx import workdir as wd


class NoEvents(FileNotFoundError):
    """A workdir without TensorBoard event files (training never logged a step)."""


class Summaries:
    """TensorBoard scalars in `directory` (process 0 only; no-op elsewhere), as
    `tf.summary.scalar` writes them: 0-d float32 tensors of the "scalars" plugin.

    Each Summaries writes a new event file, flushed at every `scalars` call (tx.storage.Appender:
    appended to on a local disk; on a bucket the object is written whole again, so a file
    there is closed and a new one begun past ROLL_BYTES).
    """

    ROLL_BYTES = 8 << 20

    def __init__(self, directory: str, enabled: bool):
        self.directory, self.file = directory, None
        if enabled:
            self._begin()

    def _begin(self) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        # Named as TensorFlow names them: time, host, pid, a number within the process.
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.{next(_EVENT_FILES)}.v2"
        )
        self.file = storage.Appender(storage.join(self.directory, name))
        self._records = RecordWriter(self.file)
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _write(self, event) -> None:
        self._records.write(event.SerializeToString())

    def scalars(self, step: int, values: dict) -> None:
        if self.file is None:
            return
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb

        if storage.is_remote(self.directory) and self.file.size > self.ROLL_BYTES:
            self._begin()
        summary = summary_pb2.Summary()
        for key, value in values.items():
            summary.value.extend(scalar_pb(key, np.float32(value)).value)
        self._write(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))
        self._records.flush()

    def close(self) -> None:
        if self.file is not None:
            self._records.flush()


_EVENT_FILES = itertools.count()


def read_scalars(workdir: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """tag -> (steps int [n], values float [n]), sorted by step, from W/tensorboard/.

    Each file is read whole (in one request on a bucket: one version of an object its writer
    rewrites at each flush); a record cut short (the writer is still flushing) ends the file.
    Values written as 0-d tensors (`tf.summary.scalar`) and as `simple_value` (older writers)
    are both read. A run resumed from a checkpoint logs its steps after that checkpoint again,
    in a newer file: for a step written twice, the later write wins (it is the run that went on).
    """
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    directory = wd.tensorboard_dir(workdir)
    names = [n for n in storage.listdir(directory) if n.startswith("events.out.tfevents.")]
    if not names:
        raise NoEvents(f"no TensorBoard event files in {directory}")
    latest: dict[str, dict[int, tuple[float, float]]] = {}  # tag -> step -> (wall time, value)
    for name in names:
        # The loader turns a `simple_value` into a tensor (tensorboard.data_compat).
        for event in EventFileLoader(storage.local_copy(storage.join(directory, name))).Load():
            for v in event.summary.value:
                seen = latest.setdefault(v.tag, {})
                if event.step not in seen or seen[event.step][0] <= event.wall_time:
                    value = float(np.asarray(tensor_util.make_ndarray(v.tensor)).item())
                    seen[event.step] = (event.wall_time, value)
    out = {}
    for tag, by_step in latest.items():
        steps = np.array(sorted(by_step), np.int64)
        out[tag] = (steps, np.array([by_step[s][1] for s in steps], np.float64))
    return out
