"""A flaky object store for the tests: an HTTP proxy in front of a test server
(tests/object_store.py) that refuses one request in every `every`, deterministically by count,
as a loaded service does: S3's 503 SlowDown
(https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html), GCS's 503 and 429 with
Retry-After (https://cloud.google.com/storage/docs/retry-strategy). Every other request is
forwarded as it came (Host included: signatures and the URLs a server hands back stay valid).
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import itertools
import sys
import threading
import urllib.parse

S3_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
GCS_ERROR = b'{"error": {"code": %d, "message": "%s", "errors": [{"reason": "%s"}]}}'
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}


def _refusal(flavour: str, n: int) -> tuple[int, dict, bytes]:
    """(status, headers, body) of the n-th refusal: S3 always 503 SlowDown; GCS 503 and 429
    (with Retry-After) in turn."""
    if flavour == "s3":
        return 503, {"Content-Type": "application/xml"}, S3_SLOWDOWN
    if n % 2:
        body = GCS_ERROR % (429, b"slow down", b"rateLimitExceeded")
        return 429, {"Content-Type": "application/json", "Retry-After": "1"}, body
    return 503, {"Content-Type": "application/json"}, GCS_ERROR % (503, b"error", b"backendError")


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the clients expect of a service

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while size := int(self.rfile.readline().split(b";")[0].strip(), 16):
                out += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return bytes(out)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _answer(self, status: int, headers, body: bytes, length: str | None = None) -> None:
        """`length`: a HEAD's Content-Length (the object's, not its empty body's)."""
        self.send_response(status)
        for key, value in headers:
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        self.send_header("Content-Length", length or str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _forward(self) -> None:
        body, proxy = self._body(), self.server.proxy
        n = next(proxy.count)
        if proxy.refusing and n % proxy.every == proxy.every - 1:
            status, headers, refusal = _refusal(proxy.flavour, n // proxy.every)
            proxy.refused += 1
            self._answer(status, headers.items(), refusal)
            return
        upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            upstream.request(self.command, self.path, body=body or None, headers=headers)
            response = upstream.getresponse()
            data, length = response.read(), response.getheader("Content-Length")
            head = self.command == "HEAD"
            self._answer(response.status, response.getheaders(), data, length if head else None)
        finally:
            upstream.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _forward

    def log_message(self, *args) -> None:  # quiet
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # not a client that hung up
            super().handle_error(request, client_address)


class FlakyProxy:
    """Forwards to `upstream` (http://host:port), refusing requests every-1, 2*every-1, ...
    (counted from 0 over all connections) while `refusing`, and forwarding all of them once it
    is not; `url` is its own address, `refused` a count."""

    def __init__(self, upstream: str, flavour: str, every: int = 7):
        self.upstream, self.flavour, self.every = urllib.parse.urlparse(upstream), flavour, every
        self.count, self.refused, self.refusing = itertools.count(), 0, True
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.proxy = self
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@contextlib.contextmanager
def flaky(upstream: str, flavour: str, every: int = 7):
    """A FlakyProxy serving in a thread while the block runs."""
    proxy = FlakyProxy(upstream, flavour, every)
    thread = threading.Thread(target=proxy.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.server.shutdown()
        proxy.server.server_close()
        thread.join()
