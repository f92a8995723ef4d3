"""Transformer big, WMT 2014 English->German (Table 2: 28.4 BLEU; Table 3 big row).

Command:   python train.py --config configs/big.py --workdir runs/table2/big_ende
Hardware:  the paper: 8 P100 GPUs, 1.0 s/step, 300k steps, 3.5 days. On TPU slices: the
           compiler's estimates in docs/accelerators.md (python benchmarks/compiled_table.py).
Expected:  newstest2013 perplexity about 4.33 (Table 3), newstest2014 BLEU 28.4 (tokenized,
           compound-split, average of the last 20 checkpoints).
"""

import os

from tx.config import read_config


def get_config():
    cfg = read_config(os.path.join(os.path.dirname(__file__), "base.py"))
    cfg.model.d_model = 1024
    cfg.model.d_ff = 4096
    cfg.model.num_heads = 16
    cfg.model.dropout_rate = 0.3  # P_drop = 0.3 for big EN-DE (0.1 for EN-FR)
    cfg.train.num_steps = 300_000
    cfg.train.checkpoint_every_steps = 600  # 10 minutes at the paper's 1.0 s/step
    cfg.decode.average_last = 20
    cfg.reference = dict(
        params_m=213.0, dev_ppl=4.33, dev_bleu=26.4, test_bleu=28.4, train_cost_flops=2.3e19
    )
    return cfg
