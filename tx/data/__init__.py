"""The data wing: sources -> SentencePiece -> token id cache -> token-budget batches, per host.

    settings.py      the config's `data` section: fields, defaults, checks (tx.config's layer)
    sources.py       TFDS WMT, plain text files, the demo corpus, treebanks: sentence pairs
    external.py      TFDS in a bucket (a local mirror), sacreBLEU's copies of the test sets
    demo_corpus.py   the built-in offline corpus (synthetic, generated)
    trees.py         Penn Treebank trees, their linearization for parsing as translation
    tokenizer.py     SentencePiece: train, load, encode (one model, or Marian's two mapped)
    token_cache.py   token ids on disk, written once per run
    pipeline.py      filtering, length buckets, batches sized by tokens, the (seed, epoch) plan
    dataset.py       one split of a run's data, from config to batches
    vocabulary.py    a run's vocabulary, its one owner: obtained, copied, verified, recorded

May import: tx.tokens, tx.model, tx.config, tx.workdir and this wing.
settings.py sits at tx.config's layer: it imports nothing of tx above tx.model.
"""
