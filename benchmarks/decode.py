"""Decoding speed: beam search (beam 4, alpha 0.6) over the demo test set, sentences/s and
output tokens/s, and the speed-up of the key/value cache over recomputing the whole prefix;
then the same test set through CTranslate2 exports (float32 and int8, tx.infer.export), side by side
with tx's own search: tokens/s, BLEU and the share of translations identical to tx's.

    python benchmarks/decode.py --workdir runs/demo     (a trained demo workdir)

The workdir is only read: the exports go to a temporary directory. Every engine decodes the
whole test set once untimed (compilation, first-call set-up), then once timed.
"""

import argparse
import functools
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import save  # noqa: E402

from tx.config import load_config  # noqa: E402
from tx.data.dataset import split_text  # noqa: E402
from tx.eval.metrics import sacrebleu_scores  # noqa: E402
from tx.infer import ct2  # noqa: E402
from tx.infer.decoders import decoder as tx_decoder  # noqa: E402
from tx.infer.export import export  # noqa: E402
from tx.infer.search import Decoder, beam_search  # noqa: E402
from tx.infer.translate import load_model, translate_pairs  # noqa: E402
from tx.model.transformer import Transformer  # noqa: E402
from tx.tokens import UNK_ID  # noqa: E402


@functools.partial(jax.jit, static_argnames=("model", "beam", "steps", "cached"))
def _search(model, params, inputs, max_lengths, *, beam, steps, cached):
    if cached:
        decoder = tx_decoder(model, params, inputs, beam, steps)
    else:
        decoder = Decoder(*_uncached_decoder(model, params, inputs, beam, steps))
    return beam_search(decoder, max_lengths, beam_size=beam, alpha=0.6, max_steps=steps)


def _uncached_decoder(model, params, inputs, beam, steps):
    """The baseline: the "cache" is the prefix itself; every step re-runs the whole decoder."""
    encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
    encoded = jnp.repeat(encoded, beam, axis=0)
    inputs_k = jnp.repeat(inputs, beam, axis=0)
    cache = {
        "prefix": jnp.zeros((inputs_k.shape[0], steps), jnp.int32),
        "i": jnp.array(0, jnp.int32),
    }

    def t2l(ids, cache):
        prefix = jax.lax.dynamic_update_slice(cache["prefix"], ids, (0, cache["i"]))
        # decode() shifts right itself: feed the prefix without its BOS, read position i.
        # Positions >= i get a non-pad placeholder, because teacher-forced decoding masks
        # cross-attention for padding targets (causality hides the placeholder itself).
        targets = jnp.concatenate([prefix[:, 1:], prefix[:, :1]], axis=1)
        future = jnp.arange(targets.shape[1])[None, :] >= cache["i"]
        targets = jnp.where(future, UNK_ID, targets)
        logits = model.apply(
            {"params": params}, encoded, inputs_k, targets, method=Transformer.decode
        )
        step_logits = jax.lax.dynamic_index_in_dim(logits, cache["i"], 1, keepdims=False)
        return step_logits, {"prefix": prefix, "i": cache["i"] + 1}

    return t2l, cache  # reordering: every leaf with a row dimension (the prefix)


def time_search(loaded, sources, cached, beam=4, extra=50):
    length = max(len(s) for s in sources)
    inputs = np.zeros((len(sources), length), np.int32)
    for i, s in enumerate(sources):
        inputs[i, : len(s)] = s
    max_lengths = jnp.array([len(s) - 1 + extra for s in sources])

    def run():
        return _search(
            loaded.model,
            loaded.params,
            jnp.asarray(inputs),
            max_lengths,  # noqa
            beam=beam,
            steps=length + extra,
            cached=cached,
        )

    jax.block_until_ready(run())  # compile
    start = time.perf_counter()
    seqs, _ = jax.block_until_ready(run())
    return time.perf_counter() - start, np.asarray(seqs)


def time_engine(engine, sources, references, cfg) -> dict:
    """One untimed pass (compilation, set-up), one timed; output tokens count EOS."""
    translate_pairs(engine, sources, cfg)
    start = time.perf_counter()
    pairs = translate_pairs(engine, sources, cfg)
    elapsed = time.perf_counter() - start
    hyps = [engine.tokenizer.decode(out) for _, out in pairs]
    tokens = sum(len(out) + 1 for _, out in pairs)
    return {
        "source": engine.source,
        "seconds": elapsed,
        "sentences_per_sec": len(sources) / elapsed,
        "output_tokens_per_sec": tokens / elapsed,
        "bleu": sacrebleu_scores(hyps, references)["bleu"],
        "hypotheses": hyps,
    }


def ctranslate2_rows(cfg, workdir, sources, references, tx_hyps, threads) -> dict:
    """CTranslate2 float32 and int8 exports of `workdir`, beside tx's hypotheses."""
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for q in ("float32", "int8"):
            out = os.path.join(tmp, q)
            export(cfg, workdir, out, quantization=q)
            for n in threads:
                row = time_engine(ct2.load(out, threads=n), sources, references, cfg)
                hyps = row.pop("hypotheses")
                row["threads"] = n
                row["identical_to_tx"] = sum(a == b for a, b in zip(hyps, tx_hyps, strict=True))
                row["identical_share"] = row["identical_to_tx"] / len(sources)
                rows[f"ctranslate2_{q}_threads{n}"] = row
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", default="runs/demo")
    p.add_argument("--uncached_sentences", type=int, default=64)
    p.add_argument(
        "--threads", default="1,2", help="CTranslate2 intra-op threads to measure, comma-separated"
    )
    args = p.parse_args()
    cfg = load_config(os.path.join(args.workdir, "config.json"))
    loaded = load_model(cfg, args.workdir)
    pairs = split_text(cfg.data, "test")
    sources, references = [s for s, _ in pairs], [r for _, r in pairs]
    tx_row = time_engine(loaded, sources, references, cfg)
    tx_hyps = tx_row.pop("hypotheses")
    threads = [int(t) for t in args.threads.split(",")]
    engines = {"tx_jax": tx_row}
    engines.update(ctranslate2_rows(cfg, args.workdir, sources, references, tx_hyps, threads))
    n = args.uncached_sentences
    ids = [np.asarray(loaded.tokenizer.encode(s), np.int32) for s in sources]
    sub = ids[:n]
    t_cached, s_cached = time_search(loaded, sub, cached=True)
    t_uncached, s_uncached = time_search(loaded, sub, cached=False)
    save(
        "decode",
        {
            "checkpoint": loaded.source,
            "beam_size": cfg.decode.beam_size,
            "alpha": cfg.decode.alpha,
            "sentences": len(sources),
            "seconds": tx_row["seconds"],
            "sentences_per_sec": tx_row["sentences_per_sec"],
            "output_tokens_per_sec": tx_row["output_tokens_per_sec"],
            "engines": engines,
            "load_average_1min": os.getloadavg()[0],  # other jobs share these cores
            "cache_comparison": {
                "sentences": n,
                "cached_seconds": t_cached,
                "uncached_seconds": t_uncached,
                "speedup": t_uncached / t_cached,
                "same_output": bool((s_cached == s_uncached).all()),
            },
        },
    )


if __name__ == "__main__":
    main()
