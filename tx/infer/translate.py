"""Translating text with a trained workdir: parameters, vocabulary, batching, search.

Sentences are encoded, sorted into length buckets (one compiled decoder per bucket), decoded
with the configured search (tx.infer.search: beam by default) and returned in input order. Empty
lines give empty translations.

The text-level functions (translate, translate_nbest, translate_pairs) also drive another
engine: anything with `tokenizer`, `source` and `search_ids(ids, decode_cfg, nbest)` with
translate_ids's contract (tx.infer.ct2: a CTranslate2 export). Several models decode as one
ensemble (tx.infer.decoders) through `ensemble`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from tx import storage
from tx import workdir as wd
from tx.config import ConfigError, load_config, model_config
from tx.data.pipeline import eval_batches
from tx.data.tokenizer import Tokenizer
from tx.data.vocabulary import check_source_vocabulary, run_tokenizer
from tx.infer.decoders import decoder, ensemble_decoder
from tx.infer.safeguards import max_output_length
from tx.infer.search import Strategy
from tx.model.families import build_model
from tx.model.transformer_config import TABLES
from tx.tokens import EOS_ID, PAD_ID
from tx.train import best, checkpoint, kept, sharding
from tx.train.averaging import averaged_meta, averaged_steps, restore_averaged


class StaleAverage(ValueError):
    """The newest averaged model predates training checkpoints written after it."""


@dataclasses.dataclass
class LoadedModel:
    model: object  # tx.model.families.build_model: a Transformer or an RNNSeq2Seq
    params: object
    tokenizer: Tokenizer
    source: str  # which checkpoint the parameters came from
    layout: sharding.Layout
    # Ensemble: further (model, params) members decoded with this one (see `ensemble`).
    others: tuple = ()

    @property
    def members(self) -> tuple:
        """((model, params), ...): this model first, then the ensemble's others."""
        return ((self.model, self.params), *self.others)


def load_model(
    cfg: ml_collections.ConfigDict, run: str | wd.Selection, checkpoint: int | str | None = None
) -> LoadedModel:
    """The parameters `run` selects: a tx.workdir.Selection, or its text with `checkpoint` (a
    step, "best" by train.best_metric (tx.train.best), "averaged/STEP"); by default the run's
    newest average, else its latest training checkpoint. Only parameters are read: no
    optimizer is built.

    A newest average that training has moved past is refused (StaleAverage), not silently
    used or rewritten: translating must not write into a run that may still be training. An
    average named by its step is used as it is.
    """
    selection = run if isinstance(run, wd.Selection) else wd.Selection.parse(run, checkpoint)
    workdir = selection.run
    tokenizer = check_source_vocabulary(run_tokenizer(workdir), cfg.model, workdir)
    mc = model_config(cfg)
    layout = sharding.layout(cfg.mesh)
    # no optimizer built, no memory allocated; traced once and kept (tx.train.kept)
    target = layout.placed(kept.abstract_params(mc))
    chosen = _choose(cfg, selection)
    if chosen.kind == wd.AVERAGE:
        params, source = _read_average(workdir, chosen.step, target)
    else:
        params, source = _read_checkpoint(workdir, chosen.step, target)
        if selection.step == "best":
            source += f" (best by {cfg.train.best_metric})"
    logging.info("translating with %s", source)
    return LoadedModel(build_model(mc), params, tokenizer, source, layout)


def _choose(cfg: ml_collections.ConfigDict, selection: wd.Selection) -> wd.Selection:
    """`selection` with its kind and step (tx.workdir.Selection.resolve): "best" by the run's
    dev scores; by default the newest average, unless training has moved past it
    (StaleAverage), else the latest checkpoint."""
    workdir = selection.run
    if selection.step == "best":
        selection = dataclasses.replace(selection, step=_best_step(cfg, workdir))
    chosen = selection.resolve(lambda: averaged_steps(workdir), lambda: _steps(workdir))
    if selection.kind is None and chosen.kind == wd.AVERAGE:
        _check_fresh(cfg, workdir, chosen.step)
    return chosen


