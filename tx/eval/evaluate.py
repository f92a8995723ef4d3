"""Evaluating a run: translate a split, write the hypotheses, score them (tx.eval.metrics).

evaluate(cfg, split=..., references=..., ...) -> `python -m tx evaluate`'s three modes: a
  run's split, any files translated, or translations given; `summary` words the result
evaluate_split(cfg, workdir, "test") -> scores, hypotheses file, checkpoint used
evaluate_files(cfg, refs, sources=F, loaded=...) or (cfg, refs, hypotheses=F) -> the same
  for any files: translated by the model, or translations given
dev_bleu_hook(cfg, workdir) -> callable(params) for BLEU during training
"""

from __future__ import annotations

import os

import ml_collections

from tx import storage
from tx import workdir as wd
from tx.config import ConfigError, model_config
from tx.data import trees as parsing
from tx.data.dataset import split_text
from tx.data.sources import DataError, gold_trees, read_lines
from tx.data.vocabulary import run_tokenizer
from tx.eval import evalb
from tx.eval.metrics import bleu_by_length, sacrebleu_scores, score_all, tokenized_bleu
from tx.infer.engines import load_engine, with_search
from tx.infer.translate import LoadedModel, load_model, translate
from tx.model.families import build_model
from tx.train import runcard, sharding


def evaluate(
    cfg: ml_collections.ConfigDict,
    *,
    split: str | None = None,
    references: str | None = None,
    sources: str | None = None,
    hypotheses: str | None = None,
    output: str | None = None,
    bootstrap: int = 0,
    by_length: int | None = None,
    search: dict | None = None,
    **engine,
) -> tuple[str, str | None, dict]:
    """`python -m tx evaluate`: the run's `split` (default test) translated and scored, or any
    files: `sources` translated and scored against `references`, or `hypotheses` scored
    without a model. `search`: tx.infer.engines.with_search's settings; `engine`: load_engine's
    keyword arguments (a run and its --checkpoint, or an export); `by_length`: a bucket width
    in source words (None: no buckets). Returns (label, where, result): the name the scores
    go under (the split, or the reference file's name), the directory outputs go to by default
    (the run, or the export), and evaluate_split's or evaluate_files's result."""
    label = _check(split, references, sources, hypotheses, output, by_length)
    cfg = with_search(cfg, **(search or {}))
    own = engine.get("engine", "jax") == "jax"
    # An export is scored into its own directory; the run card is the training run's.
    where = (engine.get("workdirs") or [None])[0] if own else engine.get("model")
    loaded = None if hypotheses else load_engine(cfg, **engine)
    if references:
        default = f"{os.path.basename(sources or '')}.hyp.{cfg.data.tgt_lang}"
        result = evaluate_files(
            cfg,
            references,
            sources=sources,
            hypotheses=hypotheses,
            loaded=loaded,
            output=output or (None if hypotheses else storage.join(where, default)),
            bootstrap=bootstrap,
            by_length=by_length or 0,
        )
    else:
        result = evaluate_split(
            cfg,
            where,
            label,
            loaded,
            bootstrap=bootstrap,
            output=output,
            by_length=by_length or 0,
            record=own,
        )
    if loaded is not None and not own:
        result["engine"] = engine["engine"]
    return label, where, result


def _check(split, references, sources, hypotheses, output, by_length) -> str:
    """The options that make one evaluation; the name its scores go under (the split, or the
    reference file's name)."""
    if by_length is not None and by_length <= 0:
        raise ConfigError(f"--bucket-width must be positive, got {by_length}")
    if not (sources or references or hypotheses):
        return split or "test"
    if split:
        raise ConfigError("--split evaluates the run's split; --src, --ref and --hyp name files")
    if not references or not (sources or hypotheses):
        raise ConfigError("evaluate needs --ref FILE with --src FILE (translated) or --hyp FILE")
    if hypotheses and output:
        raise ConfigError("--output writes translations; --hyp gives them")
    if by_length is not None and not sources:
        raise ConfigError("--by-length needs --src FILE (the source sentences' lengths)")
    return os.path.basename(references)


