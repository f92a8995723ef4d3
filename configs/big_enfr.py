"""Transformer big, WMT 2014 English->French (Table 2: 41.8 BLEU).

Command:   python train.py --config configs/big_enfr.py --workdir runs/table2/big_enfr
Hardware:  the paper: 8 P100 GPUs, 300k steps, 3.5 days.
Expected:  newstest2014 BLEU 41.8 (tokenized), average of the last 20 checkpoints.
"""

import os

from tx.config import read_config


def get_config():
    cfg = read_config(os.path.join(os.path.dirname(__file__), "big.py"))
    cfg.data.tfds_name = "wmt14_translate/fr-en"
    cfg.data.tgt_lang = "fr"
    cfg.data.vocab_size = 32000
    cfg.model.dropout_rate = 0.1  # big EN-FR used P_drop = 0.1
    cfg.reference = dict(
        params_m=None, dev_ppl=None, dev_bleu=None, test_bleu=41.8, train_cost_flops=2.3e19
    )
    return cfg
