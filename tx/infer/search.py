"""Search strategies (beam, greedy, sampling): pure functions over a model's `Decoder`.

    decoder.tokens_to_logits(ids [n, 1] int32, cache) -> (logits [n, V] float32, new cache)
    decoder.reorder_cache(cache, rows [n] int32) -> the cache of those rows (beam selection)
    decoder.resize_cache(cache, length) -> the cache with room for `length` positions (optional)

The search knows nothing of the model or of how its cache is laid out: the model side says
how its cache follows a beam (as fairseq's `reorder_incremental_state`); `gather_rows`, the
default, gathers every leaf with a row dimension. A decoder that can resize its cache is run
in windows (`windows`): a search of 80 steps makes steps 0-23 on a cache of 24 positions,
24-39 on 40 and the rest on 80, so that early steps attend over, and beam reordering copies,
only what has been written.

Section 6.1: beam size 4, length penalty alpha = 0.6 in the GNMT form
lp(Y) = ((5 + |Y|) / 6)^alpha, maximum output length = input length + 50 per sentence.
Beam scores are log-probabilities divided by lp, where |Y| counts the EOS token.
The search stops once no live hypothesis can beat the k finished ones: a live hypothesis's
log-probability can only fall, so its best possible score is logprob / lp(its maximum length).
EOS is accepted only when it ranks among the top k candidates, so beam 1 with alpha = 0 is
exactly greedy decoding. PAD and BOS are never generated.

Two safeguards, both off by default (the paper's search is then exactly as above; they are
tx.infer.safeguards'): `no_repeat_ngram_size` n > 0 is fairseq's NGramRepeatBlock: no n-gram
occurs twice in a hypothesis (`repeated_ngram_bans`); `max_output_length`'s ratio caps a
sentence's output length at a multiple of its input's as well.

`Strategy` (from `cfg.decode`) picks one: every caller (translate, evaluate, benchmarks) goes
through `Strategy.__call__`, so a new strategy is added here and named in
tx.infer.settings.STRATEGIES (which the config's check reads).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from tx.infer.safeguards import repeated_ngram_bans
from tx.infer.settings import STRATEGIES
from tx.infer.topk import NEG, top_log_probs
from tx.tokens import BOS_ID, EOS_ID, PAD_ID


def gather_rows(cache: Any, rows: jax.Array) -> Any:
    """Every leaf with a leading row dimension [n, ...] -> [len(rows), ...]; scalars (step
    counters shared by all rows) are kept."""
    return jax.tree_util.tree_map(lambda x: x if x.ndim == 0 else x[rows], cache)


class Decoder(NamedTuple):
    """What a search needs from a model (see the module docstring for the shapes).

    `rows_independent`: tokens_to_logits computes each row from that row's token and cache
    rows alone (nothing per row is closed over), so it may run on the rows that
    reorder_cache(cache, rows) selects; and the rows of a sentence start out with equal
    caches. Beam search then makes its first step on one row per sentence.
    """

    tokens_to_logits: Callable[[jax.Array, Any], tuple[jax.Array, Any]]
    cache: Any
    reorder_cache: Callable[[Any, jax.Array], Any] = gather_rows
    rows_independent: bool = False
    # (cache, length) -> the cache with room for `length` output positions, those written so
    # far kept; None: the cache keeps its size (the search then runs in one window).
    resize_cache: Callable[[Any, int], Any] | None = None


EARLIER_WINDOWS = (1 / 2, 1 / 4)  # where the windows before the last end, in max_steps


def windows(max_steps: int) -> list[int]:
    """Where the windows of a `max_steps` search end: a quarter, a half and all of max_steps,
    rounded up to multiples of 8, and none that ends fewer than 8 steps before the next
    (31 -> 8, 16, 31; 80 -> 24, 40, 80; 20 -> 8, 20; 9 -> 9).

    Every window is its own loop, compiled once, with a cache of its end's size: a step
    attends over, and beam search reorders, that many positions instead of max_steps; a
    translation's maximum length (its input's + 50) is mostly unreached, so a search that
    stops early makes few steps, or none, in the larger windows. Each window adds a compile
    of the step: three bound it. Figures: docs/performance.md, "Decoding in windows and the
    first step on one row"."""
    ends = [max_steps]
    for fraction in EARLIER_WINDOWS:
        end = 8 * math.ceil(max_steps * fraction / 8)
        if end <= ends[0] - 8:
            ends.insert(0, end)
    return ends


