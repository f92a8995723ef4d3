"""An LSTM encoder-decoder with attention (Bahdanau et al. 2015) on the offline demo.

Command:   python -m tx train --config configs/rnn_attention.py --workdir runs/rnn_attention
           `--config.model.attention=dot` or `=general` swaps in Luong et al.'s (2015) scores.
Hardware:  2 CPU cores, no download: the demo's data, budget and decoding, as
           configs/rnn_seq2seq.py (from which this differs in `model.attention` only).
Expected:  see README.md ("Road to the Transformer", `python -m tx road length`).
"""

import os

from tx.config import read_config


def get_config():
    cfg = read_config(os.path.join(os.path.dirname(__file__), "rnn_seq2seq.py"))
    cfg.model.attention = "additive"  # "additive" (Bahdanau) | "dot" | "general" (Luong)
    return cfg
