"""Translating text with a trained workdir: parameters, vocabulary, batching, beam search.

Sentences are encoded, sorted into length buckets (one compiled decoder per bucket), decoded
with beam search and returned in input order. Empty lines give empty translations.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tx import checkpoint, sharding
from tx.config import model_config
from tx.data.pipeline import eval_batches
from tx.data.tokenizer import EOS_ID, MODEL_FILENAME, PAD_ID, Tokenizer
from tx.decode import beam_search
from tx.model import Transformer, beam_decoder
from tx.train import abstract_train_state, make_trainer


class CheckpointNotFound(FileNotFoundError):
    pass


class StaleAverage(ValueError):
    """The newest averaged model predates training checkpoints written after it."""


@dataclasses.dataclass
class LoadedModel:
    model: Transformer
    params: object
    tokenizer: Tokenizer
    source: str  # which checkpoint the parameters came from
    mesh: Mesh


def load_model(
    cfg: ml_collections.ConfigDict,
    workdir: str,
    checkpoint_step: int | None = None,
    averaged: bool | None = None,
) -> LoadedModel:
    """Parameters of `workdir`: the newest averaged checkpoint if there is one (unless
    `averaged=False`), else the latest training checkpoint, or `checkpoint_step` if given.

    An averaged model that training has moved past is refused (StaleAverage), not silently
    used or rewritten: translating must not write into a run that may still be training.
    """
    tokenizer = Tokenizer(os.path.join(workdir, MODEL_FILENAME))
    mc = model_config(cfg)
    mesh = sharding.make_mesh(cfg.mesh)
    trainer = make_trainer(cfg, mc, mesh, sharding.rules(cfg.mesh))
    abstract = abstract_train_state(trainer)
    avg_steps = checkpoint.averaged_steps(workdir)
    if checkpoint_step is None and avg_steps and averaged is not False:
        _check_fresh(cfg, workdir, avg_steps[-1])
        params, meta = checkpoint.restore_averaged(workdir, avg_steps[-1], abstract.params)
        source = f"averaged/{avg_steps[-1]} (steps {meta['averaged_steps']})"
    else:
        ckpt = checkpoint.Checkpointer(workdir, keep=None)
        step = checkpoint_step if checkpoint_step is not None else ckpt.latest_step()
        if step is None or step not in ckpt.all_steps():
            raise CheckpointNotFound(
                f"no checkpoint {'at step ' + str(step) if step is not None else ''} in "
                f"{ckpt.directory} (available: {ckpt.all_steps()})"
            )
        state, _ = ckpt.restore(step, abstract)
        ckpt.close()
        params, source = state.params, f"checkpoints/{step}"
    logging.info("translating with %s", source)
    return LoadedModel(Transformer(mc), params, tokenizer, source, mesh)


def _check_fresh(cfg: ml_collections.ConfigDict, workdir: str, averaged_step: int) -> None:
    ckpt = checkpoint.Checkpointer(workdir, keep=None)
    steps = checkpoint.averaging_steps(
        ckpt.all_steps(), cfg.train.checkpoint_every_steps, cfg.train.num_steps
    )
    ckpt.close()
    if steps and steps[-1] > averaged_step:
        raise StaleAverage(
            f"{os.path.join(workdir, checkpoint.AVERAGED, str(averaged_step))} is stale: training "
            f"has written checkpoints up to step {steps[-1]} since. Average again with "
            f"`python -m tx average --workdir {workdir}` (the last {cfg.decode.average_last}), "
            "or choose one training checkpoint with --checkpoint STEP"
        )


@functools.partial(jax.jit, static_argnames=("model", "beam_size", "alpha", "max_steps"))
def _decode_batch(
    model: Transformer, params, inputs, max_lengths, *, beam_size: int, alpha: float, max_steps: int
):
    """inputs [b, s] -> (sequences [b, k, max_steps], scores [b, k])."""
    tokens_to_logits, cache = beam_decoder(model, params, inputs, beam_size, max_steps)
    return beam_search(
        tokens_to_logits, cache, max_lengths, beam_size=beam_size, alpha=alpha, max_steps=max_steps
    )


def translate_ids(
    loaded: LoadedModel,
    sources: list[np.ndarray],
    decode_cfg,
    bucket_lengths: tuple[int, ...],
    nbest: int = 1,
):
    """Token ids (each ending in EOS) -> per sentence a list of (ids, score), best first."""
    beam = decode_cfg.beam_size
    lengths = np.array([len(s) for s in sources], np.int64)
    results: list = [None] * len(sources)
    shards = sharding.data_shards(loaded.mesh)
    for length, idx in eval_batches(lengths, decode_cfg.batch_tokens, bucket_lengths, shards):
        rows = len(idx)
        inputs = np.zeros((rows, length), np.int32)
        max_lengths = np.zeros(rows, np.int32)  # padding rows: decode nothing
        for r, i in enumerate(idx):
            if i >= 0:
                inputs[r, : lengths[i]] = sources[i]
                # input length + 50, counting the source's sub-words without its EOS
                max_lengths[r] = lengths[i] - 1 + decode_cfg.max_extra_len
        max_steps = length - 1 + decode_cfg.max_extra_len + 1
        inputs_g, max_lengths_g = _to_global(loaded.mesh, inputs, max_lengths)
        seqs, scores = _decode_batch(
            loaded.model,
            loaded.params,
            inputs_g,
            max_lengths_g,
            beam_size=beam,
            alpha=float(decode_cfg.alpha),
            max_steps=max_steps,
        )
        seqs, scores = _to_host(seqs), _to_host(scores)
        for r, i in enumerate(idx):
            if i >= 0:
                results[i] = [(_strip(seqs[r, j]), float(scores[r, j])) for j in range(nbest)]
    return results


def _to_global(mesh: Mesh, inputs: np.ndarray, max_lengths: np.ndarray):
    """Every process computes the same batch and contributes its own rows (decoding is split
    across processes and devices along the batch)."""
    count, index = jax.process_count(), jax.process_index()
    per = inputs.shape[0] // count
    rows = slice(index * per, (index + 1) * per)
    return (
        jax.make_array_from_process_local_data(
            NamedSharding(mesh, P(sharding.BATCH_AXES, None)), inputs[rows]
        ),
        jax.make_array_from_process_local_data(
            NamedSharding(mesh, P(sharding.BATCH_AXES)), max_lengths[rows]
        ),
    )


def _to_host(x: jax.Array) -> np.ndarray:
    if jax.process_count() == 1:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _strip(ids: np.ndarray) -> np.ndarray:
    """Output ids up to (not including) EOS."""
    ends = np.flatnonzero((ids == EOS_ID) | (ids == PAD_ID))
    return ids[: ends[0]] if len(ends) else ids


def translate(
    loaded: LoadedModel, sentences: list[str], cfg: ml_collections.ConfigDict, nbest: int = 1
) -> list[str]:
    """Detokenized translations (best hypothesis), in input order; "" for empty input."""
    positional_limit = cfg.model.max_len if cfg.model.positional == "learned" else None
    todo = [(i, s) for i, s in enumerate(sentences) if s.strip()]
    ids = [np.asarray(loaded.tokenizer.encode(s.strip()), np.int32) for _, s in todo]
    if positional_limit is not None:
        for (i, _), x in zip(todo, ids, strict=True):
            if len(x) - 1 + cfg.decode.max_extra_len + 1 > positional_limit:
                raise ValueError(
                    f"input line {i + 1}: {len(x)} tokens + "
                    f"{cfg.decode.max_extra_len} exceed model.max_len="
                    f"{positional_limit} of the learned position table"
                )
    out = [""] * len(sentences)
    if not todo:
        return out
    hyps = translate_ids(loaded, ids, cfg.decode, tuple(cfg.data.bucket_lengths), nbest)
    for (i, _), h in zip(todo, hyps, strict=True):
        out[i] = loaded.tokenizer.decode(h[0][0])
    return out
