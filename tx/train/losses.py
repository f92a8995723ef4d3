"""Label-smoothed cross-entropy (section 5.4), returning sums so devices and hosts add up."""

from __future__ import annotations

import functools
import math

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


def cross_entropy(logits: Array, targets: Array, weights: Array, label_smoothing: float = 0.1):
    """Label-smoothed cross-entropy and plain NLL, summed over non-padding tokens.

    The smoothed target puts 1 - eps on the true token and eps / (V - 1) on each other token.
    `loss` has the smoothed distribution's entropy subtracted, so a perfect smoothed prediction
    scores 0; `nll` is the unsmoothed negative log-likelihood (its mean gives perplexity).

    Args:
      logits: [b, t, V] float.
      targets: [b, t] int.
      weights: [b, t] float, 1 for real tokens and 0 for padding.
      label_smoothing: epsilon_ls in [0, 1).

    Returns:
      dict of scalar sums: loss, nll, correct (argmax == target), weight (number of tokens).
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
    return {
        "loss": jnp.sum(smoothed * weights),
        "nll": jnp.sum(nll * weights),
        "correct": jnp.sum(correct * weights),
        "weight": jnp.sum(weights),
    }


# `train.loss_chunk_tokens = -1` (the default): a piece's float32 logits fill about this much
# memory on a CPU, where the passes over a piece then stay in the last-level cache (32 MiB
# here: at V = 32,000 that is 262 tokens). The base train step (2,048 tokens, four trainers
# timed interleaved in one process) took 5.4-5.5 s with pieces of 256 against 5.8-6.1 s with
# one piece; pieces of 128 to 512 were equal, 64 slower. An accelerator keeps big pieces:
# fewer, larger products.
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

    Args:
      hidden: [b, t, m] decoder outputs before the softmax layer (compute dtype).
      head: [V', m] the softmax layer's matrix (V' >= vocab_size rows).
      targets, weights: [b, t] as in `cross_entropy`.

    Returns:
      dict of scalar sums as `cross_entropy`: loss, nll, correct, weight.
    """
    loss, nll, correct = _fused(hidden, head, targets, weights, label_smoothing, vocab_size, chunks)
    return {
        "loss": loss,
        "nll": jax.lax.stop_gradient(nll),
        "correct": jax.lax.stop_gradient(correct),
        "weight": jnp.sum(weights),
    }


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


