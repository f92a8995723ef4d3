"""The model wing: what a translation model is, independent of data, training and search.

    layers.py                the model's modes, embeddings, positional encodings, feed-forward,
                             LayerNorm, dropout
    splash.py                the Pallas splash attention kernel (TPU)
    kernels.py               how attention is computed: the kernel chosen, masking forms
    attention.py             multi-head attention: projections, modes, the decoding cache
    family_base.py           what every family shares: the config base (from_dict, dtypes,
                             vocabulary rows, checks), shift_right, reorder_cache
    transformer_config.py    the Transformer's frozen ModelConfig, its parameter and FLOP counts
    transformer.py           the Transformer (encoder and decoder stacks, encode / decode / step)
    transformer_decoding.py  its incremental decoding: the KV cache (init, resize), the decoder
    cells.py                 the recurrent cells (LSTM / GRU / tanh) and their layers
    rnn_config.py            the recurrent family's frozen RNNConfig, its parameter and FLOP counts
    rnn.py                   the recurrent seq2seq (with or without attention), its decoder
    families.py              `model.family` -> its config, module, decoding pieces and counts
    counting.py              parameter counts and FLOPs per step, any family (via families)

Imports run down this list. May import: tx.tokens and this wing.
"""
