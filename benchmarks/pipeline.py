"""Input pipeline: batches/s and tokens/s of the training stream, and padding efficiency of
length buckets vs packing, on the demo corpus and on a WMT-like length distribution.

    python benchmarks/pipeline.py [--workdir runs/bench_pipeline]
"""

import argparse
import dataclasses
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import save  # noqa: E402

from tx.config import load_config  # noqa: E402
from tx.data import dataset, vocabulary  # noqa: E402
from tx.data.pipeline import (  # noqa: E402
    BatchSpec,
    filter_for_training,
    padding_efficiency,
    wmt_like,
)


def stream_speed(stream, seconds=10.0) -> dict:
    start, n_batches, tokens = time.perf_counter(), 0, 0
    while time.perf_counter() - start < seconds:
        b = next(stream)
        tokens += int((b["inputs"] > 0).sum() + (b["targets"] > 0).sum())
        n_batches += 1
    elapsed = time.perf_counter() - start
    return {"batches_per_sec": n_batches / elapsed, "tokens_per_sec": tokens / elapsed}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", default="", help="default: a fresh temporary directory")
    args = p.parse_args()
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="tx-bench-pipeline-")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = {}
    base = load_config(os.path.join(root, "configs", "base.py"))
    spec = BatchSpec(
        tuple(base.data.bucket_lengths),
        base.data.tokens_per_step,
        base.data.max_len,
        row_multiple=8,
    )
    # WMT14 EN-DE has 4.5M pairs; packing (a Python loop) is measured on 1M of them.
    for name, n, s in (
        ("wmt_like_buckets", 4_500_000, spec),
        ("wmt_like_packed", 1_000_000, dataclasses.replace(spec, pack=True)),
    ):
        wmt = wmt_like(n)
        keep, _ = filter_for_training(wmt, base.data.max_len)
        out[name] = {"pairs": n, **padding_efficiency(wmt, keep, s)}
    demo = load_config(os.path.join(root, "configs", "demo.py"))
    tok = vocabulary.obtain(demo.data, args.workdir)
    start = time.perf_counter()
    ids = dataset.split_ids(demo.data, args.workdir, tok, "train")
    out["demo_tokenize_seconds"] = time.perf_counter() - start
    keep, _ = filter_for_training(ids, demo.data.max_len)
    dspec = dataset.batch_spec(demo.data, 1)
    out["demo_packed"] = padding_efficiency(ids, keep, dspec)
    out["demo_buckets"] = padding_efficiency(ids, keep, dataclasses.replace(dspec, pack=False))
    stream, _ = dataset.train_stream(demo.data, args.workdir, tok, dspec)
    out["demo_stream"] = stream_speed(stream)
    out["demo_stream_prefetched"] = stream_speed(dataset.prefetch(stream))
    for v in out.values():
        if isinstance(v, dict) and "shapes" in v:
            v["shapes"] = [list(s) for s in v["shapes"]]
    save("pipeline", out)


if __name__ == "__main__":
    main()
