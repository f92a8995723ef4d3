"""Any Table 3 row at a scale between the demo and the paper, on a real corpus, on 2 CPU cores.

Command:   python benchmarks/real_corpus.py --out R/corpus --pair en-nl --train-pairs 15000
           python -m tx reproduce --table 3 --scale real --root R --run
           (one row: python -m tx train --config configs/real.py:table3.py:A1,corpus=R/corpus
           --workdir R/table3-real/A1; docs/reproducing.md, "Real scale")
Hardware:  2 CPU cores; each row's measured time is in its run card
           (results/cards/table3-real/; `reproduce --table 3 --scale real --plan` reads it).
Expected:  not the paper's numbers: each row's change applied to the paper's base divided
           evenly, trained on 15,000 pairs of English->Dutch interface text. Whether it moves
           dev perplexity and BLEU the paper's way, beyond the base row's seed-to-seed noise,
           is what the table shows (results/table3-real.md).

The paper's base divided evenly: every width (d_model, d_ff, d_k, d_v) by WIDTH and every layer
count by DEPTH, so d_model 128, d_ff 512, 8 heads of 16, 3+3 layers, post-LN, dropout 0.1,
label smoothing 0.1, the paper's Adam and its inverse-square-root schedule. A row keeps its
change in proportion: A1's one head is 128 wide (constant compute), C4 halves d_model, C3 has
4+4 layers, big doubles d_model and d_ff with 16 heads and dropout 0.3. Heads, dropout, label
smoothing and positions are the row's own. Nothing else differs from row to row.

Unlike configs/small.py (pre-LN, no dropout, unlikelihood: a recipe for the best model in 30
minutes), nothing here departs from the paper's base but its size, the corpus and the schedule's
length: the rows must change one thing of the paper's base each.

The arguments after the row (comma-separated): `corpus=DIR` the folder that
benchmarks/real_corpus.py wrote (train/dev/test.en and .nl); `steps=N` the steps of a 100k-step
row (big trains 3x); `seed=S` sets train.seed and data.shuffle_seed (a second seed of a row).
"""

import os

from tx.config import ConfigError, read_config

WIDTH = 4  # 512 -> 128, 2048 -> 512, d_k 64 -> 16
DEPTH = 2  # 6 -> 3, C1's 2 -> 1, C3's 8 -> 4
# Steps of a 100k-step row: where the pilot's dev perplexity flattened (under 2% change over
# its last fifth), big 3x, as the paper's 300k (benchmarks/table3_pilot.py; its curve and the
# 50,000-pair pilot that never flattened: docs/reproducing.md, "Real scale").
STEPS = 6000
# One warm-up for every row, as the paper's 4,000 for every row: the lowest dev perplexity of
# 200, 400 and 800 on the base row (benchmarks/table3_pilot.py). The base's peak rate:
# 128^-0.5 x 400^-0.5 = 4.4e-3.
WARMUP = 400
SCALE_KEYS = ("d_model", "d_ff", "d_k", "d_v")
PAIR = ("en", "nl")


def get_config(arg="table3.py:base"):
    name, _, rest = arg.partition(",")
    opts = _options(rest, arg)
    cfg = read_config(os.path.join(os.path.dirname(__file__), name))
    m, t = cfg.model, cfg.train
    for key in SCALE_KEYS:
        if m[key] is not None:
            m[key] = max(m[key] // WIDTH, 1)
    for key in ("num_layers", "num_encoder_layers", "num_decoder_layers"):
        if m[key] is not None:
            m[key] = max(m[key] // DEPTH, 1)
    m.dtype = "float32"  # on a CPU without bf16 units float32 is the fast one
    m.max_len = 256
    _data(cfg, opts.get("corpus", ""))
    steps = int(opts.get("steps", STEPS))
    t.num_steps = max(t.num_steps * steps // 100_000, 1)  # big: 300k -> 3 x steps
    cfg.optim.warmup_steps = WARMUP
    if "seed" in opts:
        t.seed = cfg.data.shuffle_seed = int(opts["seed"])
    _checkpoints(cfg)
    cfg.mesh.shape = dict(data=-1, fsdp=1, tensor=1)
    return cfg


def _options(rest: str, arg: str) -> dict:
    opts = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in ("corpus", "steps", "seed") or not value:
            raise ConfigError(
                f"configs/real.py:{arg}: {item!r} is not corpus=DIR, steps=N or seed=S"
            )
        if key in ("steps", "seed") and not value.isdigit():
            raise ConfigError(f"configs/real.py:{arg}: {key} must be a whole number, got {value!r}")
        opts[key] = value
    if opts.get("steps") == "0":
        raise ConfigError(f"configs/real.py:{arg}: steps must be at least 1")
    return opts


def _data(cfg, corpus: str) -> None:
    """The corpus's text files, one shared BPE vocabulary of 4,000 pieces learned from all of
    its training text, and 1,000 tokens per side per step in packed rows of 128: what 2 CPU
    cores train at about 0.35 s a step, so that every row and seed fits in about 10 hours."""
    d = cfg.data
    d.source = "text"
    d.src_lang, d.tgt_lang = PAIR
    if corpus:
        d.train_prefix, d.dev_prefix, d.test_prefix = (
            os.path.join(corpus, split) for split in ("train", "dev", "test")
        )
    d.vocab_size = cfg.model.vocab_size = 4000
    d.spm_sample_size = 1_000_000
    d.max_len = 128
    d.bucket_lengths = (8, 16, 24, 32, 48, 64, 96, 128)
    d.pack = True
    d.tokens_per_step = 1000
    d.num_workers = 0
    cfg.decode.batch_tokens = 4096


def _checkpoints(cfg) -> None:
    """Dev perplexity 20 times a run (the curves), step-spaced checkpoints for resuming; Table 3
    reports the last checkpoint, unaveraged, as the paper does."""
    t = cfg.train
    t.eval_every_steps = max(t.num_steps // 20, 1)
    t.eval_bleu_every_steps = 0
    t.checkpoint_every_steps = max(t.num_steps // 10, 1)
    t.checkpoint_every_secs = 300
    t.keep_checkpoints = 2
    t.log_every_steps = max(t.num_steps // 40, 1)
