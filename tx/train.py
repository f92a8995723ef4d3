"""Sharded train state and the pure, jitted training and evaluation steps.

`create_train_state` follows the pjit recipe: jax.eval_shape -> logical partition specs ->
NamedSharding -> jax.jit(init, out_shardings=...), so parameters are born sharded even on a
pod. `train_step(state, batch) -> (state, metrics)` accumulates gradients over micro-batches
so the optimizer sees the configured token budget on any number of devices.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tx.data.tokenizer import PAD_ID
from tx.losses import cross_entropy
from tx.model import ModelConfig, Transformer
from tx.optim import make_optimizer
from tx.sharding import BATCH_AXES, logical_shardings

MODEL_INPUTS = (
    "inputs",
    "targets",
    "inputs_segments",
    "targets_segments",
    "inputs_positions",
    "targets_positions",
)


class TrainState(flax.struct.PyTreeNode):
    """Everything a step changes. The data position travels beside it in the checkpoint."""

    step: jax.Array  # [] int32, optimizer updates applied so far
    params: Any
    opt_state: Any
    rng: jax.Array  # [2] uint32 base key; each step folds in its number


@dataclasses.dataclass(frozen=True)
class Trainer:
    """The static parts of training: model, optimizer, mesh and shardings."""

    model: Transformer
    optimizer: optax.GradientTransformation
    schedule: optax.Schedule
    mesh: Mesh
    rules: tuple
    state_sharding: Any
    label_smoothing: float
    micro_batches: int


def _init_boxed(model: Transformer, optimizer, rng):
    tokens = jnp.ones((1, 8), jnp.int32)
    params = model.init({"params": rng}, tokens, tokens, deterministic=True)["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        rng=jax.random.fold_in(rng, 1),
    )


def make_trainer(
    cfg: ml_collections.ConfigDict,
    model_cfg: ModelConfig,
    mesh: Mesh,
    rules: tuple,
    optimizer: optax.GradientTransformation | None = None,
) -> Trainer:
    """The static parts of training. `optimizer` replaces the configured Adam: the tests that
    compare meshes use SGD, whose update is linear in the gradient (see tests/equivalence.py)."""
    model = Transformer(model_cfg)
    adam, schedule = make_optimizer(cfg.optim, model_cfg.d_model)
    optimizer = optimizer or adam
    abstract = jax.eval_shape(
        functools.partial(_init_boxed, model, optimizer), jax.random.PRNGKey(0)
    )
    with mesh:
        shardings = logical_shardings(abstract, mesh, rules)
    return Trainer(
        model,
        optimizer,
        schedule,
        mesh,
        rules,
        shardings,
        cfg.train.label_smoothing,
        cfg.train.micro_batches,
    )


def create_train_state(trainer: Trainer, seed: int) -> TrainState:
    """Initialises parameters and optimizer state directly in their sharded layout."""

    def init(rng):
        return nn.meta.unbox(_init_boxed(trainer.model, trainer.optimizer, rng))

    with trainer.mesh, nn.logical_axis_rules(trainer.rules):
        return jax.jit(init, out_shardings=trainer.state_sharding)(jax.random.PRNGKey(seed))


def abstract_train_state(trainer: Trainer) -> TrainState:
    """ShapeDtypeStructs with shardings: the restore target for checkpoints on this mesh."""

    def init(rng):
        return nn.meta.unbox(_init_boxed(trainer.model, trainer.optimizer, rng))

    shapes = jax.eval_shape(init, jax.random.PRNGKey(0))
    return jax.tree_util.tree_map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        shapes,
        trainer.state_sharding,
    )


def _loss_sums(trainer: Trainer, params, batch, rng, deterministic: bool):
    """Summed losses of one (micro-)batch; the model sees only its own inputs."""
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    rngs = None if deterministic else {"dropout": rng}
    logits = trainer.model.apply(
        {"params": params}, **inputs, deterministic=deterministic, rngs=rngs
    )
    weights = (batch["targets"] != PAD_ID).astype(jnp.float32)
    return cross_entropy(logits, batch["targets"], weights, trainer.label_smoothing)


def _split_micro(batch: dict, k: int, mesh: Mesh) -> dict:
    """[R, L] -> [k, R/k, L], micro-batch m taking rows m, m+k, ... so that every device's
    contiguous block of rows feeds every micro-batch equally."""

    def split(x):
        rows = x.shape[0]
        x = x.reshape(rows // k, k, *x.shape[1:]).swapaxes(0, 1)
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, BATCH_AXES)))

    return {key: split(v) for key, v in batch.items()}


def train_step(trainer: Trainer, state: TrainState, batch: dict):
    """One optimizer update over the whole batch (all micro-batches).

    The gradient is that of (sum of smoothed losses) / (number of target tokens in the whole
    batch), the same whether the batch is split into micro-batches or not. A non-finite loss
    or gradient leaves the state unchanged and reports `finite = False`.
    """
    k = trainer.micro_batches
    total_weight = jnp.maximum(jnp.sum(batch["targets"] != PAD_ID), 1).astype(jnp.float32)
    step_rng = jax.random.fold_in(state.rng, state.step)
    micro = _split_micro(batch, k, trainer.mesh)

    def accumulate(carry, xs):
        grads, sums = carry
        index, mb = xs

        def loss_fn(params):
            s = _loss_sums(trainer, params, mb, jax.random.fold_in(step_rng, index), False)
            return s["loss"] / total_weight, s

        g, s = jax.grad(loss_fn, has_aux=True)(state.params)
        add = functools.partial(jax.tree_util.tree_map, jnp.add)
        s = {key: v.astype(jnp.float32) for key, v in s.items()}  # metrics: float32 always
        return (add(grads, g), add(sums, s)), None

    zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
    zero_sums = {key: jnp.zeros((), jnp.float32) for key in ("loss", "nll", "correct", "weight")}
    (grads, sums), _ = jax.lax.scan(accumulate, (zeros, zero_sums), (jnp.arange(k), micro))

    updates, opt_state = trainer.optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(grad_norm)
    keep = functools.partial(jax.tree_util.tree_map, lambda new, old: jnp.where(finite, new, old))
    new_state = state.replace(
        step=state.step + 1,
        params=keep(params, state.params),
        opt_state=keep(opt_state, state.opt_state),
    )
    metrics = {
        **sums,  # "weight": real target tokens
        "src_tokens": jnp.sum(batch["inputs"] != PAD_ID).astype(jnp.float32),
        "grad_norm": grad_norm,
        "finite": finite,
        "learning_rate": trainer.schedule(state.step),
    }
    return new_state, metrics


def eval_step(trainer: Trainer, params, batch: dict) -> dict:
    """Summed dev loss, NLL (for per-token perplexity), correct tokens and token count."""
    return _loss_sums(trainer, params, batch, None, True)


def jit_train_step(trainer: Trainer):
    """train_step compiled with the state donated and its sharding fixed."""
    batch_sharding = NamedSharding(trainer.mesh, P(BATCH_AXES, None))

    def step(state, batch):
        with trainer.mesh, nn.logical_axis_rules(trainer.rules):
            return train_step(trainer, state, batch)

    return jax.jit(
        step,
        in_shardings=(trainer.state_sharding, batch_sharding),
        out_shardings=(trainer.state_sharding, None),
        donate_argnums=(0,),
    )


def jit_eval_step(trainer: Trainer):
    batch_sharding = NamedSharding(trainer.mesh, P(BATCH_AXES, None))

    def step(params, batch):
        with trainer.mesh, nn.logical_axis_rules(trainer.rules):
            return eval_step(trainer, params, batch)

    return jax.jit(step, in_shardings=(trainer.state_sharding.params, batch_sharding))
