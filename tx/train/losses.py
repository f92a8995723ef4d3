"""Label-smoothed cross-entropy (section 5.4), returning sums so devices and hosts add up.

Optionally with token-level unlikelihood (Welleck et al. 2020, "Neural Text Generation with
Unlikelihood Training", section 5.1): at each target position, -log(1 - p(c)) for every token c
that came earlier in the same target sentence and is not the one due there. Its slope in p(c)
is 1 / (1 - p(c)), steep only where the model is already sure of a repeat the reference does
not make, the start of a repetition loop; through the logits it pushes the candidate's own
down by p(c) and hands that mass to the others.
The paper's objective has none (`train.unlikelihood = 0`).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


def smoothed_targets_entropy(vocab_size: int, label_smoothing: float) -> float:
    """Entropy of the smoothed target distribution: the loss of a perfect prediction."""
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab_size - 1)
    ent = -confidence * math.log(confidence)
    if label_smoothing > 0:
        ent -= (vocab_size - 1) * low * math.log(low)
    return ent


# 1 - p(c) is floored here, as Welleck et al.'s code does; a candidate above it sends no gradient.
UNLIKELY_FLOOR = 1e-5


def unlikelihood_candidates(targets: Array, weights: Array, segments: Array | None) -> Array:
    """[b, t, s] float: 1 where target s is a candidate at position t: earlier in the same
    sentence (`segments` tells packed sentences apart; None: one per row), a real token, the
    first of its kind there (a candidate set counts each token once), and not the one due at t.

    Args:
      targets, weights: [b, t] as in `cross_entropy`; segments: [b, t] int or None.
    """
    length = targets.shape[1]
    seg = jnp.zeros_like(targets) if segments is None else segments
    same_sentence = seg[:, :, None] == seg[:, None, :]  # [b, t, s]
    earlier = jnp.arange(length)[None, :, None] > jnp.arange(length)[None, None, :]
    same_token = targets[:, :, None] == targets[:, None, :]
    before = earlier & same_sentence
    seen = jnp.any(same_token & before, axis=-1)  # [b, s]: the token at s came before in it
    real = weights[:, None, :] > 0
    return (before & real & ~seen[:, None, :] & ~same_token).astype(jnp.float32)


def _candidate_log_probs(table: Array, targets: Array) -> Array:
    """[b, t, V] per-position table, [b, s] targets -> [b, t, s]: table[b, t, targets[b, s]]."""
    index = jnp.broadcast_to(targets[:, None, :], (*table.shape[:2], targets.shape[1]))
    return jnp.take_along_axis(table, index, axis=-1)


def cross_entropy(
    logits: Array,
    targets: Array,
    weights: Array,
    label_smoothing: float = 0.1,
    unlikelihood: float = 0.0,
    segments: Array | None = None,
):
    """Label-smoothed cross-entropy and plain NLL, summed over non-padding tokens.

    The smoothed target puts 1 - eps on the true token and eps / (V - 1) on each other token.
    `loss` has the smoothed distribution's entropy subtracted, so a perfect smoothed prediction
    scores 0; `nll` is the unsmoothed negative log-likelihood (its mean gives perplexity).

    Args:
      logits: [b, t, V] float.
      targets: [b, t] int.
      weights: [b, t] float, 1 for real tokens and 0 for padding.
      label_smoothing: epsilon_ls in [0, 1).
      unlikelihood: its weight alpha; > 0 adds the sums `unlikelihood` and `objective` (loss +
        alpha x unlikelihood, what training differentiates). segments: [b, t] or None.

    Returns:
      dict of scalar sums: loss, nll, correct (argmax == target), weight (number of tokens);
      with `unlikelihood` > 0 also unlikelihood (the sum of -log(1 - p(c)) over candidates) and
      objective.
    """
    vocab_size = logits.shape[-1]
    # float32 at least (float64 stays: the equivalence tests run in float64).
    log_probs = jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), -1)
    true_lp = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # [b, t]
    nll = -true_lp
    if label_smoothing > 0:
        confidence = 1.0 - label_smoothing
        low = label_smoothing / (vocab_size - 1)
        # sum_v q_v * -log p_v with q = low everywhere except `confidence` on the target.
        sum_lp = log_probs.sum(-1)
        smoothed = -(confidence - low) * true_lp - low * sum_lp
    else:
        smoothed = nll
    smoothed = smoothed - smoothed_targets_entropy(vocab_size, label_smoothing)
    correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
    sums = {
        "loss": jnp.sum(smoothed * weights),
        "nll": jnp.sum(nll * weights),
        "correct": jnp.sum(correct * weights),
        "weight": jnp.sum(weights),
    }
    if unlikelihood > 0:
        cand = unlikelihood_candidates(targets, weights, segments)
        p = jnp.exp(_candidate_log_probs(log_probs, targets))  # [b, t, s]
        per_token = -jnp.sum(cand * jnp.log(jnp.maximum(1.0 - p, UNLIKELY_FLOOR)), -1)
        sums["unlikelihood"] = jnp.sum(per_token * weights)
        sums["objective"] = sums["loss"] + unlikelihood * sums["unlikelihood"]
    return sums


def objective(sums: dict) -> Array:
    """What training differentiates: the smoothed loss, plus the weighted unlikelihood if any."""
    return sums["objective"] if "objective" in sums else sums["loss"]


# `train.loss_chunk_tokens = -1` (the default): on a CPU a piece's float32 logits fill about
# the last-level cache, where the passes over a piece stay; an accelerator keeps big pieces,
# fewer and larger products ([measured](docs/performance.md#what-made-tx-faster)).
CPU_CHUNK_BYTES = 32 * 2**20
ACCELERATOR_CHUNK_TOKENS = 8192


def chunk_tokens(requested: int, vocab_rows: int, platform: str) -> int:
    """The (row, position) pairs per device of one loss piece: `requested`, or for -1 the
    platform's choice (see CPU_CHUNK_BYTES). 0 stays 0: the plain loss."""
    if requested >= 0:
        return requested
    if platform == "cpu":
        return max(1, CPU_CHUNK_BYTES // (4 * vocab_rows))
    return ACCELERATOR_CHUNK_TOKENS


def chunks_for(positions: int, length: int, chunk_positions: int) -> int:
    """How many pieces of the length axis keep each piece's logits within `chunk_positions`
    (rows x length positions of one device), at least 1 and at most `length`."""
    if chunk_positions <= 0:
        return 1
    return max(1, min(length, -(-positions // chunk_positions)))


def chunked_cross_entropy(
    hidden: Array,
    head: Array,
    targets: Array,
    weights: Array,
    *,
    label_smoothing: float,
    vocab_size: int,
    chunks: int = 1,
    unlikelihood: float = 0.0,
    segments: Array | None = None,
) -> dict:
    """`cross_entropy` of the logits `hidden @ head^T`, without ever holding them all.

    The length axis is cut into `chunks` pieces; each piece's logits [b, t/chunks, V] exist
    only while that piece is summed. They are written in the states' dtype (bf16 in the
    configs), as the Flax WMT example and MaxText do, and every sum is taken in float32: the
    logits were the largest array of a TPU step, read by three passes (see _piece). Under
    differentiation the gradient is formed in the same pass (the loss is the last operation:
    d loss / d logits = w (softmax - smoothed target)) and multiplied into d hidden and d head
    at once, so no [b, t, V] array is kept for the backward pass and no logits are computed
    twice. Columns >= `vocab_size` (padding of the vocabulary to a multiple of 128) are
    excluded: their logits are masked and their gradient is zero.

    Only `loss` is differentiable: `nll` and `correct` are metrics (their gradient is stopped).
    With `unlikelihood` > 0 it is `objective` (loss + alpha x unlikelihood, formed in the same
    pass: see _piece), and `loss` and `unlikelihood` are metrics as well.

    Args:
      hidden: [b, t, m] decoder outputs before the softmax layer (compute dtype).
      head: [V', m] the softmax layer's matrix (V' >= vocab_size rows).
      targets, weights, segments: [b, t] as in `cross_entropy`.

    Returns:
      dict of scalar sums as `cross_entropy`: loss, nll, correct, weight (unlikelihood, objective).
    """
    static = (label_smoothing, vocab_size, chunks, unlikelihood)
    obj, loss, nll, correct, unlikely = _fused(hidden, head, targets, weights, segments, *static)
    stop = jax.lax.stop_gradient
    sums = {"loss": obj, "nll": stop(nll), "correct": stop(correct), "weight": jnp.sum(weights)}
    if unlikelihood > 0:
        sums.update(loss=stop(loss), unlikelihood=stop(unlikely), objective=obj)
    return sums


def _pieces(x: Array, chunks: int) -> Array:
    """[b, t, ...] -> [chunks, b, ceil(t / chunks), ...], the length axis zero-padded."""
    b, t = x.shape[:2]
    size = -(-t // chunks)
    x = jnp.pad(x, [(0, 0), (0, chunks * size - t)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape(b, chunks, size, *x.shape[2:]), 1, 0)


def _unpieces(x: Array, length: int) -> Array:
    """The inverse of `_pieces`: [chunks, b, size, ...] -> [b, length, ...]."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :length]


class _Logits(NamedTuple):
    """One piece's logits and their log-softmax, as the passes over them read them."""

    raw: Array  # [b, c, V'] the product as stored, in h's dtype
    log_probs: Array  # [b, c, V'] float32 at least
    real: Array  # [V'] bool: the columns < vocab_size
    padded: bool  # V' > vocab_size (static: no mask pass without padding)
    top: Array  # [b, c, 1] the row's largest logit
    log_sum: Array  # [b, c, 1] log sum exp(logits - top)


def _log_softmax(h: Array, head: Array, vocab_size: int) -> _Logits:
    """h [b, c, m] x head [V', m] -> the piece's `_Logits` (padding columns masked)."""
    acc = jnp.promote_types(h.dtype, jnp.float32)
    # The product accumulates in float32 and is stored in h's dtype: in bf16 that rounds each
    # logit by at most 2^-9 relative (tests/test_losses.py bounds what that does to the sums);
    # each pass converts as it reads, so no float32 [b, c, V'] array is written
    # ([measured](docs/performance.md#on-the-tpu-compilers-cost-model)).
    raw = jnp.einsum("bcm,Vm->bcV", h, head, preferred_element_type=h.dtype)
    logits = raw.astype(acc)
    padded = logits.shape[-1] > vocab_size
    real = jnp.arange(logits.shape[-1]) < vocab_size  # [V']
    if padded:
        logits = jnp.where(real, logits, jnp.finfo(acc).min)
    # The operations of jax.nn.log_softmax, so that the sums match `cross_entropy`'s.
    top = jax.lax.stop_gradient(jnp.max(logits, -1, keepdims=True))
    shifted = logits - top
    log_sum = jnp.log(jnp.sum(jnp.exp(shifted), -1, keepdims=True))
    return _Logits(raw, shifted - log_sum, real, padded, top, log_sum)


def _piece(h, head, targets, weights, unlikely, static, *, with_grad: bool):
    """One piece: sums (loss, nll, correct, unlikelihood) and, `with_grad`, d objective / d
    logits [b, c, V']. `unlikely` is None (alpha 0) or (the piece's [b, c, s] candidates from
    `unlikelihood_candidates`, the whole rows' targets [b, s]); `static` is `_fused`'s."""
    label_smoothing, vocab_size, _, alpha = static
    z = _log_softmax(h, head, vocab_size)
    acc = z.log_probs.dtype
    # Gathered from the stored logits, not from the shifted ones: a gather from those made XLA
    # write all of them in float32 (one more [b, c, V'] array) to read one entry a row.
    true_shifted = jnp.take_along_axis(z.raw, targets[..., None], axis=-1).astype(acc) - z.top
    true_lp = (true_shifted - z.log_sum)[..., 0]
    nll = -true_lp
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab_size - 1)
    if label_smoothing > 0:
        sum_lp = jnp.sum(jnp.where(z.real, z.log_probs, 0.0) if z.padded else z.log_probs, -1)
        smoothed = -(confidence - low) * true_lp - low * sum_lp
    else:
        smoothed = nll
    smoothed = smoothed - smoothed_targets_entropy(vocab_size, label_smoothing)
    # The target has the largest logit (the max is at hand; an argmax would be another pass
    # over [b, c, V'] and differs only where another token ties with it exactly).
    correct = (true_shifted[..., 0] >= 0).astype(acc)
    unlikely_sum = jnp.zeros((), acc)
    if unlikely is not None:
        cand, row_targets = unlikely
        # Gathered from the stored logits, as the target's was: [b, c, s].
        p = jnp.exp(_candidate_log_probs(z.raw, row_targets).astype(acc) - z.top - z.log_sum)
        rest = 1.0 - p
        per_token = -jnp.sum(cand * jnp.log(jnp.maximum(rest, UNLIKELY_FLOOR)), -1)
        unlikely_sum = jnp.sum(per_token * weights)
    sums = (
        jnp.sum(smoothed * weights),
        jnp.sum(nll * weights),
        jnp.sum(correct * weights),
        unlikely_sum,
    )
    if not with_grad:
        return sums, None
    q = _smoothed_target(z, targets, confidence, low)
    w = weights[..., None].astype(acc)
    if unlikely is None:
        return sums, (jnp.exp(z.log_probs) - q) * w
    return sums, _unlikely_grad(z, q, w, (cand, row_targets, p, rest), alpha)


def _smoothed_target(z: _Logits, targets: Array, confidence: float, low: float) -> Array:
    """q [b, c, V']: `confidence` on the target, `low` elsewhere, 0 on padding columns; the
    smoothed loss's d / d logit_v is p_v - q_v."""
    is_target = jnp.arange(z.log_probs.shape[-1]) == targets[..., None]
    q = jnp.where(is_target, confidence, low)
    return jnp.where(z.real, q, 0.0) if z.padded else q


def _unlikely_grad(z: _Logits, q: Array, w: Array, unlikely: tuple, alpha: float) -> Array:
    """d objective / d logits with the unlikelihood term: `unlikely` = (candidates, the rows'
    targets, their p, 1 - p) [b, c, s]. d -log(1 - p_c) / d logit_v = r_c (1[v = c] - p_v),
    r_c = p_c / (1 - p_c) (0 where the floor holds): each candidate's own column gains
    alpha r_c, every column loses alpha S p_v with S the sum of r_c. The first is a scatter of
    [b, c, s] entries, not a [b, c, V'] pass."""
    cand, row_targets, p, rest = unlikely
    r = cand * jnp.where(rest > UNLIKELY_FLOOR, p / jnp.maximum(rest, UNLIKELY_FLOOR), 0.0)
    spread = 1.0 - alpha * jnp.sum(r, -1, keepdims=True)  # [b, c, 1]
    d_logits = (jnp.exp(z.log_probs) * spread - q) * w
    b, c, s = r.shape
    rows = jnp.broadcast_to(jnp.arange(b)[:, None, None], r.shape)
    cols = jnp.broadcast_to(jnp.arange(c)[None, :, None], r.shape)
    columns = jnp.broadcast_to(row_targets[:, None, :], r.shape)
    return d_logits.at[rows, cols, columns].add(alpha * r * w)


def _sums_and_grads(hidden, head, targets, weights, segments, static, *, grads: bool):
    _, _, chunks, alpha = static
    pieces = (_pieces(hidden, chunks), _pieces(targets, chunks), _pieces(weights, chunks))
    if alpha > 0:  # each piece's candidates among the whole rows' targets: [chunks, b, c, s]
        pieces += (_pieces(unlikelihood_candidates(targets, weights, segments), chunks),)
    acc = jnp.promote_types(hidden.dtype, jnp.float32)

    def body(d_head_t, xs):
        h, t, w = xs[:3]
        unlikely = (xs[3], targets) if alpha > 0 else None
        sums, d_logits = _piece(h, head, t, w, unlikely, static, with_grad=grads)
        if not grads:
            return d_head_t, (sums, None)
        d_logits = d_logits.astype(h.dtype)
        d_h = jnp.einsum("bcV,Vm->bcm", d_logits, head, preferred_element_type=acc)
        # Accumulated as [m, V']: d_logits is read as it lies (tokens major), not transposed.
        d_head_t = d_head_t + jnp.einsum("bcm,bcV->mV", h, d_logits, preferred_element_type=acc)
        return d_head_t, (sums, d_h.astype(h.dtype))

    d_head_t = jnp.zeros(head.shape[::-1], acc) if grads else None
    d_head_t, (sums, d_hidden) = jax.lax.scan(body, d_head_t, pieces)
    loss, nll, correct, unlikely = (jnp.sum(s) for s in sums)
    totals = (loss + alpha * unlikely, loss, nll, correct, unlikely)
    if not grads:
        return totals, None
    return totals, (_unpieces(d_hidden, hidden.shape[1]), d_head_t.T.astype(head.dtype))


# -> (objective, loss, nll, correct, unlikelihood): sums; the objective is loss + alpha x
# unlikelihood, the only one with a gradient.
@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _fused(hidden, head, targets, weights, segments, label_smoothing, vocab_size, chunks, alpha):
    static = (label_smoothing, vocab_size, chunks, alpha)
    return _sums_and_grads(hidden, head, targets, weights, segments, static, grads=False)[0]


def _fused_fwd(
    hidden, head, targets, weights, segments, label_smoothing, vocab_size, chunks, alpha
):
    static = (label_smoothing, vocab_size, chunks, alpha)
    totals, grads = _sums_and_grads(hidden, head, targets, weights, segments, static, grads=True)
    return totals, (grads, weights)


def _fused_bwd(label_smoothing, vocab_size, chunks, alpha, residuals, cotangents):
    (d_hidden, d_head), weights = residuals
    g = cotangents[0]  # the other sums are stopped: only the objective sends a gradient back
    return (
        (g * d_hidden).astype(d_hidden.dtype),
        (g * d_head).astype(d_head.dtype),
        None,
        jnp.zeros_like(weights),
        None,
    )


_fused.defvjp(_fused_fwd, _fused_bwd)