def _read_average(workdir: str, step: int, target) -> tuple[object, str]:
    """(parameters, source) of the average of `step`."""
    try:
        params, meta = restore_averaged(workdir, step, target)
    except checkpoint.UnreadableCheckpoint as e:
        raise checkpoint.UnreadableCheckpoint(
            f"{e}; average again with `python -m tx average --workdir {workdir}`, or choose "
            "a training checkpoint with --checkpoint STEP"
        ) from None
    if "imported_from" in meta:  # tx.infer.huggingface_io: no training of its own
        return params, f"averaged/{step} (imported from {meta['imported_from']})"
    how = f"best by {meta['metric']}: " if meta.get("selection") == "best" else ""
    return params, f"averaged/{step} ({how}steps {meta['averaged_steps']})"


def _read_checkpoint(workdir: str, step: int, target) -> tuple[object, str]:
    """(parameters, source) of the training checkpoint of `step`."""
    ckpt = checkpoint.Checkpointer(workdir, keep=None)
    try:  # never another checkpoint in its place: the user asked for this model
        return ckpt.restore_params(step, target), f"checkpoints/{step}"
    except checkpoint.UnreadableCheckpoint as e:
        others = [s for s in ckpt.all_steps() if s != step]
        raise checkpoint.UnreadableCheckpoint(
            f"{e}; choose another with --checkpoint STEP (available: {others})"
        ) from None
    finally:
        ckpt.close()


def _steps(workdir: str) -> list[int]:
    """The run's complete training checkpoints."""
    ckpt = checkpoint.Checkpointer(workdir, keep=None)
    try:
        return ckpt.all_steps()
    finally:
        ckpt.close()


def _best_step(cfg: ml_collections.ConfigDict, workdir: str) -> int:
    metric = cfg.train.best_metric
    ckpt = checkpoint.Checkpointer(workdir, keep=None)
    try:
        scores = ckpt.scores(metric)
    finally:
        ckpt.close()
    if not scores:
        raise wd.CheckpointNotFound(
            f"--checkpoint best: no checkpoint in {ckpt.directory} carries a {metric} score "
            "(train with train.keep_best > 0)"
        )
    return best.ranked(scores, metric)[0]


def _check_fresh(cfg: ml_collections.ConfigDict, workdir: str, averaged_step: int) -> None:
    """An average of the last checkpoints is stale once training has saved a later one; an
    average of the best ones, once the best ones are others."""
    try:
        meta = averaged_meta(workdir, averaged_step)
    except checkpoint.UnreadableCheckpoint:  # the restore that follows names the damage
        meta = {}
    if meta.get("selection") == "best":
        _check_best_fresh(workdir, averaged_step, meta)
        return
    steps = checkpoint.averaging_steps(
        _steps(workdir), cfg.train.checkpoint_every_steps, cfg.train.num_steps
    )
    if steps and steps[-1] > averaged_step:
        raise StaleAverage(
            f"{storage.join(wd.averaged_dir(workdir), str(averaged_step))} is stale: training "
            f"has written checkpoints up to step {steps[-1]} since. Average again with "
            f"`python -m tx average --workdir {workdir}` (the last {cfg.decode.average_last}), "
            "or choose one training checkpoint with --checkpoint STEP"
        )


def _check_best_fresh(workdir: str, averaged_step: int, meta: dict) -> None:
    ckpt = checkpoint.Checkpointer(workdir, keep=None)
    scores = ckpt.scores(meta["metric"])
    ckpt.close()
    now = best.best_steps(scores, meta["metric"], len(meta["averaged_steps"]))
    if now != meta["averaged_steps"]:
        raise StaleAverage(
            f"{storage.join(wd.averaged_dir(workdir), str(averaged_step))} is stale: it averages "
            f"the best checkpoints by {meta['metric']} when they were {meta['averaged_steps']}; "
            f"they are now {now}. Average again with `python -m tx average --workdir {workdir} "
            "--which best`, or choose one training checkpoint with --checkpoint STEP"
        )


def ensemble(members: list[LoadedModel]) -> LoadedModel:
    """One LoadedModel that decodes with all `members` (tx.infer.decoders); they must share the
    vocabulary. The first member's layout is used."""
    first = members[0]
    for m in members[1:]:
        if m.tokenizer.fingerprint != first.tokenizer.fingerprint:
            raise ValueError(
                f"ensemble members need one vocabulary: {m.tokenizer.path} differs from "
                f"{first.tokenizer.path}"
            )
    others = tuple(pair for m in members[1:] for pair in m.members)
    source = " + ".join(m.source for m in members)
    return dataclasses.replace(first, source=source, others=first.others + others)


