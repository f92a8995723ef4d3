"""What translates, and lines of text through it: the library side of `translate` and `serve`.

An engine is tx's own search over one run's parameters, an ensemble of several runs or
checkpoints (tx.infer.decoders), or a CTranslate2 export (tx.infer.ct2). `translate_lines`
gives one output line per input line: the translation, the n-best list
(`index<TAB>score<TAB>text` lines) or `translation ||| i-j ...` (Marian's --alignment layout).
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_collections

from tx.config import ConfigError
from tx.infer.alignment import DEFAULT_LAYER, align
from tx.infer.translate import (
    LoadedModel,
    load_ensemble,
    load_model,
    nbest_lines,
    translate,
    translate_nbest,
    translate_pairs,
)

ENGINES = ("jax", "ctranslate2")


def load_engine(
    cfg: ml_collections.ConfigDict,
    *,
    engine: str = "jax",
    workdirs: Sequence[str] = (),
    checkpoints: Sequence[int] = (),
    model: str | None = None,
    device: str = "cpu",
    compute_type: str = "default",
    threads: int = 0,
):
    """A CTranslate2 export (`engine="ctranslate2"`, `model` its directory), or the parameters
    of one workdir, or an ensemble of several workdirs or checkpoints (see `members`)."""
    if engine not in ENGINES:
        raise ConfigError(f"--engine {engine!r}: one of {', '.join(ENGINES)}")
    if engine == "ctranslate2":
        from tx.infer import ct2

        if not model or workdirs:
            raise ConfigError("--engine ctranslate2 takes --model DIR (an export), no --workdir")
        return ct2.load(model, device, compute_type, threads)
    if model:
        raise ConfigError("--model DIR is for --engine ctranslate2")
    runs, steps = members(workdirs, checkpoints)
    if len(runs) == 1:
        return load_model(cfg, runs[0], steps[0])
    return load_ensemble(cfg, runs, steps)


def members(
    workdirs: Sequence[str], checkpoints: Sequence[int]
) -> tuple[list[str], list[int | None]]:
    """Ensemble members as (workdirs, steps) of one length: several workdirs (each at one
    step, or each at its latest), several checkpoints of one workdir, or pairs of both."""
    runs, steps = list(workdirs), list(checkpoints)
    if not runs:
        raise ConfigError("translating needs --workdir DIR (or --engine ctranslate2 --model DIR)")
    if len(runs) > 1 and len(steps) > 1 and len(steps) != len(runs):
        raise ConfigError(f"{len(runs)} --workdir but {len(steps)} --checkpoint values")
    if len(runs) == 1 and len(steps) > 1:
        runs = runs * len(steps)
    steps = steps if len(steps) == len(runs) else [steps[0] if steps else None] * len(runs)
    return runs, steps


def translate_lines(
    loaded,
    lines: list[str],
    cfg: ml_collections.ConfigDict,
    *,
    nbest: int | None = None,
    alignments: bool = False,
    align_layer: int | None = None,
) -> list[str]:
    """Output lines for `lines`: one translation each; with `nbest` N, N lines
    `index<TAB>score<TAB>text` each (tx.infer.translate.nbest_lines); with `alignments`,
    `translation ||| i-j ...` each (one model of tx's own search only)."""
    if alignments:
        if not isinstance(loaded, LoadedModel) or len(loaded.members) > 1:
            raise ConfigError("--alignments needs one model and --engine jax")
        return aligned_lines(loaded, lines, cfg, layer=align_layer)
    if nbest:
        width = cfg.decode.beam_size if cfg.decode.strategy == "beam" else 1
        if nbest > width:
            raise ConfigError(f"--nbest {nbest}: decode.{cfg.decode.strategy} keeps {width}")
        return nbest_lines(translate_nbest(loaded, lines, cfg, nbest))
    return translate(loaded, lines, cfg)


def aligned_lines(
    loaded: LoadedModel, lines: list[str], cfg: ml_collections.ConfigDict, *, layer: int | None
) -> list[str]:
    """`translation ||| i-j ...` per line, from decoder layer `layer`'s cross-attention
    (None: tx.infer.alignment.DEFAULT_LAYER; negative counts from the last)."""
    mc = loaded.model.config
    if mc.family != "transformer":
        raise ConfigError(
            "--alignments reads a Transformer's encoder-decoder attention; this run's "
            f"model.family is {mc.family!r}"
        )
    layer = DEFAULT_LAYER if layer is None else layer
    layers = mc.num_decoder_layers
    if not -layers <= layer < layers:
        raise ConfigError(
            f"--align_layer {layer}: the model has {layers} decoder layers "
            f"(0 to {layers - 1}; -1 is the last)"
        )
    pairs = translate_pairs(loaded, lines, cfg)
    links = align(loaded, pairs, layer)
    decode = loaded.tokenizer.decode
    return [f"{decode(out)} ||| {a}" for (_, out), a in zip(pairs, links, strict=True)]
