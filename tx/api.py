"""tx from Python: load a trained model, then translate, score and align sentences.

    >>> import tx
    >>> m = tx.load("runs/demo")  # a run: its averaged model, else its latest checkpoint
    >>> m.translate(["The dog sees a cat.", ""], beam=4)  # doctest: +ELLIPSIS
    [..., '']

`tx.load` takes a run directory (`--workdir` of `python -m tx train`), one of its checkpoints
(`runs/demo/checkpoints/STEP`, or `checkpoint=STEP` / `"best"`), an averaged one
(`runs/demo/averaged/STEP`, or `checkpoint="averaged/STEP"`): tx.workdir.Selection; or a
CTranslate2 export (`python -m tx export`); local or in a bucket (gs://, s3://). A run decodes
with tx's own search; an export with CTranslate2 (`device`, `compute_type`, `threads` are its
settings). A Hugging Face directory is neither: `python -m tx import` makes it a run.

The search settings are the run's config (its decode section) unless given: `beam` (beam
search of that width), `alpha` (the length penalty), `max_extra_len` (output length <= input
length + this), `batch_tokens`, or any other decode key by name (`strategy="greedy"`).

    >>> type(m.translate("The dog sees a cat.", alpha=0.0))  # one sentence: one str
    <class 'str'>
    >>> best = m.translate(["The dog sees a cat."], nbest=3)[0]  # (translation, score)s
    >>> len(best), best[0][1] >= best[1][1] >= best[2][1]  # best first
    (3, True)

`score` gives the model's log-probability of each target given its source, per sentence
and per sub-word (the target's pieces and its end, "</s>"); with alpha 0 a beam search scores
its own output so (tx.infer.scoring):

    >>> s = m.score(["The dog sees a cat."], ["Der Hund sieht eine Katze."])[0]
    >>> s.tokens[-1], s.log_prob < 0, len(s.token_log_probs) == len(s.tokens)
    ('</s>', True, True)

Word alignments, as `python -m tx translate --alignments` prints them: (source word, target
word) pairs, 0-based, each target word linked to the source word it attends to most
(tx.infer.alignment). `align` links given translations; `translate(..., alignments=True)`
gives (translation, links) for its own:

    >>> links = m.align(["The dog sees a cat."], ["Der Hund sieht eine Katze."])[0]
    >>> sorted(j for _, j in links), all(0 <= i < 5 for i, _ in links)
    ([0, 1, 2, 3, 4], True)
    >>> text, links = m.translate("The dog sees a cat.", alignments=True)
"""

from __future__ import annotations

import dataclasses
import json

import ml_collections

from tx import storage
from tx import workdir as wd
from tx.config import ConfigError, load_config
from tx.infer import engines, export, scoring
from tx.infer.alignment import align
from tx.infer.translate import load_model, translate_nbest, translate_pairs


def load(
    path: str,
    checkpoint: int | str | None = None,
    *,
    device: str | None = None,
    compute_type: str | None = None,
    threads: int | None = None,
) -> Model:
    """The model at `path`: a run, RUN/checkpoints/STEP, RUN/averaged/STEP, or a CTranslate2
    export (see the module's docstring). `checkpoint` (a run only): a training step, "best" by
    the run's dev score, or "averaged/STEP". `device` ("cpu", "cuda", "auto"), `compute_type`
    and `threads` (0: one per core) are CTranslate2's, for an export only."""
    path = path.rstrip("/")
    record_file = storage.join(path, export.EXPORT_FILE)
    if storage.isfile(record_file):
        from tx.infer import ct2

        if json.loads(storage.read_text(record_file)).get("format") == "huggingface":
            raise ConfigError(
                f"{path} is a Hugging Face export (transformers' MarianMTModel reads it); "
                f"`python -m tx import --from-huggingface {path} --workdir W` makes it a run"
            )
        if checkpoint is not None:
            raise ConfigError(f"{path} is an export of one checkpoint: no checkpoint= to choose")
        engine = ct2.load(path, device or "cpu", compute_type or "default", threads or 0)
        return Model(engine, engine.cfg)
    if (device, compute_type, threads) != (None, None, None):
        raise ConfigError("device, compute_type and threads are for a CTranslate2 export")
    selection = wd.Selection.parse(path, checkpoint)
    cfg = load_config(wd.config_file(selection.run))
    return Model(load_model(cfg, selection), cfg)


@dataclasses.dataclass
class Model:
    """A loaded model: `translate`, `score`, `align` (see the module's docstring)."""

    engine: object  # tx.infer.translate.LoadedModel, or tx.infer.ct2.CT2Model (an export)
    config: ml_collections.ConfigDict  # the run's config (an export's: the run it came from)

    @property
    def source(self) -> str:
        """Which parameters translate: "averaged/20 (steps [15, 20])", "checkpoints/20", ..."""
        return self.engine.source

    def translate(
        self,
        sentences: str | list[str],
        *,
        beam: int | None = None,
        alpha: float | None = None,
        max_extra_len: int | None = None,
        batch_tokens: int | None = None,
        nbest: int | None = None,
        alignments: bool = False,
        align_layer: int | None = None,
        **search,
    ):
        """Translations of `sentences` in their order ("" for an empty one); one sentence (a
        str) gives one result. With `nbest` N: per sentence its N best (translation, score),
        best first (the score is the search's: the log-probability over the length penalty).
        With `alignments`: per sentence (translation, [(source word, target word), ...]),
        from decoder layer `align_layer`'s cross-attention (default: the last)."""
        one = isinstance(sentences, str)
        lines = [sentences] if one else list(sentences)
        cfg = engines.with_search(
            self.config,
            beam=beam,
            alpha=alpha,
            max_extra_len=max_extra_len,
            batch_tokens=batch_tokens,
            **search,
        )
        if nbest and alignments:
            raise ValueError("nbest or alignments, not both")
        if alignments:
            layer = engines.check_alignments(self.engine, align_layer)
            pairs = translate_pairs(self.engine, lines, cfg)
            decode = self.engine.tokenizer.decode
            out = [
                (decode(target), _links(links))
                for (_, target), links in zip(pairs, align(self.engine, pairs, layer), strict=True)
            ]
        elif nbest:
            engines.check_nbest(cfg, nbest)
            out = translate_nbest(self.engine, lines, cfg, nbest)
        else:
            out = engines.translate_lines(self.engine, lines, cfg)
        return out[0] if one else out

    def score(self, sources: list[str], targets: list[str]) -> list[scoring.Scored]:
        """The model's log-probability of each target given its source (natural log): per
        sentence `log_prob`, and per sub-word `tokens` and `token_log_probs`."""
        return scoring.score_texts(self.engine, list(sources), list(targets))

    def align(
        self, sources: list[str], translations: list[str], *, layer: int | None = None
    ) -> list[list[tuple[int, int]]]:
        """Per pair its word links [(source word, target word), ...], 0-based, from decoder
        layer `layer`'s cross-attention (default: the last); [] where a side is empty."""
        layer = engines.check_alignments(self.engine, layer)
        tokenizer = self.engine.tokenizer
        pairs = [
            (tokenizer.encode(s.strip())[:-1], tokenizer.encode(t.strip(), target=True)[:-1])
            for s, t in zip(sources, translations, strict=True)
        ]
        return [_links(links) for links in align(self.engine, pairs, layer)]


def _links(pharaoh: str) -> list[tuple[int, int]]:
    """ "0-0 1-2" -> [(0, 0), (1, 2)]."""
    return [tuple(map(int, link.split("-"))) for link in pharaoh.split()]
