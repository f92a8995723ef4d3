"""Pictures: valid PNGs of the expected size, no overlapping text for a 25-token sentence, the
model's own positional encodings, curves from event files, and the commands that draw them."""

import os
import struct
import time

import jax.numpy as jnp
import numpy as np
import pytest
from matplotlib.image import imread
from matplotlib.text import Text
from test_cli import tx_in_process

from tx.model.layers import PositionEmbedding
from tx.train.events import read_scalars
from tx.viz import plots
from tx.viz.pictures import PictureError, positional_encoding

# 25 sub-words of a WMT-like sentence, some long, as SentencePiece spells them.
TOKENS_25 = [
    "▁The",
    "▁international",
    "▁committee",
    "▁said",
    "▁on",
    "▁Tues",
    "day",
    "▁that",
    "▁negoti",
    "ations",
    "▁between",
    "▁the",
    "▁two",
    "▁governments",
    "▁would",
    "▁continue",
    "▁through",
    "out",
    "▁the",
    "▁following",
    "▁week",
    ",",
    "▁officials",
    "▁say",
    ".",
]


def png_size(path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk; the file must also decode as a whole."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", head[16:24])
    assert imread(path).shape[:2] == (height, width)  # zlib and CRCs are intact
    return width, height


def expected_size(fig) -> tuple[int, int]:
    w, h = fig.get_size_inches() * plots.DPI
    return round(w), round(h)


def overlaps(fig, draw=None) -> list[tuple[str, str]]:
    """Pairs of texts drawn on `fig` (titles, labels, the tick labels inside the view) whose
    boxes intersect, as `draw()` draws it: the canvas by default, or `plots.save` writing the
    PNG (it lays out and draws the figure at the same DPI; a 6 x 8 grid takes seconds a draw,
    so a test that saves checks that drawing rather than adding one)."""
    drawn = {}  # in drawing order, once (a save lays out the figure, then draws it)
    original = Text.draw

    def record(self, renderer):
        if self.get_visible() and self.get_text().strip():
            drawn[self] = None
        return original(self, renderer)

    Text.draw = record
    try:
        (draw or fig.canvas.draw)()
    finally:
        Text.draw = original
    texts = list(drawn)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer).shrunk(0.98, 0.98) for t in texts]
    return [
        (texts[i].get_text(), texts[j].get_text())
        for i in range(len(texts))
        for j in range(i + 1, len(texts))
        if boxes[i].overlaps(boxes[j])
    ]


def random_attention(layers, heads, q, k, seed=0) -> np.ndarray:
    x = np.random.default_rng(seed).random((layers, heads, q, k)) ** 4
    return x / x.sum(-1, keepdims=True)


def grid_25(layers=6, heads=8):
    return plots.attention_grid(
        random_attention(layers, heads, 25, 25),
        TOKENS_25,
        TOKENS_25,
        "Encoder self-attention: " + " ".join(TOKENS_25),
        "query: source sub-word",
        "key: source sub-word",
    )


def test_attention_grid_is_a_png_of_its_size_without_overlapping_text(tmp_path):
    fig = grid_25()  # the base model's 6 layers x 8 heads
    path = str(tmp_path / "sub" / "grid.png")
    assert overlaps(fig, draw=lambda: plots.save(fig, path)) == []
    assert png_size(path) == expected_size(fig)
    assert max(png_size(path)) < 6000  # legible, not a poster
    assert not os.path.exists(path + ".tmp")


def test_the_overlap_check_sees_crowded_labels(monkeypatch):
    """The check above can fail: with 0.05 in per token the labels must collide."""
    monkeypatch.setattr(plots, "CELL_IN", 0.05)
    monkeypatch.setattr(plots, "PANEL_IN", (0.5, 3.0))
    assert overlaps(grid_25(layers=2, heads=2))


def test_a_long_sentence_labels_every_nth_token():
    tokens = [f"▁w{i}" for i in range(150)]
    fig = plots.attention_grid(random_attention(1, 2, 150, 150), tokens, tokens, "t", "q", "k")
    ax = fig.axes[0]
    assert len(ax.get_yticks()) <= plots.MAX_LABELS and ax.get_yticklabels()[1].get_text() == "▁w3"
    assert overlaps(fig) == []
    assert max(expected_size(fig)) < 6000


