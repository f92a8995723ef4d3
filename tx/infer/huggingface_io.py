"""A run as a Hugging Face MarianMTModel directory, and such a directory as a run (the weights'
mapping is tx.infer.huggingface's).

    python -m tx export --workdir W --format huggingface --out DIR      (`write_export`)
    python -m tx import --from-huggingface DIR --workdir W              (`import_marian`)

The export (DIR, written whole by tx.infer.export) holds what `MarianMTModel.from_pretrained`,
`MarianTokenizer.from_pretrained`, `generate` and `ct2-transformers-converter` read
(transformers 5 has no `pipeline("translation")`: tokenize, `generate`, `batch_decode`):
  config.json              transformers' MarianConfig (huggingface.marian_config), float32
  model.safetensors        the state dict (huggingface.to_marian), position tables included
                           (`max_positions` rows) so that tx's exact sinusoids, and the folded
                           start token, are what transformers adds
  generation_config.json   the run's search as `generate` reads it (`generation_config`)
  source.spm, target.spm, vocab.json, tokenizer_config.json, special_tokens_map.json
                           (target_vocab.json: separate vocabularies, imported)
                           a tx run: its spm.model as both models, vocab.json its pieces at
                           Marian's ids (huggingface.export_order); an imported run: its own
                           files and ids, and its original max_position_embeddings
  tx_config.json, tx_export.json   tx's provenance (tx.infer.export)

generation_config.json carries the run's search as far as `generate` can follow it: how the
length penalties map and where the two searches still differ, in
[deploy](docs/deploy.md#the-same-search-in-transformers-generate).

The import (W, a new run) holds:
  config.json              tx's defaults with the model (huggingface.model_section), the
                           vocabulary's size, data.source "text" with no files yet (name them
                           with --config.data.*_prefix), the languages tokenizer_config.json
                           names, generate's num_beams and its length_penalty as decode.alpha
                           (exported back as they came, max_length too). train.init_from=W
                           needs W's model: `train --config W/config.json
                           --config.train.init_from=W ...`
  source.spm, target.spm, vocab.json, vocab.sha256   the vocabulary (tx.data.tokenizer
                           .MappedTokenizer) and its fingerprint; target_vocab.json too for
                           separate vocabularies (share_encoder_decoder_embeddings=False: the
                           Tatoeba-Challenge models), whose two matrices are the model's
                           source_vocab_size rows and its target's, tied to the softmax
  averaged/0               the parameters as the run's average (tx.train.averaging), their meta
                           naming the directory they came from: translate, evaluate, export
                           and train.init_from take them as a trained run's
  huggingface/             the directory's own config.json, generation_config.json,
                           tokenizer_config.json and special_tokens_map.json, for exporting back
  run_card.json            its `imported` entry: from where, each file's sha256
config.json is written last: a directory without it is no run, and an import cut short is
done again over it.
"""

from __future__ import annotations

import hashlib
import json
import os

import ml_collections
import numpy as np

from tx import storage
from tx import workdir as wd
from tx.config import ConfigError, defaults, model_config, validate
from tx.data import tokenizer as tokenizers
from tx.data import vocabulary
from tx.infer import huggingface as hf
from tx.model.transformer_config import TABLES
from tx.tokens import EOS_ID, PAD_ID, UNK_ID

ORIGINAL_DIR = "huggingface"  # W/huggingface/: an imported model's own metadata files
ORIGINAL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
# config.json's fields tx's model does not decide: an imported model's come back as they were
KEPT = ("bos_token_id", "forced_eos_token_id")
TX_CONFIG = "tx_config.json"  # tx.infer.export.CONFIG_FILE, beside a tx run's export
WEIGHTS = "model.safetensors"
TORCH_WEIGHTS = "pytorch_model.bin"  # older directories; read only where torch is installed


def max_positions(cfg: ml_collections.ConfigDict, workdir: str) -> int:
    """Rows of the position tables exported: an imported run's original size, else enough for
    every input the run trained on and its longest output (tx's sinusoids have no table)."""
    if cfg.model.get("positional") in TABLES:  # its tables, as they are
        return int(cfg.model.max_len)
    original = _original(workdir, "config.json")
    if original and "max_position_embeddings" in original:
        return int(original["max_position_embeddings"])
    longest = cfg.data.max_len + cfg.decode.max_extra_len + 1
    return max(hf.MIN_POSITIONS, cfg.model.get("max_len", 0), longest)


