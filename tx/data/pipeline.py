"""Batches holding about the same number of tokens: the paper's "approximately 25000 source
tokens and 25000 target tokens" per batch (section 5.1), counted as real (non-padding) tokens.

Training pairs go to the smallest bucket length L >= max(source, target length), and XLA
compiles one step per bucket length. A bucket's batch has a fixed number of rows, chosen from
the training data itself: `tokens_per_step` divided by the mean real tokens per row and side
((source + target) / 2) of the pairs in that bucket. That number does not depend on the
devices: the batch is then padded with empty rows (no loss, no gradient) up to a multiple of
the data shards x micro-batches (`BatchSpec.padded`), so 1 GPU and a 512-chip slice train on
the same real tokens per step. So every shape is static and the average step holds the paper's
budget of real tokens on each side (within a few percent: the sides differ in length), whatever
the padding. Real rows never hold more than 2 x tokens_per_step padded tokens per side
(`max_rows`), which bounds memory. With `pack=True`,
pairs are instead packed several to a row of `max_len` tokens (segment ids and per-pair
positions keep them apart in the model), and the rows per batch come from the mean fill.

The plan of an epoch is a pure function of (lengths, seed, epoch), so the data position
(epoch, batch) is all a checkpoint needs to resume with the very next batch. Every process
computes the same plan and materialises only its own rows of each global batch: the rows the
layout says its devices hold (`BatchSpec.local_rows`, tx.train.sharding.Layout.process_rows).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator

import numpy as np

from tx.data.mixing import Mix
from tx.data.sources import DataError
from tx.data.token_cache import TokenizedSplit

# Real rows per batch may move this far off the token budget to fill every data shard, rather
# than compute empty rows: the budget holds within 1% on any device count.
ROW_TOLERANCE = 0.01
PACK_SAMPLE = 100_000  # pairs packed to measure the mean fill of a packed row
POSITION_KEY = "data_position"  # [1, 2] int32 (epoch, batch) after this batch: for checkpoints
Batch = dict[str, np.ndarray]  # inputs/targets [rows, L] int32 (+ *_segments, *_positions)


@dataclasses.dataclass(frozen=True)
class BatchSpec:
    """How training batches are cut.

    `row_multiple` = data shards (global) x micro-batches: each batch's rows are padded to a
    multiple of it. `local_rows(n)` = the global rows of an n-row batch this process supplies
    (tx.train.sharding.Layout.process_rows); None = all of them (one process).
    """

    bucket_lengths: tuple[int, ...]
    tokens_per_step: int  # real tokens per side per step, on average (global)
    max_len: int
    row_multiple: int = 1
    local_rows: Callable[[int], np.ndarray] | None = None
    seed: int = 0
    pack: bool = False

    def max_rows(self, length: int) -> int:
        """The most real rows a batch of padded length `length` holds: 2 x the budget."""
        return max(2 * self.tokens_per_step // length, 1)

    def rows_for(self, length: int, mean_tokens: float) -> int:
        """Real rows whose tokens per side add up to the budget, given the mean real tokens
        per row and side, on any number of devices: a multiple of `row_multiple` when one
        lies within ROW_TOLERANCE of the budget (no empty rows to compute), else the nearest
        whole number (`padded` then adds empty rows)."""
        target = self.tokens_per_step / max(mean_tokens, 1.0)
        cap = self.max_rows(length)
        aligned = round(target / self.row_multiple) * self.row_multiple
        if 0 < aligned <= cap and abs(aligned - target) <= ROW_TOLERANCE * target:
            return aligned
        return min(max(round(target), 1), cap)

    def padded(self, rows: int) -> int:
        """`rows` rounded up to a multiple of `row_multiple`: every data shard and micro-batch
        gets as many rows; the added rows are empty (they carry no loss)."""
        return -(-rows // self.row_multiple) * self.row_multiple

    def mine(self, rows: int) -> np.ndarray:
        """The global rows of a `rows`-row batch this process materializes."""
        return np.arange(rows) if self.local_rows is None else self.local_rows(rows)


@dataclasses.dataclass(frozen=True)
class PlannedBatch:
    """One global batch: its padded length and, per row, the example indices it holds."""

    length: int
    rows: list[list[int]]  # example indices per row; [] for a padding row


def filter_for_training(split: TokenizedSplit, max_len: int) -> tuple[np.ndarray, dict]:
    """Indices of usable training pairs, and counts of those dropped (empty or too long).

    A side that is empty holds only EOS (length 1).
    """
    src, tgt = split.src_lengths, split.tgt_lengths
    empty = (src <= 1) | (tgt <= 1)
    too_long = ~empty & ((src > max_len) | (tgt > max_len))
    keep = np.flatnonzero(~empty & ~too_long)
    counts = {
        "total": len(src),
        "kept": len(keep),
        "dropped_empty": int(empty.sum()),
        "dropped_too_long": int(too_long.sum()),
    }
    logging.info("training pairs: %s", counts)
    return keep, counts


def step_rows(
    src_len: np.ndarray,
    tgt_len: np.ndarray,
    keep: np.ndarray,
    spec: BatchSpec,
    mix: Mix | None = None,
) -> dict[int, int]:
    """Real (non-empty) rows per batch for each padded length: the real-token budget, on
    average, independent of the devices (batches are then padded: `BatchSpec.padded`). With a
    `mix`, the means are over the pairs as an epoch draws them (`Mix.frequency`).

    A pure function of the lengths (and `spec.seed`, data.shuffle_seed, for packing), so every
    process and every resume computes the same shapes.
    """
    mean_side = (src_len[keep] + tgt_len[keep]) / 2.0  # real tokens per pair and side
    if spec.pack:  # the mean fill of a packed row, measured on a sample of the data
        rng = np.random.default_rng([spec.seed, 2**31])
        pool = keep if mix is None else mix.draw(keep, spec.seed, 0, rng)  # epoch 0's pairs
        sample = rng.permutation(pool)[:PACK_SAMPLE]
        packed = _pack_rows(sample, src_len, tgt_len, spec)
        fill = (src_len[sample].sum() + tgt_len[sample].sum()) / 2.0 / len(packed)
        return {spec.max_len: spec.rows_for(spec.max_len, fill)}
    bucket_of = _bucket_of(keep, src_len, tgt_len, spec)
    drawn = None if mix is None else mix.frequency(keep)
    out = {}
    for b, length in enumerate(spec.bucket_lengths):
        here = bucket_of == b
        if not here.any():
            mean = float(length)
        elif drawn is None:
            mean = mean_side[here].mean()
        else:
            mean = np.average(mean_side[here], weights=drawn[here])
        out[int(length)] = spec.rows_for(int(length), mean)
    return out


def _bucket_of(order, src_len, tgt_len, spec: BatchSpec) -> np.ndarray:
    """Index of the smallest bucket length >= the longer side, per pair of `order`."""
    longest = np.maximum(src_len[order], tgt_len[order])
    return np.searchsorted(np.asarray(spec.bucket_lengths), longest)


def plan_epoch(
    src_len: np.ndarray,
    tgt_len: np.ndarray,
    keep: np.ndarray,
    spec: BatchSpec,
    epoch: int,
    *,
    rows: dict[int, int] | None = None,
    mix: Mix | None = None,
) -> list[PlannedBatch]:
    """The shuffled list of global batches of one epoch (every kept pair exactly once; with a
    `mix`, each corpus's share of pairs, `Mix.draw`).

    `rows` is `step_rows(...)` (computed here when not given).
    """
    rows = rows or step_rows(src_len, tgt_len, keep, spec, mix)
    rng = np.random.default_rng([spec.seed, epoch])
    if mix is None:
        order = keep[rng.permutation(len(keep))]
    else:
        order = mix.draw(keep, spec.seed, epoch, rng)
    if spec.pack:
        packed = _pack_rows(order, src_len, tgt_len, spec)
        batches = _batch_packed(packed, spec.max_len, rows[spec.max_len], spec.padded)
    else:
        batches = _bucket(order, src_len, tgt_len, spec, rows)
    return [batches[i] for i in rng.permutation(len(batches))]


def _bucket(order, src_len, tgt_len, spec: BatchSpec, rows_of: dict) -> list[PlannedBatch]:
    bucket_of = _bucket_of(order, src_len, tgt_len, spec)
    batches = []
    for b, length in enumerate(spec.bucket_lengths):
        members = order[bucket_of == b]
        rows = rows_of[int(length)]
        for start in range(0, len(members), rows):
            chunk = [[i] for i in members[start : start + rows].tolist()]  # Python ints
            # Empty rows: the bucket's last batch, and up to a multiple of the data shards.
            chunk += [[] for _ in range(spec.padded(rows) - len(chunk))]
            batches.append(PlannedBatch(int(length), chunk))
    return batches


def _pack_rows(order, src_len, tgt_len, spec: BatchSpec, open_rows: int = 16) -> list[list[int]]:
    """First-fit packing into rows of `max_len` on both sides, over a window of open rows.

    Plain Python lists, not NumPy scalars: every command that trains plans its epoch with this
    loop, over every pair, before its first step."""
    length = spec.max_len
    done: list[list[int]] = []
    rows: list[list[int]] = []  # the window's open rows, oldest first, and their room left
    src_room: list[int] = []
    tgt_room: list[int] = []
    pairs = zip(order.tolist(), src_len[order].tolist(), tgt_len[order].tolist(), strict=True)
    for i, s, t in pairs:
        for k, room in enumerate(src_room):
            if s <= room and t <= tgt_room[k]:
                rows[k].append(i)
                src_room[k] = room - s
                tgt_room[k] -= t
                break
        else:
            if len(rows) == open_rows:
                done.append(rows.pop(0))
                del src_room[0], tgt_room[0]
            rows.append([i])
            src_room.append(length - s)
            tgt_room.append(length - t)
    done.extend(rows)
    return done


def _batch_packed(
    done: list[list[int]], length: int, rows_per_batch: int, padded
) -> list[PlannedBatch]:
    batches = []
    for start in range(0, len(done), rows_per_batch):
        rows = done[start : start + rows_per_batch]
        rows += [[] for _ in range(padded(rows_per_batch) - len(rows))]
        batches.append(PlannedBatch(length, rows))
    return batches


def materialize(batch: PlannedBatch, split: TokenizedSplit, spec: BatchSpec) -> Batch:
    """This process's rows of a global batch (`spec.mine`) as padded int32 arrays."""
    mine = [batch.rows[i] for i in spec.mine(len(batch.rows))]
    shape = (len(mine), batch.length)
    out = {k: np.zeros(shape, np.int32) for k in ("inputs", "targets")}
    if spec.pack:
        for k in ("inputs_segments", "inputs_positions", "targets_segments", "targets_positions"):
            out[k] = np.zeros(shape, np.int32)
    for r, members in enumerate(mine):
        src_at = tgt_at = 0
        for seg, i in enumerate(members, 1):
            src, tgt = split.src(i), split.tgt(i)
            out["inputs"][r, src_at : src_at + len(src)] = src
            out["targets"][r, tgt_at : tgt_at + len(tgt)] = tgt
            if spec.pack:
                out["inputs_segments"][r, src_at : src_at + len(src)] = seg
                out["targets_segments"][r, tgt_at : tgt_at + len(tgt)] = seg
                out["inputs_positions"][r, src_at : src_at + len(src)] = np.arange(len(src))
                out["targets_positions"][r, tgt_at : tgt_at + len(tgt)] = np.arange(len(tgt))
            src_at, tgt_at = src_at + len(src), tgt_at + len(tgt)
    return out


class TrainStream:
    """Endless training batches for this process, resumable from a data position.

    `position` is {"epoch": e, "batch": b}: the next batch `next()` returns.
    """

    def __init__(
        self,
        split: TokenizedSplit,
        keep: np.ndarray,
        spec: BatchSpec,
        position: dict | None = None,
        mix: Mix | None = None,
    ):
        if len(keep) == 0:
            raise DataError(
                "no training pairs left after filtering: every pair is empty or longer than "
                "data.max_len (or was left out by data.on_bad_line=skip)"
            )
        self.split, self.keep, self.spec, self.mix = split, keep, spec, mix
        self._src_len, self._tgt_len = split.src_lengths, split.tgt_lengths
        self.rows = step_rows(self._src_len, self._tgt_len, keep, spec, mix)
        position = position or {"epoch": 0, "batch": 0}
        self.epoch, self.batch = int(position["epoch"]), int(position["batch"])
        self._plan = self._plan_of(self.epoch)

    def _plan_of(self, epoch: int) -> list[PlannedBatch]:
        src, tgt = self._src_len, self._tgt_len
        return plan_epoch(src, tgt, self.keep, self.spec, epoch, rows=self.rows, mix=self.mix)

    @property
    def position(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch}

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        while self.batch >= len(self._plan):
            self.epoch, self.batch = self.epoch + 1, 0
            self._plan = self._plan_of(self.epoch)
        planned = self._plan[self.batch]
        self.batch += 1
        out = materialize(planned, self.split, self.spec)
        out[POSITION_KEY] = np.array([[self.epoch, self.batch]], np.int32)
        return out

    def epoch_plan(self) -> list[PlannedBatch]:
        return self._plan


def padding_efficiency(
    split: TokenizedSplit, keep: np.ndarray, spec: BatchSpec, mix: Mix | None = None
) -> dict:
    """Over one epoch's batches: non-padding / all tokens (both sides together), the mean
    real source and target tokens per step (the paper's "about 25,000" each), and per batch
    length its rows (real and padded to the shards) and mean real tokens per batch."""
    src_len, tgt_len = split.src_lengths, split.tgt_lengths
    plan = plan_epoch(src_len, tgt_len, keep, spec, 0, mix=mix)
    total = sum(2 * len(b.rows) * b.length for b in plan)
    per_length = {}
    real_src = real_tgt = 0
    for length, rows in step_rows(src_len, tgt_len, keep, spec, mix).items():
        batches = [b for b in plan if b.length == length]
        pairs = _pairs_of(batches)
        src, tgt = int(src_len[pairs].sum()), int(tgt_len[pairs].sum())
        real_src, real_tgt = real_src + src, real_tgt + tgt
        per_length[length] = {
            "rows": rows,
            "padded_rows": spec.padded(rows),
            "batches": len(batches),
            "real_src_tokens": src / max(len(batches), 1),
            "real_tgt_tokens": tgt / max(len(batches), 1),
        }
    return {
        "efficiency": (real_src + real_tgt) / total,
        "batches": len(plan),
        "real_src_tokens_per_step": real_src / len(plan),
        "real_tgt_tokens_per_step": real_tgt / len(plan),
        "shapes": sorted({(len(b.rows), b.length) for b in plan}),
        "by_length": per_length,
    }


def _pairs_of(batches: list[PlannedBatch]) -> np.ndarray:
    """The indices of every pair in `batches`' rows, as one array (summed at once: per-row
    sums cost seconds at WMT's millions of pairs)."""
    return np.array([i for b in batches for row in b.rows for i in row], np.int64)


def wmt_like(n: int, seed: int = 0) -> TokenizedSplit:
    """Sub-word lengths shaped like WMT'14 EN-DE under a 37k BPE (log-normal, mean ~30 per
    side, target ~1.1x source), token ids all 0: for planning batches when the data itself
    is not at hand (`tx info --devices N`, benchmarks, tests)."""
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(3.2, 0.55, n).astype(int), 2, 400)
    tgt = np.clip((src * rng.normal(1.1, 0.12, n)).astype(int), 2, 400)
    return TokenizedSplit(
        np.zeros(src.sum(), np.int32),
        np.concatenate([[0], np.cumsum(src)]),
        np.zeros(tgt.sum(), np.int32),
        np.concatenate([[0], np.cumsum(tgt)]),
    )


def eval_batches(
    lengths: np.ndarray, batch_tokens: int, bucket_lengths: tuple[int, ...], row_multiple: int = 1
) -> list[tuple[int, np.ndarray]]:
    """Length-sorted batches over ALL sentences (nothing dropped), for decoding and dev loss.

    Returns (padded length, indices) pairs; indices hold -1 for padding rows, so each bucket
    length has one static shape. Sentences longer than the last bucket get lengths rounded up
    to a multiple of it, so nothing is ever truncated.
    """
    step = bucket_lengths[-1]
    order = np.argsort(lengths, kind="stable")
    out = []
    start = 0
    while start < len(order):
        longest = int(lengths[order[start]])
        for b in bucket_lengths:
            if b >= longest:
                length = b
                break
        else:
            length = -(-longest // step) * step
        rows = max(row_multiple, (batch_tokens // length) // row_multiple * row_multiple)
        members = [i for i in order[start : start + rows] if lengths[i] <= length]
        idx = np.full(rows, -1, np.int64)
        idx[: len(members)] = members
        out.append((length, idx))
        start += len(members)
    return out
