"""BLEU the paper's way and sacreBLEU's way, and chrF: pure functions of text (tx.eval.evaluate
translates and calls them).

* `sacrebleu_scores`: detokenized hypotheses against raw references with sacreBLEU's own
  13a tokenization: the comparable standard today, reported with its signature.
* `tokenized_bleu`: the paper's number: Moses tokenization (sacremoses, as tokenizer.perl
  -l LANG with its default HTML escaping), then BLEU over those tokens with no further
  tokenization, as multi-bleu.perl computes it (case-sensitive, no smoothing). For a German
  target only, compounds are first split at hyphens (`s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`), as
  tensor2tensor's get_ende_bleu.sh does; that script is EN-DE's, so EN-FR and any other target
  are not split. `tok_bleu_recipe(lang)` spells out the exact steps, and `score_all` reports it.
* `repetition_loops`: the hypotheses caught in a loop, the failure a BLEU score hides best.
No sentence is ever dropped, lower-cased or shortened.
"""

from __future__ import annotations

import re

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

_COMPOUND = re.compile(r"(\S)-(\S)")
COMPOUND_SPLIT_LANGS = frozenset({"de"})  # get_ende_bleu.sh is EN-DE's: German targets only


def moses_tokenize(lines: list[str], lang: str) -> list[str]:
    """Moses tokenization as tokenizer.perl -l LANG does by default (with HTML escaping)."""
    # imported here: sacremoses compiles its patterns on import, which a training run that
    # scores BLEU only at its evaluations should not wait for at its start
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang=lang)
    return [tok.tokenize(line, return_str=True, escape=True) for line in lines]


def split_compounds(line: str) -> str:
    """Hyphenated compounds as ##AT##-##AT## tokens, exactly as get_ende_bleu.sh's perl does
    (global, non-overlapping matches: 'a-b-c' -> 'a ##AT##-##AT## b-c')."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def tok_bleu_recipe(lang: str) -> str:
    """The exact steps `tokenized_bleu` takes for target language `lang`, as one line."""
    steps = [f"sacremoses tokenizer.perl -l {lang} (escape)"]
    if lang in COMPOUND_SPLIT_LANGS:
        steps.append(r"compound split s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g")
    steps.append("multi-bleu (case-sensitive, no smoothing)")
    return " | ".join(steps)


def paper_tokenize(lines: list[str], lang: str) -> list[str]:
    """Moses tokens, compound-split for a German target (the first steps of tok_bleu_recipe)."""
    tokens = moses_tokenize(lines, lang)
    if lang in COMPOUND_SPLIT_LANGS:
        tokens = [split_compounds(x) for x in tokens]
    return tokens


def tokenized_bleu(hypotheses: list[str], references: list[str], lang: str) -> float:
    """The paper's tokenized BLEU (0-100), compound-split for German (see tok_bleu_recipe)."""
    return token_bleu(paper_tokenize(hypotheses, lang), paper_tokenize(references, lang)).score


def token_bleu(hyp_tokens: list[str], ref_tokens: list[str]):
    """BLEU over already-tokenized, space-separated text (multi-bleu.perl semantics)."""
    return BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(
        hyp_tokens, [ref_tokens]
    )


def sacrebleu_scores(hypotheses: list[str], references: list[str]) -> dict:
    bleu = BLEU()
    score = bleu.corpus_score(hypotheses, [references])
    chrf = CHRF().corpus_score(hypotheses, [references])
    return {"bleu": score.score, "bleu_signature": str(bleu.get_signature()), "chrf": chrf.score}


