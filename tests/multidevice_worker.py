"""Runs in its own process (virtual CPU devices or jax.distributed); driven by test_sharding.py.

    python tests/multidevice_worker.py MODE OUT [ARGS...]
Each mode writes its results to OUT (JSON or .npz).
"""

import json
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import equivalence  # noqa: E402  (tests/equivalence.py, beside this file)
import jax  # noqa: E402
import numpy as np  # noqa: E402

from tx.config import load_config  # noqa: E402
from tx.train.checkpoint import Checkpointer  # noqa: E402
from tx.train.trainer import (  # noqa: E402
    abstract_train_state,
    build,
    create_train_state,
    jit_train_step,
)
from tx.workdir import is_main  # noqa: E402

# Tiny, but divisible by a tensor axis of 8 (heads, d_ff, vocabulary). One layer: a second
# has the same shardings and collectives, and only adds to what every process compiles.
OVERRIDES = [
    "model.num_heads=8",
    "data.vocab_size=320",
    "model.dropout_rate=0.1",
    "model.num_layers=1",
]
# The recurrent family (mode equivalence_rnn): two LSTM layers with attention, units and
# vocabulary divisible by 8, the tiny config's data settings.
RNN_OVERRIDES = [
    "data.vocab_size=320",
    "model.d_model=32",
    "model.num_layers=2",
    "model.dropout_rate=0.1",
    "data.tokens_per_step=512",
    "data.bucket_lengths=(16, 32, 48)",
]
# (config file, overrides, a parameter whose sharding the report shows); set by the mode.
MODEL = {
    "config": "configs/tiny.py",
    "overrides": OVERRIDES,
    "example": ("decoder", "layer_0", "ffn", "wi"),
}
STEPS = 3
ROWS = 16


def config(mesh_shape=None, micro_batches=1, fp64=False):
    overrides = [*MODEL["overrides"], f"train.micro_batches={micro_batches}"]
    if fp64:
        overrides += equivalence.FP64
    if mesh_shape:
        d, f, t = mesh_shape
        overrides += [f"mesh.shape.data={d}", f"mesh.shape.fsdp={f}", f"mesh.shape.tensor={t}"]
    return load_config(str(ROOT / MODEL["config"]), overrides)


def batches(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        inputs = rng.integers(4, 320, (ROWS, 16)).astype(np.int32)
        targets = rng.integers(4, 320, (ROWS, 16)).astype(np.int32)
        inputs[::2, -4:] = 0
        targets[1::3, -6:] = 0
        out.append({"inputs": inputs, "targets": targets})
    return out


def setup(mesh_shape=None, devices=None, seed=0, optimizer=None, micro_batches=1, fp64=False):
    trainer = build(config(mesh_shape, micro_batches, fp64), devices, optimizer)
    return trainer, create_train_state(trainer, seed=seed)


def global_batches(layout, seed=0, rows=slice(None)):
    """This process's `rows` of every batch, as global arrays."""
    return [layout.global_batch({k: v[rows] for k, v in b.items()}) for b in batches(seed)]


def run_sgd(mesh_shape=None, devices=None, seed=0, rows=slice(None), micro_batches=1):
    """STEPS of SGD, recording losses and gradients (see tests/equivalence.py)."""
    optimizer = equivalence.sgd_keeping_gradients()
    trainer, state = setup(mesh_shape, devices, seed, optimizer, micro_batches, fp64=True)
    step = jit_train_step(trainer)
    return equivalence.record(step, state, global_batches(trainer.layout, seed, rows), flat)


def run_adam(mesh_shape=None, devices=None):
    trainer, state = setup(mesh_shape, devices)
    step = jit_train_step(trainer)
    for b in global_batches(trainer.layout):
        state, _ = step(state, b)
    return trainer, state


def flat(tree):
    from jax.experimental import multihost_utils

    leaves = jax.tree_util.tree_leaves_with_path(tree)
    gather = (
        (lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)))
        if jax.process_count() > 1
        else np.asarray
    )
    return {jax.tree_util.keystr(p): gather(x) for p, x in leaves}


