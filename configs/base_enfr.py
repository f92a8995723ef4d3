"""Transformer base, WMT 2014 English->French (Table 2: 38.1 BLEU).

Command:   python train.py --config configs/base_enfr.py --workdir runs/table2/base_enfr
Hardware:  as configs/base.py; the 36M-sentence corpus makes data preparation take about an hour.
Expected:  newstest2014 BLEU 38.1 (tokenized), average of the last 5 checkpoints.
"""

import os

from tx.config import read_config


def get_config():
    cfg = read_config(os.path.join(os.path.dirname(__file__), "base.py"))
    cfg.data.tfds_name = "wmt14_translate/fr-en"
    cfg.data.tgt_lang = "fr"
    cfg.data.vocab_size = 32000  # the paper's 32k word-piece vocabulary
    cfg.reference = dict(
        params_m=None, dev_ppl=None, dev_bleu=None, test_bleu=38.1, train_cost_flops=3.3e18
    )
    return cfg
