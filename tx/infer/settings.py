"""The config's `decode` section, owned by this wing: its fields with their defaults (the paper's
search, Section 6.1) and one comment each, the choices the wing's code reads, and `check`. It
sits at tx.config's layer and imports nothing of tx: tx.config composes the sections and hands
`check` a checker (`c.cfg` the whole config; its helpers raise ConfigError naming the key).
"""

from __future__ import annotations

STRATEGIES = ("beam", "greedy", "sample")  # decode.strategy (tx.infer.search.Strategy)
AVERAGE_WHICH = ("last", "best")  # decode.average_which (tx.train.averaging)


def defaults() -> dict[str, dict]:
    """Section -> field -> default."""
    decode = dict(
        strategy="beam",  # "beam" (the paper) | "greedy" | "sample" (tx.infer.search)
        beam_size=4,
        alpha=0.6,  # GNMT length penalty ((5 + len) / 6)^alpha
        max_extra_len=50,  # output length <= input length + this
        max_length_ratio=0.0,  # > 0: also <= ceil(this * input length) + 10 (fairseq); 0 = off
        no_repeat_ngram_size=0,  # > 0: no n-gram of this size twice in an output (fairseq); 0 = off
        batch_tokens=4096,  # source tokens per decoding batch (before the beam)
        average_last=5,  # checkpoints averaged for the final model (base: 5, big: 20)
        average_which="last",  # "last" (the paper) | "best" by train.best_metric (train.keep_best)
        temperature=1.0,  # sample: softmax(logits / temperature)
        top_k=0,  # sample: only the k most likely tokens; 0 = all
        seed=0,  # sample: the random draws (folded with each batch's number)
    )
    return {"decode": decode}


def check(c) -> None:
    """Raises (through `c`, tx.config's checker) on the first invalid `decode` key."""
    c.positive("decode.beam_size", "decode.batch_tokens", "decode.temperature")
    c.nonnegative("decode.alpha", "decode.max_extra_len", "decode.top_k")
    c.one_of("decode.strategy", STRATEGIES)
    ngram = c.number("decode.no_repeat_ngram_size")
    if not isinstance(ngram, int) or ngram < 0:
        c.fail(f"decode.no_repeat_ngram_size must be an int >= 0 (0 = off), got {ngram}")
    ratio = c.number("decode.max_length_ratio")
    if not 0 <= ratio < float("inf"):  # nan and inf as well
        c.fail(f"decode.max_length_ratio must be finite and >= 0 (0 = off), got {ratio}")
    which = c.one_of("decode.average_which", AVERAGE_WHICH, spelled=True)
    if which == "best" and not c.cfg.train.keep_best:
        c.fail("decode.average_which='best' needs train.keep_best >= 1")
