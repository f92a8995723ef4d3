"""The config's `data` section, owned by this wing: its fields with their defaults (the paper's
base recipe) and one comment each, the choices the wing's code reads, and `check`. It sits at
tx.config's layer and imports nothing of tx: tx.config composes the sections and hands `check`
a checker (`c.cfg` the whole config; its helpers raise ConfigError naming the key).
"""

from __future__ import annotations

from ml_collections.config_dict import placeholder

SOURCES = ("demo", "text", "tfds", "trees")  # data.source (tx.data.sources.load_split)
ON_BAD_LINE = ("error", "skip")  # data.on_bad_line: what invalid UTF-8 in training text does


def defaults() -> dict[str, dict]:
    """Section -> field -> default."""
    data = dict(
        source="tfds",  # "tfds" | "text" | "demo" | "trees" (parsing: configs/table4.py)
        tfds_name="wmt14_translate/de-en",  # dev newstest2013, test newstest2014
        tfds_data_dir=placeholder(str),  # None -> TFDS default (~/tensorflow_datasets)
        # text: <prefix>.<lang> files, one sentence per line, or several corpora's prefixes
        # separated by commas (each tokenized and cached on its own); trees: a glob
        train_prefix="",
        # text, several training corpora: each one's share of the sampled pairs, in
        # train_prefix's order (e.g. (1, 3): one pair of the first for three of the second,
        # every epoch, the smaller corpus repeated); () -> each corpus by its size, as one
        train_weights=(),
        dev_prefix="",
        test_prefix="",
        # text: a second dev set evaluated beside dev (loss and perplexity logged as dev2/...,
        # `evaluate --split dev2`), which never chooses checkpoints: e.g. the old domain's
        # while fine-tuning on a new one (configs/finetune.py)
        dev2_prefix="",
        # text: the dev / test files must be these sacreBLEU test sets (the sha256 of source and
        # reference are compared with sacreBLEU's files), e.g. "wmt13" and "wmt14/full" for the
        # paper's newstest2013 and newstest2014 (docs/data.md, "WMT without statmt")
        sacrebleu_dev_set="",
        sacrebleu_test_set="",
        src_lang="en",  # translation direction: EN->DE as in the paper
        tgt_lang="de",
        demo_seed=0,  # demo source: corpus generator seed
        demo_train_size=200_000,  # demo source: number of training pairs
        demo_eval_size=500,  # demo source: dev and test pairs each
        vocab_size=37000,  # shared BPE vocabulary (paper: about 37k for EN-DE) = model.vocab_size
        vocab_path=placeholder(str),  # an existing SentencePiece model to use
        spm_model_type="bpe",  # "bpe" | "unigram"
        spm_sample_size=2_000_000,  # sentences sampled (source and target) to learn the vocabulary
        spm_normalization="identity",  # round-trips text; nmt_nfkc makes … "...", NBSP " ", ﬁ "fi"
        spm_split_digits=False,  # True: every digit its own piece (not in the paper)
        max_len=256,  # training pairs longer than this (in tokens, either side) are dropped
        # Real (non-padding) tokens per side per optimizer step, global (all devices and
        # micro-batches): the paper's "approximately 25000 source tokens and 25000 target
        # tokens". Rows per bucket come from the data's mean lengths (tx/data/pipeline.py), so
        # this holds on average on any device count; padded tokens stay <= 2x this (memory).
        # tensor2tensor's transformer_base used batch_size=4096 per GPU x 8 GPUs, counted in
        # *padded* positions of the longer side: at most 32,768 per side, about 25k real
        # tokens per side once bucket padding and the shorter side are taken off.
        tokens_per_step=25_000,
        bucket_lengths=(8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128, 160, 192, 256),
        pack=False,  # pack several pairs per row (segment ids) instead of length buckets
        shuffle_seed=0,
        num_workers=0,  # tokenizer processes; 0 -> all cores
        on_bad_line="error",  # invalid UTF-8 in training text: "error" | "skip" (counted, logged)
    )
    return {"data": data}


def check(c) -> None:
    """Raises (through `c`, tx.config's checker) on the first invalid `data` key."""
    d = c.cfg.data
    if c.cfg.model.get("family") == "rnn" and d.pack:
        c.fail(
            "data.pack=True: model.family='rnn' reads one pair per row (its state would run "
            "across packed pairs); set data.pack=False"
        )
    c.positive("data.vocab_size", "data.max_len", "data.tokens_per_step")
    if c.cfg.model.vocab_size != d.vocab_size:
        c.fail(
            f"model.vocab_size={c.cfg.model.vocab_size} differs from data.vocab_size="
            f"{d.vocab_size}; the shared vocabulary sizes the embedding"
        )
    c.one_of("data.on_bad_line", ON_BAD_LINE)
    c.one_of("data.source", SOURCES, spelled=True)
    for key in ("sacrebleu_dev_set", "sacrebleu_test_set"):
        if d.get(key) and d.source != "text":
            c.fail(
                f"data.{key}={d[key]!r} checks text files against sacreBLEU's: it needs "
                f"data.source='text', not {d.source!r}"
            )
    _check_weights(c, d)
    if d.get("dev2_prefix") and d.source != "text":
        c.fail(f"data.dev2_prefix names text files: it needs data.source='text', not {d.source!r}")
    buckets = d.bucket_lengths
    if not isinstance(buckets, (tuple, list)) or not all(
        isinstance(b, int) and not isinstance(b, bool) for b in buckets
    ):
        c.fail(f"data.bucket_lengths must be a list of ints, got {buckets!r}")
    buckets = tuple(buckets)
    if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] <= 0:
        c.fail(f"data.bucket_lengths must be increasing positive ints, got {buckets}")
    if buckets[-1] < d.max_len:
        c.fail(f"data.bucket_lengths ends at {buckets[-1]} < data.max_len={d.max_len}")
    if d.tokens_per_step < buckets[-1]:
        c.fail(
            f"data.tokens_per_step={d.tokens_per_step} cannot hold one row of the longest "
            f"bucket ({buckets[-1]})"
        )


def _check_weights(c, d) -> None:
    """data.train_weights: one positive number per corpus of data.train_prefix (text)."""
    weights = d.get("train_weights", ())
    if not weights:
        return
    if d.source != "text":
        c.fail(
            f"data.train_weights weighs text corpora: it needs data.source='text', not {d.source!r}"
        )
    corpora = train_prefixes(d.train_prefix)
    if not isinstance(weights, (tuple, list)) or len(weights) != len(corpora):
        c.fail(
            f"data.train_weights={weights!r} must give one weight per corpus of "
            f"data.train_prefix ({len(corpora)}: {', '.join(corpora) or 'none'})"
        )
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w < float("inf"):
            c.fail(f"data.train_weights={tuple(weights)!r}: each weight must be a positive number")


def train_prefixes(train_prefix: str) -> list[str]:
    """The corpora data.train_prefix names (text source): its comma-separated prefixes."""
    return [p.strip() for p in train_prefix.split(",") if p.strip()]
