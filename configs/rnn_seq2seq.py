"""Sequence to sequence (Sutskever et al. 2014) on the offline demo: an LSTM encoder-decoder
whose decoder sees the source only through the encoder's final state (the fixed-length summary).

Command:   python -m tx train --config configs/rnn_seq2seq.py --workdir runs/rnn_seq2seq
           (then average / translate / evaluate --workdir runs/rnn_seq2seq, as any run)
Hardware:  2 CPU cores, no download: the demo's data, budget (600 steps of 3,800 real tokens
           per side) and decoding; only the model section differs from configs/demo.py.
Expected:  see README.md ("Road to the Transformer"): `python -m tx road length` trains this,
           configs/rnn_attention.py and configs/demo.py side by side and prints BLEU by length.
Sutskever et al. used 4 layers of 1,000 units, source reversal and plain SGD; here one width
(d_model) for embeddings and units, the demo's Adam schedule, and reversal off by default
(`--config.model.reverse_source=True` turns it on).
"""

import os

import ml_collections

from tx.config import read_config


def get_config():
    cfg = read_config(os.path.join(os.path.dirname(__file__), "demo.py"))
    cfg.model = ml_collections.ConfigDict(
        dict(
            family="rnn",  # tx.model.families: "transformer" (absent = this) | "rnn"
            vocab_size=cfg.data.get_ref("vocab_size"),  # = data.vocab_size: one shared vocabulary
            d_model=256,  # embedding width = hidden units of every layer
            num_layers=1,  # stacked recurrent layers in the encoder and in the decoder
            cell="lstm",  # "lstm" | "gru" | "tanh" (Elman)
            attention="none",  # the fixed-length summary; see configs/rnn_attention.py
            reverse_source=False,  # Sutskever et al.: read the source backwards
            forget_bias=1.0,  # LSTM forget-gate bias at init (the gate starts about 0.73 open)
            dropout_rate=0.1,  # embeddings, between layers, before the softmax
            share_embeddings=True,  # source embedding = target embedding = pre-softmax weights
            dtype="float32",  # as configs/demo.py (bf16 on CPUs: see configs/base.py)
            param_dtype="float32",
        )
    )
    cfg.data.pack = False  # one pair per row: the recurrent state must not run across pairs
    cfg.optim.grad_clip_norm = 1.0  # recurrent gradients can explode (Pascanu et al. 2013)
    cfg.reference = dict(params_m=None, dev_ppl=None, dev_bleu=None, test_bleu=None)
    return cfg