# (data, fsdp, tensor), micro-batches: every axis alone, all three, and accumulation on a mesh.
MESHES = (((8, 1, 1), 1), ((4, 2, 1), 1), ((2, 2, 2), 1), ((1, 1, 8), 1), ((4, 2, 1), 2))
# The default suite's one: all three axes at once, accumulating micro-batches (one reference
# and one mesh to compile; the pair it replaced took 56 s of the suite).
FEW_MESHES = (((2, 2, 2), 2),)


def equivalence_run(out, seed="0", meshes="all", unlikelihood="0"):
    """Each mesh against one device with the same micro-batches (dropout masks depend on
    them): the largest loss / gradient / parameter errors. `meshes`: "all" or "few";
    `unlikelihood`: train.unlikelihood (its scatter into vocabulary columns that the tensor
    axis shards)."""
    seed = int(seed)
    if float(unlikelihood):
        MODEL["overrides"] = [*MODEL["overrides"], f"train.unlikelihood={float(unlikelihood)}"]
    refs = {}
    report = {}
    for shape, micro in MESHES if meshes == "all" else FEW_MESHES:
        if micro not in refs:
            refs[micro] = run_sgd(devices=jax.devices()[:1], seed=seed, micro_batches=micro)[1]
        state, got = run_sgd(shape, seed=seed, micro_batches=micro)
        example = state.params
        for key in MODEL["example"]:
            example = example[key]
        report[f"{shape} x{micro}"] = {
            **equivalence.compare_steps(refs[micro], got),
            "spec_example": str(example.sharding.spec),
        }
    json.dump(report, open(out, "w"))


def equivalence_rnn_run(out, seed="0"):
    """equivalence_run for configs/rnn_attention.py: the recurrent family shards too."""
    MODEL.update(
        config="configs/rnn_attention.py",
        overrides=RNN_OVERRIDES,
        example=("decoder", "layer_0", "kernel"),
    )
    equivalence_run(out, seed)


# Rows of 128 tokens, the lengths the splash kernel tiles; float32, no dropout (its masks do
# not depend on the attention, but a step without them compares attention alone).
SPLASH = [
    *OVERRIDES[:2],
    "model.dropout_rate=0.0",
    "data.max_len=128",
    "data.bucket_lengths=(128,)",
]


def splash_run(out):
    """One SGD step with attention_impl "splash" (Pallas' interpreter on these CPU devices,
    under shard_map) on meshes splitting the batch and the heads, against "explicit" on one
    device: the loss and every gradient leaf."""
    rng = np.random.default_rng(0)
    batch = {k: rng.integers(4, 320, (ROWS, 128)).astype(np.int32) for k in ("inputs", "targets")}
    batch["inputs"][::2, -40:] = 0
    batch["targets"][1::3, -60:] = 0

    def one_step(impl, mesh_shape, devices=None):
        MODEL["overrides"] = [*SPLASH, f"model.attention_impl={impl}"]
        trainer = build(config(mesh_shape), devices, equivalence.sgd_keeping_gradients())
        state = create_train_state(trainer, seed=0)
        _, record = equivalence.record(
            jit_train_step(trainer), state, [trainer.layout.global_batch(batch)], flat
        )
        return record

    ref = one_step("explicit", None, jax.devices()[:1])
    report = {}
    for shape in ((8, 1, 1), (1, 2, 4)):  # the batch alone; fsdp rows and tensor heads
        got = one_step("splash", shape)
        report[str(shape)] = {
            "loss": abs(got["losses"][0] - ref["losses"][0]) / ref["losses"][0],
            "grad": max(
                equivalence.relative_error(got["grads"][0][k], g)
                for k, g in ref["grads"][0].items()
            ),
        }
    json.dump(report, open(out, "w"))


