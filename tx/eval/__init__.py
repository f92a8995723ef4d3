"""The evaluation wing: scores and evaluating a run.

    metrics.py    sacreBLEU, the paper's tokenized (compound-split) BLEU, chrF, BLEU by length
    evalb.py      EVALB's bracketing F1 (COLLINS.prm) for Table 4's parsing
    evaluate.py   translate a split of a run, write the hypotheses, score them

May import: tx.tokens, tx.model, tx.config, tx.workdir, tx.data, tx.train, tx.infer and this wing.
"""
