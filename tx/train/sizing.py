"""What a config asks for before it runs (`python -m tx info`): its parameters, counted and by
formula, beside the paper's figure, and on N devices the rows and real tokens of each step.

Nothing is allocated or compiled here (tx.train.aot compiles the step itself); the batch
plan reads the run's token cache, or a WMT'14-like length model when no run is named.
"""

from __future__ import annotations

import ml_collections

from tx import workdir
from tx.config import model_config


def info_report(
    cfg: ml_collections.ConfigDict, *, devices: int | None = None, run: str | None = None
) -> dict:
    """Parameter counts (actual tree, analytic formula, the paper's millions and our ratio to
    them), the model's fields, and with `devices` their `batches` (see `batches_on`)."""
    from tx.model.counting import analytic_param_count, param_counts

    mc = model_config(cfg)
    actual = param_counts(mc)
    report = dict(actual)
    report["analytic"] = analytic_param_count(mc)
    report["matches_analytic"] = report["analytic"]["params"] == actual["params"]
    ref = cfg.get("reference", None)
    if ref is not None and ref.get("params_m") is not None:
        report["paper_params_m"] = ref.params_m
        report["ratio_to_paper"] = round(actual["params"] / (ref.params_m * 1e6), 4)
    report["model"] = {k: getattr(mc, k) for k in mc.__dataclass_fields__}
    if devices:
        report["batches"] = batches_on(cfg, devices=devices, run=run)
    return report


def batches_on(cfg: ml_collections.ConfigDict, *, devices: int, run: str | None = None) -> dict:
    """Rows and real tokens per step, per batch length, on `devices` devices: the training
    data's lengths when `run` has its token cache, else a WMT'14-like length model."""
    from tx.data import dataset
    from tx.data.pipeline import filter_for_training, padding_efficiency, wmt_like
    from tx.data.tokenizer import Tokenizer
    from tx.train.sharding import data_shards

    shards = data_shards(cfg.mesh, devices)
    spec = dataset.batch_spec(cfg.data, shards * cfg.train.micro_batches)
    if run:
        workdir.require_run(run)
        tokenizer = Tokenizer(workdir.vocab_file(run))
        split, lengths = dataset.split_ids(cfg.data, run, tokenizer, "train"), f"train of {run}"
        mix = dataset.mix(cfg.data, split)
    else:
        split, lengths = wmt_like(1_000_000), "a WMT'14 EN-DE-like length model (1M pairs)"
        mix = None
    keep, _ = filter_for_training(split, cfg.data.max_len)
    report = padding_efficiency(split, keep, spec, mix)
    report.pop("shapes")
    return {"devices": devices, "data_shards": shards, "lengths": lengths, **report}
