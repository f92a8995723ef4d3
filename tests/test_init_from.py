"""`train.init_from` (tx.train.init_from): a run started from another run's parameters and
vocabulary, with a fresh optimizer on its own schedule; its checks; resuming it. The source is a
copy of the session's tiny run (`trained`: checkpoints 5, 10, 15, 20)."""

import json
import logging
import os
import shutil

import jax
import numpy as np
import pytest
from flax import traverse_util
from test_buckets_infer import upload_run

from tx import storage
from tx import workdir as wd
from tx.config import ConfigError, load_config
from tx.data import dataset, vocabulary
from tx.data.tokenizer import VocabularyError
from tx.data.vocabulary import run_tokenizer
from tx.train import init_from
from tx.train import trainer as trainer_lib
from tx.train.averaging import average_last, restore_averaged, save_params
from tx.train.checkpoint import Checkpointer
from tx.train.loop import evaluate_loss, train

# The fine-tuning run's own schedule, unlike the source's (warm-up 20, scale 1): its first
# update's learning rate is 0.5 * d_model^-0.5 * 1 * 50^-1.5 (tx.train.optim, step 1).
OWN = ("optim.warmup_steps=50", "optim.learning_rate_scale=0.5")
FIRST_LR = 0.5 * 32**-0.5 * 50**-1.5


def _copy_run(trained: str, path) -> str:
    skip = shutil.ignore_patterns("averaged", "data", "plots", "*.hyp.*", "lock.json")
    shutil.copytree(trained, str(path), ignore=skip)
    return str(path)


@pytest.fixture(scope="module")
def source(trained, tmp_path_factory):
    """The session's run as trained (checkpoints, no average), in a place of its own: a test
    here moves it away for a while."""
    return _copy_run(trained, tmp_path_factory.mktemp("source") / "run")


@pytest.fixture(scope="module")
def trainer(tiny):
    return trainer_lib.build(tiny())


def _params(tree) -> dict:
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(tree, sep="/").items()}


def _assert_same(a, b):
    a, b = _params(a), _params(b)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.fixture(scope="module")
def fine(source, tiny, tmp_path_factory):
    """One step of a run fine-tuned from `source` on its own schedule: (workdir, config, the
    metrics train returned)."""
    workdir = str(tmp_path_factory.mktemp("fine"))
    cfg = tiny(f"train.init_from={source}", "train.num_steps=1", "train.log_every_steps=1", *OWN)
    return workdir, cfg, train(cfg, workdir)


def test_dev_loss_before_the_first_update_is_the_sources(source, tiny, trainer, tmp_path):
    # The source's dev loss: its own config, newest checkpoint and vocabulary.
    src_cfg = load_config(wd.config_file(source))
    src_trainer = trainer_lib.build(src_cfg)
    src_params = Checkpointer(source).restore_params(20, src_trainer.abstract_state.params)
    src_dev = dataset.split_ids(src_cfg.data, str(tmp_path / "src"), run_tokenizer(source), "dev")
    # The new run's, before any update: its dev split through the vocabulary it took.
    cfg = tiny(f"train.init_from={source}", *OWN)
    workdir = str(tmp_path / "new")
    start = init_from.start(cfg, workdir)
    tokenizer = vocabulary.obtain(cfg.data, workdir, model=cfg.model, source=start)
    dev = dataset.split_ids(cfg.data, workdir, tokenizer, "dev")
    state = init_from.initial_state(trainer, start, cfg.train.seed)
    _assert_same(state.params, src_params)  # bit for bit, into this run's sharding

    # One compiled eval step for both (the two models are the same: init_from.start checks it),
    # compiled once for each batch shape.
    eval_fn = trainer_lib.jit_eval_step(trainer)

    def dev_loss(t, params, ids, c):
        spec = dataset.batch_spec(c.data, t.layout.data_shards)
        return evaluate_loss(t, eval_fn, params, ids, c.data, spec)

    ours, theirs = (
        dev_loss(trainer, state.params, dev, cfg),
        dev_loss(src_trainer, src_params, src_dev, src_cfg),
    )
    # The same parameters, token ids and batches through the same program: the same float32
    # operations in the same order, so no rounding can differ. Observed: equal to the bit.
    np.testing.assert_array_equal(src_dev.src_lengths, dev.src_lengths)
    assert ours == theirs
    # A fresh optimizer: no step taken, Adam's moments and counts zero.
    assert int(state.step) == 0
    assert all(not np.asarray(x).any() for x in jax.tree_util.tree_leaves(state.opt_state))


