"""`python -m tx serve --workdir W [--host H --port P]` (or `--engine ctranslate2 --model DIR`):
an HTTP JSON translation server, `POST /translate` and `GET /health` (tx.infer.server); several
--workdir or --checkpoint serve an ensemble; --beam, --alpha and --batch-tokens set the search
over the run's config."""

from __future__ import annotations

import argparse

from tx.cli import options

CONFIG = "run"


def add_options(p: argparse.ArgumentParser) -> None:
    with options.translating(p):
        p.add_argument("--host", default="127.0.0.1", help="address to listen on")
        p.add_argument("--port", type=int, default=8080, help="port")


def run(args: argparse.Namespace, cfg) -> int:
    from tx.infer.engines import load_engine, with_search
    from tx.infer.server import serve

    cfg = with_search(cfg, **options.search_settings(args))
    serve(load_engine(cfg, **options.engine_kwargs(args)), cfg, args.host, args.port)
    return 0
