"""Ensembles (tx.infer.decoders): the mean of the members' log-probabilities at every step of the
same search. An ensemble of one model is that model; of two copies, still that model."""

import dataclasses
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx import workdir as wd
from tx.config import load_config
from tx.infer.decoders import decoder as family_decoder
from tx.infer.decoders import ensemble_decoder
from tx.infer.search import beam_search, log_probs
from tx.infer.translate import ensemble, load_model, translate, translate_nbest

LINES = ["The dog sees a cat.", "", "I know that the man buys two hundred red cars."]
# In one search bucket (of 16 sub-words): an ensemble's search compiles once, not per bucket
SHORT_LINES = ["The dog sees a cat.", "", "We count three small birds."]


@pytest.fixture(scope="module")
def run(trained):
    cfg = load_config(wd.config_file(trained))
    return cfg, load_model(cfg, trained, 20), load_model(cfg, trained, 10)


def _inputs(loaded, lines):
    ids = [loaded.tokenizer.encode(s) for s in lines if s.strip()]
    inputs = np.zeros((len(ids), max(map(len, ids))), np.int32)
    for i, x in enumerate(ids):
        inputs[i, : len(x)] = x
    return jnp.asarray(inputs), jnp.asarray([len(x) - 1 + 10 for x in ids])


def _decoder(loaded, inputs, steps):
    return family_decoder(loaded.model, loaded.params, inputs, 4, steps)


def _beam(decoder, max_lengths, steps):
    return beam_search(decoder, max_lengths, beam_size=4, alpha=0.6, max_steps=steps)


@pytest.mark.slow  # three searches compiled: 30 s on 2 cores; translate's ensemble test stays
def test_ensemble_of_one_and_of_two_copies_is_the_model(run):
    _, loaded, _ = run
    inputs, max_lengths = _inputs(loaded, LINES)
    steps = int(max_lengths.max()) + 1
    seqs, scores = _beam(_decoder(loaded, inputs, steps), max_lengths, steps)
    one = _beam(ensemble_decoder([_decoder(loaded, inputs, steps)]), max_lengths, steps)
    two = _beam(
        ensemble_decoder([_decoder(loaded, inputs, steps), _decoder(loaded, inputs, steps)]),
        max_lengths,
        steps,
    )
    for e_seqs, e_scores in (one, two):
        np.testing.assert_array_equal(e_seqs, seqs)
        # Bound: the ensemble's log-softmax of log-probabilities differs from them by
        # log(sum(p)) = log(1 + V * eps) ~ 300 * 6e-8 per step, at most 11 steps: 2e-4.
        # Observed: 0 (the mean of two equal arrays is exact, log_softmax of log-probs
        # rounds back to the same floats here).
        np.testing.assert_allclose(e_scores, scores, rtol=0, atol=2e-4)


def test_ensemble_scores_are_the_mean_of_log_probs(run):
    """One step of a two-model ensemble: the mean of the two log-softmaxes, exactly."""
    _, a, b = run
    inputs, _ = _inputs(a, LINES)
    da, db = _decoder(a, inputs, 8), _decoder(b, inputs, 8)
    ids = jnp.full((inputs.shape[0] * 4, 1), 3, jnp.int32)
    la, _ = da.tokens_to_logits(ids, da.cache)
    lb, _ = db.tokens_to_logits(ids, db.cache)
    mean, caches = ensemble_decoder([da, db]).tokens_to_logits(ids, (da.cache, db.cache))
    np.testing.assert_array_equal(mean, (log_probs(la) + log_probs(lb)) / 2)
    assert float(jnp.abs(log_probs(la) - log_probs(lb)).max()) > 1e-3  # two different models
    rows = jnp.arange(ids.shape[0])[::-1]  # each member's cache follows the beam its own way
    reordered = ensemble_decoder([da, db]).reorder_cache(caches, rows)
    for mine, member, cache in zip(reordered, (da, db), caches, strict=True):
        expected = member.reorder_cache(cache, rows)
        assert jax.tree_util.tree_all(
            jax.tree_util.tree_map(lambda x, y: bool((x == y).all()), mine, expected)
        )


def test_translate_with_an_ensemble(run):
    cfg, a, b = run
    assert translate(ensemble([a, a]), SHORT_LINES, cfg) == translate(a, SHORT_LINES, cfg)
    pair = ensemble([a, b])
    assert pair.source == f"{a.source} + {b.source}" and len(pair.members) == 2
    nbest = translate_nbest(pair, SHORT_LINES, cfg, 4)
    assert [len(h) for h in nbest] == [4, 1, 4]


def test_members_need_one_vocabulary(run):
    _, a, b = run
    other = types.SimpleNamespace(fingerprint="another vocabulary", path="other/spm.model")
    with pytest.raises(ValueError, match="one vocabulary"):
        ensemble([a, dataclasses.replace(b, tokenizer=other)])


@pytest.mark.slow  # 15 s of subprocesses; test_translate_with_an_ensemble runs the same path
def test_cli_ensemble_of_checkpoints_and_workdirs(root, trained):
    def tx(*args):
        res = subprocess.run(
            [sys.executable, "-m", "tx", "translate", *args],
            cwd=root,
            input="".join(line + "\n" for line in LINES),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        return res.stdout

    single = tx("--workdir", trained, "--checkpoint", "20")
    assert tx("--workdir", trained, "--workdir", trained, "--checkpoint", "20") == single
    pair = tx("--workdir", trained, "--checkpoint", "10", "20")
    assert len(pair.splitlines()) == 3 and pair.splitlines()[1] == ""
