"""Table 3 variations of the base model on EN-DE (dev newstest2013, no checkpoint averaging).

Command:   python train.py --config configs/table3.py:B1 --workdir runs/table3/B1
Rows:      base, A1-A4 (heads), B1-B2 (d_k), C1-C7 (size), D1-D4 (regularisation),
           E (learned positions), big. The whole table: python -m tx reproduce --table 3.
Expected:  the row's PPL and BLEU from Table 3 (e.g. A1: 5.29 / 24.9, C7: 4.75 / 26.2).
"""

import os

from tx.config import read_config

# Row -> (params in millions or None, dev PPL, dev BLEU) as printed in Table 3.
PAPER = {
    "base": (65, 4.92, 25.8),
    "A1": (None, 5.29, 24.9),
    "A2": (None, 5.00, 25.5),
    "A3": (None, 4.91, 25.8),
    "A4": (None, 5.01, 25.4),
    "B1": (58, 5.16, 25.1),
    "B2": (60, 5.01, 25.4),
    "C1": (36, 6.11, 23.7),
    "C2": (50, 5.19, 25.3),
    "C3": (80, 4.88, 25.5),
    "C4": (28, 5.75, 24.5),
    "C5": (168, 4.66, 26.0),
    "C6": (53, 5.12, 25.4),
    "C7": (90, 4.75, 26.2),
    "D1": (None, 5.77, 24.6),
    "D2": (None, 4.95, 25.5),
    "D3": (None, 4.67, 25.3),
    "D4": (None, 5.47, 25.7),
    "E": (None, 4.92, 25.7),
    "big": (213, 4.33, 26.4),
}

# Row -> overrides of configs/base.py, exactly the non-blank cells of Table 3.
ROWS = {
    "base": {},
    "A1": dict(num_heads=1, d_k=512, d_v=512),
    "A2": dict(num_heads=4, d_k=128, d_v=128),
    "A3": dict(num_heads=16, d_k=32, d_v=32),
    "A4": dict(num_heads=32, d_k=16, d_v=16),
    "B1": dict(d_k=16),
    "B2": dict(d_k=32),
    "C1": dict(num_layers=2),
    "C2": dict(num_layers=4),
    "C3": dict(num_layers=8),
    "C4": dict(d_model=256, d_k=32, d_v=32),
    "C5": dict(d_model=1024, d_k=128, d_v=128),
    "C6": dict(d_ff=1024),
    "C7": dict(d_ff=4096),
    "D1": dict(dropout_rate=0.0),
    "D2": dict(dropout_rate=0.2),
    "D3": dict(label_smoothing=0.0),
    "D4": dict(label_smoothing=0.2),
    "E": dict(positional="learned"),
    "big": {},  # configs/big.py as it is
}


def get_config(row="A1"):
    if row not in ROWS:
        raise ValueError(f"unknown Table 3 row {row!r}; choose one of {', '.join(ROWS)}")
    base = "big.py" if row == "big" else "base.py"
    cfg = read_config(os.path.join(os.path.dirname(__file__), base))
    for key, value in ROWS[row].items():
        section = cfg.train if key == "label_smoothing" else cfg.model
        section[key] = value
    cfg.decode.average_last = 1  # Table 3 reports single checkpoints
    params_m, ppl, bleu = PAPER[row]
    # The paper leaves params blank where a row keeps the base's size: 65, inferred.
    cfg.reference = dict(
        params_m=float(params_m or 65),
        params_m_inferred=params_m is None,
        dev_ppl=ppl,
        dev_bleu=bleu,
        test_bleu=None,
    )
    return cfg