def load_ensemble(
    cfg: ml_collections.ConfigDict, workdirs: list[str], steps: list[int | str | None]
) -> LoadedModel:
    """Workdir i's parameters at steps[i] (load_model's `checkpoint`: None, a step, "best",
    "averaged/STEP"), as one ensemble. `cfg` (the first run's) sets the search and the input
    limits: a member whose learned position table is shorter than that limit is refused, not
    silently clamped."""
    members = []
    for w, step in zip(workdirs, steps, strict=True):
        member_cfg = cfg if w == workdirs[0] else load_config(wd.require_run(w))
        limit = cfg.model.max_len if cfg.model.positional in TABLES else None
        mine = member_cfg.model.max_len if member_cfg.model.positional in TABLES else None
        if mine is not None and (limit is None or mine < limit):
            raise ConfigError(
                f"ensemble member {w}: its learned position table ({mine}) is shorter than "
                "the first model's input limit; put it first"
            )
        members.append(load_model(member_cfg, w, step))
    return ensemble(members)


def _search_batch(
    models: tuple,
    params: tuple,
    inputs,
    max_lengths,
    seed: int,
    number: int,
    *,
    strategy: Strategy,
    max_steps: int,
):
    """inputs [b, s] -> (sequences [b, n, max_steps], scores [b, n]), n = strategy.width.

    One model, or an ensemble of several (`models` and `params` are tuples, one per member).
    Compiled once per shape, and kept traced across commands (tx.train.kept). Sampling
    draws from `seed` folded with the batch's `number`."""
    # PRNGKey keeps an int seed's low 32 bits (x64 off): the same key as PRNGKey(seed) eagerly
    args = (params, inputs, max_lengths, np.uint32(seed % 2**32), np.int32(number))
    key = {"models": models, "strategy": strategy, "max_steps": max_steps}
    return kept.program("_search", _jitted_search(**key), key, args)(*args)


@functools.cache
def _jitted_search(models: tuple, strategy: Strategy, max_steps: int):
    return jax.jit(
        functools.partial(_search, models=models, strategy=strategy, max_steps=max_steps)
    )


def _search(
    params: tuple, inputs, max_lengths, seed, number, *, models: tuple, strategy, max_steps: int
):
    """_search_batch's program. The sampling key is made inside it: made outside, its few
    operations would be compiled afresh by every command (JAX's compilation cache keeps no
    program that compiles that fast)."""
    rng = jax.random.fold_in(jax.random.PRNGKey(seed), number)
    decoders = [
        decoder(m, p, inputs, strategy.width, max_steps)
        for m, p in zip(models, params, strict=True)
    ]
    one = decoders[0] if len(decoders) == 1 else ensemble_decoder(decoders)
    return strategy(one, max_lengths, max_steps, rng)


def translate_ids(
    loaded: LoadedModel,
    sources: list[np.ndarray],
    decode_cfg,
    bucket_lengths: tuple[int, ...],
    nbest: int = 1,
):
    """Token ids (each ending in EOS) -> per sentence a list of (ids, score), best first.

    The search is `decode_cfg.strategy`; `nbest` <= its width (the beam size, or 1).
    Sampling draws from `decode_cfg.seed` folded with the batch's number, so the same input
    in the same order gives the same samples.
    """
    strategy = Strategy.from_config(decode_cfg)
    if not 1 <= nbest <= strategy.width:
        raise ValueError(f"nbest={nbest}: decode.strategy={strategy.name!r} keeps {strategy.width}")
    lengths = np.array([len(s) for s in sources], np.int64)
    extra = int(decode_cfg.max_extra_len)
    ratio = float(decode_cfg.get("max_length_ratio", 0.0))  # absent before the key existed
    results: list = [None] * len(sources)
    layout = loaded.layout
    batches = eval_batches(lengths, decode_cfg.batch_tokens, bucket_lengths, layout.data_shards)
    for number, (length, idx) in enumerate(batches):
        rows = len(idx)
        inputs = np.zeros((rows, length), np.int32)
        max_lengths = np.zeros(rows, np.int32)  # padding rows: decode nothing
        for r, i in enumerate(idx):
            if i >= 0:
                inputs[r, : lengths[i]] = sources[i]
                # input length + 50 (or less by the ratio), counting the source's sub-words
                # without its EOS
                max_lengths[r] = max_output_length(int(lengths[i]) - 1, extra, ratio)
        mine = layout.process_rows(rows)
        seqs, scores = _search_batch(
            tuple(m for m, _ in loaded.members),
            tuple(p for _, p in loaded.members),
            layout.global_batch({"inputs": inputs[mine]})["inputs"],
            layout.global_rows(max_lengths[mine]),
            int(decode_cfg.seed),
            number,
            strategy=strategy,
            max_steps=max_output_length(length - 1, extra, ratio) + 1,  # the bucket's longest
        )
        seqs, scores = _to_host(seqs), _to_host(scores)
        for r, i in enumerate(idx):
            if i >= 0:
                results[i] = [(_strip(seqs[r, j]), float(scores[r, j])) for j in range(nbest)]
    return results