def golden(out):
    cfg = load_config(
        str(ROOT / "configs" / "base.py"),
        ["mesh.shape.data=2", "mesh.shape.fsdp=2", "mesh.shape.tensor=2"],
    )
    trainer = build(cfg)
    specs = {
        jax.tree_util.keystr(p): str(s.spec)
        for p, s in jax.tree_util.tree_leaves_with_path(trainer.state_sharding.params)
    }
    json.dump(
        {"mesh": dict(trainer.mesh.shape), "params": specs},
        open(out, "w"),
        indent=1,
        sort_keys=True,
    )


def save(out, workdir, shape):
    _, state = run_adam(tuple(int(x) for x in shape.split(",")))
    ckpt = Checkpointer(workdir, async_save=True)
    ckpt.save(STEPS, state, {"epoch": 0, "batch": STEPS})
    ckpt.close()
    if is_main():
        np.savez(out, **flat(state))


def restore(out, workdir, shape, optimizer="adam"):
    state, position = _restore(workdir, shape, optimizer)
    np.savez(out, **flat(state))
    json.dump(position, open(out + ".json", "w"))


def _restore(workdir, shape, optimizer):
    cfg = config(tuple(int(x) for x in shape.split(",")), fp64=optimizer == "sgd")
    opt = equivalence.sgd_keeping_gradients() if optimizer == "sgd" else None
    trainer = build(cfg, optimizer=opt)
    return Checkpointer(workdir).restore(STEPS, abstract_train_state(trainer))


