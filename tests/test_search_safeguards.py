"""The decoding safeguards (tx.infer.search): fairseq's no_repeat_ngram_size and the maximum
length ratio. Off, the search is the one before them; on, every hypothesis keeps the rule, and
greedy decoding equals a plain-Python transcription of fairseq's NGramRepeatBlock.

The decoders here are toy language models: logits = trans[previous token] + bias[sentence] +
noise[step], so that repetitions come from the transition table and every score can be
recomputed by hand."""

import functools
import json
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tx.config import ConfigError, load_config
from tx.infer.safeguards import RATIO_EXTRA_LEN, max_output_length, repeated_ngram_bans
from tx.infer.search import NEG, Decoder, Strategy, length_penalty
from tx.tokens import BOS_ID, EOS_ID, PAD_ID

V = 10  # pad, eos, unk, bos + the words 4..9

# The programs here run for milliseconds, each compiled once: LLVM's optimisations took half of
# every compile and change results by float rounding at most (fused multiply-adds), which the
# tolerances below allow for.
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def toy_decoder(trans, bias, noise, width: int) -> Decoder:
    """logits [n, V] = trans[ids] + bias[row] + noise[step]: trans [V, V], bias [b, V] (one
    row per sentence, repeated over its `width` rows), noise [steps, V]."""
    cache = {"step": jnp.zeros((), jnp.int32), "bias": jnp.repeat(bias, width, axis=0)}

    def tokens_to_logits(ids, cache):
        logits = trans[ids[:, 0]] + cache["bias"] + noise[cache["step"]]
        return logits, {**cache, "step": cache["step"] + 1}

    return Decoder(tokens_to_logits, cache)


def toy_search(lm, max_lengths, rng=None, *, strategy: Strategy, max_steps: int):
    """`strategy`'s search with toy_decoder(*lm): sequences [b, w, max_steps], scores [b, w].
    The model's tables are arguments, not constants, and `rng` a fixed key where none is
    given, so that each strategy and shape compiles once for every seed and test."""
    rng = jax.random.PRNGKey(0) if rng is None else rng
    return _toy_search(lm, max_lengths, rng, strategy=strategy, max_steps=max_steps)


@functools.partial(jit, static_argnames=("strategy", "max_steps"))
def _toy_search(lm, max_lengths, rng, *, strategy: Strategy, max_steps: int):
    return strategy(toy_decoder(*lm, strategy.width), max_lengths, max_steps, rng)


def random_lm(seed: int, batch: int, steps: int, eos_shift: float = -4.0):
    """(trans, bias, noise) float32: strong transitions (scale 2) make cycles; EOS is pushed
    down by `eos_shift` so that hypotheses run long enough to repeat."""
    rng = np.random.default_rng(seed)
    trans = rng.normal(size=(V, V)).astype(np.float32) * 2
    trans[:, EOS_ID] += eos_shift
    bias = rng.normal(size=(batch, V)).astype(np.float32)
    noise = rng.normal(size=(steps, V)).astype(np.float32) * 0.5
    return trans, bias, noise


def cycle_lm(batch: int, steps: int):
    """A model that always prefers 5 6 5 6 ...: BOS -> 5, 5 -> 6, 6 -> 5 by 4 nats, EOS 3 nats
    below the rest; the other words in between, a little apart (no ties)."""
    trans = np.tile(np.linspace(0.0, 0.5, V, dtype=np.float32), (V, 1))
    trans[:, EOS_ID] = -3.0
    trans[BOS_ID, 5] = trans[5, 6] = trans[6, 5] = 4.0
    return trans, np.zeros((batch, V), np.float32), np.zeros((steps, V), np.float32)


def ngrams(seq, n: int) -> list[tuple]:
    return [tuple(seq[j : j + n]) for j in range(len(seq) - n + 1)]


def hypotheses(seqs, scores):
    """The real hypotheses of a search's output (score above NEG: not an empty slot) as
    (sentence, tokens up to and including EOS, score)."""
    seqs, scores = np.asarray(seqs), np.asarray(scores)
    out = []
    for b in range(seqs.shape[0]):
        for j in range(seqs.shape[1]):
            if scores[b, j] > NEG / 2:
                seq = seqs[b, j].tolist()
                out.append((b, seq[: seq.index(EOS_ID) + 1], float(scores[b, j])))
    return out