def test_the_first_update_is_on_the_runs_own_schedule(fine, source, trainer):
    workdir, _, last = fine
    # float32 arithmetic of the schedule: a few roundings of 6e-8 each. Observed: ~1e-8 rel.
    assert last["learning_rate"] == pytest.approx(FIRST_LR, rel=1e-6)
    before = _params(Checkpointer(source).restore_params(20, trainer.abstract_state.params))
    after = _params(Checkpointer(workdir).restore_params(1, trainer.abstract_state.params))
    # Adam's first update from zero moments is lr * g / (|g| + eps) per parameter: at most lr,
    # and lr to 1e-9 / |g| wherever the gradient is not tiny. The parameters are float32, so
    # each difference read back is off by at most one unit in the last place of the larger.
    delta = max(float(np.abs(after[k] - before[k]).max()) for k in before)
    ulp = max(float(np.spacing(np.abs(before[k]).max())) for k in before)
    assert abs(delta - FIRST_LR) <= 2 * ulp, (delta, FIRST_LR, ulp)  # observed: within 1 ulp


def test_the_card_names_the_source_and_the_vocabulary_was_copied(fine, source):
    workdir = fine[0]
    card = json.loads(storage.read_text(wd.run_card_file(workdir)))
    sha = run_tokenizer(source).fingerprint
    assert card["init_from"] == {
        "path": source,
        "run": source,
        "parameters": "checkpoint",
        "step": 20,
        "steps": [20],
        "vocabulary_sha256": sha,
        "vocabulary_files": {"spm.model": storage.sha256(wd.vocab_file(source))},
    }
    assert card["data"]["vocabulary_sha256"] == sha
    for name in vocabulary.files(source):
        assert storage.sha256(os.path.join(workdir, name)) == storage.sha256(
            os.path.join(source, name)
        )
    assert f"started from {source}: its checkpoint of step 20" in storage.read_text(
        wd.run_card_markdown(workdir)
    )


def test_a_second_train_resumes_the_fine_tuning_run_without_the_source(fine, source, caplog):
    workdir, cfg, _ = fine
    cfg = load_config(wd.config_file(workdir), ["train.num_steps=2"])
    away = source + ".away"
    os.rename(source, away)  # a run that read the source again would fail
    try:
        with caplog.at_level(logging.INFO):
            assert train(cfg, workdir)["step"] == 2
    finally:
        os.rename(away, source)
    assert f"resuming from {workdir}/checkpoints step 1" in caplog.text
    card = json.loads(storage.read_text(wd.run_card_file(workdir)))
    assert [(s["start_step"], s["end_step"]) for s in card["segments"]] == [(0, 1), (1, 2)]
    assert card["init_from"]["path"] == source


def test_init_from_is_fixed_with_the_run(tiny, tmp_path):
    wd.check_config(tiny("train.init_from=/runs/a"), str(tmp_path))
    with pytest.raises(ConfigError, match="train.init_from: '/runs/a' -> '/runs/b'"):
        wd.check_config(tiny("train.init_from=/runs/b"), str(tmp_path))
    with pytest.raises(ConfigError, match="init_from_new_params=True needs train.init_from"):
        tiny("train.init_from_new_params=True")


@pytest.fixture(scope="module")
def averaged_source(trained, trainer, tmp_path_factory):
    """Another copy of the run, with the average of checkpoints 15 and 20."""
    run = _copy_run(trained, tmp_path_factory.mktemp("averaged") / "run")
    average_last(run, 2, trainer.abstract_state.params, every=5, final_step=20)
    return run


def test_from_a_run_a_checkpoint_or_an_average(source, averaged_source, trainer):
    params = trainer.abstract_state.params
    ckpt = Checkpointer(averaged_source)
    average = restore_averaged(averaged_source, 20, params)[0]
    cases = {
        source: ("checkpoint", 20, [20], Checkpointer(source).restore_params(20, params)),
        f"{averaged_source}/": ("average", 20, [15, 20], average),  # the newest average
        f"{averaged_source}/checkpoints/10": (
            "checkpoint",
            10,
            [10],
            ckpt.restore_params(10, params),
        ),
        f"{averaged_source}/averaged/20": ("average", 20, [15, 20], average),
    }
    for given, (kind, step, steps, want) in cases.items():
        found = init_from.find(given)
        assert (found.kind, found.step, found.steps()) == (kind, step, steps), given
        _assert_same(init_from.initial_state(trainer, found, 0).params, want)


def _newest_only(source: str, path) -> str:
    """A copy of `source` with its newest checkpoint (20) alone: what a run found on a bucket
    starts from, a quarter of the run to upload."""
    checkpoints = os.path.join(source, "checkpoints")

    def older(directory, names):
        return [n for n in names if directory == checkpoints and n != "20"]

    shutil.copytree(source, str(path), ignore=older)
    return str(path)