def summary(result: dict, label: str) -> list[str]:
    """`evaluate`'s result as the lines a person reads, each starting with `label`."""
    if "f1" in result:
        return [
            f"{label}: bracketing F1 {result['f1']:.2f} (precision {result['precision']:.2f}"
            f", recall {result['recall']:.2f}; {result['f1_recipe']}); "
            f"{result['scored_sentences']} of {result['num_sentences']} sentences scored; "
            f"parses in {result['hypotheses_file']}"
        ]
    lines = [
        f"{label}: sacreBLEU {result['bleu']:.2f} ({result['bleu_signature']})",
        f"{label}: tokenized BLEU {result['tok_bleu']:.2f} "
        f"(paper style: {result['tok_bleu_recipe']})",
        f"{label}: chrF {result['chrf']:.2f}; {result['num_sentences']} sentences, "
        f"{result.get('repetition_loops', 0)} with a repetition loop; "
        f"hypotheses in {result['hypotheses_file']}",
    ]
    lines += [
        f"{label}: {b['bucket']:>7} words: sacreBLEU {b['bleu']:6.2f} ({b['sentences']} sentences)"
        for b in result.get("by_length", [])
    ]
    if "by_length_png" in result:
        lines.append(f"wrote {result['by_length_png']}")
    return lines


def evaluate_split(
    cfg: ml_collections.ConfigDict,
    workdir: str,
    split: str,
    loaded=None,
    *,
    bootstrap: int = 0,
    output: str | None = None,
    by_length: int = 0,
    record: bool = True,
) -> dict:
    """Translates every sentence of `split` and scores it; hypotheses go to a file.

    Returns score_all's dict plus `hypotheses_file` and `checkpoint`, and with `by_length`
    (a bucket width in source words) `by_length`: metrics.bleu_by_length's buckets.
    `loaded` may be another engine (tx.infer.ct2); `workdir` is then where hypotheses go, and
    `record=False` keeps the scores out of a run card (they are not the run's own model's).
    """
    loaded = loaded or load_model(cfg, workdir)
    pairs = split_text(cfg.data, split)
    sources = [s for s, _ in pairs]
    references = [r for _, r in pairs]
    hypotheses = translate(loaded, sources, cfg)
    path = output or wd.hypotheses_file(workdir, split, cfg.data.tgt_lang)
    storage.write_text(path, "".join(h + "\n" for h in hypotheses))
    if cfg.data.source == "trees":  # parsing: bracketing F1 against the gold trees
        result = parse_scores(gold_trees(cfg.data, split), hypotheses)
    else:
        result = score_all(hypotheses, references, cfg.data.tgt_lang, bootstrap, sources)
    result.update(hypotheses_file=path, checkpoint=loaded.source, split=split)
    if by_length:
        result["by_length"] = bleu_by_length(sources, hypotheses, references, by_length)
    result["search"] = search_recipe(cfg.decode)
    if record:
        runcard.record_scores(workdir, split, result)
    return result


