"""tx's and the Flax WMT example's train steps compiled for one TPU topology, deviceless.

    python benchmarks/side_by_side.py ../shared/bench/flax_wmt --topology v5p:2x2x1

needs libtpu (`pip install -e '.[tpu]'`): XLA's real TPU compiler runs on this CPU host. Both
steps are compiled for the same chips at the same shape: the base model in bfloat16, the shared
vocabulary of `--vocab`, and tx's largest batch of configs/base.py (the longest bucket's rows at
the paper's 25k-token budget), split over every chip along the batch. The Flax side is the
example's own `train_step` unchanged, its gradient `pmean` over the "batch" axis under
jax.shard_map (the example's pmap, as one jitted program over a mesh). Reported per chip from
the compiled programs: memory, XLA's flops and bytes accessed, the compiler's `optimal_seconds`,
and tx's MFU ceiling (the model's FLOPs over the chips' peak in that time).
"""

from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tx.config import load_config
from tx.train.aot import compile_report, estimate, topology_devices
from tx.train.chips import chip

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tx_compiled(devices, vocab: int, overrides=()) -> dict:
    cfg = load_config(
        os.path.join(ROOT, "configs/base.py"),
        [f"model.vocab_size={vocab}", f"data.vocab_size={vocab}", *overrides],
    )
    cfg.mesh.shape = {"data": len(devices), "fsdp": 1, "tensor": 1}
    report = compile_report(cfg, devices)
    return report | estimate(report)


def flax_compiled(bench, flaxsrc: str, devices, vocab: int, rows: int, length: int) -> dict:
    """The example's train step for `rows` x `length` tokens per side over `devices`."""
    bench.stub_clu()
    sys.path.insert(0, flaxsrc)
    import models  # noqa: I001 - the example's modules, found on the path just set
    import optax
    import train as ftrain
    from flax import linen as nn

    cfg = models.TransformerConfig(
        vocab_size=vocab, output_vocab_size=vocab, share_embeddings=True,
        logits_via_embedding=True, dtype=jnp.bfloat16, emb_dim=512, num_heads=8,
        num_layers=6, qkv_dim=512, mlp_dim=2048, max_len=256, dropout_rate=0.1,
        attention_dropout_rate=0.1, deterministic=False, decode=False,
        kernel_init=nn.initializers.xavier_uniform(),
        bias_init=nn.initializers.normal(stddev=1e-6),
    )  # fmt: skip
    model = models.Transformer(cfg.replace(deterministic=True))
    lr = ftrain.create_learning_rate_schedule(learning_rate=0.002, warmup_steps=1000)
    opt = optax.adamw(learning_rate=lr, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0)

    def create(key):
        x = jnp.ones((1, length), jnp.int32)
        params = model.init(key, x, x)["params"]
        return ftrain.TrainState.create(
            apply_fn=model.apply, params=params, tx=opt, dynamic_scale=None
        )

    mesh = Mesh(np.array(devices), ("batch",))
    state = jax.eval_shape(create, jax.random.key(0))
    replicated = NamedSharding(mesh, PartitionSpec())
    state = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), state
    )
    by_row = NamedSharding(mesh, PartitionSpec("batch"))
    batch = {
        k: jax.ShapeDtypeStruct((rows, length), np.int32, sharding=by_row)
        for k in ("inputs", "targets")
    }
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
    step = functools.partial(
        ftrain.train_step, config=cfg, learning_rate_fn=lr, label_smoothing=0.1
    )
    sharded = jax.shard_map(
        lambda s, b, r: step(s, b, dropout_rng=r),
        mesh=mesh,
        in_specs=(PartitionSpec(), PartitionSpec("batch"), PartitionSpec()),
        out_specs=(PartitionSpec(), PartitionSpec()),
        check_vma=False,
    )
    compiled = jax.jit(sharded, donate_argnums=(0,)).lower(state, batch, rng).compile()
    memory, cost = compiled.memory_analysis(), compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return {
        "temporaries": memory.temp_size_in_bytes,
        "arguments": memory.argument_size_in_bytes,
        "xla_flops_per_device": cost.get("flops"),
        "xla_bytes_accessed_per_device": cost.get("bytes accessed"),
        "optimal_seconds": cost.get("optimal_seconds"),
    }


def side_by_side(bench, flaxsrc: str, topology: str, vocab: int, overrides=()) -> dict:
    devices = topology_devices(topology)
    tx = tx_compiled(devices, vocab, overrides)
    rows, length = tx["batch"]["rows"], tx["batch"]["length"]
    flax = flax_compiled(bench, flaxsrc, devices, vocab, rows, length)
    known = chip(devices[0].device_kind)
    flax_mfu = tx["analytic_model_flops"] / (
        flax["optimal_seconds"] * len(devices) * known.bf16_tflops * 1e12
    )
    per_chip = {
        "temporaries_gb": {"tx": tx["per_device_bytes"]["temporaries"] / 1e9,
                           "flax": flax["temporaries"] / 1e9},
        "flops": {"tx": tx["xla_flops_per_device"], "flax": flax["xla_flops_per_device"]},
        "bytes_accessed_gb": {"tx": tx["xla_bytes_accessed_per_device"] / 1e9,
                              "flax": flax["xla_bytes_accessed_per_device"] / 1e9},
        "optimal_seconds": {"tx": tx["optimal_seconds"], "flax": flax["optimal_seconds"]},
    }  # fmt: skip
    return {
        "topology": topology,
        "chip": known.name,
        "batch": {"rows": rows, "length": length, "dtype": "bfloat16", "vocab": vocab},
        "per_chip": per_chip,
        "tpu_optimal_seconds_tx_over_flax": tx["optimal_seconds"] / flax["optimal_seconds"],
        "tpu_mfu_ceiling_tx": tx["mfu_ceiling"],
        "tpu_mfu_ceiling_flax": flax_mfu,
    }