def pair(out, workdir, port, pid):
    """One of two processes (test_two_processes_train_save_and_decode_like_one), mesh
    (2, 1, 1): SGD in float64, each process feeding its half of every batch, saved to
    `workdir` together; then the trained parameters in float32 decode the fixed sentences
    (_decode), the rows of each batch split over the processes. Process 0 writes OUT (the
    state), OUT.record.npz, OUT.json and OUT.decoded.json. Float64 only inside enable_x64:
    decoding fails with x64 on (dynamic_update_slice is given int64 and int32 indices)."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", 2, int(pid))
    per = ROWS // 2
    rows = slice(int(pid) * per, (int(pid) + 1) * per)  # this process's half of each batch
    with jax.enable_x64(True):
        state, record = run_sgd((2, 1, 1), rows=rows)
        ckpt = Checkpointer(workdir)
        ckpt.save(STEPS, state, {"epoch": 0, "batch": STEPS})
        ckpt.close()
        params = flat(state)
        decoded = _float32(state.params)
    if is_main():
        np.savez(out, **params)
        _dump_record(out, record, processes=jax.process_count())
    _decode(out + ".decoded.json", build(config((2, 1, 1))), decoded)
    jax.distributed.shutdown()


def reference(out, workdir):
    """The pair's one-process side: the same SGD steps on one device (OUT.record.npz,
    OUT.json), the pair's checkpoint restored (OUT.restored.npz) and its parameters, bit for
    bit those the pair decoded, decoding the same sentences (OUT.decoded.json)."""
    with jax.enable_x64(True):
        _, record = run_sgd((1, 1, 1), devices=jax.devices()[:1])
        _dump_record(out, record, processes=1)
        state, _ = _restore(workdir, "1,1,1", "sgd")
        np.savez(out + ".restored.npz", **flat(state))
        decoded = _float32(state.params)
    _decode(out + ".decoded.json", build(config((1, 1, 1))), decoded)


def _float32(params):
    """float64 parameters (trained with x64 on) as the float32 ones a model decodes with."""
    return jax.tree_util.tree_map(lambda x: x.astype(np.float32), params)


def _dump_record(out, record, **extra):
    """The recorded run as OUT.record.npz (losses, per-step gradients, final parameters)."""
    arrays = {"losses": np.array(record["losses"])}
    for i, grads in enumerate(record["grads"]):
        arrays.update({f"grad{i}/{k}": v for k, v in grads.items()})
    arrays.update({f"param/{k}": v for k, v in record["params"].items()})
    np.savez(out + ".record.npz", **arrays)
    json.dump(extra, open(out + ".json", "w"))


def translate_ids_run(out, port=None, pid=None):
    """Decodes fixed token ids with freshly initialised parameters, in 1 or 2 processes."""
    if port is not None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"localhost:{port}", 2, int(pid))
    trainer, state = setup((jax.process_count(), 1, 1))
    _decode(out, trainer, state.params)
    if port is not None:
        jax.distributed.shutdown()


def _decode(out, trainer, params):
    """Beam-decodes 9 fixed sentences with float32 `params`; process 0 writes per sentence:
    best ids, best score, runner-up's score. One bucket of 4 rows: 3 batches of one shape
    (one search to compile), the last one real row and 3 padding rows, so that with two
    processes one of them decodes padding alone."""
    import ml_collections

    from tx.infer.translate import LoadedModel, translate_ids

    loaded = LoadedModel(trainer.model, params, None, "init", trainer.layout)
    rng = np.random.default_rng(1)
    ids = [np.append(rng.integers(4, 320, n), 1).astype(np.int32) for n in rng.integers(1, 20, 9)]
    decode = ml_collections.ConfigDict(
        dict(strategy="beam", beam_size=4, alpha=0.6, max_extra_len=5, batch_tokens=128)
    )
    decode.update(temperature=1.0, top_k=0, seed=0)
    hyps = translate_ids(loaded, ids, decode, (32,), nbest=2)
    if is_main():
        json.dump([[h[0][0].tolist(), h[0][1], h[1][1]] for h in hyps], open(out, "w"))


def interleaved(out, kind, mapping, what, port, pid):
    """2 processes x 2 devices on a mesh that interleaves the processes: along the batch axis
    (kind "data": mesh (4, 1, 1) over devices p0, p1, p0, p1) or with the tensor axis spanning
    them (kind "tensor": mesh (2, 1, 2), each data shard one device of each process).
    `mapping` "layout" feeds rows as the library does (Layout.process_rows); "contiguous"
    replaces that with the old assumption (process p owns rows [p * n/2, (p + 1) * n/2)), which
    the tests expect to fail. `what`: "sgd" (a training record) or "translate" (decoding)."""
    from tx.train import sharding

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", 2, int(pid))
    mine = [[d for d in jax.devices() if d.process_index == p] for p in range(2)]
    order = [mine[p][i] for i in range(2) for p in range(2)]
    shape = (4, 1, 1) if kind == "data" else (2, 1, 2)
    if mapping == "contiguous":
        p = int(pid)
        sharding.Layout.process_rows = lambda self, n: np.arange(p * n // 2, (p + 1) * n // 2)
    if what == "sgd":
        trainer, _ = setup(shape, order)
        _check_interleaved(trainer.mesh)
        state, record = run_sgd(shape, order, rows=trainer.layout.process_rows(ROWS))
        if is_main():
            _dump_record(out, record, processes=jax.process_count())
    else:
        trainer, state = setup(shape, order)
        _decode(out, trainer, state.params)
    jax.distributed.shutdown()


def _check_interleaved(mesh):
    """The mesh kept the requested order: neighbours along its first axis alternate."""
    owners = [d.process_index for d in mesh.devices.reshape(-1)]
    assert owners == [0, 1, 0, 1], owners


def single(out):
    _, record = run_sgd((1, 1, 1), devices=jax.devices()[:1])
    _dump_record(out, record, processes=1)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    mode, out, *args = sys.argv[1:]
    if mode in ("equivalence", "equivalence_rnn", "single") or "sgd" in args:
        jax.config.update("jax_enable_x64", True)  # the SGD comparisons run in float64
    {
        "equivalence": equivalence_run,
        "equivalence_rnn": equivalence_rnn_run,
        "golden": golden,
        "save": save,
        "restore": restore,
        "pair": pair,
        "reference": reference,
        "single": single,
        "translate": translate_ids_run,
        "interleaved": interleaved,
        "splash": splash_run,
    }[mode](out, *args)
