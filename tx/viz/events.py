"""Reading back the scalars tx.train.monitor wrote to a run's TensorBoard event files.

Event files are TFRecord files of `Event` protos; they are parsed here with TensorBoard's
protobuf classes alone, so drawing curves neither imports TensorFlow (seconds) nor touches a
run that is still training (the files are only read). `tf.summary.scalar` stores each value as
a 0-d tensor; older writers used `simple_value`: both are read. The files are listed and read
through tx.storage (a local workdir or a bucket's).
"""

from __future__ import annotations

import struct

import numpy as np

from tx import storage
from tx import workdir as wd


class NoEvents(FileNotFoundError):
    """A workdir without TensorBoard event files (training never logged a step)."""


def _records(path: str):
    """The payloads of a TFRecord file (length, length CRC, data, data CRC; CRCs not checked).

    The file is read whole, in one request on a bucket (one version of an object its writer
    rewrites at each flush). A record cut short (the writer is still flushing) ends the file
    quietly.
    """
    data, at = storage.read_bytes(path), 0
    while at + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        end = at + 12 + length
        if end + 4 > len(data):
            return
        yield data[at + 12 : end]
        at = end + 4


def _values(event) -> list[tuple[str, float]]:
    from tensorboard.util import tensor_util

    out = []
    for v in event.summary.value:
        if v.HasField("tensor"):
            out.append((v.tag, float(np.asarray(tensor_util.make_ndarray(v.tensor)).item())))
        elif v.HasField("simple_value"):
            out.append((v.tag, float(v.simple_value)))
    return out


def read_scalars(workdir: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """tag -> (steps int [n], values float [n]), sorted by step, from W/tensorboard/.

    A run resumed from a checkpoint logs its steps after that checkpoint again, in a newer
    file: for a step written twice, the later write wins (it is the run that went on).
    """
    from tensorboard.compat.proto import event_pb2

    directory = wd.tensorboard_dir(workdir)
    names = [n for n in storage.listdir(directory) if n.startswith("events.out.tfevents.")]
    files = [storage.join(directory, name) for name in names]
    if not files:
        raise NoEvents(f"no TensorBoard event files in {wd.tensorboard_dir(workdir)}")
    latest: dict[str, dict[int, tuple[float, float]]] = {}  # tag -> step -> (wall time, value)
    for path in files:
        for record in _records(path):
            event = event_pb2.Event.FromString(record)
            for tag, value in _values(event):
                seen = latest.setdefault(tag, {})
                if event.step not in seen or seen[event.step][0] <= event.wall_time:
                    seen[event.step] = (event.wall_time, value)
    out = {}
    for tag, by_step in latest.items():
        steps = np.array(sorted(by_step), np.int64)
        out[tag] = (steps, np.array([by_step[s][1] for s in steps], np.float64))
    return out
