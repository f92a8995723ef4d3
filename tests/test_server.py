"""The translation server (tx.infer.server) over real HTTP on loopback: concurrent clients get
exactly their own translations in order, requests are batched, a full queue answers 503 and
bad requests get a 4xx with a JSON message."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

aiohttp = pytest.importorskip("aiohttp")

from tx import workdir as wd  # noqa: E402
from tx.config import load_config  # noqa: E402
from tx.infer.server import Limits, engine_app, make_app, running  # noqa: E402
from tx.infer.translate import load_model, translate  # noqa: E402


class Fake:
    """A translation function that records its batches: "abc def" -> "FED CBA"."""

    def __init__(self, delay: float = 0.0, gate: threading.Event | None = None):
        self.batches: list[list[str]] = []
        self.delay, self.gate = delay, gate

    def __call__(self, sentences):
        if self.gate is not None:
            self.gate.wait(30)
        time.sleep(self.delay)
        self.batches.append(list(sentences))
        return [s.upper()[::-1] for s in sentences]


def _count(sentence: str) -> int:
    return len(sentence.split())


async def _post(session, url, payload=None, data=None):
    body = data if data is not None else json.dumps(payload).encode()
    async with session.post(url + "/translate", data=body) as r:
        return r.status, await r.json()


def test_concurrent_clients_get_their_own_translations():
    fake = Fake(delay=0.02)
    app = make_app(fake, _count, Limits(batch_tokens=200, window_s=0.01))

    async def client(session, url, c):
        got = []
        for r in range(4):  # bounded: 24 clients x 4 requests
            sentences = [f"client {c} request {r} sentence {i}" for i in range(c % 3 + 1)]
            sentences.insert(1, "")  # an empty sentence keeps its place
            status, body = await _post(session, url, {"sentences": sentences})
            assert status == 200, body
            got.append((sentences, body["translations"]))
        return got

    async def main(url):
        async with aiohttp.ClientSession() as session:
            return await asyncio.gather(*(client(session, url, c) for c in range(24)))

    with running(app) as url:
        results = asyncio.run(main(url))
    answered = [pair for client_results in results for pair in client_results]
    assert len(answered) == 96  # nothing lost
    for sentences, translations in answered:
        assert translations == [s.upper()[::-1] for s in sentences]
    decoded = sorted(s for batch in fake.batches for s in batch)
    assert decoded == sorted(s for sentences, _ in answered for s in sentences)  # each once
    assert len(fake.batches) < 96  # requests were batched together
    for batch in fake.batches:  # within the token budget (a lone request may exceed it)
        assert sum(_count(s) + 1 for s in batch) <= 200


def test_a_full_queue_answers_503_and_recovers():
    gate = threading.Event()
    app = make_app(Fake(gate=gate), _count, Limits(max_queue=2, window_s=0.0))

    async def main(url):
        async with aiohttp.ClientSession() as session:
            first = asyncio.create_task(_post(session, url, ["first"]))
            await asyncio.sleep(0.3)  # decoding (blocked at the gate): out of the queue
            waiting = [asyncio.create_task(_post(session, url, [f"w{i}"])) for i in range(2)]
            await asyncio.sleep(0.3)
            status, body = await _post(session, url, ["one too many"])
            assert status == 503 and "try again" in body["error"]
            async with session.get(url + "/health") as r:
                health = await r.json()
            assert health["queued"] == 2 and health["max_queue"] == 2
            gate.set()
            results = [await first] + [await w for w in waiting]
            assert [r[1]["translations"] for r in results] == [["TSRIF"], ["0W"], ["1W"]]
            status, _ = await _post(session, url, ["again"])
            assert status == 200

    with running(app) as url:
        asyncio.run(main(url))


def test_bad_requests_get_4xx_with_a_message():
    limits = Limits(max_body_bytes=2000, max_sentences=3, max_sentence_tokens=5)
    app = make_app(Fake(), _count, limits)
    cases = [
        (b"{not json", 400, "not valid JSON"),
        (b'["caf\xe9"]', 400, "not valid UTF-8"),
        (b'{"sentences": [1, 2]}', 400, "list of strings"),
        (b'{"text": "hello"}', 400, "list of strings"),
        (b"", 400, "not valid JSON"),
        (json.dumps(["a", "b", "c", "d"]).encode(), 413, "at most 3 per request"),
        (json.dumps(["one two three four five six"]).encode(), 413, "sentence 0: 6 tokens"),
        (json.dumps(["x" * 3000]).encode(), 413, "larger than 2000 bytes"),
    ]

    async def main(url):
        async with aiohttp.ClientSession() as session:
            for data, status, message in cases:
                got, body = await _post(session, url, data=data)
                assert (got, message in body["error"]) == (status, True), (data, body)
            async with session.get(url + "/translate") as r:
                assert r.status == 405
            status, body = await _post(session, url, {"sentences": ["fine"]})
            assert (status, body) == (200, {"translations": ["ENIF"]})  # still serving

    with running(app) as url:
        asyncio.run(main(url))


def test_round_trip_with_the_trained_model(trained):
    cfg = load_config(wd.config_file(trained))
    loaded = load_model(cfg, trained)
    lines = ["The dog sees a cat.", "", "We count three small birds."]

    async def main(url):
        async with aiohttp.ClientSession() as session:
            return await asyncio.gather(*(_post(session, url, lines) for _ in range(3)))

    with running(engine_app(loaded, cfg)) as url:
        results = asyncio.run(main(url))
    expected = translate(loaded, lines, cfg)
    assert results == [(200, {"translations": expected})] * 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_serve(root, trained, tmp_path):
    """`python -m tx serve` answers /health and /translate, and stops on SIGTERM."""
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, "-m", "tx", "serve", "--workdir", trained, "--port", str(port)]
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)

    async def main(url):
        async with aiohttp.ClientSession() as session:
            for _ in range(240):  # up to 2 minutes to start (imports, restore)
                try:
                    async with session.get(url + "/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.5)
            return await _post(session, url, ["The dog sees a cat.", ""])

    try:
        status, body = asyncio.run(main(f"http://127.0.0.1:{port}"))
        assert status == 200 and len(body["translations"]) == 2, (
            tmp_path / "serve.log"
        ).read_text()
        assert body["translations"][1] == ""
    finally:
        proc.terminate()
        assert proc.wait(30) == 0  # a clean shutdown
        log.close()