# Each search on random_lm(0, 3, 10) with max_lengths [7, 4, 9] before the safeguards existed
# (commit bbb900e): (sequences, scores) per strategy.
GOLDEN = {
    "beam": (
        [
            [[9, 1, 0, 0, 0, 0, 0, 0, 0, 0], [9, 4, 7, 9, 4, 7, 9, 1, 0, 0],
             [9, 4, 7, 4, 7, 4, 7, 1, 0, 0]],
            [[9, 4, 7, 9, 1, 0, 0, 0, 0, 0], [9, 5, 6, 6, 1, 0, 0, 0, 0, 0],
             [9, 6, 6, 6, 1, 0, 0, 0, 0, 0]],
            [[9, 1, 0, 0, 0, 0, 0, 0, 0, 0], [9, 5, 7, 4, 7, 9, 5, 7, 9, 1],
             [9, 5, 7, 4, 7, 4, 7, 4, 7, 1]],
        ],
        [[-1.8420959, -3.9063828, -6.9473987], [-4.4150119, -10.1125555, -10.2025425],
         [-1.9715539, -4.8933759, -7.0672455]],
    ),
    "greedy": (
        [[[9, 4, 7, 4, 7, 4, 7, 1, 0, 0]], [[9, 4, 7, 9, 1, 0, 0, 0, 0, 0]],
         [[9, 5, 7, 4, 7, 4, 7, 4, 7, 1]]],
        [[-11.0483522], [-5.9984794], [-12.2465620]],
    ),
    "sample": (
        [[[4, 8, 7, 4, 7, 9, 6, 1, 0, 0]], [[9, 5, 6, 2, 1, 0, 0, 0, 0, 0]],
         [[7, 4, 2, 4, 7, 2, 5, 7, 9, 1]]],
        [[-22.0285301], [-8.2979870], [-13.9602957]],
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", ["beam", "greedy", "sample"])
def test_off_the_search_is_the_one_before_the_safeguards(name):
    lm = [jnp.asarray(x) for x in random_lm(0, 3, 10)]
    decode = dict(strategy=name, beam_size=3, alpha=0.6, temperature=1.5, top_k=0)
    old = Strategy.from_config(ml_collections.ConfigDict(decode))  # a section without the keys
    off = Strategy.from_config(ml_collections.ConfigDict({**decode, "no_repeat_ngram_size": 0}))
    assert old == off and off.no_repeat_ngram_size == 0
    seqs, scores = toy_search(
        lm, jnp.array([7, 4, 9]), jax.random.PRNGKey(7), strategy=off, max_steps=10
    )
    want_seqs, want_scores = GOLDEN[name]
    np.testing.assert_array_equal(np.asarray(seqs), np.array(want_seqs))
    # The same operations as before (the jaxprs of the three searches were identical to those
    # of bbb900e's code, and the scores equal to the bit); the literals keep 8 digits, and
    # 1e-5 leaves room for another machine's exp and log (<= 10 log-probabilities, |x| < 25).
    np.testing.assert_allclose(np.asarray(scores), np.array(want_scores), atol=1e-5)


@pytest.mark.parametrize("name", ["beam", "greedy", "sample"])
def test_a_repeating_model_repeats_without_the_option_and_never_with_it(name):
    # The shapes (4 sentences, 13 steps) and beam and greedy searches of
    # test_beam_keeps_the_rule_and_scores_the_models_log_probabilities: compiled once for both.
    lm = [jnp.asarray(x) for x in cycle_lm(4, 13)]
    max_lengths = jnp.array([12, 9, 12, 9])
    for n in (0, 2, 3):
        strategy = Strategy(name, beam_size=4, no_repeat_ngram_size=n)
        out = toy_search(lm, max_lengths, strategy=strategy, max_steps=13)
        found = hypotheses(*out)
        assert len(found) == 4 * strategy.width  # every slot holds a hypothesis
        for b, seq, _ in found:
            assert seq[-1] == EOS_ID and len(seq) <= int(max_lengths[b]) + 1
            words = seq[:-1]
            if n == 0:  # the model's own choice: 5 6 5 6 ...
                assert len(set(ngrams(words, 2))) < len(ngrams(words, 2)), seq
            else:
                assert len(set(ngrams(words, n))) == len(ngrams(words, n)), (n, seq)


def fairseq_greedy(trans, bias, noise, max_len: int, n: int):
    """Greedy decoding of one sentence of a toy model with fairseq's NGramRepeatBlock, in plain
    Python (fairseq/ngram_repeat_block.py, `_no_repeat_ngram`): tokens hold BOS then what was
    generated; at step s the n-grams of tokens[:s+1] are indexed by their first n-1 tokens and
    those following tokens[s+2-n : s+1] get log-probability -inf. Then tx's rules: PAD and BOS
    never, only EOS from step max_len on. Returns (tokens up to EOS, sum of log-probabilities)."""
    tokens, total = [BOS_ID], 0.0
    for step in range(noise.shape[0]):
        logits = (trans[tokens[-1]] + bias + noise[step]).astype(np.float64)
        logits[[PAD_ID, BOS_ID]] = -np.inf
        lprobs = logits - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()
        if step >= max_len:
            lprobs[np.arange(V) != EOS_ID] = -np.inf
        if n > 0 and step + 2 - n >= 0:
            gen_ngrams: dict[tuple, list[int]] = {}
            for ngram in zip(*[tokens[i:] for i in range(n)], strict=False):
                gen_ngrams.setdefault(ngram[:-1], []).append(ngram[-1])
            for banned in gen_ngrams.get(tuple(tokens[step + 2 - n : step + 1]), []):
                lprobs[banned] = -np.inf
        tok = int(np.argmax(lprobs))
        total += lprobs[tok]
        tokens.append(tok)
        if tok == EOS_ID:
            break
    return tokens[1:], total


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_equals_fairseqs_rule_token_by_token(seed):
    batch, steps = 6, 14
    trans, bias, noise = random_lm(seed, batch, steps)
    max_lengths = np.array([13, 13, 10, 7, 13, 3])
    lm = [jnp.asarray(x) for x in (trans, bias, noise)]
    changed = 0
    for n in (1, 2, 3, 4):
        greedy = Strategy("greedy", no_repeat_ngram_size=n)
        seqs, scores = toy_search(lm, jnp.asarray(max_lengths), strategy=greedy, max_steps=steps)
        for b in range(batch):
            want, want_score = fairseq_greedy(trans, bias[b], noise, max_lengths[b], n)
            got = np.asarray(seqs[b, 0]).tolist()
            assert got[: len(want)] == want, (n, b)
            assert set(got[len(want) :]) <= {PAD_ID}
            # float32 against float64: <= 14 log-probabilities of float32 rounding; observed
            # <= 2.3e-6 (seeds 0-4).
            assert float(scores[b, 0]) == pytest.approx(want_score, abs=1e-4)
            changed += want != fairseq_greedy(trans, bias[b], noise, max_lengths[b], 0)[0]
    # The rule changed most outputs (observed 17-21 of 24, seeds 0-4): not a vacuous check.
    assert changed >= 12


@pytest.mark.parametrize("seed", [0, 1])
def test_beam_keeps_the_rule_and_scores_the_models_log_probabilities(seed):
    """Beam search with the rule: every hypothesis is free of repeated n-grams and scores the
    model's own log-probability of its tokens (the banned ones are set aside after the
    normalisation, as fairseq does, not renormalised away); beam 1 without a length penalty is
    greedy decoding with the rule."""
    batch, steps = 4, 13
    trans, bias, noise = random_lm(seed, batch, steps)
    lm = [jnp.asarray(x) for x in (trans, bias, noise)]
    max_lengths = jnp.array([12, 8, 12, 5])
    run = functools.partial(toy_search, lm, max_lengths, max_steps=steps)
    off, _ = run(strategy=Strategy("beam", beam_size=4, alpha=0.6))
    for n in (2, 3):
        seqs, scores = run(
            strategy=Strategy("beam", beam_size=4, alpha=0.6, no_repeat_ngram_size=n)
        )
        assert (np.asarray(seqs) != np.asarray(off)).any()  # observed: 9-16 of 16 differ
        for b, seq, score in hypotheses(seqs, scores):
            words = seq[:-1]
            assert len(set(ngrams(words, n))) == len(ngrams(words, n)), (n, seq)
            want = teacher_forced(trans, bias[b], noise, seq) / float(length_penalty(len(seq), 0.6))
            # <= 13 float32 log-probabilities; observed <= 1.6e-6 (seeds 0-4)
            assert score == pytest.approx(want, abs=1e-4)
        one, _ = run(strategy=Strategy("beam", beam_size=1, alpha=0.0, no_repeat_ngram_size=n))
        greedy, _ = run(strategy=Strategy("greedy", no_repeat_ngram_size=n))
        np.testing.assert_array_equal(np.asarray(one), np.asarray(greedy))


def teacher_forced(trans, bias, noise, seq) -> float:
    """Sum of the toy model's log-probabilities (PAD and BOS excluded) of `seq` after BOS."""
    total, prev = 0.0, BOS_ID
    for step, tok in enumerate(seq):
        logits = (trans[prev] + bias + noise[step]).astype(np.float64)
        logits[[PAD_ID, BOS_ID]] = -np.inf
        total += logits[tok] - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()
        prev = tok
    return total


# One compile per n and shape for the cases below (op by op, each case compiled its own).
bans = jit(repeated_ngram_bans, static_argnums=(2, 3))


@pytest.mark.parametrize(
    "written,n,banned",
    [
        ([4, 5, 4, 5, 4], 2, [5]),  # "4 5" twice already; after "... 4", 5 again is banned
        ([4, 5, 6, 4, 5], 3, [6]),  # "4 5 6": after "4 5", 6
        ([4, 5, 6, 4, 5], 2, [6]),  # "5 6": after "5", 6
        ([4, 5, 4, 6, 4], 2, [5, 6]),  # "4 5" and "4 6": both
        ([4, 5, 6, 7, 8], 2, []),  # no repeat yet
        ([4, EOS_ID, 6, 4], 2, []),  # "4 EOS" (in no real hypothesis): EOS is never banned
        ([7, 8, 7], 1, [7, 8]),  # n = 1: every written token (fairseq's unigram rule)
        ([], 2, []),  # nothing written
        ([4], 2, []),  # an n-gram's start but no window before it
        ([4, 4], 3, []),
        ([4, 4, 4], 4, []),
    ],
)
def test_bans_follow_the_written_tokens_and_never_eos(written, n, banned):
    """repeated_ngram_bans on rows of 7 positions, `written` first and tokens that are not
    written yet after them (they must not count: here 4s, which would ban 4 or 5)."""
    length = len(written)
    row = written + [4] * (7 - length)
    got = bans(jnp.array([row, row], jnp.int32), jnp.array(length), n, V)
    assert [np.flatnonzero(r).tolist() for r in np.asarray(got)] == [banned, banned]


def test_an_ngram_longer_than_the_rows_bans_nothing():
    seqs = jnp.array([[4, 4, 4]], jnp.int32)
    assert not np.asarray(bans(seqs, jnp.array(3), 4, V)).any()


def test_max_output_length_is_the_papers_limit_capped_by_the_ratio():
    # Off: exactly input + max_extra_len, as before.
    assert [max_output_length(n, 50) for n in (0, 1, 3, 80)] == [50, 51, 53, 130]
    assert [max_output_length(n, 50, 0.0) for n in (0, 1, 3, 80)] == [50, 51, 53, 130]
    # The documented examples: r = 1.2 gives min(n + 50, ceil(1.2 n) + 10).
    assert RATIO_EXTRA_LEN == 10
    assert [max_output_length(n, 50, 1.2) for n in (1, 3, 50, 200, 300)] == [12, 14, 70, 250, 350]
    # The ratio as the decimal written: 1.1 * 50 is 55 (float arithmetic: 55.00000000000001).
    assert math.ceil(1.1 * 50) == 56 and max_output_length(50, 50, 1.1) == 55 + 10
    assert max_output_length(0, 50, 0.5) == 10  # an empty input may still say something
    for r in (0.3, 1.0, 1.5, 2.0):  # never above the paper's limit; non-decreasing in n
        limits = [max_output_length(n, 50, r) for n in range(300)]
        assert all(x <= n + 50 for n, x in enumerate(limits))
        assert limits == sorted(limits)


def test_a_search_runs_to_the_ratios_limit_and_not_beyond():
    """A model that never wants EOS: every hypothesis ends exactly at its sentence's limit."""
    inputs = [1, 3, 14, 30]  # sub-words, EOS excluded
    limits = [max_output_length(n, 50, 0.5) for n in inputs]
    assert limits == [11, 12, 17, 25]
    trans, bias, noise = random_lm(3, len(inputs), max(limits) + 1, eos_shift=-1e3)
    lm = [jnp.asarray(x) for x in (trans, bias, noise)]
    for strategy in (Strategy("beam", beam_size=2), Strategy("greedy")):
        seqs, scores = toy_search(
            lm, jnp.array(limits), strategy=strategy, max_steps=max(limits) + 1
        )
        for b, seq, _ in hypotheses(seqs, scores):
            assert len(seq) == limits[b] + 1, (strategy.name, b, seq)  # the limit's words + EOS


def test_translate_ids_passes_the_limits_to_the_search(tiny, monkeypatch):
    """translate_ids's max_lengths and max_steps: unchanged by default, the ratio's with it."""
    import tx.infer.translate as translate
    from tx.train import sharding

    seen = []

    def search(models, params, inputs, max_lengths, seed, number, *, strategy, max_steps):
        seen.append((np.asarray(inputs), np.asarray(max_lengths), max_steps))
        shape = (inputs.shape[0], strategy.width)
        return jnp.full((*shape, max_steps), EOS_ID, jnp.int32), jnp.zeros(shape)

    monkeypatch.setattr(translate, "_search_batch", search)
    loaded = translate.LoadedModel(None, None, None, "none", sharding.layout(tiny().mesh))
    sources = [np.array([*range(4, 4 + n), EOS_ID], np.int32) for n in (1, 3, 14, 30)]
    decode = dict(strategy="greedy", beam_size=4, alpha=0.6, max_extra_len=50, batch_tokens=64)
    decode.update(temperature=1.0, top_k=0, seed=0)  # a section from before the safeguards
    for ratio in (None, 0.0, 0.5):
        cfg = ml_collections.ConfigDict(
            decode if ratio is None else {**decode, "max_length_ratio": ratio}
        )
        seen.clear()
        translate.translate_ids(loaded, sources, cfg, (8, 16, 32))
        for inputs, max_lengths, max_steps in seen:
            n = (inputs != PAD_ID).sum(axis=1) - 1  # sub-words without EOS; -1: padding rows
            want = [max_output_length(x, 50, ratio or 0.0) if x >= 0 else 0 for x in n]
            assert max_lengths.tolist() == want
            bucket = inputs.shape[1]
            if not ratio:  # the paper's: input + 50, as before the ratio existed
                assert want == [x + 50 if x >= 0 else 0 for x in n]
                assert max_steps == bucket - 1 + 50 + 1
            else:
                assert max_steps == max_output_length(bucket - 1, 50, ratio) + 1 < bucket + 50
        assert seen


def base(root):
    return str(root / "configs" / "base.py")


@pytest.mark.parametrize(
    "override,key",
    [
        ("decode.no_repeat_ngram_size=-1", "decode.no_repeat_ngram_size"),
        ("decode.no_repeat_ngram_size=2.5", "decode.no_repeat_ngram_size"),
        ("decode.max_length_ratio=-0.5", "decode.max_length_ratio"),
        ("decode.max_length_ratio='x'", "decode.max_length_ratio"),
        ("decode.max_length_ratio=1e309", "decode.max_length_ratio"),  # inf
    ],
)
def test_invalid_safeguards_name_the_key(root, override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(base(root), [override])


def test_the_safeguards_are_off_in_every_config_and_on_where_set(root):
    cfg = load_config(base(root))
    assert cfg.decode.no_repeat_ngram_size == 0 and cfg.decode.max_length_ratio == 0.0
    cfg = load_config(base(root), ["decode.no_repeat_ngram_size=3", "decode.max_length_ratio=1.5"])
    assert Strategy.from_config(cfg.decode).no_repeat_ngram_size == 3
    assert cfg.decode.max_length_ratio == 1.5


def test_a_run_config_from_before_the_safeguards_loads_with_them_off(root, tmp_path):
    saved = json.loads(load_config(base(root)).to_json_best_effort())
    del saved["decode"]["no_repeat_ngram_size"], saved["decode"]["max_length_ratio"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    cfg = load_config(str(tmp_path / "config.json"))
    assert cfg.decode.no_repeat_ngram_size == 0 and cfg.decode.max_length_ratio == 0.0


def test_the_search_recipe_names_the_safeguards_only_where_set(root):
    """A score's recorded recipe (tx.eval.evaluate.search_recipe) is as before by default, so
    run cards written before the safeguards still compare equal."""
    from tx.eval.evaluate import search_recipe

    decode = load_config(base(root)).decode
    assert search_recipe(decode) == {
        "strategy": "beam",
        "beam_size": 4,
        "alpha": 0.6,
        "max_extra_len": 50,
    }
    decode.no_repeat_ngram_size, decode.max_length_ratio = 3, 1.5
    assert search_recipe(decode)["no_repeat_ngram_size"] == 3
    assert search_recipe(decode)["max_length_ratio"] == 1.5
