import dataclasses
import json
import pathlib
import random
import subprocess
import sys

import pytest

from tx.config import (
    SECTIONS,
    ConfigError,
    defaults,
    load_config,
    model_config,
    split_config_args,
)
from tx.model.counting import analytic_param_count, param_counts, train_flops_per_step
from tx.model.families import FAMILIES
from tx.model.family_base import ConfigShell
from tx.model.rnn_config import RNNConfig

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"


def base(root):
    return str(root / "configs" / "base.py")


def test_overrides_apply_and_types_are_checked(root):
    cfg = load_config(
        base(root),
        ["model.num_layers=4", "optim.warmup_steps=8000", "model.d_k=32", "data.vocab_size=8000"],
    )
    mc = model_config(cfg)
    assert (mc.num_encoder_layers, mc.num_decoder_layers, mc.d_k, mc.d_v) == (4, 4, 32, 64)
    assert cfg.optim.warmup_steps == 8000
    assert cfg.model.vocab_size == 8000  # one shared vocabulary size


@pytest.mark.parametrize(
    "override,key",
    [
        ("model.num_heds=4", "model.num_heds"),
        ("modle.d_model=4", "modle"),
        ("model.d_model=500", "model.d_model"),  # 500 % 8 != 0 and d_k unset
        ("model.dropout_rate=-0.1", "model.dropout_rate"),
        ("train.label_smoothing=1.5", "train.label_smoothing"),
        ("optim.warmup_steps=0", "optim.warmup_steps"),
        ("data.source=ftp", "data.source"),
        ("mesh.shape.data=0", "mesh.shape.data"),
        ("decode.strategy=nucleus", "decode.strategy"),
        ("decode.temperature=0.0", "decode.temperature"),
        ("decode.top_k=-1", "decode.top_k"),
        ("data.on_bad_line=ignore", "data.on_bad_line"),
        ("mesh.heartbeat_timeout_secs=0", "mesh.heartbeat_timeout_secs"),
        ("train.loss_chunk_tokens=-2", "train.loss_chunk_tokens"),  # -1 is "per platform"
        ("optim.b1=None", "optim.b1"),  # found by the fuzzing below: a TypeError before
        ("model={}", "model"),  # and an AttributeError
        ("train.num_steps={'a': 1}", "train.num_steps"),  # a message of several lines
    ],
)
def test_invalid_configs_name_the_key(root, override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(base(root), [override])


def test_a_run_config_from_before_later_keys_loads_with_their_older_values(root, tmp_path):
    """A key a saved config.json lacks gets the value its run had: OLDER's where that differs
    from today's default (train.loss_chunk_tokens), else the default."""
    saved = json.loads(load_config(base(root)).to_json_best_effort())
    del saved["data"]["on_bad_line"], saved["mesh"]["heartbeat_timeout_secs"]
    del saved["train"]["loss_chunk_tokens"], saved["decode"]["average_which"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    cfg = load_config(str(tmp_path / "config.json"))
    assert cfg.data.on_bad_line == "error" and cfg.mesh.heartbeat_timeout_secs == 100
    assert cfg.train.loss_chunk_tokens == 8192 and cfg.decode.average_which == "last"


def test_defaults_are_the_wings_sections_and_the_model_dataclass():
    """tx.config.defaults composes each wing's section and derives `model` from the family's
    frozen dataclass; one reference carries the shared vocabulary size."""
    cfg = defaults()
    assert set(cfg) == set(SECTIONS)
    assert model_config(cfg) == FAMILIES["transformer"].config()
    cfg.data.vocab_size = 1000
    assert cfg.model.vocab_size == 1000
    with pytest.raises(TypeError):  # a None default keeps its field's type
        cfg.model.d_k = "wide"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.py")))
def test_every_shipped_config_loads_and_passes_the_checks(root, name, tmp_path):
    path = str(root / "configs" / name)
    if name == "finetune.py":  # it starts from a run: the base config's, as a run keeps it
        (tmp_path / "config.json").write_text(
            load_config(str(root / "configs" / "base.py")).to_json()
        )
        path += f":{tmp_path}"
    cfg = load_config(path)
    assert model_config(cfg).vocab_size > 0 and cfg.train.num_steps > 0


def test_table3_rows_load(root):
    for row in ("A1", "B1", "C4", "D3", "E"):
        load_config(str(root / "configs" / f"table3.py:{row}"))
    with pytest.raises(ValueError, match="Z9"):
        load_config(str(root / "configs" / "table3.py:Z9"))


def expected_count(V, m, h, dk, dv, dff, n_enc, n_dec):
    """The paper's architecture written out term by term."""
    attn = m * h * dk + m * h * dk + m * h * dv + h * dv * m  # W^Q, W^K, W^V, W^O; no biases
    ffn = m * dff + dff + dff * m + m  # W1, b1, W2, b2
    enc_layer = attn + ffn + 2 * (2 * m)  # two LayerNorms (scale + bias)
    dec_layer = 2 * attn + ffn + 3 * (2 * m)
    return V * m + n_enc * enc_layer + n_dec * dec_layer  # one shared embedding


@pytest.mark.parametrize(
    "overrides,args",
    [
        ([], (37000, 512, 8, 64, 64, 2048, 6, 6)),
        (
            ["model.d_model=1024", "model.d_ff=4096", "model.num_heads=16"],
            (37000, 1024, 16, 64, 64, 4096, 6, 6),
        ),
        (["model.num_layers=2"], (37000, 512, 8, 64, 64, 2048, 2, 2)),
        (
            ["model.num_encoder_layers=3", "model.num_decoder_layers=5"],
            (37000, 512, 8, 64, 64, 2048, 3, 5),
        ),
        (["model.d_k=16"], (37000, 512, 8, 16, 64, 2048, 6, 6)),
        (["model.d_ff=1024", "data.vocab_size=8000"], (8000, 512, 8, 64, 64, 1024, 6, 6)),
    ],
)
def test_param_counts_equal_formula(root, overrides, args):
    mc = model_config(load_config(base(root), overrides))
    expected = expected_count(*args)
    assert param_counts(mc)["params"] == expected
    assert analytic_param_count(mc)["params"] == expected


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_fills_the_shell(name):
    """Each family's config is a ConfigShell that declares every field the shell computes from."""
    config = FAMILIES[name].config
    assert issubclass(config, ConfigShell) and config.family == name
    shared = set(ConfigShell.__annotations__) - {"family"}  # family: a ClassVar, not a field
    assert shared <= {f.name for f in dataclasses.fields(config)}


def test_counting_asks_the_families_registry(monkeypatch):
    """tx.model.counting picks no formula itself: it returns what the family registers."""
    rnn = FAMILIES["rnn"]
    monkeypatch.setitem(
        FAMILIES,
        "rnn",
        dataclasses.replace(
            rnn, param_count=lambda c: {"params": 7}, train_flops=lambda c, *n: sum(n)
        ),
    )
    c = RNNConfig(vocab_size=10, d_model=4)
    assert analytic_param_count(c) == {"params": 7}
    assert train_flops_per_step(c, 1.0, 2.0, 3.0, 4.0) == 10.0


def test_counts_near_paper_figures(root):
    base_n = param_counts(model_config(load_config(base(root))))["params"]
    big_n = param_counts(model_config(load_config(str(root / "configs" / "big.py"))))["params"]
    assert base_n == 63_045_632 and big_n == 214_171_648
    assert abs(base_n / 65e6 - 1) < 0.04 and abs(big_n / 213e6 - 1) < 0.04


def test_info_cli_prints_counts_beside_paper(root):
    out = subprocess.run(
        [sys.executable, "-m", "tx", "info", "--config", base(root)],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
    ).stdout
    info = json.loads(out)
    assert info["params"] == 63_045_632 and info["paper_params_m"] == 65.0
    assert info["encoder"] + info["decoder"] + info["embeddings"] == info["params"]
    assert info["matches_analytic"] is True


def test_info_cli_rejects_unknown_key(root):
    res = subprocess.run(
        [sys.executable, "-m", "tx", "info", "--config", base(root), "--config.model.foo=1"],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert res.returncode == 2 and "model.foo" in res.stderr


# ---------------------------------------------------------------- fuzzing the command line
ODD_VALUES = (
    "", "0", "-1", "1.5", "1e309", "nan", "-inf", "True", "false", "None", "'x'", '"', "x=y",
    "[1, 2", "(1,)", "{}", "{'a': 1}", "b'x'", "1+2j", "...", "1_000", "\x00", "é", " 7 ",
    "[" * 300 + "]" * 300, "9" * 5000, "(" * 50_000, "lambda: 0", "__import__('os')",
)  # fmt: skip


def _leaf_keys(cfg, prefix=""):
    for key, value in cfg.items():
        if hasattr(value, "items"):
            yield from _leaf_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def test_random_command_lines_give_a_config_or_a_config_error(root):
    """Seeded (no new dependency, the same cases every run): 600 command lines of real and
    misspelt keys, sections, odd values and stray tokens. Each gives a validated config or a
    one-line ConfigError, never another exception."""
    rng = random.Random(16)
    keys = [*_leaf_keys(load_config(base(root))), "model", "mesh.shape", "model.", ".x", "a..b"]
    tokens = ["--config", "--config.", "--config=", "--workdir", "x", "--config.model.d_model"]
    outcomes = {"config": 0, "error": 0}
    for _ in range(600):
        argv = []
        for _ in range(rng.randint(1, 4)):
            key = rng.choice(keys) if rng.random() < 0.9 else rng.choice(keys) + "x"
            value = rng.choice(ODD_VALUES) if rng.random() < 0.6 else str(rng.randint(-3, 99))
            form = rng.random()
            if form < 0.6:
                argv.append(f"--config.{key}={value}")
            elif form < 0.9:
                argv += [f"--config.{key}", value]
            else:
                argv.append(rng.choice(tokens))
        rest, path, overrides = split_config_args(argv)
        assert path is None or isinstance(path, str)
        try:
            cfg = load_config(base(root), overrides)
        except ConfigError as e:
            assert "\n" not in str(e), argv
            outcomes["error"] += 1
            continue
        except Exception as e:  # noqa: BLE001 - the property under test
            pytest.fail(f"{argv!r} raised {type(e).__name__}: {e!s:.300}")
        outcomes["config"] += 1
        last = dict(item.partition("=")[::2] for item in overrides)
        for key, raw in last.items():  # a config that loads holds what was asked for last
            if raw.lstrip("-").isdigit() and len(raw) < 9 and "vocab_size" not in key:
                assert _value(cfg, key) in (int(raw), float(raw), raw), (key, raw)
    assert min(outcomes.values()) > 50, outcomes  # both outcomes were exercised


def _value(cfg, dotted):
    for part in dotted.split("."):
        cfg = cfg[part]
    return cfg
