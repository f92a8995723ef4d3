"""The inference wing: from a trained run to translations.

    settings.py        the config's `decode` section: fields, defaults, checks (tx.config's layer)
    search.py          beam search, greedy, sampling: pure functions over a Decoder
    decoders.py        a model's Decoder (any family), and ensembles of them
    translate.py       load a run (or an ensemble), translate sentences, n-best lists
    engines.py         which engine translates (a run, an ensemble, an export); lines through it
    attention_maps.py  the attention weights of a translation, per layer and head
    alignment.py       word alignments from cross-attention
    export.py, ct2.py  CTranslate2 export, and translating through CTranslate2
    server.py          the HTTP JSON translation server

May import: tx.tokens, tx.model, tx.config, tx.workdir, tx.data, tx.train and this wing.
settings.py sits at tx.config's layer: it imports nothing of tx above tx.model.
"""