def _in_windows(decoder: Decoder, state: dict, max_steps: int, loop) -> dict:
    """state["cache"] grown window by window, and `loop(state, start, end)` run in each: it
    makes the steps start..end-1 (or fewer, where the search stops early)."""
    if decoder.resize_cache is None:
        return loop(state, 0, max_steps)
    start = 0
    for end in windows(max_steps):
        state = {**state, "cache": decoder.resize_cache(state["cache"], end)}
        state = loop(state, start, end)
        start = end
    return state


def length_penalty(length, alpha: float):
    """GNMT length penalty ((5 + length) / 6)^alpha."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def log_probs(logits: jax.Array) -> jax.Array:
    """log softmax over the tokens the decoder may emit (never PAD or BOS)."""
    logits = logits.astype(jnp.float32)
    logits = logits.at[..., PAD_ID].set(NEG).at[..., BOS_ID].set(NEG)
    return jax.nn.log_softmax(logits, axis=-1)


def _only_eos_at_max(lp: jax.Array, at_max: jax.Array) -> jax.Array:
    """Where `at_max` (broadcast over the vocabulary), every token but EOS is excluded."""
    eos_only = jnp.full((lp.shape[-1],), NEG).at[EOS_ID].set(0.0)
    return jnp.where(at_max, jnp.maximum(lp, NEG) + eos_only, lp)


def beam_search(
    decoder: Decoder,
    max_lengths: jax.Array,
    *,
    beam_size: int,
    alpha: float,
    max_steps: int,
    no_repeat_ngram_size: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """Batched beam search.

    Args:
      decoder: its cache holds b*k rows (k = beam_size rows per sentence, sentence-major).
      max_lengths: [b] int, the most output tokens (excluding EOS) per sentence; a padding
        row uses 0.
      beam_size: k.
      alpha: length-penalty exponent.
      max_steps: static bound >= max(max_lengths) + 1 (the EOS step).
      no_repeat_ngram_size: n > 0: no n-gram twice in a hypothesis (`repeated_ngram_bans`);
        0: off.

    Returns:
      sequences [b, k, max_steps] int32 (EOS-terminated, PAD after), best first;
      scores [b, k] float32, length-penalised log-probabilities.
    """
    batch, k, T = max_lengths.shape[0], beam_size, max_steps
    init = {
        "i": jnp.array(0, jnp.int32),
        "live_seqs": jnp.full((batch, k, T + 1), PAD_ID, jnp.int32).at[:, :, 0].set(BOS_ID),
        "live_logprobs": jnp.tile(jnp.array([0.0] + [NEG] * (k - 1)), (batch, 1)),
        "fin_seqs": jnp.full((batch, k, T + 1), PAD_ID, jnp.int32),
        "fin_scores": jnp.full((batch, k), NEG),
        "cache": decoder.cache,
    }
    max_lp = length_penalty(max_lengths + 1, alpha)  # [b]

    def not_done(s):
        full = s["fin_scores"][:, -1] > NEG / 2  # k finished hypotheses
        best_live = s["live_logprobs"][:, 0] / max_lp
        can_improve = ~full | (best_live > s["fin_scores"][:, -1])
        live = s["live_logprobs"][:, 0] > NEG / 2
        return (s["i"] < T) & jnp.any(can_improve & live)

    ngram = no_repeat_ngram_size
    step = functools.partial(_beam_step, decoder, max_lengths, k, alpha, ngram)
    if decoder.resize_cache is not None:  # step 0 below on the first window's cache too
        init["cache"] = decoder.resize_cache(init["cache"], windows(T)[0])
    if decoder.rows_independent and k > 1 and T > 0:  # not_done holds at step 0
        first = _one_row_per_sentence(decoder, batch, k)
        init = _beam_step(first, max_lengths, k, alpha, ngram, init)

    def loop(s, start, end):  # start: s["i"] itself
        return jax.lax.while_loop(lambda s: not_done(s) & (s["i"] < end), step, s)

    final = _in_windows(decoder, init, T, loop)
    return final["fin_seqs"][:, :, 1:], final["fin_scores"]


def _one_row_per_sentence(decoder: Decoder, batch: int, k: int) -> Decoder:
    """The decoder of beam search's first step, run on one row per sentence: at step 0 the k
    rows of a sentence hold the same token (BOS) and the same cache, so they have the same
    logits. Those are computed once and repeated, and the step's reorder, whose parents can
    only be copies of that row, gives each of the k rows its sentence's new cache: one step's
    work of k rows is done once (figures: docs/performance.md, as `windows`)."""
    first = jnp.arange(batch) * k  # each sentence's first row

    def tokens_to_logits(ids, cache):
        logits, cache = decoder.tokens_to_logits(ids[first], decoder.reorder_cache(cache, first))
        return jnp.repeat(logits, k, axis=0), cache  # [b*k, V]; the cache has b rows

    def reorder_cache(cache, rows):
        return decoder.reorder_cache(cache, rows // k)  # row s*k + beam -> sentence s

    return decoder._replace(tokens_to_logits=tokens_to_logits, reorder_cache=reorder_cache)


def _beam_step(decoder: Decoder, max_lengths, k, alpha, ngram, s):
    batch = s["live_seqs"].shape[0]
    i = s["i"]
    ids = jax.lax.dynamic_slice_in_dim(s["live_seqs"], i, 1, axis=2).reshape(batch * k, 1)
    logits, cache = decoder.tokens_to_logits(ids, s["cache"])
    # The best 2k continuations of the batch's k beams are among each beam's best 2k: adding
    # the beam's score keeps the order within a beam. So 2k per beam, then 2k of those k * 2k.
    at_max = jnp.repeat(i >= max_lengths, k)[:, None]  # [b*k, 1]
    n = min(2 * k, logits.shape[-1])  # a beam wider than half the vocabulary takes it all
    banned = None
    if ngram:  # the i tokens written so far: live_seqs[:, :, 1 : i+1] (BOS at 0)
        written = s["live_seqs"][:, :, 1:].reshape(batch * k, -1)  # [b*k, T]
        banned = repeated_ngram_bans(written, i, ngram, logits.shape[-1])  # [b*k, V]
    lp, tok = top_log_probs(logits, n, at_max, banned)  # [b*k, n]
    candidates = s["live_logprobs"][:, :, None] + lp.reshape(batch, k, n)
    top_lp, top_idx = jax.lax.top_k(candidates.reshape(batch, k * n), 2 * k)  # [b, 2k]
    top_beam = top_idx // n
    top_tok = jnp.take_along_axis(tok.reshape(batch, k * n), top_idx, axis=1)
    top_seqs = jnp.take_along_axis(s["live_seqs"], top_beam[:, :, None], axis=1)
    top_seqs = jax.lax.dynamic_update_slice_in_dim(top_seqs, top_tok[:, :, None], i + 1, axis=2)
    is_eos = top_tok == EOS_ID
    # Live: the best k candidates that did not end.
    live_lp = jnp.where(is_eos, NEG, top_lp)
    live_lp, live_pos = jax.lax.top_k(live_lp, k)
    live_seqs = jnp.take_along_axis(top_seqs, live_pos[:, :, None], axis=1)
    live_beam = jnp.take_along_axis(top_beam, live_pos, axis=1)  # [b, k] beam within sentence
    rows = (jnp.arange(batch)[:, None] * k + live_beam).reshape(-1)  # [b*k] rows of the cache
    cache = decoder.reorder_cache(cache, rows)
    # Finished: EOS candidates within the top k, merged with those found earlier.
    rank_ok = jnp.arange(2 * k)[None, :] < k
    fin_new = jnp.where(
        is_eos & rank_ok & (top_lp > NEG / 2), top_lp / length_penalty(i + 1, alpha), NEG
    )
    all_scores = jnp.concatenate([s["fin_scores"], fin_new], axis=1)
    all_seqs = jnp.concatenate([s["fin_seqs"], top_seqs], axis=1)
    fin_scores, fin_pos = jax.lax.top_k(all_scores, k)
    fin_seqs = jnp.take_along_axis(all_seqs, fin_pos[:, :, None], axis=1)
    return {
        "i": i + 1,
        "live_seqs": live_seqs,
        "live_logprobs": jnp.maximum(live_lp, NEG),
        "fin_seqs": fin_seqs,
        "fin_scores": fin_scores,
        "cache": cache,
    }


def greedy_search(
    decoder: Decoder, max_lengths: jax.Array, *, max_steps: int, no_repeat_ngram_size: int = 0
):
    """Argmax at every step until EOS (or the sentence's maximum length); with
    no_repeat_ngram_size n > 0, over the tokens that repeat no n-gram.

    Returns sequences [b, max_steps] int32 (EOS-terminated, PAD after) and their summed
    log-probabilities [b].
    """
    return _one_path(
        decoder, max_lengths, max_steps, lambda lp, i: jnp.argmax(lp, -1), no_repeat_ngram_size
    )


def sample_search(
    decoder: Decoder,
    max_lengths: jax.Array,
    rng: jax.Array,
    *,
    max_steps: int,
    temperature: float = 1.0,
    top_k: int = 0,
    no_repeat_ngram_size: int = 0,
):
    """Ancestral sampling from softmax(logits / temperature), restricted to the `top_k` most
    likely tokens when top_k > 0 (0: the whole vocabulary), and to those that repeat no n-gram
    when no_repeat_ngram_size n > 0.

    Returns sequences [b, max_steps] int32 (EOS-terminated, PAD after) and their summed
    log-probabilities [b] under the model (temperature 1, no top-k).
    """

    def choose(lp, i):
        scaled = lp / temperature
        if top_k:
            kth = jax.lax.top_k(scaled, top_k)[0][:, -1:]  # [b, 1]
            scaled = jnp.where(scaled >= kth, scaled, NEG)
        return jax.random.categorical(jax.random.fold_in(rng, i), scaled, axis=-1)

    return _one_path(decoder, max_lengths, max_steps, choose, no_repeat_ngram_size)


def _one_path(decoder: Decoder, max_lengths, max_steps: int, choose, ngram: int = 0):
    """One hypothesis per sentence, token by token: `choose(log_probs [b, V], step) -> [b]`;
    ngram > 0: tokens that would repeat an n-gram get log-probability NEG first."""
    batch = max_lengths.shape[0]

    def body(i, s):
        ids = jnp.where(i == 0, BOS_ID, s["seqs"][:, jnp.maximum(i - 1, 0)])[:, None]
        logits, cache = decoder.tokens_to_logits(ids, s["cache"])
        lp = log_probs(logits)  # [b, V]
        if ngram:  # the i tokens written so far: seqs[:, :i]
            lp = jnp.where(repeated_ngram_bans(s["seqs"], i, ngram, lp.shape[-1]), NEG, lp)
        lp = _only_eos_at_max(lp, (i >= max_lengths)[:, None])
        tok = choose(lp, i).astype(jnp.int32)
        tok = jnp.where(s["done"], PAD_ID, tok)
        score = s["score"] + jnp.where(
            s["done"], 0.0, jnp.take_along_axis(lp, tok[:, None], 1)[:, 0]
        )
        return {
            "seqs": s["seqs"].at[:, i].set(tok),
            "cache": cache,
            "score": score,
            "done": s["done"] | (tok == EOS_ID),
        }

    init = {
        "seqs": jnp.full((batch, max_steps), PAD_ID, jnp.int32),
        "cache": decoder.cache,
        "score": jnp.zeros((batch,), jnp.float32),
        "done": jnp.zeros((batch,), bool),
    }
    out = _in_windows(
        decoder,
        init,
        max_steps,
        lambda s, start, end: jax.lax.fori_loop(start, end, body, s),
    )
    return out["seqs"], out["score"]


@dataclasses.dataclass(frozen=True)
class Strategy:
    """The search `cfg.decode` asks for; hashable, so jit can take it as a static argument."""

    name: str = "beam"  # one of STRATEGIES
    beam_size: int = 4
    alpha: float = 0.6
    temperature: float = 1.0
    top_k: int = 0
    no_repeat_ngram_size: int = 0  # 0: off (the paper's search)

    @classmethod
    def from_config(cls, decode: ml_collections.ConfigDict) -> Strategy:
        return cls(
            decode.strategy,
            int(decode.beam_size),
            float(decode.alpha),
            float(decode.temperature),
            int(decode.top_k),
            # .get: decode sections built before the key (tests, old exports) leave it off
            int(decode.get("no_repeat_ngram_size", 0)),
        )

    @property
    def width(self) -> int:
        """Rows of the decoder cache per sentence, and hypotheses returned per sentence."""
        return self.beam_size if self.name == "beam" else 1

    def __call__(
        self, decoder: Decoder, max_lengths: jax.Array, max_steps: int, rng: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """sequences [b, width, max_steps], scores [b, width] (best first for beam).

        `rng` is used by sampling only.
        """
        if self.name == "beam":
            return beam_search(
                decoder,
                max_lengths,
                beam_size=self.beam_size,
                alpha=self.alpha,
                max_steps=max_steps,
                no_repeat_ngram_size=self.no_repeat_ngram_size,
            )
        if self.name == "greedy":
            seqs, scores = greedy_search(
                decoder,
                max_lengths,
                max_steps=max_steps,
                no_repeat_ngram_size=self.no_repeat_ngram_size,
            )
        elif self.name == "sample":
            seqs, scores = sample_search(
                decoder,
                max_lengths,
                rng,
                max_steps=max_steps,
                temperature=self.temperature,
                top_k=self.top_k,
                no_repeat_ngram_size=self.no_repeat_ngram_size,
            )
        else:
            raise ValueError(f"decode.strategy must be one of {STRATEGIES}, got {self.name!r}")
        return seqs[:, None], scores[:, None]
