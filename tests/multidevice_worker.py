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

import jax  # noqa: E402
import numpy as np  # noqa: E402

from tx import sharding  # noqa: E402
from tx.checkpoint import Checkpointer  # noqa: E402
from tx.config import load_config, model_config  # noqa: E402
from tx.train import (  # noqa: E402
    abstract_train_state,
    create_train_state,
    jit_train_step,
    make_trainer,
)

# Tiny, but divisible by a tensor axis of 8 (heads, d_ff, vocabulary).
OVERRIDES = ["model.num_heads=8", "data.vocab_size=320", "model.dropout_rate=0.1"]
STEPS = 3
ROWS = 16


def config(mesh_shape=None):
    overrides = list(OVERRIDES)
    if mesh_shape:
        d, f, t = mesh_shape
        overrides += [f"mesh.shape.data={d}", f"mesh.shape.fsdp={f}", f"mesh.shape.tensor={t}"]
    return load_config(str(ROOT / "configs" / "tiny.py"), overrides)


def batches():
    rng = np.random.default_rng(0)
    out = []
    for _ in range(STEPS):
        inputs = rng.integers(4, 320, (ROWS, 16)).astype(np.int32)
        targets = rng.integers(4, 320, (ROWS, 16)).astype(np.int32)
        inputs[::2, -4:] = 0
        targets[1::3, -6:] = 0
        out.append({"inputs": inputs, "targets": targets})
    return out


def run(mesh_shape=None, devices=None, rows=slice(None)):
    cfg = config(mesh_shape)
    mesh = sharding.make_mesh(cfg.mesh, devices)
    trainer = make_trainer(cfg, model_config(cfg), mesh, sharding.rules(cfg.mesh))
    state = create_train_state(trainer, seed=0)
    step = jit_train_step(trainer)
    losses, grad_norms = [], []
    for b in batches():
        local = {k: v[rows] for k, v in b.items()}
        state, m = step(state, sharding.global_batch(local, mesh))
        losses.append(float(m["loss"]) / float(m["weight"]))
        grad_norms.append(float(m["grad_norm"]))
    return trainer, state, losses, grad_norms


def flat(tree):
    from jax.experimental import multihost_utils

    leaves = jax.tree_util.tree_leaves_with_path(tree)
    gather = (
        (lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)))
        if jax.process_count() > 1
        else np.asarray
    )
    return {jax.tree_util.keystr(p): gather(x) for p, x in leaves}


def equivalence(out):
    _, ref_state, ref_loss, ref_gn = run(devices=jax.devices()[:1])
    ref = flat(ref_state.params)
    report = {}
    for shape in ((8, 1, 1), (4, 2, 1), (2, 2, 2), (1, 1, 8)):
        _, state, loss, gn = run(shape)
        params = flat(state.params)
        report[str(shape)] = {
            "loss_diff": max(abs(a - b) for a, b in zip(loss, ref_loss, strict=True)),
            "grad_norm_diff": max(abs(a - b) / b for a, b in zip(gn, ref_gn, strict=True)),
            "param_diff": max(float(np.abs(params[k] - ref[k]).max()) for k in ref),
            "spec_example": str(state.params["decoder"]["layer_0"]["ffn"]["wi"].sharding.spec),
        }
    json.dump(report, open(out, "w"))


def golden(out):
    cfg = load_config(
        str(ROOT / "configs" / "base.py"),
        ["mesh.shape.data=2", "mesh.shape.fsdp=2", "mesh.shape.tensor=2"],
    )
    mesh = sharding.make_mesh(cfg.mesh)
    trainer = make_trainer(cfg, model_config(cfg), mesh, sharding.rules(cfg.mesh))
    specs = {
        jax.tree_util.keystr(p): str(s.spec)
        for p, s in jax.tree_util.tree_leaves_with_path(trainer.state_sharding.params)
    }
    json.dump({"mesh": dict(mesh.shape), "params": specs}, open(out, "w"), indent=1, sort_keys=True)


def save(out, workdir, shape):
    trainer, state, _, _ = run(tuple(int(x) for x in shape.split(",")))
    ckpt = Checkpointer(workdir, async_save=True)
    ckpt.save(STEPS, state, {"epoch": 0, "batch": STEPS})
    ckpt.close()
    if jax.process_index() == 0:
        np.savez(out, **flat(state))


def restore(out, workdir, shape):
    cfg = config(tuple(int(x) for x in shape.split(",")))
    mesh = sharding.make_mesh(cfg.mesh)
    trainer = make_trainer(cfg, model_config(cfg), mesh, sharding.rules(cfg.mesh))
    state, position = Checkpointer(workdir).restore(STEPS, abstract_train_state(trainer))
    np.savez(out, **flat(state))
    json.dump(position, open(out + ".json", "w"))


def multiprocess(out, workdir, port, pid):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", 2, int(pid))
    per = ROWS // 2
    rows = slice(int(pid) * per, (int(pid) + 1) * per)  # this process's half of each batch
    trainer, state, losses, _ = run((2, 1, 1), rows=rows)
    ckpt = Checkpointer(workdir)
    ckpt.save(STEPS, state, {"epoch": 0, "batch": STEPS})
    ckpt.close()
    params = flat(state)
    if jax.process_index() == 0:
        np.savez(out, **params)
        json.dump({"losses": losses, "processes": jax.process_count()}, open(out + ".json", "w"))
    jax.distributed.shutdown()


def translate_ids_run(out, port=None, pid=None):
    """Decodes fixed token ids with freshly initialised parameters, in 1 or 2 processes."""
    import ml_collections

    from tx.translate import LoadedModel, translate_ids

    if port is not None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"localhost:{port}", 2, int(pid))
    cfg = config((jax.process_count(), 1, 1))
    mesh = sharding.make_mesh(cfg.mesh)
    trainer = make_trainer(cfg, model_config(cfg), mesh, sharding.rules(cfg.mesh))
    state = create_train_state(trainer, seed=0)
    loaded = LoadedModel(trainer.model, state.params, None, "init", mesh)
    rng = np.random.default_rng(1)
    ids = [np.append(rng.integers(4, 320, n), 1).astype(np.int32) for n in rng.integers(1, 20, 9)]
    decode = ml_collections.ConfigDict(
        dict(beam_size=4, alpha=0.6, max_extra_len=5, batch_tokens=64)
    )
    hyps = translate_ids(loaded, ids, decode, (8, 16, 32))
    if jax.process_index() == 0:
        json.dump([[h[0][0].tolist(), h[0][1]] for h in hyps], open(out, "w"))
    if port is not None:
        jax.distributed.shutdown()


def single(out):
    _, state, losses, _ = run((1, 1, 1), devices=jax.devices()[:1])
    np.savez(out, **flat(state))
    json.dump({"losses": losses}, open(out + ".json", "w"))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    mode, out, *args = sys.argv[1:]
    {
        "equivalence": equivalence,
        "golden": golden,
        "save": save,
        "restore": restore,
        "multiprocess": multiprocess,
        "single": single,
        "translate": translate_ids_run,
    }[mode](out, *args)
