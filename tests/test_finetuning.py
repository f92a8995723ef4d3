"""Fine-tuning's pieces: configs/finetune.py (a run's own config, started from its parameters at
a constant rate), and a second dev set (data.dev2_prefix): evaluated beside dev while training,
logged as dev2/... and on the run card, never a checkpoint's score; `evaluate --split dev2`."""

import pytest

from tx.config import ConfigError, load_config
from tx.data.sources import DataError
from tx.eval.evaluate import evaluate_split
from tx.train import runcard
from tx.train.events import read_scalars
from tx.train.loop import train


def _write(prefix, pairs):
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for side, lang in enumerate(("en", "de")):
        (prefix.parent / f"{prefix.name}.{lang}").write_text("".join(p[side] + "\n" for p in pairs))


@pytest.fixture(scope="module")
def two_domains(tmp_path_factory):
    root = tmp_path_factory.mktemp("domains")
    house = [(f"the house {i} is red", f"das Haus {i} ist rot") for i in range(60)]
    archer = [(f"the archer {i} attacks", f"der Bogenschütze {i} greift an") for i in range(12)]
    _write(root / "train", house)
    _write(root / "dev", house[:8])
    _write(root / "dev2", archer)
    return root


def test_dev2_is_evaluated_beside_dev_and_never_chooses(two_domains, tiny, vocab, tmp_path):
    cfg = tiny(
        "data.source=text", f"data.vocab_path={vocab}", "data.num_workers=1",
        f"data.train_prefix={two_domains}/train", f"data.dev_prefix={two_domains}/dev",
        f"data.dev2_prefix={two_domains}/dev2", "train.num_steps=4", "train.eval_every_steps=2",
        "train.keep_best=1", "train.best_metric=dev_loss", "train.checkpoint_every_steps=2",
    )  # fmt: skip
    workdir = str(tmp_path / "run")
    last = train(cfg, workdir)
    assert {"dev_perplexity", "dev2_perplexity", "dev2_loss"} <= set(last)
    assert last["dev2_perplexity"] != last["dev_perplexity"]  # another text, another score
    scalars = read_scalars(workdir)
    assert list(scalars["dev2/perplexity"][0]) == list(scalars["dev/perplexity"][0]) == [2, 4]
    card = runcard.load(workdir)
    assert card["dev2"]["step"] == 4 and "dev2_perplexity" in card["dev2"]
    assert card["data"]["splits"]["dev2"]["pairs_read"] == 12
    assert "dev2" not in str(card.get("best", ""))  # the best checkpoints are dev's
    result = evaluate_split(cfg, workdir, "dev2")
    assert result["num_sentences"] == 12


def test_dev2_needs_text(tiny, tmp_path):
    with pytest.raises(ConfigError, match="data.dev2_prefix names text files: it needs"):
        tiny(f"data.dev2_prefix={tmp_path}/dev2")
    cfg = tiny()
    with pytest.raises(DataError, match="data.dev2_prefix is not set"):
        from tx.data import sources

        cfg.data.source = "text"
        sources.load_split(cfg.data, "dev2")


def test_the_finetune_config_is_the_runs_own_started_from_it(tiny, tmp_path, root):
    run = tmp_path / "base"
    run.mkdir()
    source = tiny("data.vocab_path=/somewhere/spm.model", "model.d_model=48")
    (run / "config.json").write_text(source.to_json())
    cfg = load_config(f"{root}/configs/finetune.py:{run}")
    assert cfg.model.d_model == 48 and cfg.train.init_from == str(run)
    assert (cfg.optim.schedule, cfg.optim.learning_rate, cfg.optim.warmup_steps) == (
        "constant", 1e-4, 100
    )  # fmt: skip
    assert cfg.data.vocab_path is None and cfg.train.early_stopping_patience == 3
    with pytest.raises(ConfigError, match="configs/finetune.py needs the run to start from"):
        load_config(f"{root}/configs/finetune.py")
    with pytest.raises(ConfigError, match=f"{tmp_path}/nope/config.json does not exist"):
        load_config(f"{root}/configs/finetune.py:{tmp_path}/nope")
