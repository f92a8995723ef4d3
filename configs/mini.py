"""Any paper config in miniature, for testing the reproduction harness on one CPU.

Command:   python -m tx train --config configs/mini.py:table3.py:A1 --workdir runs/table3-mini/A1
           (python -m tx reproduce --table 3 --scale mini writes these commands for every row)
Hardware:  2 CPU cores; each row's measured time is in its run card (results/cards/table3-mini/,
           `python -m tx reproduce --table 3 --scale mini` plans with it).
Expected:  not the paper's numbers: the row's change applied to a small model on the offline
           demo corpus. Whether each change moves dev perplexity and BLEU in the paper's
           direction is what a mini table shows (README, "Reproducing the tables").

The row's change is kept in proportion: every width (d_model, d_ff, d_k, d_v) is divided by
WIDTH and every layer count by DEPTH, so a row that halves d_model still halves it, and a row
with 4 heads of 128 still has 4 heads, each twice as wide as the base's. Heads, dropout,
label smoothing, positions, the learning-rate schedule's shape, beam size, alpha and how many
checkpoints are averaged are the row's own. Steps are scaled from the paper's (100k for base
rows, 300k for big: big stays 3x longer). Warm-up is 4% of 100k in the paper; here it is 40% of
the 400 steps (160), which gives the d_model = 64 base the peak learning rate of the demo
(about 1e-2): a 16-step warm-up would peak at 3e-2.
"""

import os

from tx.config import read_config

WIDTH = 8  # 512 -> 64, 2048 -> 256, d_k 64 -> 8
DEPTH = 2  # 6 -> 3, C1's 2 -> 1, C3's 8 -> 4
STEPS = 400  # for the paper's 100k steps
SCALE_KEYS = ("d_model", "d_ff", "d_k", "d_v")


def get_config(arg="table3.py:base"):
    """`arg` is a config of this directory with its own argument (`table3.py:A1`, `base.py`),
    optionally followed by a step budget for a 100k-step row: `table3.py:A1,steps=40`."""
    name, _, budget = arg.partition(",")
    steps = int(budget.removeprefix("steps=")) if budget else STEPS
    cfg = read_config(os.path.join(os.path.dirname(__file__), name))
    m, t = cfg.model, cfg.train
    for key in SCALE_KEYS:
        if m[key] is not None:
            m[key] = max(m[key] // WIDTH, 1)
    for key in ("num_layers", "num_encoder_layers", "num_decoder_layers"):
        if m[key] is not None:
            m[key] = max(m[key] // DEPTH, 1)
    m.max_len = 128
    m.dtype = "float32"  # its published figures are float32 (bf16: see configs/base.py)
    _demo_data(cfg)
    t.num_steps = max(t.num_steps * steps // 100_000, 1)
    cfg.optim.warmup_steps = max(cfg.optim.warmup_steps * steps // 10_000, 1)  # 4000 -> 160
    _checkpoints(cfg)
    cfg.decode.batch_tokens = 2048
    cfg.mesh.shape = dict(data=-1, fsdp=1, tensor=1)
    return cfg


def _demo_data(cfg):
    """A shared vocabulary of 1000 pieces and 1600 tokens per step, on the offline demo corpus
    (a config that reads the user's files, such as Table 4's treebank, keeps them)."""
    d = cfg.data
    d.vocab_size = 1000
    d.tokens_per_step = 1600
    d.num_workers = 1
    if d.source in ("text", "trees"):  # the user's own files (a treebank for Table 4)
        return
    d.source = "demo"
    d.demo_train_size = 20_000
    d.spm_sample_size = 40_000
    d.spm_split_digits = True
    d.max_len = 48
    d.bucket_lengths = (16, 24, 32, 48)
    d.pack = True


def _checkpoints(cfg):
    """Ten step-spaced checkpoints, so that averaging the last 5 (base) spans the same share
    of training as the paper's; dev perplexity measured once, at the end."""
    t = cfg.train
    t.checkpoint_every_steps = max(t.num_steps // 10, 1)
    t.checkpoint_every_secs = 0
    t.keep_checkpoints = max(cfg.decode.average_last, 2)
    t.log_every_steps = max(t.num_steps // 8, 1)
    t.eval_every_steps = t.num_steps
    t.eval_bleu_every_steps = 0