def test_each_panel_shows_its_head_and_the_mean(tmp_path):
    weights = random_attention(2, 3, 4, 5)
    fig = plots.attention_grid(weights, list("abcd"), list("vwxyz"), "t", "q", "k")
    panels = [ax for ax in fig.axes if ax.images and ax.get_label() != "<colorbar>"]
    assert len(panels) == 2 * 4
    np.testing.assert_array_equal(panels[1].images[0].get_array(), weights[0, 1])
    np.testing.assert_allclose(panels[7].images[0].get_array(), weights[1].mean(0))
    assert [ax.get_title() for ax in panels[:4]] == ["head 0", "head 1", "head 2", "mean of heads"]


@pytest.mark.parametrize("d_model", [16, 512])
def test_positional_picture_shows_the_models_own_encoding(d_model):
    encoding = positional_encoding(d_model)
    fig = plots.positional_figure(encoding)
    lines, matrix, dots = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    positions = jnp.arange(len(encoding))[None]
    # What the model adds to its embeddings: PositionEmbedding applied to zeros.
    added = PositionEmbedding(d_model).apply({}, jnp.zeros((1, len(encoding), d_model)), positions)
    np.testing.assert_array_equal(matrix.images[0].get_array(), np.asarray(added[0]))
    np.testing.assert_allclose(dots.images[0].get_array(), encoding @ encoding.T)
    for line in lines.get_lines():
        dim = int(line.get_label().split()[1])
        np.testing.assert_array_equal(line.get_ydata(), np.asarray(added[0, :, dim]))
    assert overlaps(fig) == []


def test_positional_needs_an_even_width():
    with pytest.raises(PictureError, match="even"):
        positional_encoding(7)


