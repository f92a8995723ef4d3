"""Decoding speed: beam search (beam 4, alpha 0.6) over the demo test set, sentences/s and
output tokens/s, and the speed-up of the key/value cache over recomputing the whole prefix.

    python benchmarks/decode.py --workdir runs/demo     (a trained demo workdir)
"""

import argparse
import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import save  # noqa: E402

from tx.config import load_config  # noqa: E402
from tx.data.dataset import split_text  # noqa: E402
from tx.model import Transformer, incremental_decoder  # noqa: E402
from tx.search import Decoder, beam_search  # noqa: E402
from tx.tokens import UNK_ID  # noqa: E402
from tx.translate import load_model, translate, translate_ids  # noqa: E402


@functools.partial(jax.jit, static_argnames=("model", "beam", "steps", "cached"))
def _search(model, params, inputs, max_lengths, *, beam, steps, cached):
    if cached:
        decoder = Decoder(*incremental_decoder(model, params, inputs, beam, steps))
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", default="runs/demo")
    p.add_argument("--uncached_sentences", type=int, default=64)
    args = p.parse_args()
    cfg = load_config(os.path.join(args.workdir, "config.json"))
    loaded = load_model(cfg, args.workdir)
    sources = [s for s, _ in split_text(cfg.data, "test")]
    translate(loaded, sources[:64], cfg)  # compile the buckets
    start = time.perf_counter()
    ids = [np.asarray(loaded.tokenizer.encode(s), np.int32) for s in sources]
    hyps = translate_ids(loaded, ids, cfg.decode, tuple(cfg.data.bucket_lengths))
    elapsed = time.perf_counter() - start
    out_tokens = sum(len(h[0][0]) + 1 for h in hyps)
    n = args.uncached_sentences
    sub = ids[:n]
    t_cached, s_cached = time_search(loaded, sub, cached=True)
    t_uncached, s_uncached = time_search(loaded, sub, cached=False)
    save(
        "decode",
        {
            "checkpoint": loaded.source,
            "beam_size": 4,
            "alpha": 0.6,
            "sentences": len(sources),
            "seconds": elapsed,
            "sentences_per_sec": len(sources) / elapsed,
            "output_tokens_per_sec": out_tokens / elapsed,
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
