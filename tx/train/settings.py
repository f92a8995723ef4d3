"""The config's `optim`, `train` and `mesh` sections, owned by this wing (tx.train.optim, the
trainer and loop, tx.train.sharding read them): their fields with their defaults (the paper's
base recipe) and one comment each, the names the wing's code reads, and `check`. It sits at
tx.config's layer and imports nothing of tx: tx.config composes the sections and hands `check`
a checker (`c.cfg` the whole config; its helpers raise ConfigError naming the key).
"""

from __future__ import annotations

AXES = ("data", "fsdp", "tensor")  # the device mesh's axes, in mesh order (tx.train.sharding)
# A dev metric that can choose checkpoints (tx.train.best) -> the key of its evaluation interval.
BEST_METRICS = {"dev_bleu": "train.eval_bleu_every_steps", "dev_loss": "train.eval_every_steps"}


def defaults() -> dict[str, dict]:
    """Section -> field -> default."""
    return {"optim": _optim(), "train": _train(), "mesh": _mesh()}


SCHEDULES = ("paper", "constant")  # optim.schedule (tx.train.optim.make_optimizer)


def _optim() -> dict:
    """Adam and the paper's learning-rate schedule (tx.train.optim)."""
    return dict(
        # "paper": d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); "constant": a linear
        # warm-up to learning_rate, then that rate (fine-tuning: configs/finetune.py)
        schedule="paper",
        learning_rate_scale=1.0,  # "paper": multiplies its rate (1.0 = the paper's)
        learning_rate=1e-4,  # "constant": the rate after the warm-up
        warmup_steps=4000,
        b1=0.9,
        b2=0.98,
        eps=1e-9,
        grad_clip_norm=0.0,  # 0 = no clipping (the paper does not clip)
    )


def _train() -> dict:
    """The loss, the loop, checkpoints and evaluation (tx.train.trainer, tx.train.loop)."""
    return dict(
        num_steps=100_000,
        # A time budget: stop (saving a checkpoint; `train` again goes on) once this invocation
        # has run this long, data preparation and compiling included; 0 = none.
        max_minutes=0.0,
        seed=0,
        label_smoothing=0.1,  # epsilon_ls
        # Token-level unlikelihood (tx.train.losses; Welleck et al. 2020) with this weight,
        # against repeating a token the reference does not repeat; 0 = none (the paper's).
        unlikelihood=0.0,
        micro_batches=1,  # gradient accumulation: each step = this many micro-batches
        # The loss forms the softmax logits piece by piece along the length axis, at most this
        # many (row, position) pairs per device at once, with the gradient in the same pass
        # (tx.train.losses.chunked_cross_entropy): float32 [tokens, V] logits never exist whole.
        # 0 = the plain loss over the whole logits (the reference the fused one is tested on);
        # -1 = per platform (tx.train.losses.chunk_tokens): 8192 on accelerators, on a CPU as
        # many as keep a piece's logits within 32 MiB (docs/performance.md, "What made tx faster").
        loss_chunk_tokens=-1,
        # The paper averages the last 5 checkpoints "written at 10-minute intervals": at its
        # 0.4 s/step that is every 1,500 steps. Averaging uses these step-spaced checkpoints
        # (and the last step), so the window spans the same 6,000 steps on any hardware; 0 =
        # every checkpoint counts. The time-based saves are for resuming only (the newest is kept).
        checkpoint_every_steps=1500,
        checkpoint_every_secs=600,  # safety saves against preemption; never averaged
        keep_checkpoints=20,  # step-spaced checkpoints kept: enough for big's last 20
        log_every_steps=100,
        eval_every_steps=5000,  # dev loss / perplexity; 0 = never
        eval_bleu_every_steps=0,  # dev BLEU during training; 0 = never
        # Keeping the best checkpoints by a dev score (tx.train.best; configs/small.py). The
        # paper keeps and averages the last ones: its dev score still rises when training ends.
        keep_best=0,  # the N best by best_metric, kept beside the last ones; 0 = off
        best_metric="dev_bleu",  # a key of BEST_METRICS, evaluated every BEST_METRICS[it] steps
        early_stopping_patience=0,  # stop after this many evaluations without a better one
        peak_tflops=0.0,  # per device, for MFU; 0 = look up by device kind
        # Fine-tuning (tx.train.init_from): start from another run's parameters instead of
        # random ones: its workdir (its newest average, else its latest checkpoint), one of its
        # checkpoints (W/checkpoints/STEP) or averages (W/averaged/STEP), or a model
        # `python -m tx import` wrote; local or in a bucket. The run takes the source's
        # vocabulary (data.vocab_size must be the source's; data.vocab_path empty or the
        # source's file) and starts at step 0 with a fresh Adam, its own optim schedule and its
        # own data order. Fixed with the run: resuming goes on from the run's own checkpoints
        # and never reads the source again. "" = random initialisation.
        init_from="",
        # With init_from, a model config that differs from the source's in more than what
        # leaves the parameters as they are (dropout rates, dtype, attention_impl, max_len,
        # forget_bias) is refused naming the keys. True lets it differ: the parameters the
        # source lacks (model.attention_bias added, say) start from their initialisation, and
        # every parameter both have must still have the source's shape.
        init_from_new_params=False,
    )