def _piece(h, head, targets, weights, label_smoothing, vocab_size, with_grad: bool):
    """One piece: sums (loss, nll, correct) and, `with_grad`, d loss / d logits [b, c, V']."""
    acc = jnp.promote_types(h.dtype, jnp.float32)
    # The product accumulates in float32 and is stored in h's dtype: in bf16 that rounds each
    # logit by at most 2^-9 relative (tests/test_losses.py bounds what that does to the sums);
    # each pass below converts as it reads, so no float32 [b, c, V'] array is written. Base on
    # a v5p:2x2x1 slice (`python -m tx compile`, the TPU compiler's cost model): 23.3 ms a step
    # with float32 logits, 22.8 ms with bf16 ones, 22.5 ms with the gather below as well; 47.2,
    # 44.4 and 43.9 GB of memory traffic; 5.9, 5.4 and 4.5 GB of HBM per chip.
    raw = jnp.einsum("bcm,Vm->bcV", h, head, preferred_element_type=h.dtype)
    logits = raw.astype(acc)
    padded = logits.shape[-1] > vocab_size  # a static choice: no mask pass without padding
    real = jnp.arange(logits.shape[-1]) < vocab_size  # [V']
    if padded:
        logits = jnp.where(real, logits, jnp.finfo(acc).min)
    # The operations of jax.nn.log_softmax, so that the sums match `cross_entropy`'s.
    top = jax.lax.stop_gradient(jnp.max(logits, -1, keepdims=True))
    shifted = logits - top
    log_sum = jnp.log(jnp.sum(jnp.exp(shifted), -1, keepdims=True))
    log_probs = shifted - log_sum  # [b, c, V']
    # Gathered from the stored logits, not from `shifted`: a gather from `shifted` made XLA
    # write all of it in float32 (one more [b, c, V'] array) to read one entry a row.
    true_logit = jnp.take_along_axis(raw, targets[..., None], axis=-1).astype(acc)
    true_shifted = true_logit - top  # [b, c, 1]
    true_lp = (true_shifted - log_sum)[..., 0]
    nll = -true_lp
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab_size - 1)
    if label_smoothing > 0:
        sum_lp = jnp.sum(jnp.where(real, log_probs, 0.0) if padded else log_probs, -1)
        smoothed = -(confidence - low) * true_lp - low * sum_lp
    else:
        smoothed = nll
    smoothed = smoothed - smoothed_targets_entropy(vocab_size, label_smoothing)
    # The target has the largest logit (the max is at hand; an argmax would be another pass
    # over [b, c, V'] and differs only where another token ties with it exactly).
    correct = (true_shifted[..., 0] >= 0).astype(acc)
    sums = (jnp.sum(smoothed * weights), jnp.sum(nll * weights), jnp.sum(correct * weights))
    if not with_grad:
        return sums, None
    # d smoothed / d logit_v = p_v - q_v, q the smoothed target (0 on padding columns).
    is_target = jnp.arange(logits.shape[-1]) == targets[..., None]
    q = jnp.where(is_target, confidence, low)
    if padded:
        q = jnp.where(real, q, 0.0)
    d_logits = (jnp.exp(log_probs) - q) * weights[..., None].astype(acc)
    return sums, d_logits


def _sums_and_grads(hidden, head, targets, weights, label_smoothing, vocab_size, chunks, grads):
    pieces = (_pieces(hidden, chunks), _pieces(targets, chunks), _pieces(weights, chunks))
    acc = jnp.promote_types(hidden.dtype, jnp.float32)

    def body(d_head_t, xs):
        h, t, w = xs
        sums, d_logits = _piece(h, head, t, w, label_smoothing, vocab_size, grads)
        if not grads:
            return d_head_t, (sums, None)
        d_logits = d_logits.astype(h.dtype)
        d_h = jnp.einsum("bcV,Vm->bcm", d_logits, head, preferred_element_type=acc)
        # Accumulated as [m, V']: d_logits is read as it lies (tokens major), not transposed.
        d_head_t = d_head_t + jnp.einsum("bcm,bcV->mV", h, d_logits, preferred_element_type=acc)
        return d_head_t, (sums, d_h.astype(h.dtype))

    d_head_t = jnp.zeros(head.shape[::-1], acc) if grads else None
    d_head_t, (sums, d_hidden) = jax.lax.scan(body, d_head_t, pieces)
    totals = tuple(jnp.sum(s) for s in sums)
    if not grads:
        return totals, None
    return totals, (_unpieces(d_hidden, hidden.shape[1]), d_head_t.T.astype(head.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _fused(hidden, head, targets, weights, label_smoothing, vocab_size, chunks):
    return _sums_and_grads(
        hidden, head, targets, weights, label_smoothing, vocab_size, chunks, False
    )[0]


def _fused_fwd(hidden, head, targets, weights, label_smoothing, vocab_size, chunks):
    totals, grads = _sums_and_grads(
        hidden, head, targets, weights, label_smoothing, vocab_size, chunks, True
    )
    return totals, (grads, targets, weights)


def _fused_bwd(label_smoothing, vocab_size, chunks, residuals, cotangents):
    (d_hidden, d_head), targets, weights = residuals
    g = cotangents[0]  # nll and correct are stopped: only the loss sends a gradient back
    return (
        (g * d_hidden).astype(d_hidden.dtype),
        (g * d_head).astype(d_head.dtype),
        None,
        jnp.zeros_like(weights),
    )


_fused.defvjp(_fused_fwd, _fused_bwd)