def write_export(directory: str, cfg, mc, params: dict, tokenizer, workdir: str) -> None:
    """Writes the Hugging Face files (the module's docstring) into the local `directory`, from
    tx parameters (numpy, float32) and the run's tokenizer."""
    from safetensors.numpy import save_file

    order, source_order, files = _vocabulary_files(mc, tokenizer)
    positions = max_positions(cfg, workdir)
    marian = hf.marian_config(mc, positions, order, source_order)
    files |= _model_files(cfg, marian, positions, workdir)
    files |= _tokenizer_files(cfg, tokenizer, bool(mc.source_vocab_size), positions, workdir)
    for name, data in files.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    state = hf.to_marian(mc, params, order, positions, source_order)
    # C order: safetensors.numpy writes an array's buffer as it lies in memory, and the
    # channel permutation leaves some of them in Fortran order.
    state = {k: np.ascontiguousarray(v) for k, v in state.items()}
    path = os.path.join(directory, WEIGHTS)
    save_file(state, path, metadata={"format": "pt"})
    os.chmod(path, os.stat(os.path.join(directory, "config.json")).st_mode)  # not 0600


def _vocabulary_files(mc, tokenizer) -> tuple[np.ndarray, np.ndarray | None, dict[str, bytes]]:
    """(Marian's id of each tx id, the same for the source vocabulary if separate, the
    vocabulary's files): an imported run's own files and ids, else the run's spm.model as both
    models and vocab.json its pieces at Marian's ids."""
    if tokenizer.vocab_size != mc.vocab_size:
        raise hf.HuggingFaceError(
            f"the vocabulary has {tokenizer.vocab_size} pieces but model.vocab_size={mc.vocab_size}"
        )
    if isinstance(tokenizer, tokenizers.MappedTokenizer):  # imported: its own files and ids
        source_order = tokenizer.source_order if tokenizer.source_vocab_size else None
        if tokenizer.source_vocab_size != mc.source_vocab_size:
            raise hf.HuggingFaceError(
                f"the source vocabulary has {tokenizer.source_vocab_size} pieces but "
                f"model.source_vocab_size={mc.source_vocab_size}"
            )
        return tokenizer.order, source_order, dict(tokenizer.files)
    order = hf.export_order(mc.vocab_size)
    files = {name: tokenizer.model_bytes for name in (tokenizers.SOURCE_SPM, tokenizers.TARGET_SPM)}
    files[tokenizers.VOCAB_JSON] = _json(_vocab_json(tokenizer, order))
    return order, None, files


def _model_files(cfg, marian: dict, positions: int, workdir: str) -> dict[str, bytes]:
    """config.json (MarianConfig `marian` over an imported run's own) and
    generation_config.json."""
    original = _original(workdir, "config.json") or {}
    config = {**original, **marian, "dtype": "float32"}
    for key in KEPT:  # what tx's model does not decide, as an imported model had it
        if key in original:
            config[key] = original[key]
    length = min(positions, cfg.data.max_len + cfg.decode.max_extra_len + 1)
    original = _original(workdir, "generation_config.json") or {}
    length = int(original.get("max_length") or length)  # an imported run's, as it came
    generation = generation_config(
        cfg.decode, marian["pad_token_id"], marian["eos_token_id"], length
    )
    return {"config.json": _json(config), "generation_config.json": _json(generation)}


def _tokenizer_files(cfg, tokenizer, separate: bool, positions: int, workdir: str) -> dict:
    """tokenizer_config.json and special_tokens_map.json: an imported run's own, else made."""
    special = {
        "eos_token": tokenizer.piece(EOS_ID),
        "unk_token": tokenizer.piece(UNK_ID),
        "pad_token": tokenizer.piece(PAD_ID),
    }
    made = {
        "tokenizer_config.json": {
            "tokenizer_class": "MarianTokenizer",
            "source_lang": cfg.data.src_lang,
            "target_lang": cfg.data.tgt_lang,
            "separate_vocabs": separate,
            "model_max_length": positions,
            **special,
        },
        "special_tokens_map.json": special,
    }
    return {name: _json(_original(workdir, name) or here) for name, here in made.items()}


def generation_config(decode: ml_collections.ConfigDict, pad: int, eos: int, length: int) -> dict:
    """transformers' GenerationConfig fields for tx's `decode` section (the module's docstring
    says how the length penalties map)."""
    out = {
        "decoder_start_token_id": pad,
        "pad_token_id": pad,
        "eos_token_id": eos,
        "forced_eos_token_id": eos,  # at max_length, as tx ends a hypothesis at its limit
        "bad_words_ids": [[pad]],  # tx never emits padding (tx.infer.search.log_probs)
        "max_length": length,
    }
    if decode.strategy == "beam":
        out |= {"num_beams": int(decode.beam_size), "length_penalty": float(decode.alpha)}
    elif decode.strategy == "greedy":
        out |= {"num_beams": 1}
    else:
        out |= {"do_sample": True, "num_beams": 1, "temperature": float(decode.temperature)}
        out |= {"top_k": int(decode.top_k)}  # 0: all tokens, in both
    if decode.get("no_repeat_ngram_size", 0):
        out["no_repeat_ngram_size"] = int(decode.no_repeat_ngram_size)
    return out