def _to_host(x: jax.Array) -> np.ndarray:
    if jax.process_count() == 1:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _strip(ids: np.ndarray) -> np.ndarray:
    """Output ids up to (not including) EOS."""
    ends = np.flatnonzero((ids == EOS_ID) | (ids == PAD_ID))
    return ids[: ends[0]] if len(ends) else ids


def translate(loaded, sentences: list[str], cfg: ml_collections.ConfigDict) -> list[str]:
    """Detokenized translations (best hypothesis), in input order; "" for empty input."""
    pairs = translate_pairs(loaded, sentences, cfg)
    return [loaded.tokenizer.decode(out) for _, out in pairs]


def translate_nbest(
    loaded, sentences: list[str], cfg: ml_collections.ConfigDict, nbest: int
) -> list[list[tuple[str, float]]]:
    """Per sentence its `nbest` best (translation, score), best first; an empty line gives
    [("", 0.0)] (nothing is decoded: the empty translation, log-probability 0)."""
    out = [[("", 0.0)] for _ in sentences]
    todo, _, hyps = _search_lines(loaded, sentences, cfg, nbest)
    for i, h in zip(todo, hyps, strict=True):
        out[i] = [(loaded.tokenizer.decode(ids), score) for ids, score in h]
    return out


def nbest_lines(nbest: list[list[tuple[str, float]]], start: int = 0) -> list[str]:
    """`index \t score \t translation` lines (index from `start`, in input order), best first."""
    return [
        f"{i}\t{score:.6f}\t{text}" for i, hyps in enumerate(nbest, start) for text, score in hyps
    ]


def translate_pairs(
    loaded, sentences: list[str], cfg: ml_collections.ConfigDict
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per sentence (source ids, best output ids), both without EOS; empty for empty input.

    What `translate` decodes, for callers that need the sub-words too (alignments).
    """
    empty = np.zeros(0, np.int32)
    out = [(empty, empty)] * len(sentences)
    todo, ids, hyps = _search_lines(loaded, sentences, cfg, 1)
    for i, x, h in zip(todo, ids, hyps, strict=True):
        out[i] = (x[:-1], h[0][0])
    return out


def _search_lines(loaded, sentences: list[str], cfg: ml_collections.ConfigDict, nbest: int):
    """(numbers of the non-empty lines, their ids with EOS, their hypotheses [(ids, score)])."""
    learned = cfg.model.get("positional") in TABLES  # only Transformers have positions
    positional_limit = cfg.model.max_len if learned else None
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    ids = [np.asarray(loaded.tokenizer.encode(sentences[i].strip()), np.int32) for i in todo]
    if positional_limit is not None:
        for i, x in zip(todo, ids, strict=True):
            if len(x) - 1 + cfg.decode.max_extra_len + 1 > positional_limit:
                raise ValueError(
                    f"input line {i + 1}: {len(x)} tokens + "
                    f"{cfg.decode.max_extra_len} exceed model.max_len="
                    f"{positional_limit} of the learned position table"
                )
    if not todo:
        return [], [], []
    if isinstance(loaded, LoadedModel):
        hyps = translate_ids(loaded, ids, cfg.decode, tuple(cfg.data.bucket_lengths), nbest)
    else:  # another engine (tx.infer.ct2)
        hyps = loaded.search_ids(ids, cfg.decode, nbest)
    return todo, ids, hyps