def test_from_a_bucket(source, trainer, bucket, tmp_path, tiny):
    run = bucket + "/run"
    upload_run(_newest_only(source, tmp_path / "newest"), run)
    params = trainer.abstract_state.params
    found = init_from.find(run)
    assert (found.kind, found.step) == ("checkpoint", 20)
    _assert_same(
        init_from.initial_state(trainer, found, 0).params,
        Checkpointer(source).restore_params(20, params),
    )
    mean = jax.tree_util.tree_map(lambda x: x / 2, Checkpointer(source).restore_params(10, params))
    save_params(run, 20, mean, [10], {"selection": "last"})  # written there, as `average` does
    found = init_from.find(f"{run}/averaged/20")
    _assert_same(init_from.initial_state(trainer, found, 0).params, mean)
    cfg = tiny(f"train.init_from={run}")
    found = init_from.vocabulary_source(cfg, str(tmp_path))
    vocabulary.obtain(cfg.data, str(tmp_path), model=cfg.model, source=found)
    assert storage.sha256(wd.vocab_file(str(tmp_path))) == storage.sha256(wd.vocab_file(source))


def test_parameters_of_other_shapes_are_named_one_by_one(source, tiny, tmp_path):
    leaves = [
        f"{stack}/layer_{i}/ffn/{name}: source {a}, this run {b}"
        for stack in ("decoder", "encoder")
        for i in (0, 1)
        for name, a, b in (
            ("bi", [64], [128]),
            ("wi", [32, 64], [32, 128]),
            ("wo", [64, 32], [128, 32]),
        )
    ]
    for extra in ((), ("train.init_from_new_params=True",)):
        cfg = tiny(f"train.init_from={source}", "model.d_ff=128", *extra)
        with pytest.raises(ConfigError) as e:
            init_from.start(cfg, str(tmp_path))
        message = str(e.value)
        assert message.startswith(f"train.init_from={source}: ")
        assert "parameters whose shapes differ: " + "; ".join(leaves) in message
        assert ("model.d_ff: 64 -> 128" in message) == (not extra)


def test_a_different_model_is_refused_with_its_keys(source, tiny, tmp_path):
    start = init_from.start
    for keys in (["model.activation=swish"], ["model.pre_ln=True"]):
        with pytest.raises(ConfigError, match="this run's model differs from the source's"):
            start(tiny(f"train.init_from={source}", *keys), str(tmp_path))
    with pytest.raises(ConfigError, match=r"\(model.activation: 'relu' -> 'swish'\)"):
        start(tiny(f"train.init_from={source}", "model.activation=swish"), str(tmp_path))
    # What leaves the parameters as they are may differ.
    free = ("model.dropout_rate=0.3", "model.attention_impl=explicit", "model.max_len=64")
    assert start(tiny(f"train.init_from={source}", *free), str(tmp_path)).new_params == ()


def test_new_parameters_start_from_their_initialisation_with_the_option(
    source, tiny, trainer, tmp_path
):
    cfg = tiny(f"train.init_from={source}", "model.attention_bias=True")
    with pytest.raises(ConfigError, match=r"model.attention_bias: False -> True"):
        init_from.start(cfg, str(tmp_path))
    cfg = tiny(
        f"train.init_from={source}", "model.attention_bias=True", "train.init_from_new_params=True"
    )
    found = init_from.start(cfg, str(tmp_path))
    assert found.differs == ("attention_bias",)
    assert "encoder/layer_0/self_attention/query_bias" in found.new_params
    assert all(k.endswith("_bias") for k in found.new_params) and len(found.new_params) == 24
    with_bias = trainer_lib.build(cfg)
    got = _params(init_from.initial_state(with_bias, found, 7).params)
    fresh = _params(trainer_lib.create_train_state(with_bias, 7).params)
    # The source's parameters: the tiny model's, as the module's `trainer` builds it.
    src = _params(Checkpointer(source).restore_params(20, trainer.abstract_state.params))
    for k, value in got.items():
        np.testing.assert_array_equal(value, fresh[k] if k in found.new_params else src[k], k)


def test_another_vocabulary_is_refused(source, tiny, tmp_path):
    with pytest.raises(VocabularyError) as e:
        init_from.start(tiny(f"train.init_from={source}", "data.vocab_size=400"), str(tmp_path))
    assert str(e.value) == (
        f"data.vocab_size=400, but the vocabulary of train.init_from={source} has 300 pieces: "
        "set data.vocab_size=300"
    )
    other = tmp_path / "other.model"
    other.write_bytes(b"another vocabulary")
    with pytest.raises(VocabularyError, match="is not the vocabulary of train.init_from="):
        init_from.start(
            tiny(f"train.init_from={source}", f"data.vocab_path={other}"), str(tmp_path)
        )
    same = shutil.copy(wd.vocab_file(source), tmp_path / "same.model")
    assert init_from.start(
        tiny(f"train.init_from={source}", f"data.vocab_path={same}"), str(tmp_path)
    )


def test_what_is_not_a_source_is_named(source, tmp_path):
    with pytest.raises(ConfigError, match="is neither a tx run"):
        init_from.find(str(tmp_path))
    with pytest.raises(
        ConfigError,
        match=r"no checkpoint at step 7 in .*/checkpoints \(available: \[5, 10, 15, 20\]\)",
    ):
        init_from.find(f"{source}/checkpoints/7")
