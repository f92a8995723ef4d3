"""The pictures wing: PNGs drawn from runs (matplotlib, Agg only).

    plots.py      the drawing: curves, heat maps, bars
    pictures.py   what the commands draw: learning curves, attention maps, positional encodings

May import: tx.tokens, tx.model, tx.config, tx.workdir, tx.data, tx.train, tx.infer,
tx.eval and this wing.
"""
