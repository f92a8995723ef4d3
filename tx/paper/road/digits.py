"""`road digits`: reverse a list of digits, the seed's small proof of the bottleneck.

"3 1 4" in, "4 1 3" out: the decoder's first output is the encoder's last input, so a model
without attention must carry the whole list in its final state. Three models train on the
same budget (the seed's: 2,500 steps of 64 lists of 3 to 12 digits, teacher forcing) through
tx.train.trainer's jitted step: an LSTM encoder-decoder without attention (configs/rnn_seq2seq.py),
the same with additive attention (configs/rnn_attention.py) and a small Transformer
(configs/demo.py), all 64 wide. Each is scored on 500 new lists of length 4, 8, 12 and 16
(16: longer than any training list): exact match (every digit right) and per-digit accuracy,
teacher-forced as the seed measured, and free-running (greedy and beam 4 through
tx.infer.translate), which the seed did not measure.

Token ids: tx.tokens' reserved ids (PAD 0, EOS 1, UNK 2, BOS 3) and the digits 0-9 as 4-13: a
14-id vocabulary of which 12 occur, as the seed's 12 tokens (digits, start, end).
Time: about 4 minutes on 2 CPU cores (see README.md).
"""

from __future__ import annotations

import time

import jax
import ml_collections
import numpy as np

from tx.config import load_config
from tx.paper.road import config_path, markdown_table
from tx.paper.road.published import DIGITS, DIGITS_TRAINING, DIGITS_WEIGHTS
from tx.tokens import EOS_ID, PAD_ID
from tx.viz import plots

FIRST_DIGIT = 4  # id of digit 0
VOCAB = FIRST_DIGIT + 10
TRAIN_LENGTHS = (3, 12)
TEST_LENGTHS = (4, 8, 12, 16)
TEST_LISTS = 500
BATCH = 64
WIDTH = 64  # d_model of all three (the seed's LSTM has 64 units)
SETTINGS = [  # every model: the same data, steps, batch, Adam schedule and clipping
    f"data.vocab_size={VOCAB}",
    f"model.d_model={WIDTH}",
    "model.dropout_rate=0.0",
    "data.pack=False",
    "train.num_steps=2500",
    "train.label_smoothing=0.0",
    "optim.warmup_steps=200",
    "optim.learning_rate_scale=1.0",
    "optim.grad_clip_norm=1.0",
    "decode.alpha=0.0",  # digit lists have a known length: no length preference
    "decode.max_extra_len=4",
    "decode.batch_tokens=4096",
]
MODELS = (  # name, config, its own overrides
    ("LSTM, no attention", "configs/rnn_seq2seq.py", ("model.num_layers=1",)),
    ("LSTM + additive attention", "configs/rnn_attention.py", ("model.num_layers=1",)),
    (
        "Transformer",
        "configs/demo.py",
        ("model.num_layers=2", "model.num_heads=4", "model.d_ff=128"),
    ),
)


def digit_lists(rng: np.random.Generator, count: int, low: int, high: int):
    """(sources, targets) [count, high + 1] int32: digits then EOS, and the same reversed."""
    lengths = rng.integers(low, high + 1, count)
    src = np.full((count, high + 1), PAD_ID, np.int32)
    tgt = np.full((count, high + 1), PAD_ID, np.int32)
    for row, n in enumerate(lengths):
        digits = rng.integers(0, 10, n) + FIRST_DIGIT
        src[row, : n + 1] = [*digits, EOS_ID]
        tgt[row, : n + 1] = [*digits[::-1], EOS_ID]
    return src, tgt


def train_model(cfg: ml_collections.ConfigDict, seed: int = 0):
    """Trains on fresh random lists every step; returns (trainer, params, last loss, secs)."""
    from tx.train.trainer import build, create_train_state, jit_train_step

    trainer = build(cfg)
    state = create_train_state(trainer, seed)
    step = jit_train_step(trainer)
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    for _ in range(cfg.train.num_steps):
        src, tgt = digit_lists(rng, BATCH, *TRAIN_LENGTHS)
        state, metrics = step(state, trainer.layout.global_batch({"inputs": src, "targets": tgt}))
    loss = float(metrics["loss"] / metrics["weight"])
    return trainer, state.params, loss, time.perf_counter() - start


def teacher_forced(trainer, params, src, tgt) -> tuple[float, float]:
    """% of lists with every digit right and % of digits right, given the true prefix."""
    logits = jax.jit(trainer.model.apply)({"params": params}, src, tgt)
    right = (np.asarray(logits).argmax(-1) == tgt) | (tgt < FIRST_DIGIT)  # digits only
    digits = tgt >= FIRST_DIGIT
    return 100 * right.all(1).mean(), 100 * (right & digits).sum() / digits.sum()


