"""What each picture command draws: from a workdir (or nothing) to PNG files.

attention_pictures  one sentence's attention maps: encoder, decoder, encoder-decoder
curves_picture      learning curves of one or more runs, from their event files
positional_picture  the model's sinusoidal encodings
by_length_picture   BLEU per source-length bucket of an evaluation

Every function returns the paths it wrote; tx.viz.plots draws, this module gathers the data.
"""

from __future__ import annotations

import os
import posixpath

import numpy as np

from tx import storage
from tx import workdir as wd
from tx.infer.attention_maps import sentence_maps
from tx.model.layers import sinusoidal_encoding
from tx.tokens import EOS_ID
from tx.train.events import read_scalars
from tx.viz import plots

POSITIONS = 128  # positions drawn by positional_picture


class PictureError(ValueError):
    """Input a picture cannot be drawn from (an empty sentence, an odd d_model)."""


def attention_pictures(loaded, cfg, text: str, out_dir: str) -> list[str]:
    """Translates `text` with the configured search and draws its attention maps.

    Writes encoder_self_attention.png, decoder_self_attention.png and
    encoder_decoder_attention.png into `out_dir`; returns their paths.
    """
    from tx.infer.translate import translate_pairs

    if not text.strip():
        raise PictureError("--text is empty: give the sentence whose attention to draw")
    if loaded.model.config.family != "transformer":
        raise PictureError(
            "attention maps are read from a Transformer's attention layers; this run's "
            f"model.family is {loaded.model.config.family!r}"
        )
    [(source, output)] = translate_pairs(loaded, [text], cfg)
    maps = sentence_maps(loaded, [*source, EOS_ID], [*output, EOS_ID])
    translation = loaded.tokenizer.decode(output)
    produced = "query: the position producing this target sub-word"
    figures = {
        "encoder_self_attention.png": plots.attention_grid(
            maps.encoder,
            maps.source,
            maps.source,
            f"Encoder self-attention: {text.strip()}",
            "query: source sub-word",
            "key: source sub-word",
        ),
        "decoder_self_attention.png": plots.attention_grid(
            maps.decoder,
            maps.target,
            maps.decoder_inputs,
            f"Decoder self-attention: {translation}",
            produced,
            "key: decoder input (the translation shifted right)",
        ),
        "encoder_decoder_attention.png": plots.attention_grid(
            maps.cross,
            maps.target,
            maps.source,
            f"Encoder-decoder attention: {text.strip()} -> {translation}",
            produced,
            "key: source sub-word",
        ),
    }
    return [plots.save(fig, storage.join(out_dir, name)) for name, fig in figures.items()]


def run_names(workdirs: list[str]) -> list[str]:
    """Legend names: the directories' last parts, or the whole paths where those repeat."""
    whole = [w.rstrip("/") if storage.is_remote(w) else os.path.normpath(w) for w in workdirs]
    short = [posixpath.basename(w) if storage.is_remote(w) else os.path.basename(w) for w in whole]
    return short if len(set(short)) == len(short) else whole


def curves_picture(workdirs: list[str], out: str) -> str:
    """Learning curves of all `workdirs` on one figure, written to `out`."""
    for w in workdirs:
        wd.require_run(w)
    runs = {name: read_scalars(w) for name, w in zip(run_names(workdirs), workdirs, strict=True)}
    return plots.save(plots.curves_figure(runs), out)


def positional_encoding(d_model: int, positions: int = POSITIONS) -> np.ndarray:
    """[positions, d_model]: the encoding the model adds (tx.model.layers.sinusoidal_encoding)."""
    if d_model <= 0 or d_model % 2:
        raise PictureError(f"--d_model must be a positive even number, got {d_model}")
    return np.asarray(sinusoidal_encoding(np.arange(positions), d_model))


def positional_picture(d_model: int, out: str) -> str:
    return plots.save(plots.positional_figure(positional_encoding(d_model)), out)


def by_length_picture(result: dict, out: str) -> str:
    """The by-length buckets of an evaluate_split result as a bar chart."""
    title = f"{result['split']}: sacreBLEU by source length, {result['checkpoint']}"
    return plots.save(plots.by_length_figure(result["by_length"], title), out)