def evaluate_files(
    cfg: ml_collections.ConfigDict,
    references: str,
    *,
    sources: str | None = None,
    hypotheses: str | None = None,
    loaded=None,
    output: str | None = None,
    bootstrap: int = 0,
    by_length: int = 0,
) -> dict:
    """Scores translations of any file against the file `references` (one sentence a line,
    local or a bucket's object): the given `hypotheses`, or `loaded`'s translation of the file
    `sources` (written to the file `output`). `sources` beside `hypotheses` is read for the
    repetition-loop count and `by_length`. Nothing joins a run card: the files are no split
    of the run's. Returns score_all's dict plus `hypotheses_file` and `references_file`; with
    a model, `checkpoint` and `search`; with `by_length`, metrics.bleu_by_length's buckets."""
    refs = _read(references)
    texts = {name: _read(name) for name in (sources, hypotheses) if name}
    for name, lines in texts.items():
        if len(lines) != len(refs):
            raise DataError(f"{name} has {len(lines)} lines, {references} {len(refs)}")
    srcs = texts.get(sources)
    if hypotheses:
        hyps = texts[hypotheses]
    else:
        hyps = translate(loaded, srcs, cfg)
        storage.write_text(output, "".join(h + "\n" for h in hyps))
    result = score_all(hyps, refs, cfg.data.tgt_lang, bootstrap, srcs)
    result.update(hypotheses_file=hypotheses or output, references_file=references)
    if not hypotheses:
        result.update(checkpoint=loaded.source, search=search_recipe(cfg.decode))
    if by_length:
        result["by_length"] = bleu_by_length(srcs, hyps, refs, by_length)
    return result


def _read(path: str) -> list[str]:
    with storage.open_read(path) as f:
        return read_lines(f, path)


def parse_scores(gold: list[parsing.Tree], hypotheses: list[str]) -> dict:
    """EVALB (COLLINS.prm) bracketing scores of linearized parses. Each hypothesis is read back
    over its sentence's words with the gold POS tags (tx.data.trees.delinearize repairs
    ill-formed output), as Vinyals et al. scored: punctuation is then deleted by its tag."""
    tests = [
        parsing.delinearize(parsing.words(g), h, parsing.tags(g))
        for g, h in zip(gold, hypotheses, strict=True)
    ]
    score = evalb.bracket_f1(gold, tests)
    return {
        "f1": score.f1,
        "precision": score.precision,
        "recall": score.recall,
        "complete_match": score.complete_match,
        "tagging_accuracy": score.tagging_accuracy,
        "num_sentences": len(gold),
        "scored_sentences": score.valid,
        "errors": score.error_count,
        "f1_recipe": "EVALB COLLINS.prm (tx.eval.evalb.bracket_f1); output repaired by "
        "tx.data.trees.delinearize with the gold POS tags",
    }


def search_recipe(decode: ml_collections.ConfigDict) -> dict:
    """The decoding settings a score depends on, recorded beside it. The safeguards (off by
    default) only where set: the recipes of scores without them stay as they were."""
    keys = ("strategy", "beam_size", "alpha", "max_extra_len")
    if decode.strategy == "sample":
        keys += ("temperature", "top_k", "seed")
    keys += tuple(k for k in ("no_repeat_ngram_size", "max_length_ratio") if decode.get(k, 0))
    return {k: decode[k] for k in keys}


def copy_baseline(cfg: ml_collections.ConfigDict, split: str) -> dict:
    """Scores of "translating" by copying the source: what a model must beat by far."""
    pairs = split_text(cfg.data, split)
    return score_all([s for s, _ in pairs], [r for _, r in pairs], cfg.data.tgt_lang)


def dev_bleu_hook(cfg: ml_collections.ConfigDict, workdir: str):
    """A callable(params) -> {"bleu", "tok_bleu"} on the whole dev split, for training.

    The model, layout and dev sentences are prepared once; each call decodes with the
    current parameters (the configured search).
    """
    pairs = split_text(cfg.data, "dev")
    sources, references = [s for s, _ in pairs], [r for _, r in pairs]
    layout = sharding.layout(cfg.mesh)
    model = build_model(model_config(cfg))
    state = {}

    def hook(params) -> dict:
        if "tokenizer" not in state:  # the vocabulary exists once training has started
            state["tokenizer"] = run_tokenizer(workdir)
        loaded = LoadedModel(model, params, state["tokenizer"], "training", layout)
        hyps = translate(loaded, sources, cfg)
        return {
            "bleu": sacrebleu_scores(hyps, references)["bleu"],
            "tok_bleu": tokenized_bleu(hyps, references, cfg.data.tgt_lang),
        }

    return hook
