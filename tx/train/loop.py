"""The training loop: resume, step, watch, evaluate, checkpoint, stop cleanly.

    train(cfg, workdir) -> final metrics

The data is prepared first (`prepare_data`: by a lone process itself; for several processes,
by `python -m tx prepare` beforehand). Then the latest checkpoint in `workdir` that can be read
is restored (state and data position) onto the current mesh, whatever mesh wrote it; unreadable
newer ones are set aside (tx.train.checkpoint). A run with none starts from random weights, or
from another run's parameters and vocabulary with `train.init_from` (tx.train.init_from).
SIGTERM / SIGINT save a checkpoint and return; a non-finite loss raises `Diverged`
(tx.train.monitor) naming the step, leaving earlier checkpoints intact. With `train.keep_best`,
each dev evaluation of `train.best_metric` is saved with its checkpoint and training stops early
after `train.early_stopping_patience` evaluations without a better one (tx.train.best).
The steps themselves are tx.train.trainer's; the paths and checks of the workdir, tx.workdir's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable

import jax
import ml_collections
import numpy as np

from tx import workdir as wd
from tx.data import dataset, vocabulary
from tx.data.pipeline import POSITION_KEY, BatchSpec, PlannedBatch, eval_batches, materialize
from tx.data.token_cache import TokenizedSplit
from tx.model.counting import train_flops_per_step
from tx.train import best, init_from, runcard, runlock
from tx.train import trainer as trainer_lib
from tx.train.checkpoint import Checkpointer
from tx.train.distributed import StopSignal, process_lost, sync_flags
from tx.train.events import Summaries
from tx.train.monitor import Progress, Throughput, Window, peak_tflops
from tx.train.prepare import check_prepared
from tx.train.runcard import Segment


@dataclasses.dataclass(kw_only=True)
class _Run:
    """What the loop works with, built once by `train`."""

    cfg: ml_collections.ConfigDict
    trainer: trainer_lib.Trainer
    ckpt: Checkpointer
    spec: BatchSpec
    progress: Progress
    summaries: Summaries
    dev: TokenizedSplit | None  # dev token ids, when dev loss is evaluated
    dev2: TokenizedSplit | None  # data.dev2_prefix's, evaluated beside dev (never chooses)
    bleu_hook: Callable[[object], dict] | None
    card: Segment  # this invocation's entry in the run card
    peak: float  # TFLOP/s of one device, for MFU
    criterion: best.Criterion | None  # keeping the best checkpoints by a dev score
    deadline: float | None  # time.monotonic() at which train.max_minutes runs out


def evaluate_loss(trainer, eval_fn, params, ids: TokenizedSplit, data, spec: BatchSpec) -> dict:
    """Dev loss, per-token perplexity and accuracy over EVERY pair of the split."""
    lengths = np.maximum(ids.src_lengths, ids.tgt_lengths)
    totals = {"loss": 0.0, "nll": 0.0, "correct": 0.0, "weight": 0.0}
    unpacked = dataclasses.replace(spec, pack=False)
    for length, idx in eval_batches(
        lengths, data.tokens_per_step, tuple(data.bucket_lengths), spec.row_multiple
    ):
        planned = PlannedBatch(length, [[int(i)] if i >= 0 else [] for i in idx])
        local = materialize(planned, ids, unpacked)
        sums = eval_fn(params, trainer.layout.global_batch(local))
        for k in totals:
            totals[k] += float(sums[k])
    w = max(totals["weight"], 1.0)
    return {
        "dev_loss": totals["loss"] / w,
        "dev_perplexity": math.exp(totals["nll"] / w),
        "dev_accuracy": totals["correct"] / w,
    }


def train(
    cfg: ml_collections.ConfigDict,
    workdir: str,
    progress_stream=None,
    bleu_hook=None,
    take_over_lock: bool = False,
) -> dict:
    """Trains until `cfg.train.num_steps`, or until stopped; returns the last metrics.

    `bleu_hook(params) -> dict of scores`, when given, runs every
    `train.eval_bleu_every_steps` (see tx.eval.evaluate.dev_bleu_hook: decoding lives downstream).
    The run holds the workdir's lock throughout (tx.train.runlock): a second run on the same
    workdir stops at once; `take_over_lock` takes a lock whose holder is known to be gone.
    """
    with runlock.hold(workdir, take_over=take_over_lock):
        return _train(cfg, workdir, progress_stream, bleu_hook)


def _train(cfg: ml_collections.ConfigDict, workdir: str, progress_stream, bleu_hook) -> dict:
    run, state, stream = _start(cfg, workdir, progress_stream, bleu_hook)
    lost = None
    try:
        return _loop(run, state, stream)
    except Exception as e:
        lost = process_lost(e)
        if lost is not None:
            raise lost from e
        raise
    finally:
        if lost is None:  # else Orbax would wait at a barrier for the dead process
            run.ckpt.close()
        run.summaries.close()


def _start(cfg: ml_collections.ConfigDict, workdir: str, progress_stream, bleu_hook):
    """(the run, its train state, its training stream): the config checked, the data prepared
    and the vocabulary recorded, the newest checkpoint restored (or a state initialised), this
    invocation's entry in the run card begun."""
    t = cfg.train
    wd.check_config(cfg, workdir)
    source = init_from.start(cfg, workdir)  # None: random weights, or resuming
    deadline = time.monotonic() + 60 * t.max_minutes if t.max_minutes else None
    started = time.time()
    tokenizer = prepare_data(cfg, workdir, source)
    prepare_secs = time.time() - started
    vocabulary.record(workdir, tokenizer)
    trainer = trainer_lib.build(cfg)
    criterion = best.Criterion.from_config(t)
    ckpt = Checkpointer(
        workdir,
        keep=t.keep_checkpoints,
        every_steps=t.checkpoint_every_steps,
        final_step=t.num_steps,
        keep_best=criterion.keep if criterion else 0,
        best_metric=criterion.metric if criterion else "dev_bleu",
    )
    state, position = _restore_or_init(trainer, ckpt, t.seed, source)
    peak = peak_tflops(configured=t.peak_tflops)
    card = Segment(cfg, workdir, int(state.step), peak)
    if source is not None:
        card.note(init_from=init_from.record(source, workdir, tokenizer))
    progress = Progress(t.num_steps, wd.is_main(), progress_stream, deadline)
    begins = f"start step {int(state.step)}" + (f" from {source.describe()}" if source else "")
    spec, stream, dev, dev2 = _data(
        cfg, workdir, tokenizer, trainer, position, card=card, progress=progress, begins=begins
    )
    card.entry["prepare_secs"] = round(prepare_secs, 3)
    run = _Run(
        cfg=cfg,
        trainer=trainer,
        ckpt=ckpt,
        spec=spec,
        progress=progress,
        summaries=Summaries(wd.tensorboard_dir(workdir), wd.is_main()),
        dev=dev,
        dev2=dev2,
        bleu_hook=bleu_hook,
        card=card,
        peak=peak,
        criterion=criterion,
        deadline=deadline,
    )
    return run, state, stream


