"""BLEU the paper's way and sacreBLEU's way, and chrF.

* `sacrebleu_scores`: detokenized hypotheses against raw references with sacreBLEU's own
  13a tokenization: the comparable standard today, reported with its signature.
* `tokenized_bleu`: the paper's number: Moses tokenization (sacremoses, as tokenizer.perl
  -l LANG with its default HTML escaping), then BLEU over those tokens with no further
  tokenization, as multi-bleu.perl computes it (case-sensitive, no smoothing). For a German
  target only, compounds are first split at hyphens (`s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`), as
  tensor2tensor's get_ende_bleu.sh does; that script is EN-DE's, so EN-FR and any other target
  are not split. `tok_bleu_recipe(lang)` spells out the exact steps, and `score_all` reports it.
No sentence is ever dropped, lower-cased or shortened.
"""

from __future__ import annotations

import re

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacremoses import MosesTokenizer

_COMPOUND = re.compile(r"(\S)-(\S)")
COMPOUND_SPLIT_LANGS = frozenset({"de"})  # get_ende_bleu.sh is EN-DE's: German targets only


def moses_tokenize(lines: list[str], lang: str) -> list[str]:
    """Moses tokenization as tokenizer.perl -l LANG does by default (with HTML escaping)."""
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


def score_all(hypotheses: list[str], references: list[str], lang: str, bootstrap: int = 0) -> dict:
    """Everything `tx evaluate --json` reports."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    out = sacrebleu_scores(hypotheses, references)
    out["tok_bleu"] = tokenized_bleu(hypotheses, references, lang)
    out["tok_bleu_recipe"] = tok_bleu_recipe(lang)
    out["num_sentences"] = len(references)
    if bootstrap:
        out["bleu_95ci"] = bootstrap_interval(hypotheses, references, bootstrap)
    return out


def evaluate_split(
    cfg, workdir: str, split: str, loaded=None, bootstrap: int = 0, output: str | None = None
) -> dict:
    """Translates every sentence of `split` and scores it; hypotheses go to a file.

    Returns score_all's dict plus `hypotheses_file` and `checkpoint`.
    """
    import os

    from tx.data.dataset import split_text
    from tx.translate import load_model, translate

    loaded = loaded or load_model(cfg, workdir)
    pairs = split_text(cfg.data, split)
    sources = [s for s, _ in pairs]
    references = [r for _, r in pairs]
    hypotheses = translate(loaded, sources, cfg)
    path = output or os.path.join(workdir, f"{split}.hyp.{cfg.data.tgt_lang}")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(h + "\n" for h in hypotheses)
    os.replace(tmp, path)
    result = score_all(hypotheses, references, cfg.data.tgt_lang, bootstrap)
    result.update(hypotheses_file=path, checkpoint=loaded.source, split=split)
    return result


def copy_baseline(cfg, split: str) -> dict:
    """Scores of "translating" by copying the source: what a model must beat by far."""
    from tx.data.dataset import split_text

    pairs = split_text(cfg.data, split)
    return score_all([s for s, _ in pairs], [r for _, r in pairs], cfg.data.tgt_lang)


def dev_bleu_hook(cfg, workdir: str):
    """A callable(params) -> {"bleu", "tok_bleu"} on the whole dev split, for training.

    The model, vocabulary and dev sentences are prepared once; each call decodes with the
    current parameters (beam search as configured).
    """
    import os

    from tx import sharding
    from tx.config import model_config
    from tx.data.dataset import split_text
    from tx.data.tokenizer import MODEL_FILENAME, Tokenizer
    from tx.model import Transformer
    from tx.translate import LoadedModel, translate

    pairs = split_text(cfg.data, "dev")
    sources, references = [s for s, _ in pairs], [r for _, r in pairs]
    mesh = sharding.make_mesh(cfg.mesh)
    model = Transformer(model_config(cfg))
    state = {}

    def hook(params) -> dict:
        if "tokenizer" not in state:  # the vocabulary exists once training has started
            state["tokenizer"] = Tokenizer(os.path.join(workdir, MODEL_FILENAME))
        loaded = LoadedModel(model, params, state["tokenizer"], "training", mesh)
        hyps = translate(loaded, sources, cfg)
        return {
            "bleu": sacrebleu_scores(hyps, references)["bleu"],
            "tok_bleu": tokenized_bleu(hyps, references, cfg.data.tgt_lang),
        }

    return hook