def _vocab_json(tokenizer, order: np.ndarray) -> dict[str, int]:
    pieces = [tokenizer.piece(i) for i in range(tokenizer.vocab_size)]
    if len(set(pieces)) != len(pieces):
        raise hf.HuggingFaceError("the vocabulary has repeated pieces: vocab.json maps them")
    return {piece: int(order[t]) for t, piece in enumerate(pieces)}


def _json(tree) -> bytes:
    return (json.dumps(tree, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _original(workdir: str, name: str) -> dict | None:
    """An imported run's own metadata file `name` (W/huggingface/), None if it has none."""
    path = storage.join(workdir, ORIGINAL_DIR, name)
    return json.loads(storage.read_text(path)) if storage.exists(path) else None


# -------------------------------------------------------------------------------------------
# Import


def import_marian(source: str, workdir: str) -> dict:
    """Writes a MarianMTModel directory `source` (local or a bucket's prefix) as the new run
    `workdir` (the module's docstring); returns what was imported. HuggingFaceError for a model
    tx cannot express; ConfigError for a workdir that holds a run."""
    if storage.exists(wd.config_file(workdir)):
        raise ConfigError(
            f"--workdir {workdir} already holds a run (it has config.json): import into a new "
            "directory"
        )
    config = _read_json(source, "config.json", required=True)
    if config.get("model_type") != "marian":
        raise hf.HuggingFaceError(
            f"{source} holds a {config.get('model_type')!r} model: tx imports MarianMTModel "
            "(model_type 'marian', as OPUS-MT's)"
        )
    hf.check_importable(config)  # before reading the rest
    separate = not config.get("share_encoder_decoder_embeddings", True)
    names = tokenizers.MAPPED_FILES + ((tokenizers.TARGET_VOCAB_JSON,) if separate else ())
    files = {n: _read_bytes(source, n) for n in names}
    tokenizer = tokenizers.MappedTokenizer(source, files)
    vocab, target_vocab = (
        tokenizers.read_vocab(files[n], storage.join(source, n)) if n in files else None
        for n in (tokenizers.VOCAB_JSON, tokenizers.TARGET_VOCAB_JSON)
    )
    order = hf.import_order(vocab, config, target_vocab)  # config.json against the vocabularies
    state = read_weights(source, separate)
    tx_config = _read_json(source, TX_CONFIG)  # a tx run's export: its LayerNorm epsilon
    source_order = tokenizer.source_order if separate else None
    section = hf.model_section(config, state, order, tx_config, source_order)
    originals = {n: _read_json(source, n) for n in ORIGINAL_FILES}
    cfg = run_config(section, originals, tx_config)
    mc = model_config(cfg)
    params = hf.from_marian(mc, state, order, source_order)
    return _write_run(source, workdir, cfg, tokenizer, params, originals)


def run_config(
    section: dict, originals: dict, tx_config: dict | None = None
) -> ml_collections.ConfigDict:
    """tx's defaults with an imported model's section, its vocabulary's size, and what its
    tokenizer and generation configs say of the languages and the beam; the length penalty
    a tx run's export had (`tx_config`, its tx_config.json), else generate's length_penalty
    as decode.alpha (the export's mapping, reversed: the same search only at 0)."""
    cfg = defaults()
    for key, value in section.items():
        cfg.model[key] = value  # vocab_size: data.vocab_size too (one reference)
    cfg.data.source = "text"
    tokenizer_config = originals.get("tokenizer_config.json") or {}
    for key, field in (("source_lang", "src_lang"), ("target_lang", "tgt_lang")):
        if tokenizer_config.get(key):
            cfg.data[field] = str(tokenizer_config[key])
    generation = {
        **(originals.get("config.json") or {}),
        **(originals.get("generation_config.json") or {}),
    }
    if int(generation.get("num_beams") or 1) > 1:
        cfg.decode.beam_size = int(generation["num_beams"])
        alpha = ((tx_config or {}).get("decode") or {}).get("alpha")
        alpha = generation.get("length_penalty") if alpha is None else alpha
        if alpha is not None:
            cfg.decode.alpha = float(alpha)
    validate(cfg)
    return cfg


def read_weights(source: str, separate: bool = False) -> dict[str, np.ndarray]:
    """The state dict of `source` (model.safetensors; pytorch_model.bin only where torch is
    installed), float32, with the names tied weights and buffers may be saved under;
    `separate`: the encoder's and the decoder's embeddings are their own (separate
    vocabularies), the decoder's tied to lm_head."""
    path = storage.join(source, WEIGHTS)
    if storage.exists(path):
        from safetensors.numpy import load_file

        state = load_file(storage.local_copy(path))
    elif storage.exists(storage.join(source, TORCH_WEIGHTS)):
        state = _torch_weights(storage.join(source, TORCH_WEIGHTS))
    else:
        raise FileNotFoundError(f"{source} has no {WEIGHTS}: not a saved MarianMTModel")
    state = {k: np.asarray(v, np.float32) for k, v in state.items()}
    if separate:
        state.setdefault("model.decoder.embed_tokens.weight", state.get("lm_head.weight"))
        for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
            if state.get(name) is None:
                raise hf.HuggingFaceError(f"{source}'s weights have no {name}")
        rows = state["model.decoder.embed_tokens.weight"].shape[0]
        state.setdefault("final_logits_bias", np.zeros((1, rows), np.float32))
        return state
    for tied in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        state.setdefault("model.shared.weight", state.get(tied))
    state.setdefault("model.shared.weight", state.get("lm_head.weight"))
    if state["model.shared.weight"] is None:
        raise hf.HuggingFaceError(f"{source}'s weights have no embedding (model.shared.weight)")
    rows = state["model.shared.weight"].shape[0]
    state.setdefault("final_logits_bias", np.zeros((1, rows), np.float32))  # transformers' too
    return state


def _torch_weights(path: str) -> dict:
    try:
        import torch
    except ImportError:
        raise hf.HuggingFaceError(
            f"{path}: tx reads {WEIGHTS} (transformers' save_pretrained writes it); save the "
            "model again with save_pretrained, or install torch to read this file"
        ) from None
    state = torch.load(storage.local_copy(path), map_location="cpu", weights_only=True)
    return {k: v.float().numpy() for k, v in state.items()}


def _write_run(source, workdir, cfg, tokenizer, params, originals) -> dict:
    """The run's files (the module's docstring), config.json last."""
    import jax

    from tx.model.counting import abstract_params
    from tx.train import runcard, runlock, sharding
    from tx.train.averaging import save_params

    mc = model_config(cfg)
    target = sharding.layout(cfg.mesh).placed(abstract_params(mc))
    leaves = jax.tree_util.tree_structure(target), jax.tree_util.tree_structure(params)
    if leaves[0] != leaves[1]:  # from_marian and the model disagree: a bug, not the input's
        raise AssertionError(f"imported parameters do not fit the model: {leaves}")
    placed = jax.tree_util.tree_map(
        lambda x, t: jax.device_put(np.asarray(x, t.dtype), t.sharding), params, target
    )
    storage.makedirs(workdir)
    with runlock.hold(workdir):
        vocabulary.install(workdir, tokenizer)
        for name, tree in originals.items():
            if tree is not None:
                storage.write_bytes(storage.join(workdir, ORIGINAL_DIR, name), _json(tree))
        origin = storage.absolute(source)
        meta = {"selection": "imported", "imported_from": origin}
        path = save_params(workdir, 0, placed, [], meta)
        entry = {
            "from": origin,
            "time": runcard.now(),
            "files_sha256": {n: _sha256(d) for n, d in tokenizer.files.items()},
            "vocabulary_sha256": tokenizer.fingerprint,
            "averaged": path,
            **runcard.code_version(),
        }
        runcard.record(workdir, "imported", entry)
        wd.check_config(cfg, workdir)  # config.json, last: the run is whole
    return {"workdir": workdir, **entry, "vocab_size": mc.vocab_size, "model": cfg.model.to_dict()}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_bytes(source: str, name: str) -> bytes:
    path = storage.join(source, name)
    if not storage.exists(path):
        raise FileNotFoundError(
            f"{path} is missing: a MarianMTModel directory holds its tokenizer's source.spm, "
            "target.spm and vocab.json (MarianTokenizer's save_pretrained writes them)"
        )
    return storage.read_bytes(path)


def _read_json(source: str, name: str, required: bool = False) -> dict | None:
    path = storage.join(source, name)
    if not storage.exists(path):
        if required:
            raise FileNotFoundError(f"{path} is missing: not a Hugging Face model directory")
        return None
    try:
        tree = json.loads(storage.read_text(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise hf.HuggingFaceError(f"{path} is not JSON: {e}") from e
    if not isinstance(tree, dict):
        raise hf.HuggingFaceError(f"{path} holds a JSON {type(tree).__name__}, not an object")
    return tree