def free_running(trainer, params, cfg, src, tgt, strategy: str) -> tuple[float, float]:
    """The same two scores of the model's own output (greedy or beam 4, tx.infer.translate)."""
    from tx.infer.translate import LoadedModel, translate_ids

    decode = ml_collections.ConfigDict(cfg.decode.to_dict())
    decode.strategy = strategy
    loaded = LoadedModel(trainer.model, params, None, "road digits", trainer.layout)
    sources = [row[row != PAD_ID] for row in src]
    hyps = translate_ids(loaded, sources, decode, (src.shape[1],))
    exact = right = total = 0
    for [(out, _)], ref in zip(hyps, tgt, strict=True):
        ref = ref[ref >= FIRST_DIGIT]
        hit = np.zeros(len(ref), bool)
        hit[: min(len(out), len(ref))] = out[: len(ref)] == ref[: len(out)]
        exact += len(out) == len(ref) and hit.all()
        right, total = right + hit.sum(), total + len(ref)
    return 100 * exact / len(hyps), 100 * right / total


def evaluate(trainer, params, cfg) -> dict:
    """{length: {"teacher": (exact, tokens), "greedy": ..., "beam": ...}} on new lists."""
    rng = np.random.default_rng(12345)  # other lists than training's (seed 0)
    out = {}
    for n in TEST_LENGTHS:
        src, tgt = digit_lists(rng, TEST_LISTS, n, n)
        out[n] = {
            "teacher": teacher_forced(trainer, params, src, tgt),
            "greedy": free_running(trainer, params, cfg, src, tgt, "greedy"),
            "beam": free_running(trainer, params, cfg, src, tgt, "beam"),
        }
    return out


def run(results: str, root: str, overrides=(), say=print):
    from tx.model.counting import param_counts

    models = []
    for name, path, own in MODELS:
        cfg = load_config(config_path(path), [*SETTINGS, *own, *overrides])
        trainer, params, loss, secs = train_model(cfg)
        weights = param_counts(trainer.model.config)["params"]
        say(f"road digits: {name}: {weights:,} weights, last loss {loss:.3f}, {secs:.0f} s")
        models.append(dict(name=name, weights=weights, loss=loss, secs=secs))
        models[-1]["scores"] = evaluate(trainer, params, cfg)
    extra = "".join(f" --config.{o}" for o in overrides)
    return report(models, load_config(config_path(MODELS[0][1]), [*SETTINGS, *overrides]), extra)


def _cell(scores) -> str:
    return f"{scores[0]:.1f}% ({scores[1]:.1f}%)"


def report(models: list[dict], cfg, extra: str):
    steps = cfg.train.num_steps
    head = ["length", "seed: no attention", "seed: with attention"]
    head += [m["name"] for m in models]
    rows = []
    for n in TEST_LENGTHS:
        seed = DIGITS.get(n, ((None, None), (None, None)))
        rows.append(
            [n, _cell(seed[0]), _cell(seed[1])] + [_cell(m["scores"][n]["teacher"]) for m in models]
        )
    free_head = ["length"] + [f"{m['name']}, {s}" for m in models for s in ("greedy", "beam 4")]
    free = [
        [n] + [_cell(m["scores"][n][s]) for m in models for s in ("greedy", "beam")]
        for n in TEST_LENGTHS
    ]
    trained = "; ".join(
        f"{m['name']} {m['weights']:,} weights, last loss {m['loss']:.3f}, {m['secs']:.0f} s"
        for m in models
    )
    body = (
        f"Reverse a list of digits. Training: {steps} steps of {BATCH} random lists of "
        f"{TRAIN_LENGTHS[0]} to {TRAIN_LENGTHS[1]} digits, teacher forcing, Adam on the "
        f"paper's schedule (warm-up {cfg.optim.warmup_steps}), the same for all three: "
        f"{trained}. The seed: {DIGITS_TRAINING}; {DIGITS_WEIGHTS['no attention']:,} and "
        f"{DIGITS_WEIGHTS['with attention']:,} weights.\n\n"
        f"Teacher-forced (the seed's measure): % of {TEST_LISTS} new lists with every digit "
        "right (% of digits right); length 16 is longer than any training list.\n\n"
        + markdown_table(head, rows)
        + "\nFree-running (the model's own previous digits; not measured by the seed): the "
        "output must be the reversed list exactly; digits compared position by position.\n\n"
        + markdown_table(free_head, free)
    )
    return body, figure(models), f"python -m tx road digits{extra}"


def figure(models: list[dict]):
    fig = plots.new_figure(11, 4.2)
    axes = fig.subplots(1, 2)
    for ax, k, title in zip(axes, (0, 1), ("whole list right", "digits right"), strict=True):
        for i, m in enumerate(models):
            for style, key in (("-o", "teacher"), (":s", "greedy")):
                values = [m["scores"][n][key][k] for n in TEST_LENGTHS]
                label = f"{m['name']}, {'teacher-forced' if key == 'teacher' else 'greedy'}"
                ax.plot(TEST_LENGTHS, values, style, color=f"C{i}", label=label)
        for j, name in enumerate(("seed: no attention", "seed: with attention")):
            seed = [DIGITS[n][j][k] for n in TEST_LENGTHS]
            ax.plot(TEST_LENGTHS, seed, "x", color=f"C{j}", markersize=10, label=name)
        ax.axvspan(12.5, 16.5, color="grey", alpha=0.1)
        ax.set(xlabel="list length (grey: longer than training)", ylabel="%", title=title)
        ax.set_xticks(TEST_LENGTHS)
        ax.set_ylim(-3, 103)
    axes[0].legend(fontsize=7)
    fig.suptitle("Reversing digits: the fixed-length summary against attention")
    return fig
