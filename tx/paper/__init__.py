"""Whole runs: train -> average -> evaluate, the offline demo, the paper's tables, the road.

    end_to_end.py  one run: train -> average -> evaluate, for the demo, the tables and the road
    demo.py        the offline demo end to end
    tables.py      Tables 2, 3, 4: their rows, configs and the paper's figures
    reproduce.py   plan, run and report the tables
    *.json         what plans take their hours from (package data): compiled step times,
                   the real-scale pilot
    report.py      a table rendered from run cards
    road/          the seed's experiments on the road to the Transformer

May import: tx.tokens, tx.model, tx.config, tx.workdir, tx.data, tx.train, tx.infer,
tx.eval, tx.viz and this wing.
"""
