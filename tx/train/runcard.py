"""The run card: what a run was, on what, for how long, and what it scored.

    W/run_card.json   the record (written by train, completed by average and evaluate)
    W/run_card.md     the same, short, for people

Every `train` segment (a fresh start or a resume) appends one entry to `segments`: the code
(git commit, dirty flag counting untracked files), the packages (the accelerator stack
included), the hardware (CPU model, devices, the backend's platform version), the time it spent
preparing data, the steps it added, the real tokens it trained on, its wall time and its model
FLOPs. `data` records where the text came from (files and their sha256, or the TFDS dataset and
version), the pairs read, kept and dropped per split, and the vocabulary's sha256; `init_from`,
the run a fine-tuning run started from (tx.train.init_from.record: its path, checkpoint or
average and steps, the vocabulary's sha256 and files). The entry is
rewritten at every checkpoint, so a segment that is killed counts up to its last checkpoint:
exactly the steps the next segment resumes from (time spent after that checkpoint is lost work
and is not counted). `average` records which checkpoints it averaged; `evaluate` records every
score with its exact recipe and signature. tx.paper.reproduce builds its tables from run cards
only.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import subprocess

import jax
import ml_collections

from tx import storage
from tx import workdir as wd
from tx.config import checkout

FORMAT = 1
PACKAGES = (
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "orbax-checkpoint",
    "tensorflow-datasets",
    "sentencepiece",
    "sacrebleu",
    "sacremoses",
    "numpy",
    # The accelerator stack: jax's plugins, libtpu, and the CUDA libraries jax[cuda12] brings.
    "jax-cuda12-plugin",
    "jax-cuda12-pjrt",
    "libtpu",
    "nvidia-cuda-runtime-cu12",
    "nvidia-cudnn-cu12",
    "nvidia-cublas-cu12",
    "nvidia-nccl-cu12",
)
# TensorFlow is installed under one of these names (tx depends on tensorflow-cpu on Linux).
TENSORFLOW = ("tensorflow", "tensorflow-cpu", "tensorflow-macos", "tf-nightly")


def config_hash(config: dict) -> str:
    """sha256 of the resolved config as canonical JSON: equal configs, equal hashes."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def resolved(cfg: ml_collections.ConfigDict) -> dict:
    """The config as plain JSON data (references resolved, tuples as lists): what config.json
    holds."""
    return json.loads(cfg.to_json_best_effort())


@functools.cache
def code_version() -> dict:
    """The git commit of the tx source tree and whether it had uncommitted changes (None for
    both in an installed tx: git is asked in a checkout only)."""
    root = checkout()
    return git_state(root) if root else {"commit": None, "dirty": None}