def _data(cfg, workdir, tokenizer, trainer, position, *, card, progress, begins: str):
    """(batch spec, the training stream from `position`, dev and dev2 token ids when their loss
    is evaluated, else None); what they hold said on `progress` (ending with `begins`) and
    noted in `card`."""
    t = cfg.train
    spec = dataset.batch_spec(
        cfg.data,
        trainer.layout.data_shards * t.micro_batches,
        trainer.layout.process_rows,
    )
    build = jax.process_count() == 1  # several processes: `prepare` built it (prepare_data)
    stream, counts = dataset.train_stream(cfg.data, workdir, tokenizer, spec, position, build)
    progress.message(
        f"tx: {json.dumps(counts)} | mesh {dict(trainer.mesh.shape)} | rows per step by "
        f"length {stream.rows} | {begins}"
    )
    splits = {"train": (stream.split, counts)}
    for split in _dev_splits(cfg):
        splits[split] = (dataset.split_ids(cfg.data, workdir, tokenizer, split, build), None)
    record = runcard.data_record(cfg.data, tokenizer, splits)
    card.note(data=runcard.with_earlier_splits(card.card.get("data"), record))
    return spec, stream, splits.get("dev", (None,))[0], splits.get("dev2", (None,))[0]


def _dev_splits(cfg: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The dev sets whose loss training evaluates: dev, and dev2 where data.dev2_prefix is set."""
    if not cfg.train.eval_every_steps:
        return ()
    return ("dev", "dev2") if cfg.data.get("dev2_prefix") else ("dev",)


def prepare_data(cfg: ml_collections.ConfigDict, workdir: str, source=None):
    """The vocabulary (tx.data.vocabulary: `source`'s, when the run starts from one) and the
    token caches the run reads (train; dev when evaluated). One process builds what is missing.
    Several processes build nothing, so that none tokenizes while the others wait:
    `python -m tx prepare` has made them (tx.train.prepare), or every process stops at once
    naming what is missing and that command."""
    splits = ("train", *_dev_splits(cfg))
    if jax.process_count() > 1:
        return check_prepared(cfg, workdir, splits)
    source = init_from.vocabulary_source(cfg, workdir, source)
    tokenizer = vocabulary.obtain(cfg.data, workdir, model=cfg.model, source=source)
    for split in splits:
        dataset.split_ids(cfg.data, workdir, tokenizer, split)
    return tokenizer


def _restore_or_init(trainer, ckpt: Checkpointer, seed: int, source: init_from.Source | None):
    """The newest checkpoint that restores (see Checkpointer.restore_newest), else a new state:
    from `source`'s parameters (tx.train.init_from) or random ones."""
    restored = ckpt.restore_newest(trainer_lib.abstract_train_state(trainer))
    if restored is None and source is not None:
        logging.info("starting from %s", source.describe())
        return init_from.initial_state(trainer, source, seed), None
    if restored is None:
        return trainer_lib.create_train_state(trainer, seed), None
    step, state, position = restored
    logging.info("resuming from %s step %d", ckpt.directory, step)
    return state, position


def _loop(run: _Run, state, stream) -> dict:
    t = run.cfg.train
    step_fn = trainer_lib.kept_train_step(run.trainer, run.cfg)  # kept across commands
    eval_fn = trainer_lib.jit_eval_step(run.trainer)
    mc = run.trainer.model.config
    throughput = Throughput(jax.device_count(), run.peak)
    batches = dataset.prefetch(stream)
    step = int(state.step)
    started = last_save = time.monotonic()
    last = {}
    window = Window(lambda s, g, ls, lt: train_flops_per_step(mc, s, g, ls, lt))
    if _stopped_early(run, step):  # a finished run started again: nothing to do
        return {"step": step}
    with StopSignal() as stop:
        while step < t.num_steps:
            local = next(batches)
            position = _take_position(local)
            state, metrics = step_fn(state, run.trainer.layout.global_batch(local))
            step += 1
            window.add(step, metrics, (local["inputs"].shape[1], local["targets"].shape[1]))
            if step % t.log_every_steps == 0 or step == t.num_steps:
                last = _report(window, throughput, run.progress, run.summaries, step)
            evaluated = {}
            if t.eval_every_steps and run.dev is not None and step % t.eval_every_steps == 0:
                window.check()
                evaluated.update(_dev_eval(run, eval_fn, state, step))
                run.card.note(dev={"step": step, **{k: round(v, 6) for k, v in evaluated.items()}})
                if run.dev2 is not None:
                    dev2 = _dev_eval(run, eval_fn, state, step, "dev2")
                    run.card.note(dev2={"step": step, **{k: round(v, 6) for k, v in dev2.items()}})
                    last.update(dev2)
            if run.bleu_hook and t.eval_bleu_every_steps and step % t.eval_bleu_every_steps == 0:
                window.check()
                evaluated.update(_dev_bleu(run, state, step))
            last.update(evaluated)
            score = _score(run.criterion, evaluated)
            due = (t.checkpoint_every_steps and step % t.checkpoint_every_steps == 0) or (
                t.checkpoint_every_secs and time.monotonic() - last_save >= t.checkpoint_every_secs
            )
            out_of_time = run.deadline is not None and time.monotonic() >= run.deadline
            stopping, due = sync_flags(stop.received is not None or out_of_time, bool(due or score))
            if due or stopping or step == t.num_steps:
                window.check()  # never save a state after a non-finite step
                run.ckpt.save(step, state, position, score)
                last_save = time.monotonic()
                run.card.update(step, last_save - started, *window.totals())
            if stopping:
                why = f"{stop.received or 'stop'} received"
                why = f"train.max_minutes={t.max_minutes} reached" if out_of_time else why
                run.progress.message(f"tx: {why}: saved step {step}")
                if not out_of_time:  # a signal: end to end, a caller must not score a part
                    last["stopped"] = why
                break
            if score and _stopped_early(run, step):
                break
    window.check()
    run.ckpt.wait()
    return {**last, "step": step}


def _score(criterion: best.Criterion | None, evaluated: dict) -> dict | None:
    """{metric: value} to save with this step's checkpoint, when the criterion's metric was
    evaluated at this step."""
    if criterion is None or criterion.metric not in evaluated:
        return None
    return {criterion.metric: float(evaluated[criterion.metric])}


def _stopped_early(run: _Run, step: int) -> bool:
    """Whether `train.early_stopping_patience` evaluations in a row (up to `step`) have not
    beaten the best; if so, says so and records it in the run card. The same answer on every
    process: the scores are the checkpoints' own."""
    c = run.criterion
    if c is None or not c.patience:
        return False
    scores = run.ckpt.scores()
    since = best.evaluations_since_best(scores, c.metric, step, c.every)
    if since < c.patience:
        return False
    top = best.ranked(scores, c.metric)[0]
    run.progress.message(
        f"tx: early stop at step {step}: {c.metric} has not improved for {since} evaluations "
        f"(train.early_stopping_patience={c.patience}); best {scores[top]:.4g} at step {top}"
    )
    run.card.note(
        early_stop={"step": step, "metric": c.metric, "best_step": top, "best": scores[top]}
    )
    run.card.flush()
    return True


def _take_position(local: dict) -> dict:
    """The data position after this batch, carried through the prefetcher with the batch."""
    pos = local.pop(POSITION_KEY)
    return {"epoch": int(pos[0, 0]), "batch": int(pos[0, 1])}


def _report(window, throughput, progress, summaries, step) -> dict:
    metrics = window.drain(throughput)
    progress.update(step, metrics)
    summaries.scalars(step, {"train/" + k: v for k, v in metrics.items()})
    return metrics


def _dev_eval(run: _Run, eval_fn, state, step: int, split: str = "dev") -> dict:
    """Loss, perplexity and accuracy on `split` ("dev", or "dev2": logged beside it, named
    dev2_*, and never a checkpoint's score)."""
    ids = run.dev if split == "dev" else run.dev2
    result = evaluate_loss(run.trainer, eval_fn, state.params, ids, run.cfg.data, run.spec)
    result = {k.replace("dev_", f"{split}_"): v for k, v in result.items()}
    run.progress.message(
        f"step {step}: {split} loss {result[f'{split}_loss']:.3f} | {split} perplexity "
        f"{result[f'{split}_perplexity']:.2f} | {split} accuracy {result[f'{split}_accuracy']:.3f}"
    )
    run.summaries.scalars(step, {k.replace(f"{split}_", f"{split}/"): v for k, v in result.items()})
    return result


def _dev_bleu(run: _Run, state, step: int) -> dict:
    scores = run.bleu_hook(state.params)
    run.progress.message(f"step {step}: " + " | ".join(f"{k} {v:.2f}" for k, v in scores.items()))
    run.summaries.scalars(step, {f"dev/{k}": v for k, v in scores.items()})
    return {f"dev_{k}": v for k, v in scores.items()}
