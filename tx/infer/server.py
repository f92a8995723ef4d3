"""A translation server: HTTP with JSON, on aiohttp (the `deploy` extra).

    python -m tx serve --workdir W [--host 127.0.0.1 --port 8080]
    python -m tx serve --engine ctranslate2 --model DIR          (an export: tx.infer.export)

    POST /translate  {"sentences": ["...", ...]} or ["...", ...]  -> {"translations": [...]}
    GET  /health     -> {"status": "ok", "engine": ..., "queued": n, "max_queue": m}

Dynamic batching: requests that arrive within `Limits.window_s` of the first waiting one are
decoded together, up to `decode.batch_tokens` source tokens (a request that would pass it
waits for the next batch; one larger than it is decoded alone, tx.infer.translate splits it). One
batch decodes at a time, in a worker thread: the engine uses every core itself.
Back-pressure: at most `Limits.max_queue` requests wait; past that the answer is 503 at once,
never an unbounded backlog. Each request gets its own translations, in its order; empty
sentences give "" (tx.infer.translate's contract).
Errors are JSON {"error": "..."}: 400 for a body that is not UTF-8, not JSON, or not a list of
strings; 413 for a body, a sentence count or a sentence longer than the limits; 503 when full.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import threading
from collections.abc import Callable

from aiohttp import web

from tx.model.transformer_config import TABLES

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20  # 1 MiB per request
    max_sentences: int = 512  # per request
    max_sentence_tokens: int = 256  # sub-words (without EOS), checked before queueing
    max_queue: int = 64  # requests waiting to be batched
    window_s: float = 0.005  # how long the first waiting request waits for company
    batch_tokens: int = 4096  # source tokens per batch (decode.batch_tokens)


class QueueFull(Exception):
    pass


class BadRequest(ValueError):
    """A request the server refuses: `status` (4xx) and a message for the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Batcher:
    """Collects requests into batches and decodes them one batch at a time.

    `translate(sentences) -> translations` is blocking (run in a thread); `count(sentence)`
    is its length in tokens.
    """

    def __init__(self, translate: Callable[[list[str]], list[str]], limits: Limits):
        self.translate, self.limits = translate, limits
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=limits.max_queue)
        self._carry = None  # a request that did not fit the previous batch
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    async def submit(self, sentences: list[str], tokens: int) -> list[str]:
        """Translations of `sentences` (with `tokens` source tokens in all); QueueFull if
        `max_queue` requests already wait."""
        future = asyncio.get_running_loop().create_future()
        try:
            self.queue.put_nowait((sentences, tokens, future))
        except asyncio.QueueFull:
            raise QueueFull from None
        return await future

    async def run(self) -> None:
        """The worker: forever, the next batch."""
        while True:
            batch = await self._next_batch()
            await self._decode(batch)

    async def _next_batch(self) -> list:
        first = self._carry or await self.queue.get()
        # Waiting out the window, then taking what came, never cancels a queue.get() that
        # may already hold a request (asyncio.wait_for on a queue can drop one).
        await asyncio.sleep(self.limits.window_s)
        self._carry, batch, tokens = None, [first], first[1]
        while tokens < self.limits.batch_tokens:
            try:
                item = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                break
            if tokens + item[1] > self.limits.batch_tokens:
                self._carry = item  # first of the next batch
                break
            batch.append(item)
            tokens += item[1]
        return batch

    async def _decode(self, batch: list) -> None:
        sentences = [s for item in batch for s in item[0]]
        loop = asyncio.get_running_loop()
        try:
            outputs = await loop.run_in_executor(self._pool, self.translate, sentences)
        except Exception as e:  # every waiting request hears of it; the server goes on
            log.exception("decoding a batch of %d sentences failed", len(sentences))
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(RuntimeError(f"translation failed: {e}"))
            return
        start = 0
        for item, _, future in batch:
            if not future.done():  # a client that went away has a cancelled future
                future.set_result(outputs[start : start + len(item)])
            start += len(item)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def parse_sentences(body: bytes, limits: Limits) -> list[str]:
    """The request's sentences; BadRequest says what is wrong with it."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(400, f"the body is not valid UTF-8 ({e.reason})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRequest(400, f"the body is not valid JSON: {e}") from None
    sentences = data.get("sentences") if isinstance(data, dict) else data
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
        raise BadRequest(400, 'expected {"sentences": ["...", ...]} or a JSON list of strings')
    if len(sentences) > limits.max_sentences:
        raise BadRequest(
            413, f"{len(sentences)} sentences: at most {limits.max_sentences} per request"
        )
    return sentences


def make_app(
    translate: Callable[[list[str]], list[str]],
    count: Callable[[str], int],
    limits: Limits,
    engine: str = "",
) -> web.Application:
    """The aiohttp application: `translate` (blocking, batched here), `count(sentence)` its
    source tokens without EOS."""
    app = web.Application(client_max_size=limits.max_body_bytes)
    batcher = Batcher(translate, limits)

    async def translate_handler(request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"the body is larger than {limits.max_body_bytes} bytes")
        try:
            sentences = parse_sentences(body, limits)
        except BadRequest as e:
            return _error(e.status, str(e))
        lengths = [count(s) for s in sentences]
        for i, n in enumerate(lengths):
            if n > limits.max_sentence_tokens:
                return _error(
                    413, f"sentence {i}: {n} tokens, at most {limits.max_sentence_tokens}"
                )
        try:
            outputs = await batcher.submit(sentences, sum(lengths) + len(sentences))
        except QueueFull:
            return _error(503, f"{limits.max_queue} requests are waiting: try again later")
        except RuntimeError as e:
            return _error(500, str(e))
        return web.json_response({"translations": outputs})

    async def health(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ok",
                "engine": engine,
                "queued": batcher.queue.qsize(),
                "max_queue": limits.max_queue,
            }
        )

    async def start_worker(app: web.Application):
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()
        batcher.close()

    app.router.add_post("/translate", translate_handler)
    app.router.add_get("/health", health)
    app.cleanup_ctx.append(start_worker)
    return app


def engine_app(loaded, cfg, limits: Limits | None = None) -> web.Application:
    """The application for a tx engine (tx.infer.translate.LoadedModel, an ensemble, or
    tx.infer.ct2)."""
    from tx.infer.translate import translate

    limits = limits or Limits(batch_tokens=int(cfg.decode.batch_tokens))
    limits = dataclasses.replace(limits, max_sentence_tokens=_token_limit(loaded, cfg, limits))
    sp = loaded.tokenizer.sp
    return make_app(
        lambda sentences: translate(loaded, sentences, cfg),
        lambda s: len(sp.encode(s.strip())),
        limits,
        loaded.source,
    )


def _token_limit(loaded, cfg, limits: Limits) -> int:
    """Inputs longer than a position table allows are refused before they reach a batch."""
    tables = [getattr(loaded, "max_positions", None)]
    if cfg.model.get("positional") in TABLES:
        tables.append(cfg.model.max_len)
    room = [t - int(cfg.decode.max_extra_len) - 1 for t in tables if t is not None]
    return min([limits.max_sentence_tokens, *room])


@contextlib.contextmanager
def running(app: web.Application, host: str = "127.0.0.1", port: int = 0):
    """Serves `app` in a background thread (port 0: a free one) and yields its base URL;
    stops it on exit. For tests and benchmarks: `serve` is the command's blocking form."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    ready = threading.Event()

    def serve_forever():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, host, port).start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve_forever, daemon=True)
    thread.start()
    if not ready.wait(60):
        raise RuntimeError(f"the server did not start on {host}:{port}")
    bound_host, bound_port = runner.addresses[0][:2]
    try:
        yield f"http://{bound_host}:{bound_port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)


def serve(loaded, cfg, host: str, port: int) -> None:
    """Runs until interrupted."""
    log.info("serving %s on http://%s:%d", loaded.source, host, port)
    web.run_app(engine_app(loaded, cfg), host=host, port=port, print=None)
