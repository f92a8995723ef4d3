"""A tiny model on a small demo corpus, for tests: seconds on one CPU core.

Command:   python train.py --config configs/tiny.py --workdir /tmp/tiny
Expected:  the loss falls within a few dozen steps; translations are not meaningful.
"""

import os

from tx.config import read_config


def get_config():
    cfg = read_config(os.path.join(os.path.dirname(__file__), "demo.py"))
    cfg.data.demo_train_size = 2000
    cfg.data.vocab_size = 300
    cfg.data.spm_sample_size = 4000
    cfg.data.max_len = 48
    cfg.data.bucket_lengths = (16, 32, 48)
    cfg.data.tokens_per_step = 512
    cfg.data.num_workers = 1
    cfg.model.d_model = 32
    cfg.model.num_heads = 4
    cfg.model.d_ff = 64
    cfg.model.num_layers = 2
    cfg.model.max_len = 128
    cfg.optim.warmup_steps = 20
    cfg.optim.learning_rate_scale = 1.0
    cfg.train.num_steps = 20
    cfg.train.checkpoint_every_steps = 10
    cfg.train.log_every_steps = 5
    cfg.train.eval_every_steps = 0
    cfg.decode.batch_tokens = 512
    # 50 dev and test pairs, each output at most 4 sub-words longer than its source: what the
    # tests prove of scoring and searching holds for any number of sentences and any length,
    # and every test that scores or translates with these defaults runs the same few searches
    # (one program per bucket, compiled once per suite) for few steps
    cfg.data.demo_eval_size = 50
    cfg.decode.max_extra_len = 4
    return cfg
