"""Translating with a CTranslate2 export (tx.infer.export writes it): the same contract as
tx.infer.translate.

    python -m tx translate --engine ctranslate2 --model DIR < in > out

The search settings are the run's (DIR/tx_config.json `decode`): beam size, alpha, and the
maximum output length, input sub-words + max_extra_len per sentence (or less with
decode.max_length_ratio: tx.infer.safeguards.max_output_length). CTranslate2 takes one maximum
length per call, so sentences are decoded in groups of equal input length: each group's
limit is then every one of its sentences' own, ratio included.

Length penalty. CTranslate2's `length_penalty` divides a finished hypothesis's log-probability
by |Y|^alpha; tx's (tx.infer.search.length_penalty, the paper's GNMT form) by ((5 + |Y|)/6)^alpha.
The two rank hypotheses of different lengths differently, so CTranslate2 is asked for its
beam_size * PATIENCE finished hypotheses with their plain log-probabilities (a penalty of
RAW_ALPHA, ~0, which also turns off its stop-at-the-first-finished rule) and they are re-ranked
here with tx's penalty, |Y| counting EOS as tx does. At the maximum length tx forces EOS and
scores it; CTranslate2 stops without it, so such hypotheses get their EOS here (one scoring
pass). What can still differ from tx's own search is the set of finished hypotheses:
CTranslate2 stops after beam_size * PATIENCE of them, tx when no live hypothesis can beat its
k-th (demo test set: 500 of 500 sentences identical; PATIENCE 1 gave 496). With alpha = 0
(or greedy) the search is CTranslate2's own early-stopping beam, which ranks as tx's does.
A length penalty of 0 and min_decoding_length 0 let a hypothesis end at the first step, as in tx.

decode.no_repeat_ngram_size is CTranslate2's own (the same rule as tx's and fairseq's), with one
difference: CTranslate2 removes the banned tokens before its log-softmax (the others are
renormalised), tx and fairseq set their log-probabilities to NEG or -inf after it. Every
hypothesis is then scored again (one scoring pass) for tx's scores, the model's
log-probabilities. Greedy outputs are tx's; a beam's choices between hypotheses can differ, as
their scores during the search do.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import defaultdict

import ml_collections
import numpy as np

from tx import storage
from tx.data.tokenizer import Tokenizer
from tx.infer.export import CONFIG_FILE, EXPORT_FILE, VOCAB_FILE
from tx.infer.safeguards import max_output_length
from tx.tokens import EOS_ID

PATIENCE = 2  # finished hypotheses collected per beam slot before re-ranking
RAW_ALPHA = 1e-9  # |Y|^1e-9 = 1 to float32 precision for |Y| < 10^6: plain log-probabilities


class EngineError(ValueError):
    """A model directory or setting the CTranslate2 engine cannot use."""


@dataclasses.dataclass
class CT2Model:
    translator: object  # ctranslate2.Translator
    tokenizer: Tokenizer
    cfg: ml_collections.ConfigDict  # the run's config, as exported
    source: str  # what translates: the directory, quantization and checkpoint
    max_positions: int  # position table rows: inputs and outputs must fit
    pieces: list[str]  # vocabulary, in tx's id order

    def search_ids(self, sources: list[np.ndarray], decode_cfg, nbest: int = 1):
        """tx.infer.translate.translate_ids's contract: per sentence [(ids, score), ...], best
        first."""
        return translate_ids(self, sources, decode_cfg, nbest)


def load(model_dir: str, device: str = "cpu", compute_type: str = "default", threads: int = 0):
    """Opens an export (a directory, or a bucket's prefix: CTranslate2 reads a local copy).
    `threads` = 0 lets CTranslate2 choose (one per core)."""
    import ctranslate2

    if not storage.isfile(storage.join(model_dir, EXPORT_FILE)):  # written last: complete
        raise EngineError(
            f"--model {model_dir} is not a tx export (no {EXPORT_FILE}): write one with "
            "`python -m tx export --workdir W --format ctranslate2 --out DIR`"
        )
    local = storage.local_tree(model_dir)
    with open(os.path.join(local, EXPORT_FILE)) as f:
        record = json.load(f)
    with open(os.path.join(local, CONFIG_FILE)) as f:
        cfg = ml_collections.ConfigDict(json.load(f))
    tokenizer = Tokenizer(os.path.join(local, VOCAB_FILE))
    translator = ctranslate2.Translator(
        local, device=device, compute_type=compute_type, intra_threads=threads
    )
    sp = tokenizer.sp
    return CT2Model(
        translator,
        tokenizer,
        cfg,
        f"ctranslate2:{model_dir} ({record['quantization']}, {record['checkpoint']})",
        int(record["max_positions"]),
        [sp.id_to_piece(i) for i in range(sp.get_piece_size())],
    )


def translate_ids(model: CT2Model, sources: list[np.ndarray], decode_cfg, nbest: int = 1):
    """Token ids (each ending in EOS) -> per sentence a list of (ids, score), best first; the
    score is the GNMT-penalised log-probability, as tx's beam search gives it."""
    strategy, k = decode_cfg.strategy, int(decode_cfg.beam_size)
    if strategy not in ("beam", "greedy"):
        raise EngineError(
            f"decode.strategy={strategy!r}: the CTranslate2 engine runs beam or greedy"
        )
    k = k if strategy == "beam" else 1
    if not 1 <= nbest <= k:
        raise ValueError(f"nbest={nbest}: decode.strategy={strategy!r} keeps {k}")
    groups = defaultdict(list)  # input sub-words (without EOS) -> sentence numbers
    for i, s in enumerate(sources):
        groups[len(s) - 1].append(i)
    results: list = [None] * len(sources)
    extra = int(decode_cfg.max_extra_len)
    ratio = float(decode_cfg.get("max_length_ratio", 0.0))  # exports before the key: absent
    for n, idx in sorted(groups.items()):
        max_len = max_output_length(n, extra, ratio)  # one input length: per sentence exactly
        _check_positions(model, n, max_len)
        batch = [[model.pieces[t] for t in sources[i][:-1]] for i in idx]
        for i, hyps in zip(idx, _search(model, batch, decode_cfg, k, max_len), strict=True):
            results[i] = hyps[:nbest]
    return results


def _check_positions(model: CT2Model, n: int, max_len: int) -> None:
    # The source has n + 1 positions (EOS); the decoder reads positions 0 .. max_len (the
    # last one for the EOS that ends a hypothesis of max_len tokens).
    if max(n + 1, max_len + 1) > model.max_positions:
        raise ValueError(
            f"an input of {n + 1} tokens allows {max_len} output tokens, more than the "
            f"{model.max_positions} positions of the exported table"
        )


def _search(model: CT2Model, batch: list[list[str]], decode_cfg, k: int, max_len: int):
    """One CTranslate2 call for inputs of one length -> per input [(ids, score)] best first."""
    alpha = float(decode_cfg.alpha) if decode_cfg.strategy == "beam" else 0.0
    rerank = alpha != 0.0 and k > 1
    ngram = int(decode_cfg.get("no_repeat_ngram_size", 0))
    results = model.translator.translate_batch(
        batch,
        beam_size=k,
        patience=PATIENCE if rerank else 1,
        num_hypotheses=k * PATIENCE if rerank else k,
        length_penalty=RAW_ALPHA if rerank else 0.0,
        max_decoding_length=max_len,
        no_repeat_ngram_size=ngram,
        min_decoding_length=0,  # tx may end at once (CTranslate2 defaults to 1)
        max_input_length=0,  # tx never truncates an input
        return_scores=True,
        return_end_token=True,  # to tell ended hypotheses from those cut at max_len
        max_batch_size=int(decode_cfg.batch_tokens),
        batch_type="tokens",
    )
    eos = model.pieces[EOS_ID]
    hyps = [
        [
            [list(t), s * len(t) ** RAW_ALPHA if rerank else s]
            for t, s in zip(r.hypotheses, r.scores, strict=True)
        ]
        for r in results
    ]
    _end_cut_hypotheses(model, batch, hyps, eos, every=ngram > 0)
    index = {p: i for i, p in enumerate(model.pieces)}
    out = []
    for h in hyps:  # tx's score: log-probability / ((5 + |Y|) / 6)^alpha, |Y| counting EOS
        scored = [
            (np.array([index[t] for t in toks[:-1]], np.int32), float(lp / _gnmt(len(toks), alpha)))
            for toks, lp in h
        ]
        out.append(sorted(scored, key=lambda x: -x[1]))  # stable: CTranslate2's order on ties
    return out


def _end_cut_hypotheses(model: CT2Model, batch, hyps, eos: str, every: bool = False) -> None:
    """Hypotheses CTranslate2 cut at the maximum length get the EOS that tx's search forces
    there, with its log-probability (one scoring pass over the whole hypothesis). `every`: all
    hypotheses are scored so (their scores from CTranslate2 were renormalised around banned
    n-grams; see the module docstring)."""
    cut = [
        (b, j)
        for b, h in enumerate(hyps)
        for j, (toks, _) in enumerate(h)
        if every or toks[-1:] != [eos]
    ]
    if not cut:
        return
    words = [hyps[b][j][0][: -1 if hyps[b][j][0][-1:] == [eos] else None] for b, j in cut]
    scored = model.translator.score_batch(
        [batch[b] for b, _ in cut], words, max_input_length=0
    )  # each target's log-probabilities, its EOS's last
    for (b, j), toks, r in zip(cut, words, scored, strict=True):
        hyps[b][j] = [toks + [eos], float(np.sum(r.log_probs, dtype=np.float64))]


def _gnmt(length: int, alpha: float) -> float:
    """tx.infer.search.length_penalty, in plain Python."""
    return ((5.0 + length) / 6.0) ** alpha
