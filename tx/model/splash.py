"""Splash attention on TPU: softmax(Q K^T / sqrt(d_k)) V by JAX's Pallas kernel, in blocks.

XLA's own attention forms the weights [b, h, q, k] in HBM, in float32, forward and again for
the backward pass; for base's longest bucket (196 rows of 256) that is 0.2 GB per layer and
pass, and it made the step memory-bound on the TPU compiler's cost model (docs/performance.md).
The splash kernel (jax.experimental.pallas.ops.tpu.splash_attention) keeps a block of scores in
the core's memory, softmaxes it online and recomputes it in the backward pass from the saved
log-sum-exp, so the weights never reach HBM.

What it takes, and so when `MultiHeadAttention` uses it (`applies`): a TPU; query and key
lengths that are multiples of 128 (its blocks are 128-wide lanes; shorter buckets keep XLA's
path, where the weights are small anyway); no dropout on the weights; which keys a query
sees given as segment ids (a query attends to keys with its id; padding is id 0, so a real
query never sees it) and a static causal-or-full mask. The kernel sees one device's shard: under
a mesh it runs inside shard_map, split over the batch and heads as the logical-axis rules split
the activations.

Shape letters as tx.model.attention's: b batch, q / k query / key length, h heads, d head width.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from tx.model.layers import traced_mesh

Array = jax.Array

LANES = 128  # the kernel's key blocks are whole lanes of the TPU's vector unit


def applies(q_len: int, k_len: int) -> bool:
    """Whether the kernel's blocks tile these lengths."""
    return q_len % LANES == 0 and k_len % LANES == 0


def _libs():
    """Pallas's splash kernel and masks, imported when a kernel is first built: a slow import
    that a command on a CPU or GPU would otherwise pay for nothing."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel,
        splash_attention_mask,
    )

    return splash_attention_kernel, splash_attention_mask


def _block(length: int) -> int:
    """The largest of 512 / 256 / 128 that divides `length`: bigger blocks, fewer passes over
    the keys."""
    return next(b for b in (512, 256, LANES) if length % b == 0)


@functools.lru_cache(maxsize=64)
def _kernel(heads: int, q_len: int, k_len: int, causal: bool, interpret: bool):
    """The kernel for one device's [h, q, d] x [h, k, d] per batch row (built once per shape:
    its block masks are computed in numpy)."""
    kernel_lib, mask_lib = _libs()
    one = mask_lib.CausalMask((q_len, k_len)) if causal else mask_lib.FullMask((q_len, k_len))
    bq, bk = _block(q_len), _block(k_len)
    blocks = kernel_lib.BlockSizes(
        block_q=bq,
        block_kv=bk,
        block_kv_compute=bk,
        block_q_dkv=bq,
        block_kv_dkv=bk,
        block_kv_dkv_compute=bk,
        # One backward kernel for dq, dk and dv: the residuals are read once
        # ([measured](docs/performance.md#on-the-tpu-compilers-cost-model)).
        use_fused_bwd_kernel=True,
    )
    # Its block-mask arrays made concrete, not values of the trace that first asked for the
    # kernel: the cached kernel is used again in other traces (each layer, each shard_map).
    with jax.ensure_compile_time_eval():
        return kernel_lib.make_splash_mha(
            mask_lib.MultiHeadMask([one] * heads),
            block_sizes=blocks,
            head_shards=1,
            q_seq_shards=1,
            interpret=interpret,
        )


def _local(q, k, v, q_segments, k_segments, *, causal: bool, interpret: bool) -> Array:
    """One device's shard: q [b, h, q, d], k and v [b, h, k, d], segments [b, q] / [b, k]
    -> [b, h, q, d]."""
    run = _kernel(q.shape[1], q.shape[2], k.shape[2], causal, interpret)
    ids = _libs()[0].SegmentIds(q=q_segments, kv=k_segments)
    return jax.vmap(run)(q, k, v, segment_ids=ids)


def _mesh():
    """The mesh the caller traces under (jax.set_mesh, or tx.model.layers.traced_on), or None."""
    abstract = jax.sharding.get_abstract_mesh()
    return traced_mesh() if abstract.empty else abstract


def splash_attention(
    query: Array,
    key: Array,
    value: Array,
    segments: tuple[Array, Array],
    causal: bool,
    interpret: bool = False,
) -> Array:
    """query [b, q, h, d], key and value [b, k, h, d], segments (query ids [b, q], key ids
    [b, k]; 0 = padding) -> [b, q, h, d] in the dtype of `query`.

    `interpret` runs the kernel in Pallas' interpreter (any platform: the tests' CPU check)."""
    # The scale on the queries, in their dtype (exact for d_k = 64, a power of 4; otherwise one
    # more rounding of q than the explicit path's float32 division of the logits).
    scale = np.asarray(1.0 / np.sqrt(query.shape[-1]), query.dtype)
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (query * scale, key, value))  # [b, h, l, d]
    q_segments, k_segments = (s.astype(jnp.int32) for s in segments)
    run = functools.partial(_local, causal=causal, interpret=interpret)
    mesh = _mesh()
    if mesh is not None and mesh.size > 1:
        # Batch and heads split as the activations are; the lengths whole (the kernel's
        # masks cover them). A rule that splits the lengths is gathered here.
        rows, heads = nn.logical_to_mesh_axes(("batch", "heads"))
        qkv = jax.sharding.PartitionSpec(rows, heads, None, None)
        ids = jax.sharding.PartitionSpec(rows, None)
        run = jax.shard_map(
            run, mesh=mesh, in_specs=(qkv, qkv, qkv, ids, ids), out_specs=qkv, check_vma=False
        )
    out = run(q, k, v, q_segments, k_segments)
    return out.transpose(0, 2, 1, 3)
