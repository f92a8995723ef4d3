"""The model wing: what a translation model is, independent of data, training and search.

    layers.py        embeddings, attention (fused and explicit), feed-forward, dropout, masks
    transformer.py   the Transformer (encode / decode, KV cache, incremental decoding)
    cells.py, rnn.py the recurrent family (LSTM / GRU / tanh cells, seq2seq with attention)
    families.py      `model.family` -> its frozen config, its module, its decoding pieces
    counting.py      parameter counts and FLOPs per step, per family

May import: tx.tokens and this wing.
"""