def _event_file(path, events) -> None:
    """A TFRecord file of scalar events (step, wall time, tag, value), as older writers wrote
    them (`simple_value`)."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    with open(path, "wb") as f:
        for step, wall, tag, value in events:
            e = event_pb2.Event(step=step, wall_time=wall)
            e.summary.value.add(tag=tag, simple_value=value)
            RecordWriter(f).write(e.SerializeToString())


def test_events_are_read_in_step_order_and_a_rewritten_step_keeps_the_later_value(tmp_path):
    tb = tmp_path / "tensorboard"
    tb.mkdir()
    _event_file(
        tb / "events.out.tfevents.1.a", [(10, 1.0, "train/loss", 5.0), (20, 2.0, "train/loss", 4.0)]
    )
    # Resumed from step 10: step 20 logged again later, then step 30; the file is cut short.
    _event_file(
        tb / "events.out.tfevents.2.b", [(20, 3.0, "train/loss", 3.5), (30, 4.0, "train/loss", 3.0)]
    )
    with open(tb / "events.out.tfevents.2.b", "ab") as f:
        f.write(b"\x40\0\0\0\0\0\0\0partial")
    steps, values = read_scalars(str(tmp_path))["train/loss"]
    np.testing.assert_array_equal(steps, [10, 20, 30])
    np.testing.assert_array_equal(values, [5.0, 3.5, 3.0])


def test_curves_of_two_runs(trained, tmp_path):
    scalars = read_scalars(trained)
    assert {"train/loss", "train/learning_rate", "train/tokens_per_sec"} <= set(scalars)
    steps, _ = scalars["train/loss"]
    np.testing.assert_array_equal(steps, [5, 10, 15, 20])  # tiny: a line every 5 steps
    fig = plots.curves_figure({"a": scalars, "b": {"train/loss": (steps, np.ones(4))}})
    loss = fig.axes[0]
    assert loss.get_title() == "training loss" and len(loss.get_lines()) == 2
    assert "not logged" in " ".join(t.get_text() for t in fig.axes[3].texts)  # no dev BLEU
    assert overlaps(fig) == []
    assert png_size(plots.save(fig, str(tmp_path / "c.png"))) == expected_size(fig)


def test_by_length_figure(tmp_path):
    buckets = [
        {"bucket": "1-10", "bleu": 31.5, "sentences": 120},
        {"bucket": "11-20", "bleu": 27.0, "sentences": 80},
        {"bucket": "61+", "bleu": 12.25, "sentences": 3},
    ]
    fig = plots.by_length_figure(buckets, "test: sacreBLEU by source length, averaged/600")
    ax = fig.axes[0]
    assert [round(p.get_height(), 2) for p in ax.patches] == [31.5, 27.0, 12.25]
    assert overlaps(fig) == []
    assert png_size(plots.save(fig, str(tmp_path / "b.png"))) == expected_size(fig)


@pytest.fixture
def tx_cli(capfd, monkeypatch):
    """tx_cli(*args) -> (exit status, stdout, stderr) of `python -m tx ARGS`, run in this
    process (test_cli.tx_in_process: stderr and logging as in a process of its own). The
    pictures are drawn on Agg canvases (tx.viz.plots), whatever process draws them."""
    return lambda *args: tx_in_process(capfd, monkeypatch, *args)


def test_attention_and_plot_commands_print_what_they_wrote(tx_cli, trained, tmp_path):
    start = time.time()
    att = str(tmp_path / "att")
    status, out, err = tx_cli(
        "attention", "--workdir", trained, "--text", "The dog sees a cat.", "--out", att
    )
    assert status == 0, err[-2000:]
    paths = [line.removeprefix("wrote ") for line in out.splitlines()]
    assert [os.path.basename(p) for p in paths] == [
        "encoder_self_attention.png",
        "decoder_self_attention.png",
        "encoder_decoder_attention.png",
    ]
    for p in paths:
        assert os.path.getmtime(p) >= start - 1 and min(png_size(p)) > 300
    status, out, _ = tx_cli(
        "plot", "--workdir", trained, trained, "--out", str(tmp_path / "curves.png")
    )
    assert status == 0 and out.strip() == f"wrote {tmp_path / 'curves.png'}"
    assert png_size(tmp_path / "curves.png") == (1500, 800)
    status, _, _ = tx_cli(
        "plot", "--positional", "--d_model", "64", "--out", str(tmp_path / "pe.png")
    )
    assert status == 0 and png_size(tmp_path / "pe.png") == (1600, 500)


@pytest.mark.parametrize(
    "args,message",
    [
        (("attention", "--text", "   "), "error: --text is empty"),
        (("plot",), "error: plot needs --workdir"),
        (("plot", "--positional", "--d_model", "5"), "error: --d_model must be a positive even"),
    ],
)
def test_bad_input_is_one_line(tx_cli, trained, args, message):
    if args[0] == "attention":
        args = (*args, "--workdir", trained)
    status, _, err = tx_cli(*args)
    assert status != 0 and err.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in err


def test_no_such_workdir_is_one_line(tx_cli, tmp_path):
    for command in (("attention", "--text", "x"), ("plot",)):
        status, _, err = tx_cli(*command, "--workdir", str(tmp_path / "nope"))
        assert status == 2 and "Traceback" not in err
        assert (
            err.strip().splitlines()[-1] == f"error: --workdir {tmp_path / 'nope'} does not exist"
        )


def test_evaluate_by_length_reports_buckets_and_draws_them(trained, tmp_path, monkeypatch):
    import tx.eval.evaluate
    from tx.config import load_config
    from tx.data.dataset import split_text
    from tx.viz.pictures import by_length_picture
    from tx.workdir import config_file

    cfg = load_config(config_file(trained))
    pairs = split_text(cfg.data, "dev")
    # A perfect "model": the references themselves, so every bucket must score 100.
    monkeypatch.setattr(tx.eval.evaluate, "translate", lambda loaded, s, c: [r for _, r in pairs])
    loaded = tx.eval.evaluate.LoadedModel(None, None, None, "checkpoints/20", None)
    out = str(tmp_path / "dev.hyp")
    result = tx.eval.evaluate.evaluate_split(cfg, trained, "dev", loaded, output=out, by_length=5)
    buckets = result["by_length"]
    assert sum(b["sentences"] for b in buckets) == result["num_sentences"] == len(pairs)
    assert all(round(b["bleu"], 6) == 100.0 for b in buckets)
    lengths = [len(s.split()) for s, _ in pairs]
    assert buckets[0]["min_words"] == (min(lengths) - 1) // 5 * 5 + 1
    path = by_length_picture(result, str(tmp_path / "by_length.png"))
    assert png_size(path)[0] >= 600


# The demo's pictures (tx.paper.demo.draw_pictures): tests/test_end_to_end.py's
# test_the_demo_prints_the_average_and_samples_before_the_scores checks their paths and sizes.
