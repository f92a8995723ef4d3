"""The run's pieces from a config, the sharded train state, and the pure, jitted steps.

    trainer = build(cfg)                       # mesh + layout, model, optimizer, shardings
    state = create_train_state(trainer, seed)  # parameters born sharded, even on a pod
    step = jit_train_step(trainer)             # (state, batch) -> (state, metrics), donated

`create_train_state` follows the pjit recipe: jax.eval_shape -> logical partition specs ->
NamedSharding -> jax.jit(init, out_shardings=...). `train_step` accumulates gradients over
micro-batches so the optimizer sees the configured token budget on any number of devices.
The loop that drives these steps is tx.train.loop.
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

from tx.config import model_config
from tx.model.families import build_model
from tx.model.layers import traced_on
from tx.tokens import PAD_ID
from tx.train import kept, sharding
from tx.train.losses import (
    chunk_tokens,
    chunked_cross_entropy,
    chunks_for,
    cross_entropy,
    objective,
)
from tx.train.optim import make_optimizer

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
    """The static parts of training: model, optimizer, layout and the state's abstract form."""

    model: nn.Module  # tx.model.families.build_model: a Transformer or an RNNSeq2Seq
    optimizer: optax.GradientTransformation
    schedule: optax.Schedule
    layout: sharding.Layout
    abstract_state: Any  # TrainState of ShapeDtypeStructs with their shardings
    label_smoothing: float
    micro_batches: int
    loss_chunk_tokens: int  # 0: the plain loss; > 0: the fused one (tx.train.losses), resolved
    unlikelihood: float = 0.0  # alpha of token-level unlikelihood (tx.train.losses); 0: none
    configured: bool = True  # the optimizer is the config's (build's `optimizer` not given)

    @property
    def sum_keys(self) -> tuple[str, ...]:
        """The sums a step's loss returns (tx.train.losses.cross_entropy)."""
        extra = ("unlikelihood", "objective") if self.unlikelihood > 0 else ()
        return ("loss", "nll", "correct", "weight", *extra)

    @property
    def mesh(self):
        return self.layout.mesh

    @property
    def state_sharding(self):
        return jax.tree_util.tree_map(lambda s: s.sharding, self.abstract_state)


def _init_boxed(model: nn.Module, optimizer, rng):
    tokens = jnp.ones((1, 8), jnp.int32)
    params = model.init({"params": rng}, tokens, tokens, deterministic=True)["params"]
    return _state_around(optimizer, params, rng)


def _state_around(optimizer, params, rng) -> TrainState:
    """A new TrainState holding `params`."""
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        rng=jax.random.fold_in(rng, 1),
    )


def build(
    cfg: ml_collections.ConfigDict,
    devices=None,
    optimizer: optax.GradientTransformation | None = None,
) -> Trainer:
    """The run's pieces from `cfg`: the layout over `devices` (default: all), the model, Adam
    on the paper's schedule, and the shardings of the train state.

    `optimizer` replaces the configured Adam: the tests that compare meshes use SGD, whose
    update is linear in the gradient (see tests/equivalence.py).
    """
    mc = model_config(cfg)
    layout = sharding.layout(cfg.mesh, devices)
    sharding.check_sizes_fit(layout.mesh, mc.tensor_split_sizes())
    model = build_model(mc)
    adam, schedule = make_optimizer(cfg.optim, mc.d_model)
    configured, optimizer = optimizer is None, optimizer or adam
    # the parameters' tree traced through the model once and kept (tx.train.kept), the rest
    # of the state from it: _init_boxed's shapes without tracing the model again
    params, key = kept.abstract_params(mc), jax.eval_shape(jax.random.PRNGKey, 0)
    abstract = jax.eval_shape(functools.partial(_state_around, optimizer), params, key)
    return Trainer(
        model,
        optimizer,
        schedule,
        layout,
        layout.placed(abstract),
        cfg.train.label_smoothing,
        cfg.train.micro_batches,
        chunk_tokens(cfg.train.loss_chunk_tokens, mc.vocab_rows, layout.platform),
        cfg.train.unlikelihood,
        configured=configured,
    )


def _in_context(trainer: Trainer, fn):
    """`fn` run under the mesh and the logical-axis rules (for the activations' constraints)."""

    @functools.wraps(fn)
    def wrapped(*args):
        with traced_on(trainer.mesh), nn.logical_axis_rules(trainer.layout.rules):
            return fn(*args)

    return wrapped


def create_train_state(trainer: Trainer, seed: int) -> TrainState:
    """Initialises parameters and optimizer state directly in their sharded layout."""

    def init(rng):
        return nn.meta.unbox(_init_boxed(trainer.model, trainer.optimizer, rng))

    init = jax.jit(_in_context(trainer, init), out_shardings=trainer.state_sharding)
    return init(jax.random.PRNGKey(seed))


def abstract_train_state(trainer: Trainer) -> TrainState:
    """ShapeDtypeStructs with shardings: the restore target for checkpoints on this mesh."""
    return trainer.abstract_state


def _loss_sums(trainer: Trainer, params, batch, rng, deterministic: bool, unlikelihood=0.0):
    """Summed losses of one (micro-)batch; the model sees only its own inputs."""
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    rngs = None if deterministic else {"dropout": rng}
    targets = batch["targets"]
    weights = (targets != PAD_ID).astype(jnp.float32)
    unlikely = dict(unlikelihood=unlikelihood, segments=batch.get("targets_segments"))
    # A model with `features` (the Transformer) can hand the loss its pre-softmax states.
    if trainer.loss_chunk_tokens > 0 and hasattr(type(trainer.model), "features"):
        states, head = trainer.model.apply(
            {"params": params},
            **inputs,
            deterministic=deterministic,
            rngs=rngs,
            method="features",
        )
        rows, length = targets.shape
        per_device = rows * length // trainer.layout.data_shards
        return chunked_cross_entropy(
            states,
            head,
            targets,
            weights,
            label_smoothing=trainer.label_smoothing,
            vocab_size=trainer.model.config.vocab_size,
            chunks=chunks_for(per_device, length, trainer.loss_chunk_tokens),
            **unlikely,
        )
    logits = trainer.model.apply(
        {"params": params}, **inputs, deterministic=deterministic, rngs=rngs
    )
    return cross_entropy(logits, targets, weights, trainer.label_smoothing, **unlikely)