def _mesh() -> dict:
    """The device mesh and the sharding rules (tx.train.sharding)."""
    return dict(
        shape=dict(data=-1, fsdp=1, tensor=1),  # one -1 is filled from the device count
        rules=(  # logical axis -> mesh axes; first rule whose mesh axes are free wins
            ("batch", ("data", "fsdp")),
            ("vocab", "tensor"),
            ("heads", "tensor"),
            ("mlp", "tensor"),
            ("embed", "fsdp"),
            ("kv", None),
            ("length", None),
        ),
        # Several processes (hosts): one that sends no heartbeat for this long is taken for dead,
        # and every other process stops with an error instead of waiting on it for ever (JAX's
        # jax.distributed heartbeat; its default). A process that dies outright is noticed at
        # the next collective, sooner than this.
        heartbeat_timeout_secs=100,
    )


def check(c) -> None:
    """Raises (through `c`, tx.config's checker) on the first invalid optim, train or mesh key."""
    c.positive(
        "optim.warmup_steps",
        "train.num_steps",
        "train.micro_batches",
        "train.keep_checkpoints",
        "train.log_every_steps",
        "mesh.heartbeat_timeout_secs",
    )
    if c.one_of("optim.schedule", SCHEDULES, spelled=True) == "constant":
        c.positive("optim.learning_rate")
    c.nonnegative(
        "optim.learning_rate_scale",
        "optim.grad_clip_norm",
        "train.checkpoint_every_secs",
        "train.checkpoint_every_steps",
        "train.eval_every_steps",
        "train.max_minutes",
        "train.unlikelihood",
        "train.keep_best",
        "train.early_stopping_patience",
    )
    if c.number("train.loss_chunk_tokens") < -1:
        c.fail(
            "train.loss_chunk_tokens must be -1 (per platform), 0 (plain loss) or > 0, got "
            f"{c.cfg.train.loss_chunk_tokens}"
        )
    c.unit("train.label_smoothing", "optim.b1", "optim.b2")
    if c.get("train.init_from_new_params") and not c.get("train.init_from"):
        c.fail("train.init_from_new_params=True needs train.init_from (the run to start from)")
    _check_best(c)
    for axis, size in c.cfg.mesh.shape.items():
        if axis not in AXES:
            c.fail(f"unknown mesh axis 'mesh.shape.{axis}'")
        if c.number(f"mesh.shape.{axis}") == 0 or size < -1:
            c.fail(f"mesh.shape.{axis} must be positive or -1, got {size}")


def _check_best(c) -> None:
    """Keeping the best checkpoints needs a known metric that is evaluated (tx.train.best)."""
    t = c.cfg.train
    metric = c.one_of("train.best_metric", tuple(BEST_METRICS))
    every = BEST_METRICS[metric]
    if t.early_stopping_patience and not t.keep_best:
        c.fail(
            "train.early_stopping_patience needs train.keep_best >= 1 (the best checkpoint "
            "must be kept to know when training stopped improving)"
        )
    if t.keep_best and not c.number(every):
        c.fail(
            f"train.keep_best={t.keep_best} chooses by {metric}, which is never "
            f"evaluated: set {every} > 0"
        )