def bootstrap_interval(
    hypotheses: list[str], references: list[str], samples: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """95% interval of sacreBLEU by resampling sentences (with replacement)."""
    bleu = BLEU()
    stats = np.array(
        [_sentence_stats(bleu, h, r) for h, r in zip(hypotheses, references, strict=True)]
    )
    rng = np.random.default_rng(seed)
    scores = []
    for _ in range(samples):
        total = stats[rng.integers(0, len(stats), len(stats))].sum(0)
        scores.append(
            BLEU.compute_bleu(
                total[2:6].tolist(), total[6:10].tolist(), int(total[0]), int(total[1])
            ).score
        )
    return float(np.percentile(scores, 2.5)), float(np.percentile(scores, 97.5))


def _sentence_stats(bleu: BLEU, hyp: str, ref: str) -> list[float]:
    s = bleu.corpus_score([hyp], [[ref]])
    return [s.sys_len, s.ref_len, *s.counts, *s.totals]


# A stretch of at least two characters said at least three times in a row: "remove-remove-
# remove-", "zu automatisch zu automatisch zu automatisch".
_LOOP = re.compile(r"(.{2,}?)\1{2,}", re.DOTALL)
_LETTER = re.compile(r"[^\W\d_]")


def has_loop(text: str) -> bool:
    """Whether some stretch of `text` with a letter in it (not "...", "----", "1111") comes
    three times in a row; case is ignored. A space is put at each end, so that a loop of
    words ending the line ("zu x zu x zu x") is seen whole."""
    return any(_LETTER.search(m.group(1)) for m in _LOOP.finditer(f" {text.lower()} "))


def repetition_loops(hypotheses: list[str], sources: list[str]) -> list[int]:
    """Indices of the hypotheses caught in a repetition loop (`has_loop`) whose source has
    none (a source that says "very, very, very" may be translated so)."""
    return [
        i
        for i, (hyp, src) in enumerate(zip(hypotheses, sources, strict=True))
        if has_loop(hyp) and not has_loop(src)
    ]


def score_all(
    hypotheses: list[str],
    references: list[str],
    lang: str,
    bootstrap: int = 0,
    sources: list[str] | None = None,
) -> dict:
    """Everything `tx evaluate --json` reports (`repetition_loops` when `sources` are given)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    out = sacrebleu_scores(hypotheses, references)
    out["tok_bleu"] = tokenized_bleu(hypotheses, references, lang)
    out["tok_bleu_recipe"] = tok_bleu_recipe(lang)
    out["num_sentences"] = len(references)
    if sources is not None:
        out["repetition_loops"] = len(repetition_loops(hypotheses, sources))
    if bootstrap:
        out["bleu_95ci"] = bootstrap_interval(hypotheses, references, bootstrap)
    return out


def bleu_by_length(
    sources: list[str],
    hypotheses: list[str],
    references: list[str],
    width: int = 10,
    open_from: int = 60,
) -> list[dict]:
    """sacreBLEU of the sentences in each source-length bucket, for comparing models on long
    sentences (Bahdanau et al. 2015, Figure 2).

    Lengths are source words (whitespace-separated): comparable across vocabularies. Buckets
    are 1-`width`, `width`+1-2`width`, ... and one open bucket for the rest, from the first
    bucket start past `open_from` (1-10, ..., 51-60, 61+ by default); empty buckets are left
    out. Each bucket's BLEU is a
    corpus BLEU over its sentences, as sacreBLEU scores a test set.

    Returns:
      [{"bucket": "11-20", "min_words": 11, "max_words": 20 (None when open), "sentences",
        "bleu"}] in length order.
    """
    if width <= 0:
        raise ValueError(f"bucket width must be positive, got {width}")
    groups: dict[int, list[int]] = {}
    for i, source in enumerate(sources):
        words = max(len(source.split()), 1)
        groups.setdefault(min((words - 1) // width, -(-open_from // width)), []).append(i)
    out = []
    for b in sorted(groups):
        idx = groups[b]
        low = b * width + 1
        high = None if low > open_from else (b + 1) * width
        score = BLEU().corpus_score([hypotheses[i] for i in idx], [[references[i] for i in idx]])
        out.append(
            {
                "bucket": f"{low}+" if high is None else f"{low}-{high}",
                "min_words": low,
                "max_words": high,
                "sentences": len(idx),
                "bleu": score.score,
            }
        )
    return out
