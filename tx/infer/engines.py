"""What translates, and lines of text through it: the library side of `translate` and `serve`.

An engine is tx's own search over one run's parameters, an ensemble of several runs or
checkpoints (tx.infer.decoders), or a CTranslate2 export (tx.infer.ct2). `with_search` sets the
everyday search settings over a config's decode section. `translate_lines` gives one output
line per input line: the translation, the n-best list (`index<TAB>score<TAB>text` lines) or
`translation ||| i-j ...` (Marian's --alignment layout). `arriving` batches lines as they
arrive on a stream (a pipe, a terminal), as fairseq-interactive and marian-decoder do.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence

import ml_collections

from tx.config import ConfigError, validate
from tx.data.sources import DataError, decoded_lines
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
    device: str | None = None,
    compute_type: str | None = None,
    threads: int | None = None,
):
    """A CTranslate2 export (`engine="ctranslate2"`, `model` its directory), or the parameters
    of one workdir, or an ensemble of several workdirs or checkpoints (see `members`).
    `device`, `compute_type` and `threads` are CTranslate2's (default cpu, as exported, one
    thread per core); the JAX engine refuses them (it runs where JAX_PLATFORMS says)."""
    if engine not in ENGINES:
        raise ConfigError(f"--engine {engine!r}: one of {', '.join(ENGINES)}")
    if engine == "ctranslate2":
        from tx.infer import ct2

        if not model or workdirs:
            raise ConfigError("--engine ctranslate2 takes --model DIR (an export), no --workdir")
        return ct2.load(model, device or "cpu", compute_type or "default", threads or 0)
    if model:
        raise ConfigError("--model DIR is for --engine ctranslate2")
    ct2_only = {"--device": device, "--compute-type": compute_type, "--threads": threads}
    given = [name for name, value in ct2_only.items() if value is not None]
    if given:
        raise ConfigError(
            f"{' and '.join(given)}: for --engine ctranslate2 only (the JAX engine runs on "
            "the devices JAX finds; JAX_PLATFORMS=cpu or cuda chooses)"
        )
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


# with_search's keyword -> the decode key it sets.
SEARCH_KEYS = {"beam": "beam_size", "alpha": "alpha", "batch_tokens": "batch_tokens"}


def with_search(cfg: ml_collections.ConfigDict, **settings) -> ml_collections.ConfigDict:
    """A copy of `cfg` with search settings over its decode section, checked as a config's
    are: `beam` N (beam search of width N: strategy "beam", beam_size N), `alpha`,
    `batch_tokens`, or any decode key by its name (`strategy="greedy"`, `max_extra_len=20`).
    None leaves a setting as the config has it; no settings give `cfg` itself."""
    given = {SEARCH_KEYS.get(k, k): v for k, v in settings.items() if v is not None}
    if not given:
        return cfg
    if "beam" in settings and settings["beam"] is not None:
        given["strategy"] = "beam"
    out = cfg.copy_and_resolve_references()
    for key, value in given.items():
        if key not in out.decode:
            known = ", ".join([*SEARCH_KEYS, *sorted(set(out.decode) - set(SEARCH_KEYS))])
            raise ConfigError(f"no search setting {key!r} (the settings: {known})")
        try:
            out.decode[key] = value
        except TypeError as e:
            raise ConfigError(f"decode.{key} cannot be {value!r}: {e}") from None
    validate(out)
    return out


def translate_lines(
    loaded,
    lines: list[str],
    cfg: ml_collections.ConfigDict,
    *,
    nbest: int | None = None,
    alignments: bool = False,
    align_layer: int | None = None,
    first: int = 0,
) -> list[str]:
    """Output lines for `lines`: one translation each; with `nbest` N, N lines
    `index<TAB>score<TAB>text` each (tx.infer.translate.nbest_lines; indices count from
    `first`, the number of lines before these); with `alignments`, `translation ||| i-j ...`
    each (one model of tx's own search only)."""
    if alignments:
        check_alignments(loaded, align_layer)
        return aligned_lines(loaded, lines, cfg, layer=align_layer)
    if nbest:
        check_nbest(cfg, nbest)
        return nbest_lines(translate_nbest(loaded, lines, cfg, nbest), start=first)
    return translate(loaded, lines, cfg)


def check_nbest(cfg: ml_collections.ConfigDict, nbest: int) -> None:
    """An n-best list no longer than the search keeps (the beam's width, or 1)."""
    width = cfg.decode.beam_size if cfg.decode.strategy == "beam" else 1
    if nbest > width:
        raise ConfigError(f"--nbest {nbest}: decode.{cfg.decode.strategy} keeps {width}")


def check_alignments(loaded, layer: int | None) -> int:
    """The decoder layer whose cross-attention aligns (None: tx.infer.alignment.DEFAULT_LAYER;
    negative counts from the last), if `loaded` can align: one Transformer of tx's own."""
    if not isinstance(loaded, LoadedModel) or len(loaded.members) > 1:
        raise ConfigError("--alignments needs one model and --engine jax")
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
            f"--align-layer {layer}: the model has {layers} decoder layers "
            f"(0 to {layers - 1}; -1 is the last)"
        )
    return layer


def aligned_lines(
    loaded: LoadedModel, lines: list[str], cfg: ml_collections.ConfigDict, *, layer: int | None
) -> list[str]:
    """`translation ||| i-j ...` per line, from decoder layer `layer`'s cross-attention
    (see `check_alignments`)."""
    layer = check_alignments(loaded, layer)
    pairs = translate_pairs(loaded, lines, cfg)
    links = align(loaded, pairs, layer)
    decode = loaded.tokenizer.decode
    return [f"{decode(out)} ||| {a}" for (_, out), a in zip(pairs, links, strict=True)]


_END = object()  # what `arriving`'s reader queues after the last line


def arriving(stream, name: str, budget: int, count: Callable[[str], int]) -> Iterator[list[str]]:
    """The lines of the binary `stream` (named `name` in errors), in batches as they arrive:
    each batch is the lines read by the time the previous one was handed on (at least one;
    at most `budget` tokens by `count`, unless its one line has more). A thread reads ahead,
    so a pipe that stays open or a terminal gets each line's translation once it is typed,
    and a file piped in whole gets full batches. Lines are checked as tx.data.sources reads
    a file (UTF-8, a BOM, CRLF): the batch before an invalid line is handed on, then the
    line's DataError is raised."""
    lines: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        try:
            for _, text, problem in decoded_lines(stream, name):
                lines.put(DataError(problem) if problem else text)
        except Exception as e:  # the UTF-16 check: raised where the batches are taken
            lines.put(e)
        lines.put(_END)

    threading.Thread(target=read, daemon=True, name="tx-stdin").start()
    waiting = None  # a line read but not yet batched: it begins the next batch
    while True:
        item = lines.get() if waiting is None else waiting
        waiting = None
        if item is _END:
            return
        if isinstance(item, Exception):
            raise item
        batch, tokens = [item], count(item)
        while True:
            try:
                item = lines.get_nowait()
            except queue.Empty:
                break
            more = count(item) if isinstance(item, str) else budget + 1
            if tokens + more > budget:  # the end, an error, or over the budget: next time
                waiting = item
                break
            batch.append(item)
            tokens += more
        yield batch
