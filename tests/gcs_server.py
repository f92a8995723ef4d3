"""A GCS server for the tests: gcp-storage-emulator (PyPI) on a free port, made to keep four
promises of the GCS JSON API that it does not keep and that tx and its libraries rely on.

  1. Upload preconditions (https://cloud.google.com/storage/docs/request-preconditions):
     ifGenerationMatch=0 creates only if absent, ifGenerationMatch=<g> replaces only generation
     g; a failed one is HTTP 412. The emulator ignores both (a second "create" succeeds): tx's
     run lock (tx.train.runlock) is built on them.
  2. Listing honours startOffset / endOffset; TensorStore (under Orbax) lists key ranges with
     them, and without them its delete_range deletes the whole bucket.
  3. objects.move (POST .../o/SRC/moveTo/o/DST), which gcsfs tries first for a rename: the
     emulator answers 501 and gcsfs retries for some 30 s before copying.
  4. Downloads carry x-goog-generation, and read preconditions hold (ifGenerationMatch ->
     412, ifGenerationNotMatch -> 304): TensorStore takes an object's generation from that
     header, and its OCDBT manifest updates fail without it ("Malformed StorageGeneration").

It creates the buckets, prints "PORT=<n>" once it listens on 127.0.0.1, and runs until SIGTERM
or SIGINT.

usage: python tests/gcs_server.py [port (0: a free one)] [bucket ...]
"""

import signal
import sys
import threading
from http import HTTPStatus

from gcp_storage_emulator import server as gserver
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import buckets, objects

_MSG = "At least one of the pre-conditions you specified did not hold."
PRECONDITION_FAILED = {
    "error": {
        "code": 412,
        "message": _MSG,
        "errors": [
            {
                "domain": "global",
                "reason": "conditionNotMet",
                "message": _MSG,
                "locationType": "header",
                "location": "If-Match",
            }
        ],
    }
}


def _object_name(request):
    if "name" in request.query:
        return request.query["name"][0]
    data = request.data
    if isinstance(data, dict):
        meta = data.get("meta", data)
        if isinstance(meta, dict):
            return meta.get("name")
    return None


# 1. preconditions on uploads (media, multipart, resumable initiation)
def _guard(handler):
    def wrapped(request, response, storage):
        want = request.query.get("ifGenerationMatch", [None])[0]
        if want is not None and "upload_id" not in request.query:
            try:
                obj = storage.get_file_obj(request.params["bucket_name"], _object_name(request))
                cur = obj["generation"]
            except NotFound:
                cur = "0"
            if str(cur) != str(want):
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json(PRECONDITION_FAILED)
                return None
        return handler(request, response, storage)

    return wrapped


for _name in ("_media_upload", "_multipart_upload", "_create_resumable_upload"):
    setattr(objects, _name, _guard(getattr(objects, _name)))


# 2. listing honours startOffset/endOffset
def _ranged(ls):
    def wrapped(request, response, storage, *args, **kwargs):
        start = request.query.get("startOffset", [None])[0]
        end = request.query.get("endOffset", [None])[0]
        if start is None and end is None:
            return ls(request, response, storage, *args, **kwargs)
        inner = response.json

        def keep(name):
            return (start is None or name >= start) and (end is None or name < end)

        def json_filtered(obj):
            obj = dict(obj)
            obj["items"] = [i for i in obj.get("items") or [] if keep(i["name"])]
            obj["prefixes"] = [p for p in obj.get("prefixes") or [] if keep(p)]
            return inner(obj)

        response.json = json_filtered
        return ls(request, response, storage, *args, **kwargs)

    return wrapped


# 3. moveTo as copy + delete (atomic enough for a single-threaded server)
def _move(request, response, storage, *args, **kwargs):
    b = request.params["bucket_name"]
    src, dst = request.params["object_id"], request.params["dest_object_id"]
    try:
        obj = objects._copy(request.base_url, storage, b, src, b, dst)
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        return
    objects._delete(storage, b, src)
    response.json(obj)


# 4. downloads: x-goog-generation header, read preconditions
def _download(download):
    def wrapped(request, response, storage, *args, **kwargs):
        try:
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        except NotFound:
            return download(request, response, storage, *args, **kwargs)
        gen = str(obj["generation"])
        if_match = request.query.get("ifGenerationMatch", [None])[0]
        if_not_match = request.query.get("ifGenerationNotMatch", [None])[0]
        if if_match is not None and if_match != gen:
            response.status = HTTPStatus.PRECONDITION_FAILED
            response.json(PRECONDITION_FAILED)
            return None
        if if_not_match is not None and if_not_match == gen:
            response.status = HTTPStatus.NOT_MODIFIED
            response["x-goog-generation"] = gen
            return None
        response["x-goog-generation"] = gen
        response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))
        return download(request, response, storage, *args, **kwargs)

    return wrapped


_orig_download = objects.download
objects.download = _download(_orig_download)  # objects.get(alt=media) calls it through the module


_handlers = []
for _regex, _methods in gserver.HANDLERS:
    _methods = dict(_methods)
    if _methods.get(gserver.GET) is objects.ls:
        _methods[gserver.GET] = _ranged(objects.ls)
    if _methods.get(gserver.GET) is _orig_download:
        _methods[gserver.GET] = objects.download
    _handlers.append((_regex, _methods))
for _prefix in ("/storage/v1", ""):
    _handlers.insert(
        0,
        (
            rf"^{_prefix}/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)"
            rf"/moveTo/o/(?P<dest_object_id>.*[^/]+)$",
            {gserver.POST: _move},
        ),
    )
gserver.HANDLERS = tuple(_handlers)


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    names = sys.argv[2:] or ["bucket"]
    srv = gserver.create_server("127.0.0.1", port, in_memory=True, default_bucket=names[0])
    for name in names[1:]:
        buckets.create_bucket(name, srv._storage)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    srv.start()
    print(f"PORT={srv._api._httpd.server_address[1]}", flush=True)
    stop.wait()
    srv.stop()


if __name__ == "__main__":
    main()