def _split_micro(batch: dict, k: int, layout: sharding.Layout) -> dict:
    """[R, L] -> [k, R/k, L], micro-batch m taking rows m, m+k, ... so that every device's
    contiguous block of rows feeds every micro-batch equally."""

    def split(x):
        rows = x.shape[0]
        x = x.reshape(rows // k, k, *x.shape[1:]).swapaxes(0, 1)
        return jax.lax.with_sharding_constraint(x, layout.micro_batches)

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

    def gradient(index, mb):
        def loss_fn(params):
            rng = jax.random.fold_in(step_rng, index)
            s = _loss_sums(trainer, params, mb, rng, False, trainer.unlikelihood)
            return objective(s) / total_weight, s

        g, s = jax.grad(loss_fn, has_aux=True)(state.params)
        return g, {key: v.astype(jnp.float32) for key, v in s.items()}  # metrics: float32

    if k == 1:  # no accumulator to zero and add into: a pass over every gradient saved
        grads, sums = gradient(0, batch)
    else:

        def accumulate(carry, xs):
            g, s = gradient(*xs)
            return jax.tree_util.tree_map(jnp.add, carry, (g, s)), None

        zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
        zero_sums = {key: jnp.zeros((), jnp.float32) for key in trainer.sum_keys}
        micro = _split_micro(batch, k, trainer.layout)
        (grads, sums), _ = jax.lax.scan(accumulate, (zeros, zero_sums), (jnp.arange(k), micro))

    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(grad_norm)

    def update(_):
        updates, opt_state = trainer.optimizer.update(grads, state.opt_state, state.params)
        return optax.apply_updates(state.params, updates), opt_state

    # A branch, not a select of new and old: the update is computed only when it is applied,
    # and no pass over parameters and moments chooses between two copies.
    params, opt_state = jax.lax.cond(
        finite, update, lambda _: (state.params, state.opt_state), None
    )
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    metrics = {
        **sums,  # "weight": real target tokens
        "src_tokens": jnp.sum(batch["inputs"] != PAD_ID).astype(jnp.float32),
        "grad_norm": grad_norm,
        "finite": finite,
        "learning_rate": trainer.schedule(state.step),
    }
    return new_state, metrics


def eval_step(trainer: Trainer, params, batch: dict) -> dict:
    """Summed dev loss, NLL (for per-token perplexity), correct tokens and token count: the
    cross-entropy only, with or without `train.unlikelihood`."""
    return _loss_sums(trainer, params, batch, None, True)


def jit_train_step(trainer: Trainer):
    """train_step compiled with the state donated and its sharding fixed."""
    return jax.jit(
        _in_context(trainer, functools.partial(train_step, trainer)),
        in_shardings=(trainer.state_sharding, trainer.layout.batch),
        out_shardings=(trainer.state_sharding, None),
        donate_argnums=(0,),
    )


def kept_train_step(trainer: Trainer, cfg: ml_collections.ConfigDict):
    """jit_train_step(trainer) (built from `cfg`), kept traced across commands where
    tx.train.kept keeps programs (one device, one process, a compilation cache on): a resumed
    run neither traces nor lowers its step again. Keyed by the whole config, which is all
    the step depends on besides the shapes for a trainer `build` made from it with the
    configured optimizer (one given in its place is not in the config: that step is jitted,
    never kept). The same program runs cold and warm, on the state's leaves (jax.export keeps
    only builtin containers): one batch shape, one entry."""
    if not kept.keeping() or not trainer.configured:
        return jit_train_step(trainer)
    key = {"config": cfg.to_json_best_effort(sort_keys=True)}
    leaves, tree = jax.tree_util.tree_flatten(trainer.abstract_state)
    shardings = [x.sharding for x in leaves]

    def flat_step(state_leaves: list, batch: dict):
        state, metrics = train_step(
            trainer, jax.tree_util.tree_unflatten(tree, state_leaves), batch
        )
        return jax.tree_util.tree_leaves(state), metrics

    flat = jax.jit(
        _in_context(trainer, flat_step),
        in_shardings=(shardings, trainer.layout.batch),
        out_shardings=(shardings, None),
        donate_argnums=(0,),
    )
    programs: dict = {}  # by the batch's shapes

    def step(state: TrainState, batch: dict):
        shapes = tuple((k, v.shape, str(v.dtype)) for k, v in sorted(batch.items()))
        if shapes not in programs:
            programs[shapes] = kept.program("train_step", flat, key, (leaves, batch), (0,))
        state_leaves, state_tree = jax.tree_util.tree_flatten(state)
        if state_tree != tree:  # as the jitted step's shardings would refuse it
            raise ValueError(f"the train state's structure {state_tree} is not {tree}")
        new, metrics = programs[shapes](state_leaves, batch)
        return jax.tree_util.tree_unflatten(tree, new), metrics

    return step


def jit_eval_step(trainer: Trainer):
    return jax.jit(
        _in_context(trainer, functools.partial(eval_step, trainer)),
        in_shardings=(trainer.state_sharding.params, trainer.layout.batch),
    )