def git_state(root: str) -> dict:
    """{"commit", "dirty"} of the git checkout at `root`: dirty with any change, an untracked
    (not ignored) file included; None for both where git or the checkout is missing."""

    def git(*args):
        out = subprocess.run(
            ["git", "-C", root, *args], capture_output=True, text=True, timeout=30, check=False
        )
        return out.stdout.strip() if out.returncode == 0 else None

    try:
        commit = git("rev-parse", "HEAD")
        status = git("status", "--porcelain")  # untracked files make a tree dirty too
    except (OSError, subprocess.SubprocessError):  # no git on this machine
        commit = status = None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def packages() -> dict:
    """Versions of what decides a result (None: not installed)."""
    versions = {"python": platform.python_version()}
    versions |= {name: _version(name) for name in PACKAGES}
    found = [(name, _version(name)) for name in TENSORFLOW if _version(name)]
    versions["tensorflow"] = found[0][1] if found else None
    versions["tensorflow_distribution"] = found[0][0] if found else None
    return versions


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict:
    device = jax.devices()[0]
    return {
        "platform": device.platform,
        "device_kind": device.device_kind,
        # e.g. the CUDA runtime and driver jax runs on, or libtpu's build
        "platform_version": getattr(device.client, "platform_version", None),
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "host": platform.node(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
    }


def load(workdir: str) -> dict | None:
    """The run's card, or None if it has none. A card that is damaged (cut short, not JSON) is
    bookkeeping, not the run: it is moved aside to run_card.json.damaged with a warning, and the
    run goes on with a new card."""
    path = wd.run_card_file(workdir)
    try:
        data = storage.read_bytes(path)
    except FileNotFoundError:
        return None
    try:
        card = json.loads(data.decode("utf-8"))
        if isinstance(card, dict) and isinstance(card.get("segments", []), list):
            return card
        problem = "not a run card"
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        problem = str(e)
    logging.warning(
        "%s is damaged (%s): moved to %s.damaged; a new card starts", path, problem, path
    )
    # The bytes read, written under the new name, then the card removed: one object on a
    # bucket (which has no rename), the same on a disk. Process 0 alone: it writes the new card.
    if jax.process_index() == 0:
        with contextlib.suppress(OSError):
            storage.write_bytes(path + ".damaged", data)
            storage.remove(path)
    return None


def _save(workdir: str, card: dict) -> None:
    """Writes the card (JSON and markdown) atomically; process 0 only."""
    if jax.process_index() != 0:
        return
    # A segment that has not trained a step yet (or found the run finished) is not written.
    segments = [s for s in card["segments"] if s["end_step"] > s["start_step"]]
    card = dict(card, segments=segments)
    card["totals"] = totals(card)
    storage.write_text(wd.run_card_file(workdir), json.dumps(card, indent=2, sort_keys=True) + "\n")
    storage.write_text(wd.run_card_markdown(workdir), markdown(card))


def now() -> str:
    """The time now, UTC, to the second (ISO 8601), as the card records times."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


class Segment:
    """One `train` invocation's entry, updated in place as it goes."""

    def __init__(self, cfg: ml_collections.ConfigDict, workdir: str, start_step: int, peak: float):
        self.workdir = workdir
        config = resolved(cfg)
        card = load(workdir) or {"format": FORMAT, "segments": []}
        card.update(config=config, config_hash=config_hash(config))
        # A resume from step s replaces whatever earlier segments claimed beyond s.
        card["segments"] = [_clip(s, start_step) for s in card["segments"]]
        self.entry = {
            "started": now(),
            **code_version(),
            "packages": packages(),
            "hardware": hardware(),
            "peak_tflops_per_device": peak,
            "start_step": start_step,
            "end_step": start_step,
            "prepare_secs": 0.0,  # vocabulary and token caches, before the first step
            "wall_secs": 0.0,
            "src_tokens": 0.0,
            "tgt_tokens": 0.0,
            "model_flops": 0.0,
        }
        card["segments"].append(self.entry)
        self.card = card
        _save(workdir, card)

    def note(self, **items) -> None:
        """Top-level entries (e.g. the last dev evaluation), written with the next update."""
        self.card.update(items)

    def flush(self) -> None:
        """Writes the notes now (the run is ending without another checkpoint)."""
        _save(self.workdir, self.card)

    def update(self, step: int, wall_secs: float, src: float, tgt: float, flops: float):
        """Totals of this segment up to `step` (a step that has just been checkpointed)."""
        self.entry.update(
            end_step=step,
            wall_secs=round(wall_secs, 3),
            src_tokens=src,
            tgt_tokens=tgt,
            model_flops=flops,
        )
        _save(self.workdir, self.card)


def _clip(segment: dict, step: int) -> dict:
    """An earlier segment as seen from a resume at `step`: steps past it never happened.

    A segment only ends beyond a resume point if its later checkpoints were lost; its
    token and time totals are then scaled down to the steps that remain (an estimate,
    marked as such)."""
    if segment["end_step"] <= step:
        return segment
    kept = max(step - segment["start_step"], 0)
    done = max(segment["end_step"] - segment["start_step"], 1)
    scale = kept / done
    clipped = dict(segment, end_step=max(step, segment["start_step"]), clipped=True)
    for key in ("wall_secs", "src_tokens", "tgt_tokens", "model_flops"):
        clipped[key] = segment[key] * scale
    return clipped


def totals(card: dict) -> dict:
    """Steps, real tokens, wall time, device time, model FLOPs and mean MFU over all segments.

    `cost_flops_paper_way` is Table 2's training cost: time x devices x each device's
    assumed peak (the paper used sustained single-precision rates of its GPUs; we use the
    dense bf16 peak of tx.train.monitor's table, or the CPU's fp32 estimate)."""
    segs = card.get("segments", [])
    device_secs = sum(s["wall_secs"] * s["hardware"]["devices"] for s in segs)
    peak_flops = sum(
        s["wall_secs"] * s["hardware"]["devices"] * s["peak_tflops_per_device"] * 1e12 for s in segs
    )
    flops = sum(s["model_flops"] for s in segs)
    return {
        "steps": max((s["end_step"] for s in segs), default=0),
        "src_tokens": sum(s["src_tokens"] for s in segs),
        "tgt_tokens": sum(s["tgt_tokens"] for s in segs),
        "wall_secs": sum(s["wall_secs"] for s in segs),
        "prepare_secs": sum(s.get("prepare_secs", 0.0) for s in segs),
        "device_secs": device_secs,
        "model_flops": flops,
        "cost_flops_paper_way": peak_flops,
        "mean_mfu": flops / peak_flops if peak_flops > 0 else None,
        "segments": len(segs),
    }


def record(workdir: str, key: str, value) -> None:
    """Sets one top-level entry of the card."""
    card = load(workdir) or {"format": FORMAT, "segments": []}
    card[key] = value
    _save(workdir, card)


def record_prepared(workdir: str, cfg: ml_collections.ConfigDict, data: dict, secs: float):
    """`prepare`: the config, the data (`data_record`) and when, where and how long the data
    was prepared."""
    card = load(workdir) or {"format": FORMAT, "segments": []}
    config = resolved(cfg)
    card.update(config=config, config_hash=config_hash(config), data=data)
    card["prepared"] = {"time": now(), "host": platform.node(), "secs": round(secs, 3)}
    _save(workdir, card)


def record_average(workdir: str, path: str, steps: list[int], how: dict | None = None) -> None:
    """`average`: which checkpoints went into the averaged parameters, and (`how`) how they
    were chosen when not the last ones: {"best_by": metric, "scores": {step: value}}."""
    entry = {"path": path, "steps": list(steps), **(how or {}), "time": now()}
    record(workdir, "average", entry)


def record_scores(workdir: str, split: str, scores: dict) -> None:
    """`evaluate`: every score of `split` with its recipe, signature and checkpoint, and how
    many steps the run had trained when it was scored."""
    card = load(workdir) or {"format": FORMAT, "segments": []}
    trained = totals(card)["steps"]
    card.setdefault("scores", {})[split] = {**scores, "trained_steps": trained, "time": now()}
    _save(workdir, card)


def markdown(card: dict) -> str:
    """A short human summary of the card."""
    t = card.get("totals") or totals(card)
    cfg = card.get("config", {})
    model = cfg.get("model", {})
    lines = [
        "# Run card",
        "",
        f"- config sha256 `{card.get('config_hash', '?')[:16]}`; model d_model "
        f"{model.get('d_model')}, layers {model.get('num_layers')}, heads "
        f"{model.get('num_heads')}, d_ff {model.get('d_ff')}",
        f"- steps {t['steps']} in {len(card.get('segments', []))} segment(s); real tokens "
        f"{t['src_tokens']:.4g} source + {t['tgt_tokens']:.4g} target",
        f"- wall time {t['wall_secs'] / 3600:.3g} h, {t['device_secs'] / 3600:.3g} device-hours; "
        f"model FLOPs {t['model_flops']:.3g}; cost the paper's way {t['cost_flops_paper_way']:.3g}"
        + (f"; mean MFU {t['mean_mfu']:.3f}" if t["mean_mfu"] is not None else ""),
    ]
    lines += _data_lines(card.get("data"))
    if "init_from" in card:  # tx.train.init_from.record
        f = card["init_from"]
        lines.append(
            f"- started from {f['path']}: its {f['parameters']} of step {f['step']} (training "
            f"steps {f['steps']}), vocabulary sha256 `{f['vocabulary_sha256'][:16]}`"
        )
    for s in card.get("segments", []):
        hw = s["hardware"]
        dirty = " (dirty)" if s.get("dirty") else ""
        cpu = f", CPU {hw['cpu']}" if hw.get("cpu") else ""
        lines.append(
            f"- segment {s['start_step']}->{s['end_step']}: {hw['devices']} x "
            f"{hw['device_kind']} ({hw['processes']} process(es){cpu}), commit "
            f"{(s.get('commit') or 'unknown')[:10]}{dirty}, {s['wall_secs']:.0f} s training"
            f" + {s.get('prepare_secs', 0.0):.0f} s preparing data"
        )
        versions = {k: v for k, v in s.get("packages", {}).items() if v}
        lines.append("  - " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    if "dev" in card:
        d = card["dev"]
        lines.append(f"- dev at step {d['step']}: perplexity {d['dev_perplexity']:.3f}")
    if "average" in card:
        lines.append(f"- averaged checkpoints {card['average']['steps']}")
    for split, s in sorted(card.get("scores", {}).items()):
        parts = [f"checkpoint {s.get('checkpoint')}"]
        if "bleu" in s:
            parts.append(f"sacreBLEU {s['bleu']:.2f} ({s.get('bleu_signature')})")
            parts.append(f"tokenized BLEU {s['tok_bleu']:.2f} ({s.get('tok_bleu_recipe')})")
        if "perplexity" in s:
            parts.append(f"perplexity {s['perplexity']:.3f}")
        if "f1" in s:
            parts.append(f"bracketing F1 {s['f1']:.2f}")
        lines.append(f"- {split}: " + "; ".join(parts))
    return "\n".join(lines) + "\n"


def _data_lines(data: dict | None) -> list[str]:
    if not data:
        return []
    lines = [f"- data: {data['source']}, vocabulary sha256 `{data['vocabulary_sha256'][:16]}`"]
    for name, split in data["splits"].items():
        kept = f", kept {split['kept']}" if "kept" in split else ""
        corpora = split.get("corpora")
        if not corpora:
            lines.append(f"  - {name}: {split['pairs_read']} pairs read{kept}; {_where(split)}")
            continue
        lines.append(f"  - {name}: {split['pairs_read']} pairs read{kept}, from {len(corpora)}:")
        for c in corpora:
            share = f", weight {c['weight']:g} ({c['share']:.1%})" if "share" in c else ""
            lines.append(f"    - {c['name']}: {c['pairs']} pairs{share}; {_where(c)}")
    return lines


def _where(split: dict) -> dict:
    """Where a split's (or a corpus's) text came from: its files' sha256, or TFDS's or the
    demo generator's names."""
    return split.get("files_sha256") or {
        k: split[k] for k in ("tfds", "tfds_version", "generator") if k in split
    }


def with_earlier_splits(earlier: dict | None, record: dict) -> dict:
    """`record` with the splits an `earlier` data record of the same source and vocabulary has
    and `record` lacks (`prepare` records the test split; `train` reads only train and dev)."""
    same = earlier and all(earlier.get(k) == record[k] for k in ("source", "vocabulary_sha256"))
    return (
        {**record, "splits": {**earlier.get("splits", {}), **record["splits"]}} if same else record
    )


def data_record(data: ml_collections.ConfigDict, tokenizer, splits: dict) -> dict:
    """`data` of the card: the source, the vocabulary's sha256, and per split where its text
    came from and how many pairs were read, kept and dropped (`splits`: name -> (TokenizedSplit,
    filter counts or None))."""
    out = {"source": data.source, "vocabulary_sha256": tokenizer.fingerprint, "splits": {}}
    for name, (split, counts) in splits.items():
        out["splits"][name] = {**split.source, "pairs_read": len(split), **(counts or {})}
    return out
