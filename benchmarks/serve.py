"""Serving under a bounded load: `tx serve`'s application on loopback, C concurrent clients
each sending R requests of S sentences from the demo test set; sentences/s and request
latency percentiles (milliseconds), per engine.

    python benchmarks/serve.py --workdir runs/demo [--clients 8 --requests 8 --sentences 4]

The workdir is only read (a CTranslate2 int8 export goes to a temporary directory). Each
engine first answers one untimed round of the same load (compilation, set-up).
"""

import argparse
import asyncio
import os
import sys
import tempfile
import time

import aiohttp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import save  # noqa: E402

from tx.config import load_config  # noqa: E402
from tx.data.dataset import split_text  # noqa: E402
from tx.infer import ct2  # noqa: E402
from tx.infer.export import export  # noqa: E402
from tx.infer.server import engine_app, running  # noqa: E402
from tx.infer.translate import load_model  # noqa: E402


async def _load(url: str, sentences: list[str], clients: int, requests: int, per: int):
    """Latencies (s) of every request, all answered correctly sized, and the wall time."""
    latencies = []

    async def client(session, c):
        for r in range(requests):
            start = (c * requests + r) * per % (len(sentences) - per)
            batch = sentences[start : start + per]
            t = time.perf_counter()
            async with session.post(url + "/translate", json={"sentences": batch}) as resp:
                body = await resp.json()
            assert resp.status == 200 and len(body["translations"]) == per, body
            latencies.append(time.perf_counter() - t)

    start = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session, c) for c in range(clients)))
    return latencies, time.perf_counter() - start


def measure(app, sentences, args) -> dict:
    with running(app) as url:
        asyncio.run(_load(url, sentences, args.clients, args.requests, args.sentences))  # warm
        latencies, wall = asyncio.run(
            _load(url, sentences, args.clients, args.requests, args.sentences)
        )
    ms = np.array(latencies) * 1000
    total = args.clients * args.requests * args.sentences
    return {
        "requests": len(latencies),
        "sentences": total,
        "seconds": wall,
        "sentences_per_sec": total / wall,
        "latency_ms": {p: float(np.percentile(ms, int(p[1:]))) for p in ("p50", "p90", "p99")},
        "latency_ms_max": float(ms.max()),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", default="runs/demo")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=8, help="per client")
    p.add_argument("--sentences", type=int, default=4, help="per request")
    p.add_argument("--threads", type=int, default=1, help="CTranslate2 intra-op threads")
    p.add_argument(
        "--batch_tokens",
        type=int,
        default=256,
        help="decode.batch_tokens while serving (tx pads every batch to this many tokens per "
        "length bucket: a server's batches are small)",
    )
    args = p.parse_args()
    cfg = load_config(os.path.join(args.workdir, "config.json"))
    cfg.decode.batch_tokens = args.batch_tokens
    sentences = [s for s, _ in split_text(cfg.data, "test")]
    rows = {"tx_jax": measure(engine_app(load_model(cfg, args.workdir), cfg), sentences, args)}
    with tempfile.TemporaryDirectory() as tmp:
        export(cfg, args.workdir, tmp + "/int8", quantization="int8")
        engine = ct2.load(tmp + "/int8", threads=args.threads)
        rows["ctranslate2_int8"] = measure(engine_app(engine, cfg), sentences, args)
    save(
        "serve",
        {
            "load": {k: getattr(args, k) for k in ("clients", "requests", "sentences")},
            "ctranslate2_threads": args.threads,
            "decode_batch_tokens": args.batch_tokens,
            "engines": rows,
            "load_average_1min": os.getloadavg()[0],  # other jobs share these cores
        },
    )


if __name__ == "__main__":
    main()
